"""Commands of protocol V2: typed events, the server's incremental parser, client encoders.

The parser is sans-IO: feed it bytes, get events. It handles partial reads and
pipelined commands, and it refuses a body from its size prefix, before buffering it,
when it exceeds ``max_body_size`` / ``max_msg_size``. Errors carry NSQ's codes and
texts; after an error the parser is dead and yields nothing more.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, cast

from nsqx.wire.errors import (
    E_BAD_BODY,
    E_BAD_CHANNEL,
    E_BAD_MESSAGE,
    E_BAD_PARTITION,
    E_BAD_PROTOCOL,
    E_BAD_TOPIC,
    E_INVALID,
    ProtocolError,
)
from nsqx.wire.frames import MAGIC_V2, MSG_ID_LENGTH
from nsqx.wire.names import is_valid_name

# --- events -----------------------------------------------------------------------------


class Identify(NamedTuple):
    body: bytes


class Auth(NamedTuple):
    secret: bytes


#: No partition named: the node's default partition for the topic (Youzan's rule).
DEFAULT_PARTITION: Final = -1

#: SUB modes: plain SUB, SUB_ORDERED, SUB_ADVANCED (Youzan).
SUB_PLAIN: Final = 0
SUB_ORDERED: Final = 1
SUB_ADVANCED: Final = 2

#: SUB_ADVANCED / /channel/setoffset position kinds (Youzan's names).
OFFSET_TIMESTAMP: Final = "timestamp"
OFFSET_VIRTUAL_QUEUE: Final = "virtual_queue"
OFFSET_MSGCOUNT: Final = "msgcount"
OFFSET_SPECIAL: Final = "special"
_OFFSET_KINDS: Final = (OFFSET_TIMESTAMP, OFFSET_VIRTUAL_QUEUE, OFFSET_MSGCOUNT, OFFSET_SPECIAL)


class ConsumeStart(NamedTuple):
    """Where a channel should start: ``timestamp`` (seconds), ``virtual_queue`` (a byte
    offset in the partition's life), ``msgcount`` (a message count, i.e. a sequence) or
    ``special`` (-1: the end)."""

    kind: str
    value: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_consume_start(text: bytes | str) -> ConsumeStart:
    """``<kind>:<value>`` as Youzan's nsqd reads it; ValueError with its message."""
    s = text.decode("latin-1") if isinstance(text, bytes) else text
    parts = s.split(":")
    if len(parts) != 2 or parts[0] not in _OFFSET_KINDS:
        raise ValueError("invalid consume offset:" + s)
    return ConsumeStart(parts[0], _go_parse_int(parts[1], "ParseInt"))


class Sub(NamedTuple):
    topic: str
    channel: str
    partition: int = DEFAULT_PARTITION
    mode: int = SUB_PLAIN
    start: ConsumeStart | None = None


# The publish events are plain classes, not NamedTuples like the other events: one is
# made per publish, and compiled (mypyc) a plain class is made directly, where a
# NamedTuple goes through tuple.__new__ (a fifth of the parser's cost per PUB).


class Pub:
    """PUB: one message."""

    __slots__ = ("body", "partition", "topic")

    def __init__(self, topic: str, body: bytes, partition: int = DEFAULT_PARTITION) -> None:
        self.topic = topic
        self.body = body
        self.partition = partition

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Pub)
            and self.topic == other.topic
            and self.body == other.body
            and self.partition == other.partition
        )

    def __hash__(self) -> int:
        return hash((self.topic, self.body, self.partition))

    def __iter__(self) -> Iterator[Any]:
        # (unpacks as the NamedTuple it replaced did)
        return iter((self.topic, self.body, self.partition))

    def __repr__(self) -> str:
        return f"Pub(topic={self.topic!r}, body={self.body!r}, partition={self.partition!r})"


class _Bodies:
    """Messages of one command line (topic and partition): Pubs and Mpub."""

    __slots__ = ("bodies", "partition", "topic")

    def __init__(self, topic: str, bodies: list[bytes], partition: int = DEFAULT_PARTITION) -> None:
        self.topic = topic
        self.bodies = bodies
        self.partition = partition

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and isinstance(other, _Bodies)
            and self.topic == other.topic
            and self.bodies == other.bodies
            and self.partition == other.partition
        )

    __hash__ = None  # type: ignore[assignment]  # (its bodies are a list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.topic, self.bodies, self.partition))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(topic={self.topic!r}, bodies={self.bodies!r}, "
            f"partition={self.partition!r})"
        )


class Pubs(_Bodies):
    """Two or more PUBs in a row, in one read, with the same command line (topic and
    partition): parsed together, published together, each answered on its own."""

    __slots__ = ()


class Mpub(_Bodies):
    """MPUB: messages published together (atomically)."""

    __slots__ = ()


class PubTrace(NamedTuple):
    """PUB_TRACE: one message with a business trace id; answered with its position."""

    topic: str
    partition: int
    trace_id: int
    body: bytes


class MpubTrace(NamedTuple):
    """MPUB_TRACE: messages with a trace id each; answered with the first's position."""

    topic: str
    partition: int
    trace_ids: list[int]
    bodies: list[bytes]


class PubExt(NamedTuple):
    """PUB_EXT: one message with a JSON ext header (checked by the server: its errors
    depend on the topic and leave the connection open)."""

    topic: str
    partition: int
    header: bytes
    body: bytes


class MpubExt(NamedTuple):
    topic: str
    partition: int
    headers: list[bytes]
    bodies: list[bytes]


class Dpub(NamedTuple):
    topic: str
    defer_ms: int
    body: bytes


class Rdy(NamedTuple):
    value: int


class Fin(NamedTuple):
    """One or more consecutive FINs, parsed together."""

    ids: list[bytes]


class Req(NamedTuple):
    """REQ: ``timeout_ms`` is within 0..max-req-timeout. A request outside it is clamped,
    as NSQ 1.3 does (1.2 refused it), and ``requested_ns`` keeps what was asked (Go's
    time.Duration, in ns) for the server to log; it is None when nothing was clamped."""

    id: bytes
    timeout_ms: int
    requested_ns: int | None = None


class Touch(NamedTuple):
    id: bytes


class Cls(NamedTuple):
    pass


class Nop(NamedTuple):
    pass


Command = (
    Identify
    | Auth
    | Sub
    | Pub
    | Pubs
    | Mpub
    | Dpub
    | Rdy
    | Fin
    | Req
    | Touch
    | Cls
    | Nop
    | PubTrace
    | MpubTrace
    | PubExt
    | MpubExt
)
#: What :meth:`CommandParser.feed` yields: commands, and at most one final error.
Event = Command | ProtocolError


@dataclass(frozen=True)
class ParserLimits:
    """The server's limits that the parser enforces (NSQ flag defaults)."""

    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_rdy_count: int = 2500
    max_req_timeout_ms: int = 3600_000
    #: longest DPUB delay (nsqd's --max-dpub-timeout, else --max-req-timeout)
    max_dpub_timeout_ms: int = 3600_000
    #: Longest command line; Go's bufio reader refuses longer ones the same way.
    max_line: int = 16384


# --- parser -----------------------------------------------------------------------------

_BODY_COMMANDS: Final = frozenset(
    {
        b"PUB",
        b"MPUB",
        b"DPUB",
        b"IDENTIFY",
        b"AUTH",
        b"PUB_TRACE",
        b"MPUB_TRACE",
        b"PUB_EXT",
        b"MPUB_EXT",
    }
)
_SINGLE_PUBS: Final = frozenset({b"PUB", b"DPUB", b"PUB_TRACE", b"PUB_EXT"})
_MULTI_PUBS: Final = frozenset({b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"})
_SUBS: Final = {b"SUB": SUB_PLAIN, b"SUB_ORDERED": SUB_ORDERED, b"SUB_ADVANCED": SUB_ADVANCED}
#: trace id (u64) and ext header length (u16) prefixes of a traced / ext message
TRACE_ID_SIZE: Final = 8
EXT_LEN_SIZE: Final = 2
# a run of consecutive FIN lines, parsed with one split (an id with a space is not one:
# Go splits the line at spaces; found by fuzzing)
_FIN_RUN: Final = re.compile(rb"(?:FIN [^\n ]*\n)+")
_I32: Final = struct.Struct(">i")


def _u32_at(data: bytes, i: int) -> int:
    """The big-endian u32 at ``data[i : i + 4]`` (the caller checked the length). For
    the hot paths' size fields: compiled, four byte reads cost far less than a
    ``Struct.unpack_from`` call; a size of 2**31 or more (negative as Go's int32) is
    out of every bound, and the general path then reports it as Go does."""
    return (data[i] << 24) | (data[i + 1] << 16) | (data[i + 2] << 8) | data[i + 3]


_U64: Final = struct.Struct(">Q")
_U16: Final = struct.Struct(">H")
_NOP: Final = Nop()
_CLS: Final = Cls()


_U64_MASK: Final = (1 << 64) - 1


def _base10(b: bytes) -> int:
    """Go's ByteToBase10: ASCII digits only (empty is 0); anything else is an error."""
    if b and not b.isdigit():
        raise ValueError(b)
    return int(b) if b else 0


def _text(b: bytes) -> str:
    return b.decode("latin-1")


def _go_parse_int(text: str, func: str = "Atoi") -> int:
    """Go's strconv.Atoi / ParseInt(s, 10, 64): ValueError with Go's message."""
    t = text[1:] if text[:1] in "+-" else text
    if not t or not t.isascii() or not t.isdigit():
        raise ValueError(f'strconv.{func}: parsing "{text}": invalid syntax')
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f'strconv.{func}: parsing "{text}": value out of range')
    return value


def _partition(param: bytes) -> int:
    """A partition parameter, as Youzan's nsqd parses it (E_BAD_PARTITION if not a number)."""
    try:
        return _go_parse_int(_text(param))
    except ValueError as err:
        raise ProtocolError(E_BAD_PARTITION, f"topic partition is not valid: {err}") from None


def _message_id(b: bytes) -> bytes:
    if len(b) != MSG_ID_LENGTH:
        raise ProtocolError(E_INVALID, "Invalid Message ID")
    return b


class CommandParser:
    """Incremental parser of client commands for nsqd.

    ``feed(data)`` returns the events completed by ``data``, in order. When input is
    invalid the last event is a :class:`ProtocolError` and the parser stops.
    """

    def __init__(self, limits: ParserLimits | None = None, *, expect_magic: bool = True) -> None:
        self.limits = limits or ParserLimits()
        self._buf = b""
        self._need_magic = expect_magic
        self._dead = False
        # a body command whose size prefix was read, waiting for the body
        self._pending: tuple[bytes, list[bytes]] | None = None
        self._chunks: list[bytes | memoryview] = []
        self._have = 0
        self._need = 0
        #: Set by the server once it sends this client binary message ids (Youzan's
        #: 8-byte id + 8-byte trace id): FIN, REQ and TOUCH then carry 16 raw bytes that
        #: may contain a newline or a space, so they are cut at fixed offsets.
        self.binary_ids = False
        # the command line of the last PUB parsed (with its "\n"), checked already: the
        # same line again (a publisher's usual case) skips the checks
        self._pub_line = b""
        #: the last body command line whose parameters were checked
        self._checked_line = b""
        self._pub_topic = ""
        self._pub_partition = DEFAULT_PARTITION
        # the same for MPUB (Go's bench_writer and clients that always batch send an
        # MPUB of one message per round trip)
        self._mpub_line = b""
        self._mpub_topic = ""
        self._mpub_partition = DEFAULT_PARTITION

    @property
    def dead(self) -> bool:
        """True once an error was returned; later input is ignored."""
        return self._dead

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete command."""
        return len(self._buf) + self._have

    def take_buffered(self) -> bytes:
        """Remove and return the input not parsed yet.

        The parser stops after an IDENTIFY: the bytes behind it may belong to the
        upgraded stream (TLS, compression) that IDENTIFY negotiated. The server takes
        them from here to feed them through the new layers, or simply feeds the parser
        again (``feed(b"")``) when nothing was negotiated.
        """
        if self._pending is not None:
            raise RuntimeError("a command body is being read")
        data, self._buf = self._buf, b""
        return data

    def feed(self, data: bytes) -> list[Event]:
        """Parse ``data`` (and input held from before); return the completed events.

        After an IDENTIFY nothing more is parsed until the next call (see
        :meth:`take_buffered`)."""
        if self._dead:
            return []
        events: list[Event] = []
        try:
            self._feed(data, events)
        except ProtocolError as err:
            self._die(err, events)
        return events

    def _die(self, err: ProtocolError, events: list[Event]) -> None:
        events.append(err)
        self._dead = True
        self._buf = b""
        self._chunks = []
        self._have = 0

    def _feed(self, data: bytes, events: list[Event]) -> None:
        pos = 0
        if self._pending is not None:
            missing = self._need - self._have
            if len(data) < missing:
                self._chunks.append(data)
                self._have += len(data)
                return
            # the body is complete: one copy of it (views in, a join out) and none of
            # what follows, which is parsed in place from ``pos``
            chunks = self._chunks
            chunks.append(memoryview(data)[:missing] if len(data) > missing else data)
            body = b"".join(chunks)
            cmd, params = self._pending
            self._pending = None
            self._chunks = []
            self._have = 0
            events.append(self._body_command(cmd, params, body))
            if cmd == b"IDENTIFY":
                self._buf = data[missing:]
                return
            pos = missing
        elif self._buf:
            data = self._buf + data
            self._buf = b""
        if self._need_magic:
            if len(data) < 4:
                self._buf = data
                return
            if data[:4] != MAGIC_V2:
                raise ProtocolError(E_BAD_PROTOCOL)
            self._need_magic = False
            pos = 4
        self._parse(data, events, pos)

    def _parse(self, data: bytes, events: list[Event], pos: int) -> None:
        """Parse ``data[pos:]``."""
        limits = self.limits
        max_line = limits.max_line
        max_msg = limits.max_msg_size
        n = len(data)
        # PUBs in a row with one command line become one Pubs event: run_at is the index
        # of the last such event in ``events``, run its bodies (None: a single Pub yet)
        run_at = -1
        run: list[bytes] | None = None
        # the lines with their "\n": compared in place with one slice (compiled, a
        # slice and == are direct; find and startswith with a position are calls
        # through Python's method protocol)
        pub_line = self._pub_line
        pub_len = len(pub_line)
        mpub_line = self._mpub_line
        mpub_len = len(mpub_line)
        while pos < n:
            if pub_len and n - pos >= pub_len + 4 and data[pos : pos + pub_len] == pub_line:
                # the PUB line checked last time: only the body's size is left to check
                start = pos + pub_len + 4
                size = _u32_at(data, start - 4)
                if 0 < size <= max_msg and start + size <= n:
                    body = data[start : start + size]
                    pos = start + size
                    if run_at >= 0 and run_at == len(events) - 1:
                        if run is None:
                            first = cast(Pub, events[run_at])
                            run = [first.body, body]
                            events[run_at] = Pubs(first.topic, run, first.partition)
                        else:
                            run.append(body)
                    else:
                        events.append(Pub(self._pub_topic, body, self._pub_partition))
                        run_at = len(events) - 1
                        run = None
                    continue
                # too big, or incomplete: the general path below
            elif mpub_len and n - pos >= mpub_len + 4 and data[pos : pos + mpub_len] == mpub_line:
                # the MPUB line checked last time: the body's size and the body are left
                start = pos + mpub_len + 4
                size = _u32_at(data, start - 4)
                if 0 < size <= limits.max_body_size and start + size <= n:
                    one = _single_mpub_message(data, start, start + size, max_msg)
                    bodies = (
                        [one]
                        if one is not None
                        else parse_mpub_body(data[start : start + size], max_msg)
                    )
                    events.append(Mpub(self._mpub_topic, bodies, self._mpub_partition))
                    pos = start + size
                    continue
                # too big, or incomplete: the general path below
            nl = data.find(b"\n", pos)
            if nl < 0:
                if n - pos > max_line:
                    raise ProtocolError(E_INVALID, f"command line too long (> {max_line} bytes)")
                break
            if nl - pos > max_line:
                raise ProtocolError(E_INVALID, f"command line too long (> {max_line} bytes)")
            if self.binary_ids and data[pos] in b"FRT":
                done = self._binary_id_command(data, pos, events)
                if done < 0:
                    break  # the id or its line is incomplete
                if done > pos:
                    pos = done
                    continue
            if data.startswith(b"FIN ", pos):
                m = _FIN_RUN.match(data, pos)
                if m is not None:
                    end = m.end()
                    ids = data[pos + 4 : end - 1].split(b"\nFIN ")
                    if all(len(i) == MSG_ID_LENGTH for i in ids):
                        events.append(Fin(ids))
                        pos = end
                        continue
                # some line in the run is unusual ('\r', extra params, bad id): go slowly
            line = data[pos:nl]
            if line.endswith(b"\r"):
                line = line[:-1]
            params = line.split(b" ")
            cmd = params[0]
            if cmd not in _BODY_COMMANDS:
                events.append(self._line_command(cmd, params))
                pos = nl + 1
                continue
            if line != self._checked_line:  # (the same line as the last body command's)
                self._check_body_params(cmd, params)
                self._checked_line = line
            if n - nl - 1 < 4:
                break
            size = _I32.unpack_from(data, nl + 1)[0]
            self._check_size(cmd, size)
            start = nl + 5
            if n - start < size:
                self._pending = (cmd, params)
                self._need = size
                # a view, not a copy: the body is joined once, when complete
                self._chunks = [memoryview(data)[start:]]
                self._have = n - start
                return
            ev = self._body_command(cmd, params, data[start : start + size])
            events.append(ev)
            pos = start + size
            if cmd == b"PUB" and data[nl - 1] != 13:  # (no "\r": the line is as sent)
                pub = cast(Pub, ev)
                pub_line = line + b"\n"
                self._pub_line, self._pub_topic, self._pub_partition = (
                    pub_line,
                    pub.topic,
                    pub.partition,
                )
                pub_len = len(pub_line)
                run_at = len(events) - 1
                run = None
            elif cmd == b"MPUB" and data[nl - 1] != 13:
                mpub = cast(Mpub, ev)
                mpub_line = line + b"\n"
                self._mpub_line, self._mpub_topic, self._mpub_partition = (
                    mpub_line,
                    mpub.topic,
                    mpub.partition,
                )
                mpub_len = len(mpub_line)
            if cmd == b"IDENTIFY":
                # what follows may be TLS or compressed: the server decides (take_buffered)
                break
        if pos < n:
            self._buf = data[pos:]

    def _binary_id_command(self, data: bytes, pos: int, events: list[Event]) -> int:
        """FIN/REQ/TOUCH with a binary id at ``pos``: returns where parsing goes on, -1
        when more input is needed, or ``pos`` when the line is another command."""
        n = len(data)
        if data.startswith(b"FIN ", pos):
            # a run of fixed-size FINs is the usual case: one event for all of them
            ids: list[bytes] = []
            while pos + 21 <= n and data.startswith(b"FIN ", pos) and data[pos + 20] == 10:
                ids.append(data[pos + 4 : pos + 20])
                pos += 21
            if ids:
                events.append(Fin(ids))
                return pos
            if n - pos < 21:
                return -1
            nl = data.find(b"\n", pos + 20)
            if nl < 0:
                return -1
            events.append(Fin([data[pos + 4 : pos + 20]]))  # extra bytes ignored, as Youzan
            return nl + 1
        if data.startswith(b"REQ ", pos):
            if n - pos < 22:
                return -1
            nl = data.find(b"\n", pos + 20)
            if nl < 0:
                return -1
            msg_id = data[pos + 4 : pos + 20]
            # "REQ <16 bytes>\n" (no timeout): nl is pos + 20, before the slice's start;
            # guarded because mypyc's runtime (2.4 and earlier) makes such a bytes slice
            # a SystemError where Python gives b""
            tail = data[pos + 21 : nl].rstrip(b"\r") if nl > pos + 21 else b""
            events.append(self._req(msg_id, tail))
            return nl + 1
        if data.startswith(b"TOUCH ", pos):
            if n - pos < 23:
                return -1
            nl = data.find(b"\n", pos + 22)
            if nl < 0:
                return -1
            events.append(Touch(data[pos + 6 : pos + 22]))
            return nl + 1
        return pos

    def _req(self, msg_id: bytes, timeout: bytes) -> Req:
        try:
            timeout_ms = _base10(timeout)
        except ValueError:
            raise ProtocolError(
                E_INVALID, f"REQ could not parse timeout {_text(timeout)}"
            ) from None
        max_ms = self.limits.max_req_timeout_ms
        if timeout_ms <= max_ms:
            return Req(msg_id, timeout_ms)
        # NSQ 1.3 clamps: time.Duration(u64 ms) * time.Millisecond, with Go's wrap-around
        # (a huge value may come out negative, which clamps to 0)
        requested_ns = (timeout_ms * 1_000_000) & _U64_MASK
        if requested_ns >= 1 << 63:
            requested_ns -= 1 << 64
        if requested_ns < 0:
            return Req(msg_id, 0, requested_ns)
        if requested_ns <= max_ms * 1_000_000:  # wrapped into range: Go takes it as is
            return Req(msg_id, requested_ns // 1_000_000)
        return Req(msg_id, max_ms, requested_ns)

    # -- commands without a body --

    def _line_command(self, cmd: bytes, params: list[bytes]) -> Command:
        if cmd == b"FIN":
            if len(params) < 2:
                raise ProtocolError(E_INVALID, "FIN insufficient number of params")
            return Fin([_message_id(params[1])])
        if cmd == b"RDY":
            count = 1
            if len(params) > 1:
                try:
                    count = _base10(params[1])
                except ValueError:
                    raise ProtocolError(
                        E_INVALID, f"RDY could not parse count {_text(params[1])}"
                    ) from None
            if count > self.limits.max_rdy_count:
                raise ProtocolError(
                    E_INVALID, f"RDY count {count} out of range 0-{self.limits.max_rdy_count}"
                )
            return Rdy(count)
        if cmd == b"REQ":
            if len(params) < 3:
                raise ProtocolError(E_INVALID, "REQ insufficient number of params")
            return self._req(_message_id(params[1]), params[2])
        if cmd == b"TOUCH":
            if len(params) < 2:
                raise ProtocolError(E_INVALID, "TOUCH insufficient number of params")
            return Touch(_message_id(params[1]))
        mode = _SUBS.get(cmd)
        if mode is not None:
            return self._sub(mode, params)
        if cmd == b"NOP":
            return _NOP
        if cmd == b"CLS":
            return _CLS
        raise ProtocolError(E_INVALID, f"invalid command {_text(cmd)}")

    @staticmethod
    def _sub(mode: int, params: list[bytes]) -> Sub:
        # the texts say SUB whatever the variant, as Youzan's nsqd does
        if len(params) < 3:
            raise ProtocolError(E_INVALID, "SUB insufficient number of parameters")
        topic = _text(params[1])
        if not is_valid_name(topic):
            raise ProtocolError(E_BAD_TOPIC, f'SUB topic name "{topic}" is not valid')
        channel = _text(params[2])
        if not is_valid_name(channel):
            raise ProtocolError(E_BAD_CHANNEL, f'SUB channel name "{channel}" is not valid')
        start: ConsumeStart | None = None
        if mode == SUB_ADVANCED and len(params) > 4 and params[4]:
            try:
                start = parse_consume_start(params[4])
            except ValueError as err:
                raise ProtocolError(E_INVALID, str(err)) from None
        # A plain SUB names a partition only as a 4th parameter (NSQ 1.3 ignores more).
        # Youzan's nsqd also ignores SUB_ADVANCED's partition when a start position
        # follows it; nsqx honours it (the same partition in the usual one-per-node case).
        partition = DEFAULT_PARTITION
        if len(params) == 4 or (mode != SUB_PLAIN and len(params) >= 4):
            partition = _partition(params[3])
        return Sub(topic, channel, partition, mode, start)

    # -- commands with a size-prefixed body --

    def _check_body_params(self, cmd: bytes, params: list[bytes]) -> None:
        name = _text(cmd)
        if cmd in (b"IDENTIFY", b"AUTH"):
            if cmd == b"AUTH" and len(params) != 1:
                raise ProtocolError(E_INVALID, "AUTH invalid number of parameters")
            return
        need = 3 if cmd == b"DPUB" else 2
        if len(params) < need:
            if b"_" in cmd:  # Youzan's texts for its commands
                raise ProtocolError(E_INVALID, "insufficient number of parameters")
            raise ProtocolError(E_INVALID, f"{name} insufficient number of parameters")
        if len(params) == 3 and cmd != b"DPUB":
            _partition(params[2])  # checked before the body is read, as Youzan does
        topic = _text(params[1])
        if not is_valid_name(topic):
            raise ProtocolError(E_BAD_TOPIC, f'{name} topic name "{topic}" is not valid')
        if cmd == b"DPUB":
            try:
                defer_ms = _base10(params[2])
            except ValueError:
                raise ProtocolError(
                    E_INVALID, f"DPUB could not parse timeout {_text(params[2])}"
                ) from None
            max_ms = self.limits.max_dpub_timeout_ms
            if defer_ms > max_ms:
                raise ProtocolError(E_INVALID, f"DPUB timeout {defer_ms} out of range 0-{max_ms}")

    def _check_size(self, cmd: bytes, size: int) -> None:
        limits = self.limits
        if b"_" in cmd and cmd not in (b"IDENTIFY",):
            # Youzan's texts: no command name
            limit = limits.max_msg_size if cmd in _SINGLE_PUBS else limits.max_body_size
            if size <= 0:
                raise ProtocolError(E_BAD_BODY, f"invalid body size {size}")
            if size > limit:
                if cmd in _SINGLE_PUBS:
                    raise ProtocolError(E_BAD_MESSAGE, f"message too big {size} > {limit}")
                raise ProtocolError(E_BAD_BODY, f"body too big {size} > {limit}")
            if cmd == b"PUB_TRACE" and size <= TRACE_ID_SIZE:
                raise ProtocolError(E_BAD_BODY, f"invalid body size {size} with trace id enabled")
            if cmd == b"PUB_EXT" and size <= EXT_LEN_SIZE:
                raise ProtocolError(
                    E_BAD_BODY, f"invalid body size {size} with ext json header enabled"
                )
            return
        if cmd in (b"PUB", b"DPUB"):
            name = _text(cmd)
            if size <= 0:
                raise ProtocolError(E_BAD_MESSAGE, f"{name} invalid message body size {size}")
            if size > limits.max_msg_size:
                raise ProtocolError(
                    E_BAD_MESSAGE, f"{name} message too big {size} > {limits.max_msg_size}"
                )
            return
        name = _text(cmd)
        if cmd == b"MPUB":
            if size <= 0:
                raise ProtocolError(E_BAD_BODY, f"MPUB invalid body size {size}")
            if size > limits.max_body_size:
                raise ProtocolError(
                    E_BAD_BODY, f"MPUB body too big {size} > {limits.max_body_size}"
                )
            return
        # IDENTIFY, AUTH: size checked against max-body-size first, as nsqd does
        if size > limits.max_body_size:
            raise ProtocolError(E_BAD_BODY, f"{name} body too big {size} > {limits.max_body_size}")
        if size <= 0:
            raise ProtocolError(E_BAD_BODY, f"{name} invalid body size {size}")

    def _body_command(self, cmd: bytes, params: list[bytes], body: bytes) -> Command:
        if cmd == b"PUB":
            if len(params) == 3:
                return Pub(_text(params[1]), body, _partition(params[2]))
            return Pub(_text(params[1]), body)
        if cmd == b"MPUB":
            bodies = parse_mpub_body(body, self.limits.max_msg_size)
            if len(params) == 3:
                return Mpub(_text(params[1]), bodies, _partition(params[2]))
            return Mpub(_text(params[1]), bodies)
        if b"_" in cmd:
            return self._youzan_pub(cmd, params, body)
        if cmd == b"DPUB":
            return Dpub(_text(params[1]), _base10(params[2]), body)
        if cmd == b"IDENTIFY":
            return Identify(body)
        return Auth(body)

    def _youzan_pub(self, cmd: bytes, params: list[bytes], body: bytes) -> Command:
        topic = _text(params[1])
        partition = _partition(params[2]) if len(params) == 3 else DEFAULT_PARTITION
        if cmd == b"PUB_TRACE":
            return PubTrace(topic, partition, _U64.unpack_from(body)[0], body[TRACE_ID_SIZE:])
        if cmd == b"PUB_EXT":
            size = len(body)
            jlen = _U16.unpack_from(body)[0]
            if size <= EXT_LEN_SIZE + jlen:
                raise ProtocolError(
                    E_BAD_BODY, f"invalid body size {size} in ext json header content length"
                )
            end = EXT_LEN_SIZE + jlen
            return PubExt(topic, partition, body[EXT_LEN_SIZE:end], body[end:])
        messages = parse_mpub_body(body, self.limits.max_msg_size)
        if cmd == b"MPUB_TRACE":
            for i, m in enumerate(messages):
                if len(m) <= TRACE_ID_SIZE:
                    raise ProtocolError(
                        E_BAD_MESSAGE,
                        f"MPUB invalid message({i}) body size {len(m)} for tracing",
                    )
            trace_ids = [_U64.unpack_from(m)[0] for m in messages]
            return MpubTrace(topic, partition, trace_ids, [m[TRACE_ID_SIZE:] for m in messages])
        headers: list[bytes] = []
        bodies: list[bytes] = []
        for m in messages:
            size = len(m)
            jlen = _U16.unpack_from(m)[0] if size >= EXT_LEN_SIZE else size
            if size <= EXT_LEN_SIZE + jlen:
                raise ProtocolError(
                    E_BAD_BODY, f"invalid body size {size} in ext json header content length"
                )
            headers.append(m[EXT_LEN_SIZE : EXT_LEN_SIZE + jlen])
            bodies.append(m[EXT_LEN_SIZE + jlen :])
        return MpubExt(topic, partition, headers, bodies)


class TLSRequiredParser(CommandParser):
    """The parser of a connection that must upgrade to TLS before anything else
    (nsqd's --tls-required): IDENTIFY is the only command accepted. Any other is refused
    by its name alone, before its parameters or body are looked at, as nsqd refuses it:
    ``E_INVALID cannot <CMD> in current state (TLS required)``.
    """

    def _parse(self, data: bytes, events: list[Event], pos: int) -> None:
        nl = data.find(b"\n", pos)
        # a line too long is refused as such, whether its end has arrived yet or not
        # (found by fuzzing: the answer depended on how TCP cut the input)
        if nl >= 0 and nl - pos <= self.limits.max_line:
            line = data[pos:nl]
            if line.endswith(b"\r"):
                line = line[:-1]
            name = line.split(b" ", 1)[0]
            if name != b"IDENTIFY":
                raise ProtocolError(
                    E_INVALID, f"cannot {_text(name)} in current state (TLS required)"
                )
        super()._parse(data, events, pos)


def _single_mpub_message(data: bytes, start: int, end: int, max_msg_size: int) -> bytes | None:
    """The message of the MPUB body ``data[start:end]`` if it holds exactly one, well
    formed (Go's bench_writer --batch-size 1, and others), cut out of ``data`` without
    copying the whole body first; None otherwise (parse_mpub_body then decides)."""
    if end - start >= 8 and _u32_at(data, start) == 1:
        size = _u32_at(data, start + 4)
        if 0 < size <= max_msg_size and end - start == 8 + size:
            return data[start + 8 : end]
    return None


def parse_mpub_body(body: bytes, max_msg_size: int) -> list[bytes]:
    """Split an MPUB body ``[u32 n]([u32 size][data])*`` into message bodies."""
    total = len(body)
    if total < 4:
        raise ProtocolError(E_BAD_BODY, "MPUB failed to read message count")
    count = _I32.unpack_from(body, 0)[0]
    if count <= 0:
        raise ProtocolError(E_BAD_BODY, f"MPUB invalid message count {count}")
    one = _single_mpub_message(body, 0, total, max_msg_size)
    if one is not None:
        return [one]
    if total >= 8:
        size = _I32.unpack_from(body, 4)[0]
        stride = size + 4
        if 0 < size <= max_msg_size and total == 4 + count * stride:
            # Equal sizes (the usual batch): check every size prefix with four strided
            # slices instead of a Python loop, then cut the bodies in one comprehension.
            prefix = body[4:8]
            if all(body[4 + k :: stride] == prefix[k : k + 1] * count for k in range(4)):
                return [body[o : o + size] for o in range(8, total, stride)]
    bodies: list[bytes] = []
    append = bodies.append
    unpack = _I32.unpack_from
    pos = 4
    for i in range(count):
        if pos + 4 > total:
            raise ProtocolError(E_BAD_MESSAGE, f"MPUB failed to read message({i}) body size")
        size = unpack(body, pos)[0]
        if size <= 0:
            raise ProtocolError(E_BAD_MESSAGE, f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ProtocolError(E_BAD_MESSAGE, f"MPUB message too big {size} > {max_msg_size}")
        pos += 4
        end = pos + size
        if end > total:
            raise ProtocolError(E_BAD_MESSAGE, "MPUB failed to read message body")
        append(body[pos:end])
        pos = end
    if pos != total:
        raise ProtocolError(E_BAD_BODY, f"MPUB body has {total - pos} bytes after {count} messages")
    return bodies


# --- client encoders --------------------------------------------------------------------


def _with_body(line: bytes, body: bytes) -> bytes:
    return line + _I32.pack(len(body)) + body


def identify(data: dict[str, Any]) -> bytes:
    return _with_body(b"IDENTIFY\n", json.dumps(data).encode())


def auth(secret: bytes | str) -> bytes:
    return _with_body(b"AUTH\n", secret.encode() if isinstance(secret, str) else secret)


def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    if partition is None:
        return f"SUB {topic} {channel}\n".encode()
    return f"SUB {topic} {channel} {partition}\n".encode()


def sub_ordered(topic: str, channel: str, partition: int) -> bytes:
    return f"SUB_ORDERED {topic} {channel} {partition}\n".encode()


def sub_advanced(
    topic: str, channel: str, partition: int, start: ConsumeStart | None = None
) -> bytes:
    if start is None:
        return f"SUB_ADVANCED {topic} {channel} {partition}\n".encode()
    return f"SUB_ADVANCED {topic} {channel} {partition} {start}\n".encode()


def _pub_line(verb: str, topic: str, partition: int | None) -> bytes:
    if partition is None:
        return f"{verb} {topic}\n".encode()
    return f"{verb} {topic} {partition}\n".encode()


def pub(topic: str, body: bytes, partition: int | None = None) -> bytes:
    return _with_body(_pub_line("PUB", topic, partition), body)


def pub_trace(topic: str, partition: int | None, trace_id: int, body: bytes) -> bytes:
    return _with_body(_pub_line("PUB_TRACE", topic, partition), _U64.pack(trace_id) + body)


def pub_ext(topic: str, partition: int | None, header: bytes, body: bytes) -> bytes:
    """PUB_EXT: ``header`` is the JSON ext header (UTF-8 bytes)."""
    return _with_body(
        _pub_line("PUB_EXT", topic, partition), _U16.pack(len(header)) + header + body
    )


def mpub_trace(
    topic: str, partition: int | None, trace_ids: list[int], bodies: list[bytes]
) -> bytes:
    pack, pack64 = _I32.pack, _U64.pack
    parts = [pack(len(bodies))]
    for t, b in zip(trace_ids, bodies, strict=True):
        parts += (pack(len(b) + TRACE_ID_SIZE), pack64(t), b)
    return _with_body(_pub_line("MPUB_TRACE", topic, partition), b"".join(parts))


def mpub_ext(topic: str, partition: int | None, headers: list[bytes], bodies: list[bytes]) -> bytes:
    pack, pack16 = _I32.pack, _U16.pack
    parts = [pack(len(bodies))]
    for h, b in zip(headers, bodies, strict=True):
        parts += (pack(EXT_LEN_SIZE + len(h) + len(b)), pack16(len(h)), h, b)
    return _with_body(_pub_line("MPUB_EXT", topic, partition), b"".join(parts))


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return _with_body(f"DPUB {topic} {defer_ms}\n".encode(), body)


def mpub(topic: str, bodies: list[bytes], partition: int | None = None) -> bytes:
    pack = _I32.pack
    parts = [pack(len(bodies))]
    for b in bodies:
        parts.append(pack(len(b)))
        parts.append(b)
    return _with_body(_pub_line("MPUB", topic, partition), b"".join(parts))


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def fin_many(msg_ids: list[bytes]) -> bytes:
    """Many FINs in one buffer (one write)."""
    if not msg_ids:
        return b""
    return b"FIN " + b"\nFIN ".join(msg_ids) + b"\n"


def req(msg_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ " + msg_id + b" %d\n" % timeout_ms


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"
