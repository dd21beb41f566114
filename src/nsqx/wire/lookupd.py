"""nsqlookupd's TCP protocol V1, sans-IO: shared by nsqlookupd and nsqd's registration client.

A client (an nsqd) opens with the magic ``"  V1"``, then sends ``\\n``-terminated command
lines; IDENTIFY is followed by ``[i32 BE size][JSON body]``. Every reply, success or
error, is ``[i32 BE size][bytes]`` with no frame type. Any error is fatal: lookupd sends
it and closes the connection.

Server side: :class:`LookupParser` turns bytes into :data:`LookupEvent` objects and
enforces the protocol's state (IDENTIFY once, before REGISTER/UNREGISTER) with NSQ
1.3's error codes and texts, so the server only acts on valid events. Client side:
the ``encode_*`` functions build commands and :class:`ReplyDecoder` splits replies.

Partitions (Youzan's extension): a peer whose IDENTIFY carries a non-empty
``distributed_id``, or whose version contains ``HA`` (Youzan's nsqd), registers
partitions: ``REGISTER <topic> <partition> [<channel>]``. Everyone else (Go's nsqd 1.3)
keeps NSQ's ``REGISTER <topic> [<channel>]``. The parser picks the form from the
peer's IDENTIFY, so a Go nsqd's channel named ``5`` stays a channel.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from nsqx.wire.errors import E_BAD_BODY, E_BAD_CHANNEL, E_BAD_PROTOCOL, E_BAD_TOPIC, E_INVALID
from nsqx.wire.errors import ProtocolError as ProtocolError
from nsqx.wire.names import is_valid_name

MAGIC_V1 = b"  V1"
OK = b"OK"
#: nsqx's lookupd answers a partition-aware peer's PING with this instead of OK when it
#: cannot grant a lease now (its own etcd session may be ending): the PING kept the
#: node's session alive, but a partition leader may not count it to acknowledge writes.
NO_LEASE = b"E_NO_LEASE"

#: Youzan's lookupd error for a REGISTER/UNREGISTER partition that is not 0..254.
E_BAD_PARTITIONID = "E_BAD_PARTITIONID"
#: Partition ids are 0 .. MAX_PARTITION_ID (Youzan's MAX_PARTITION_NUM - 1).
MAX_PARTITION_ID = 254

# Go's strconv.Atoi: an optional sign, then ASCII digits (Python's int() takes more)
_ATOI_RE = re.compile(rb"[+-]?[0-9]+")

_I32 = struct.Struct(">i")

#: Longest command line accepted. Go reads lines of any length; lookupd's longest valid
#: line is ``UNREGISTER <64> <64>``, so this only stops a peer from filling memory.
MAX_LINE = 64 * 1024
#: Largest IDENTIFY body accepted (Go has no limit; nsqd sends about 150 bytes).
MAX_IDENTIFY_BODY = 1024 * 1024


# --- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerInfo:
    """What an nsqd announces in IDENTIFY: where clients reach it, and its version."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""
    #: The node's id in a partitioned cluster (Youzan's nsqd: ``ip:rpc:tcp:id``; nsqx's
    #: nsqd: ``broadcast_address:tcp_port``); empty for Go's nsqd 1.3.
    distributed_id: str = ""
    #: nsqx: ``host:port`` where this node's followers reach its HTTP API for
    #: replication, when not the broadcast address and HTTP port
    replication_address: str = ""
    #: nsqx: ``"heartbeat"`` from an nsqd that PINGs as often as nsqlookupd asks (its
    #: IDENTIFY reply), so that nsqlookupd may judge it by time; empty: judged by its
    #: connection only (an older nsqd PINGs every 15 s)
    liveness: str = ""

    @property
    def speaks_partitions(self) -> bool:
        """True for a peer that registers partitions, decided as Youzan's lookupd does:
        a non-empty distributed_id, or a version containing ``HA``."""
        return bool(self.distributed_id) or "HA" in self.version


class Ping(NamedTuple):
    """``PING``: a heartbeat; refreshes the peer's last-seen time once identified."""


class Identify(NamedTuple):
    """``IDENTIFY`` with a valid body (the parser checked the required fields)."""

    info: PeerInfo


class Register(NamedTuple):
    """``REGISTER topic [channel]`` (NSQ) or ``REGISTER topic partition [channel]``
    (a partition-aware peer): the peer has this topic partition (and channel).

    ``partition`` is None for NSQ's form; lookupd reads that as partition 0.
    """

    topic: str
    channel: str | None
    partition: int | None = None


class Unregister(NamedTuple):
    """``UNREGISTER topic [channel]`` or ``UNREGISTER topic partition [channel]``: the
    peer deleted this topic partition (or channel); ``partition`` as in Register."""

    topic: str
    channel: str | None
    partition: int | None = None


LookupCommand = Ping | Identify | Register | Unregister
#: What :meth:`LookupParser.feed` yields: commands, and at most one final (fatal) error.
LookupEvent = LookupCommand | ProtocolError


# --- server-side parser -----------------------------------------------------------------

_PEER_FIELDS: dict[str, type] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "distributed_id": str,
    "replication_address": str,
    "liveness": str,
}


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's (key, value) pairs, in order, duplicates kept."""


def _reject_constant(name: str) -> Any:
    # Go's JSON has no NaN/Infinity; Python's json would accept them
    raise ValueError(f"invalid JSON constant {name}")


def parse_identify_body(body: bytes) -> PeerInfo:
    """Decode an IDENTIFY body as Go's nsqlookupd does; raises :class:`ProtocolError`.

    Like Go's ``encoding/json`` into a struct: keys match case-insensitively, the last
    duplicate wins, ``null`` leaves a field unset, unknown keys are ignored, and a value
    of the wrong type (``"4150"`` or ``4150.0`` for a port) fails the decode.
    broadcast_address, tcp_port, http_port and version must be non-empty/non-zero.
    """
    try:
        pairs = json.loads(
            body.decode("utf-8", errors="replace"),
            object_pairs_hook=_Pairs,
            parse_constant=_reject_constant,
        )
    except ValueError:
        raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body") from None
    values: dict[str, Any] = {}
    if pairs is not None:
        if not isinstance(pairs, _Pairs):
            raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body")
        for key, value in pairs:
            name = key if key in _PEER_FIELDS else _fold_key(key)
            if name is None or value is None:
                continue
            kind = _PEER_FIELDS[name]
            ok = (
                isinstance(value, str)
                if kind is str
                else (isinstance(value, int) and not isinstance(value, bool))
            )
            if not ok or (kind is int and not -(2**63) <= value < 2**63):
                raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body")
            values[name] = value
    info = PeerInfo(
        broadcast_address=values.get("broadcast_address", ""),
        tcp_port=values.get("tcp_port", 0),
        http_port=values.get("http_port", 0),
        version=values.get("version", ""),
        hostname=values.get("hostname", ""),
        distributed_id=values.get("distributed_id", ""),
        replication_address=values.get("replication_address", ""),
        liveness=values.get("liveness", ""),
    )
    if not info.broadcast_address or not info.tcp_port or not info.http_port or not info.version:
        raise ProtocolError(E_BAD_BODY, "IDENTIFY missing fields")
    return info


def _fold_key(key: str) -> str | None:
    folded = key.casefold()
    for name in _PEER_FIELDS:
        if name == folded:
            return name
    return None


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


class LookupParser:
    """Incremental parser of the V1 protocol for nsqlookupd (sans-IO).

    ``feed(data)`` returns the events completed by ``data``, in order. It checks the
    magic, the IDENTIFY-first rule, the one-IDENTIFY rule, the body and the names, and
    reports any violation as a final :class:`ProtocolError` carrying Go's code and text
    (``E_INVALID client must IDENTIFY``, ``E_BAD_TOPIC REGISTER topic name 'x' is not
    valid``...); after that the parser is dead and yields nothing more.
    """

    def __init__(
        self, *, expect_magic: bool = True, max_identify_body: int = MAX_IDENTIFY_BODY
    ) -> None:
        self._buf = b""
        self._need_magic = expect_magic
        self._max_body = max_identify_body
        self._identified = False
        # the peer registers partitions (decided by its IDENTIFY)
        self._partitioned = False
        self._dead = False
        # an IDENTIFY line was read; waiting for its size prefix and body
        self._in_identify = False

    @property
    def dead(self) -> bool:
        """True once an error was returned; later input is ignored."""
        return self._dead

    @property
    def identified(self) -> bool:
        """True once a valid IDENTIFY was parsed."""
        return self._identified

    def feed(self, data: bytes) -> list[LookupEvent]:
        if self._dead:
            return []
        events: list[LookupEvent] = []
        buf = self._buf + data if self._buf else data
        try:
            self._buf = self._parse(buf, events)
        except ProtocolError as err:
            events.append(err)
            self._dead = True
            self._buf = b""
        return events

    def _parse(self, buf: bytes, events: list[LookupEvent]) -> bytes:
        pos = 0
        n = len(buf)
        if self._need_magic:
            if n < 4:
                return buf
            if buf[:4] != MAGIC_V1:
                raise ProtocolError(E_BAD_PROTOCOL)
            self._need_magic = False
            pos = 4
        while pos < n:
            if self._in_identify:
                if n - pos < 4:
                    break
                size = _I32.unpack_from(buf, pos)[0]
                if size < 0:
                    # Go would panic on make([]byte, negative): refuse it as unreadable
                    raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body size")
                if size > self._max_body:
                    raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body")
                if n - pos - 4 < size:
                    break
                body = buf[pos + 4 : pos + 4 + size]
                pos += 4 + size
                self._in_identify = False
                info = parse_identify_body(body)
                self._identified = True
                self._partitioned = info.speaks_partitions
                events.append(Identify(info))
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if n - pos > MAX_LINE:
                    raise ProtocolError(E_INVALID, f"command line too long (> {MAX_LINE} bytes)")
                break
            line = buf[pos:nl]
            pos = nl + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        return buf[pos:]

    def _line(self, line: bytes) -> LookupCommand | None:
        # Go: strings.TrimSpace, then strings.Split(line, " ")
        params = line.strip(b" \t\r\n\v\f").split(b" ")
        cmd = params[0]
        if cmd == b"PING":
            return Ping()
        if cmd == b"IDENTIFY":
            if self._identified:
                raise ProtocolError(E_INVALID, "cannot IDENTIFY again")
            self._in_identify = True
            return None
        if cmd == b"REGISTER" or cmd == b"UNREGISTER":
            name = cmd.decode()
            if not self._identified:
                raise ProtocolError(E_INVALID, "client must IDENTIFY")
            args = params[1:]
            if self._partitioned:
                return _partition_command(cmd, name, args)
            if not args:
                raise ProtocolError(E_INVALID, f"{name} insufficient number of params")
            topic = _text(args[0])
            channel = _text(args[1]) if len(args) >= 2 else ""
            if not is_valid_name(topic):
                raise ProtocolError(E_BAD_TOPIC, f"{name} topic name '{topic}' is not valid")
            if channel and not is_valid_name(channel):
                raise ProtocolError(E_BAD_CHANNEL, f"{name} channel name '{channel}' is not valid")
            if cmd == b"REGISTER":
                return Register(topic, channel or None)
            return Unregister(topic, channel or None)
        raise ProtocolError(E_INVALID, f"invalid command {_text(cmd)}")


def parse_partition_id(raw: bytes | str) -> int | None:
    """A partition id as Youzan reads one (Go's Atoi, then 0..254); None if invalid."""
    b = raw.encode() if isinstance(raw, str) else raw
    if _ATOI_RE.fullmatch(b) is None:
        return None
    pid = int(b)
    return pid if 0 <= pid <= MAX_PARTITION_ID else None


def _partition_command(cmd: bytes, name: str, args: list[bytes]) -> Register | Unregister:
    """``[UN]REGISTER topic partition [channel]``, checked in Youzan's order (count,
    topic, channel, partition) with its codes and texts."""
    if len(args) <= 1:
        raise ProtocolError(E_INVALID, f"{name} insufficient number of params")
    topic = _text(args[0])
    channel = _text(args[2]) if len(args) >= 3 else ""
    if not is_valid_name(topic):
        raise ProtocolError(E_BAD_TOPIC, f"{name} topic name '{topic}' is not valid")
    if channel and not is_valid_name(channel):
        raise ProtocolError(E_BAD_CHANNEL, f"{name} channel name '{channel}' is not valid")
    pid = parse_partition_id(args[1])
    if pid is None:
        # Youzan also takes -11 (its "old nsqd" marker) here; a real peer never sends it
        raise ProtocolError(
            E_BAD_PARTITIONID, f"{name} partition id '{_text(args[1])}' is not valid"
        )
    if cmd == b"REGISTER":
        return Register(topic, channel or None, pid)
    return Unregister(topic, channel or None, pid)


def encode_reply(data: bytes) -> bytes:
    """A reply as lookupd sends it: ``[i32 BE size][data]``, no frame type."""
    return _I32.pack(len(data)) + data


def encode_error_reply(err: ProtocolError) -> bytes:
    """An error reply: ``CODE description`` in the same framing as any reply."""
    return encode_reply(err.to_bytes())


# --- client side (nsqd registering) ----------------------------------------------------


def encode_identify(info: PeerInfo | Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n[i32 size][JSON]`` with nsqd's five fields (keys sorted, as Go's map),
    plus ``distributed_id`` when the PeerInfo has one (a partition-aware nsqd)."""
    if isinstance(info, PeerInfo):
        data: dict[str, Any] = {
            "broadcast_address": info.broadcast_address,
            "hostname": info.hostname,
            "http_port": info.http_port,
            "tcp_port": info.tcp_port,
            "version": info.version,
        }
        if info.distributed_id:
            data["distributed_id"] = info.distributed_id
        if info.replication_address:
            data["replication_address"] = info.replication_address
        if info.liveness:
            data["liveness"] = info.liveness
    else:
        data = dict(info)
    body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _I32.pack(len(body)) + body


def _topic_command(name: bytes, topic: str, channel: str | None, partition: int | None) -> bytes:
    words = [name, topic.encode()]
    if partition is not None:
        words.append(b"%d" % partition)
    if channel:
        words.append(channel.encode())
    return b" ".join(words) + b"\n"


def encode_register(topic: str, channel: str | None = None, partition: int | None = None) -> bytes:
    """``REGISTER topic [channel]\\n``, or ``REGISTER topic partition [channel]\\n`` when
    ``partition`` is given (only to a lookupd that :attr:`LookupdInfo.speaks_partitions`)."""
    return _topic_command(b"REGISTER", topic, channel, partition)


def encode_unregister(
    topic: str, channel: str | None = None, partition: int | None = None
) -> bytes:
    """``UNREGISTER topic [channel]\\n``, or with a partition as :func:`encode_register`."""
    return _topic_command(b"UNREGISTER", topic, channel, partition)


def encode_ping() -> bytes:
    return b"PING\n"


def is_error_reply(data: bytes) -> bool:
    """True for an error reply (lookupd's error codes all start with ``E_``)."""
    return data.startswith(b"E_")


@dataclass(frozen=True)
class LookupdInfo:
    """lookupd's answer to IDENTIFY: its ports, version and addresses."""

    tcp_port: int
    http_port: int
    version: str
    broadcast_address: str
    hostname: str
    #: nsqx's lookupd says ``"partitions": true`` to a peer that sent a distributed_id.
    partitions: bool = False
    #: nsqx's lookupd, to a partition-aware peer: PING this often (ms; 0: NSQ's 15 s)...
    heartbeat_interval_ms: int = 0
    #: ...an answered PING lets a partition leader acknowledge writes for this long
    #: after it was sent (ms; 0: this lookupd grants no leases)...
    lease_ms: int = 0
    #: ...and a node silent this long is lost (ms; 0: unknown).
    node_timeout_ms: int = 0

    @property
    def speaks_partitions(self) -> bool:
        """True if this lookupd reads ``REGISTER topic partition [channel]``: nsqx's
        (``"partitions": true``) or Youzan's (a version containing ``HA``)."""
        return self.partitions or "HA" in self.version


def parse_identify_reply(data: bytes) -> LookupdInfo:
    """Decode lookupd's IDENTIFY reply; ValueError if it is not the expected JSON."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("IDENTIFY reply is not a JSON object")

    def get(key: str, kind: type, default: Any) -> Any:
        value = obj.get(key, default)
        if value is None:
            return default
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"IDENTIFY reply: bad {key} {value!r}")
        return value

    return LookupdInfo(
        tcp_port=get("tcp_port", int, 0),
        http_port=get("http_port", int, 0),
        version=get("version", str, ""),
        broadcast_address=get("broadcast_address", str, ""),
        hostname=get("hostname", str, ""),
        partitions=_get_bool(obj, "partitions"),
        heartbeat_interval_ms=max(get("heartbeat_interval", int, 0), 0),
        lease_ms=max(get("lease", int, 0), 0),
        node_timeout_ms=max(get("node_timeout", int, 0), 0),
    )


def _get_bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"IDENTIFY reply: bad {key} {value!r}")
    return value


class ReplyDecoder:
    """Splits lookupd's replies (``[i32 size][bytes]``) out of a byte stream.

    A negative size or one above ``max_size`` raises :class:`ProtocolError`.
    """

    def __init__(self, max_size: int = 5 * 1024 * 1024) -> None:
        self._buf = b""
        self._max = max_size

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            size = _I32.unpack_from(buf, pos)[0]
            if size < 0 or size > self._max:
                raise ProtocolError("E_BAD_REPLY", f"invalid reply size {size}")
            end = pos + 4 + size
            if end > n:
                break
            out.append(buf[pos + 4 : end])
            pos = end
        self._buf = buf[pos:]
        return out
