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
from dataclasses import dataclass
from typing import Any, NamedTuple

from nsqx.wire.errors import (
    E_BAD_BODY,
    E_BAD_CHANNEL,
    E_BAD_MESSAGE,
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


class Sub(NamedTuple):
    topic: str
    channel: str


class Pub(NamedTuple):
    topic: str
    body: bytes


class Mpub(NamedTuple):
    topic: str
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
    id: bytes
    timeout_ms: int


class Touch(NamedTuple):
    id: bytes


class Cls(NamedTuple):
    pass


class Nop(NamedTuple):
    pass


Command = Identify | Auth | Sub | Pub | Mpub | Dpub | Rdy | Fin | Req | Touch | Cls | Nop
#: What :meth:`CommandParser.feed` yields: commands, and at most one final error.
Event = Command | ProtocolError


@dataclass(frozen=True)
class ParserLimits:
    """The server's limits that the parser enforces (NSQ flag defaults)."""

    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_rdy_count: int = 2500
    max_req_timeout_ms: int = 3600_000
    #: Longest command line; Go's bufio reader refuses longer ones the same way.
    max_line: int = 16384


# --- parser -----------------------------------------------------------------------------

_BODY_COMMANDS = frozenset({b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"})
# a run of consecutive FIN lines, parsed with one split
_FIN_RUN = re.compile(rb"(?:FIN [^\n]*\n)+")
_I32 = struct.Struct(">i")
_NOP = Nop()
_CLS = Cls()


def _base10(b: bytes) -> int:
    """Go's ByteToBase10: ASCII digits only (empty is 0); anything else is an error."""
    if b and not b.isdigit():
        raise ValueError(b)
    return int(b) if b else 0


def _text(b: bytes) -> str:
    return b.decode("latin-1")


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
        n = len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            if nl < 0:
                if n - pos > max_line:
                    raise ProtocolError(E_INVALID, f"command line too long (> {max_line} bytes)")
                break
            if nl - pos > max_line:
                raise ProtocolError(E_INVALID, f"command line too long (> {max_line} bytes)")
            if data.startswith(b"FIN ", pos):
                m = _FIN_RUN.match(data, pos)
                assert m is not None
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
            self._check_body_params(cmd, params)
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
            events.append(self._body_command(cmd, params, data[start : start + size]))
            pos = start + size
            if cmd == b"IDENTIFY":
                # what follows may be TLS or compressed: the server decides (take_buffered)
                break
        if pos < n:
            self._buf = data[pos:]

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
            msg_id = _message_id(params[1])
            try:
                timeout_ms = _base10(params[2])
            except ValueError:
                raise ProtocolError(
                    E_INVALID, f"REQ could not parse timeout {_text(params[2])}"
                ) from None
            max_ms = self.limits.max_req_timeout_ms
            if timeout_ms > max_ms:
                # Go prints both as time.Duration integers (nanoseconds)
                raise ProtocolError(
                    E_INVALID,
                    f"REQ timeout {timeout_ms * 1_000_000} out of range 0-{max_ms * 1_000_000}",
                )
            return Req(msg_id, timeout_ms)
        if cmd == b"TOUCH":
            if len(params) < 2:
                raise ProtocolError(E_INVALID, "TOUCH insufficient number of params")
            return Touch(_message_id(params[1]))
        if cmd == b"SUB":
            if len(params) < 3:
                raise ProtocolError(E_INVALID, "SUB insufficient number of parameters")
            topic = _text(params[1])
            if not is_valid_name(topic):
                raise ProtocolError(E_BAD_TOPIC, f'SUB topic name "{topic}" is not valid')
            channel = _text(params[2])
            if not is_valid_name(channel):
                raise ProtocolError(E_BAD_CHANNEL, f'SUB channel name "{channel}" is not valid')
            return Sub(topic, channel)
        if cmd == b"NOP":
            return _NOP
        if cmd == b"CLS":
            return _CLS
        raise ProtocolError(E_INVALID, f"invalid command {_text(cmd)}")

    # -- commands with a size-prefixed body --

    def _check_body_params(self, cmd: bytes, params: list[bytes]) -> None:
        name = _text(cmd)
        if cmd in (b"IDENTIFY", b"AUTH"):
            if cmd == b"AUTH" and len(params) != 1:
                raise ProtocolError(E_INVALID, "AUTH invalid number of parameters")
            return
        need = 3 if cmd == b"DPUB" else 2
        if len(params) < need:
            raise ProtocolError(E_INVALID, f"{name} insufficient number of parameters")
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
            max_ms = self.limits.max_req_timeout_ms
            if defer_ms > max_ms:
                raise ProtocolError(E_INVALID, f"DPUB timeout {defer_ms} out of range 0-{max_ms}")

    def _check_size(self, cmd: bytes, size: int) -> None:
        limits = self.limits
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
            return Pub(_text(params[1]), body)
        if cmd == b"MPUB":
            return Mpub(_text(params[1]), parse_mpub_body(body, self.limits.max_msg_size))
        if cmd == b"DPUB":
            return Dpub(_text(params[1]), _base10(params[2]), body)
        if cmd == b"IDENTIFY":
            return Identify(body)
        return Auth(body)


class TLSRequiredParser(CommandParser):
    """The parser of a connection that must upgrade to TLS before anything else
    (nsqd's --tls-required): IDENTIFY is the only command accepted. Any other is refused
    by its name alone, before its parameters or body are looked at, as nsqd refuses it:
    ``E_INVALID cannot <CMD> in current state (TLS required)``.
    """

    def _parse(self, data: bytes, events: list[Event], pos: int) -> None:
        nl = data.find(b"\n", pos)
        if nl >= 0:
            line = data[pos:nl]
            if line.endswith(b"\r"):
                line = line[:-1]
            name = line.split(b" ", 1)[0]
            if name != b"IDENTIFY":
                raise ProtocolError(
                    E_INVALID, f"cannot {_text(name)} in current state (TLS required)"
                )
        super()._parse(data, events, pos)


def parse_mpub_body(body: bytes, max_msg_size: int) -> list[bytes]:
    """Split an MPUB body ``[u32 n]([u32 size][data])*`` into message bodies."""
    total = len(body)
    if total < 4:
        raise ProtocolError(E_BAD_BODY, "MPUB failed to read message count")
    count = _I32.unpack_from(body, 0)[0]
    if count <= 0:
        raise ProtocolError(E_BAD_BODY, f"MPUB invalid message count {count}")
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


def sub(topic: str, channel: str) -> bytes:
    return f"SUB {topic} {channel}\n".encode()


def pub(topic: str, body: bytes) -> bytes:
    return _with_body(f"PUB {topic}\n".encode(), body)


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return _with_body(f"DPUB {topic} {defer_ms}\n".encode(), body)


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    pack = _I32.pack
    parts = [pack(len(bodies))]
    for b in bodies:
        parts.append(pack(len(b)))
        parts.append(b)
    return _with_body(f"MPUB {topic}\n".encode(), b"".join(parts))


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
