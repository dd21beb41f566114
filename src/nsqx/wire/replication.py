"""The replication stream between a partition's leader and a follower (sans-IO).

A follower opens one stream per partition to its leader (a WebSocket on the leader's
HTTP port: ``GET /replication/stream``) and keeps it open. Every message is one binary
WebSocket message whose first byte is its kind:

``HELLO`` (follower -> leader, first), JSON::

    {"topic", "partition", "node", "epoch", "end", "end_offset", "history": [[e, s], ...],
     "durable": true, "start"}

``durable`` (absent from nsqx before durable acknowledgement): the follower can report
its durable end (``DURABLE`` below). ``start`` (absent from the previous release): where
its log starts; a follower whose log starts past the point where it must cut (a torn
segment set aside whole, the sequences it may have held skipped) starts over as a new
replica does.

``WELCOME`` (leader -> follower), JSON: the leader's ``epoch``, its epoch ``history`` and
``truncate_to``, the sequence the follower must cut its log to before it appends
(:func:`divergence`), and ``reset`` ``[sequence, offset]`` when what the follower has
ends before the leader's log starts (it empties its log and starts over there);
``durable`` true when the leader wants ``DURABLE`` messages (only if the HELLO offered
them: a leader or follower of the previous release neither sends nor gets one); or
``REFUSED``, JSON ``{"error", "message"}``, then the close.

``BATCHES`` (leader -> follower)::

    [u8 kind][u64 commit][u32 n] n x ([u64 first][u64 offset][u32 messages]
                                      [i64 deliver_at][u32 stride][u32 len][frames])

the stored batches exactly as the leader appended them (nsqx.wire.batch.StoredBatch), so
the follower's log holds the same bytes at the same offsets and message ids survive a
failover; ``commit`` is the leader's commit point (every record below it is held by
the whole ISR). ``n`` may be 0: a heartbeat that carries the commit point.

``ACK`` (follower -> leader): ``[u8 kind][u64 end]``: the follower's log holds every
record below ``end`` (written to its files).

``DURABLE`` (follower -> leader, once WELCOME asked for it): ``[u8 kind][u64 end]``: every
record below ``end`` is fsynced on the follower (it may lag the ACKs: the follower
fsyncs in the background and reports as its durable end moves).

``CURSORS`` (leader -> follower), JSON ``{"channels": {name: [cursor, ordered]},
"hold_from", "deferred": {name: [[seq, attempts, due_ms], ...]}, "now_ms"}``: where each
channel stands, so that consumers resume near there on a new leader; ``deferred``
(absent from the previous release, ignored by it) the channel's deferred messages,
each due at ``due_ms`` of the leader's wall clock, which read ``now_ms`` as it sent
them (a follower counts the delay from its own clock: a skew between the nodes' clocks
does not move a due time); and, when a channel has any in a replicated dead-letter
topic, ``"replay_marks": {name: {"topic:partition": [sequence, timestamp]}}``: how far its
dead-letter replays have looked there (nsqx.nsqd.dead_letters), so that a new leader
replays none twice. A follower that does not know a key ignores it.

Epoch history (as Kafka's leader epochs, KIP-101): a list of ``[epoch, start]`` pairs,
one per leadership, ``start`` being the log end when that leader took over. A follower
adopts its leader's history. Comparing histories finds where two logs may differ.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsqx.wire.batch import StoredBatch

HELLO = 1
WELCOME = 2
REFUSED = 3
BATCHES = 4
ACK = 5
CURSORS = 6
DURABLE = 7

_HEAD = struct.Struct(">BQI")
_BATCH = struct.Struct(">QQIqII")
_ACK = struct.Struct(">BQ")
_WS_HEAD1 = struct.Struct(">BB")
_WS_HEAD2 = struct.Struct(">BBH")
_WS_HEAD8 = struct.Struct(">BBQ")

History = list[tuple[int, int]]


class ReplicationProtocolError(ValueError):
    """A replication message that cannot be decoded."""


@dataclass(frozen=True)
class Hello:
    """A follower introduces itself: which partition, who, its epoch and log end."""

    topic: str
    partition: int
    node: str
    epoch: int
    end: int
    end_offset: int
    history: History
    #: the follower reports its durable end (DURABLE messages)
    durable: bool = False
    #: where its log starts (-1: not said, a follower of the previous release)
    start: int = -1


@dataclass(frozen=True)
class Welcome:
    """The leader accepts: its epoch and history, and where the follower must cut; or,
    for a follower whose log ends before the leader's starts (reclaimed meanwhile),
    ``reset``: (sequence, offset) where the follower's emptied log starts over."""

    epoch: int
    history: History
    truncate_to: int
    reset: tuple[int, int] | None = None
    #: the leader wants the follower's durable end (DURABLE messages)
    durable: bool = False


@dataclass(frozen=True)
class Refused:
    """The leader refuses the stream (an error code and a message)."""

    error: str
    message: str


@dataclass(frozen=True)
class Batches:
    """Stored batches and the leader's commit point."""

    commit: int
    batches: list[StoredBatch]


@dataclass(frozen=True)
class Ack:
    """The follower holds every record below ``end``."""

    end: int


@dataclass(frozen=True)
class Durable:
    """Every record below ``end`` is fsynced on the follower."""

    end: int


#: a deferred message: (sequence, attempts, due time in ms of the sender's wall clock)
Deferred = tuple[int, int, int]


@dataclass(frozen=True)
class Cursors:
    """The channels' positions on the leader, their replay marks in replicated
    dead-letter topics (channel -> mark key -> (sequence, timestamp)), and their
    deferred messages (due times in ms of the leader's wall clock, which read ``now_ms``
    when it sent them)."""

    channels: dict[str, tuple[int, bool]]
    hold_from: int
    replay_marks: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    deferred: dict[str, list[Deferred]] = field(default_factory=dict)
    now_ms: int = 0


Message = Hello | Welcome | Refused | Batches | Ack | Durable | Cursors


def _json(kind: int, obj: dict[str, Any]) -> bytes:
    return bytes([kind]) + json.dumps(obj, separators=(",", ":")).encode()


def encode_hello(h: Hello) -> bytes:
    return _json(
        HELLO,
        {
            "topic": h.topic,
            "partition": h.partition,
            "node": h.node,
            "epoch": h.epoch,
            "end": h.end,
            "end_offset": h.end_offset,
            "history": [list(e) for e in h.history],
            **({"durable": True} if h.durable else {}),
            **({"start": h.start} if h.start >= 0 else {}),
        },
    )


def encode_welcome(w: Welcome) -> bytes:
    obj: dict[str, Any] = {
        "epoch": w.epoch,
        "history": [list(e) for e in w.history],
        "truncate_to": w.truncate_to,
    }
    if w.reset is not None:
        obj["reset"] = list(w.reset)
    if w.durable:
        obj["durable"] = True
    return _json(WELCOME, obj)


def encode_refused(r: Refused) -> bytes:
    return _json(REFUSED, {"error": r.error, "message": r.message})


def encode_cursors(c: Cursors) -> bytes:
    obj: dict[str, Any] = {
        "channels": {k: [v[0], v[1]] for k, v in c.channels.items()},
        "hold_from": c.hold_from,
    }
    if c.replay_marks:  # (only then: the message is the same as before for the rest)
        obj["replay_marks"] = {
            ch: {k: list(m) for k, m in marks.items()} for ch, marks in c.replay_marks.items()
        }
    if c.deferred:
        obj["deferred"] = {k: [list(d) for d in v] for k, v in c.deferred.items()}
        obj["now_ms"] = c.now_ms
    return _json(CURSORS, obj)


def encode_ack(end: int) -> bytes:
    return _ACK.pack(ACK, end)


def encode_durable(end: int) -> bytes:
    return _ACK.pack(DURABLE, end)


def encode_batches(commit: int, batches: Sequence[StoredBatch]) -> bytes:
    """One BATCHES message: a join of the heads and the stored frames (no copy of the
    frames beyond the join)."""
    return b"".join(batches_parts(commit, batches))


def batches_parts(commit: int, batches: Sequence[StoredBatch]) -> list[bytes]:
    """One BATCHES message as the pieces :func:`encode_batches` joins (the stored frames
    themselves among them), for a writer that sends them with one ``writev``."""
    parts: list[bytes] = [_HEAD.pack(BATCHES, commit, len(batches))]
    pack = _BATCH.pack
    for b in batches:
        parts.append(pack(b.first, b.offset, b.messages, b.deliver_at, b.stride, len(b.chunk)))
        parts.append(b.chunk)
    return parts


def ws_binary_head(length: int) -> bytes:
    """The head of a final, unmasked WebSocket binary frame of ``length`` payload bytes
    (RFC 6455 section 5.2): what a server writes before the payload."""
    if length < 0:
        raise ValueError("a negative length")
    if length < 126:
        return _WS_HEAD1.pack(0x82, length)
    if length < 1 << 16:
        return _WS_HEAD2.pack(0x82, 126, length)
    return _WS_HEAD8.pack(0x82, 127, length)


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReplicationProtocolError(f"{key} is not a non-negative integer: {value!r}")
    return value


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ReplicationProtocolError(f"{key} is not a string: {value!r}")
    return value


def _history(obj: dict[str, Any]) -> History:
    raw = obj.get("history")
    if not isinstance(raw, list):
        raise ReplicationProtocolError("history is not a list")
    out: History = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in item)
        ):
            raise ReplicationProtocolError(f"bad history entry {item!r}")
        out.append((item[0], item[1]))
    return out


def decode(data: bytes | bytearray | memoryview) -> Message:
    """One message from its bytes; ReplicationProtocolError if it is malformed."""
    if not data:
        raise ReplicationProtocolError("empty message")
    kind = data[0]
    if kind == BATCHES:
        return _decode_batches(data)
    if kind in (ACK, DURABLE):
        if len(data) != _ACK.size:
            raise ReplicationProtocolError(
                "bad ACK length" if kind == ACK else "bad DURABLE length"
            )
        end = _ACK.unpack(data)[1]
        return Ack(end) if kind == ACK else Durable(end)
    if kind not in (HELLO, WELCOME, REFUSED, CURSORS):
        raise ReplicationProtocolError(f"unknown message kind {kind}")
    try:
        obj = json.loads(bytes(data[1:]))
    except ValueError as err:
        raise ReplicationProtocolError(f"bad JSON: {err}") from None
    if not isinstance(obj, dict):
        raise ReplicationProtocolError("not a JSON object")
    if kind == HELLO:
        return Hello(
            _str(obj, "topic"),
            _int(obj, "partition"),
            _str(obj, "node"),
            _int(obj, "epoch"),
            _int(obj, "end"),
            _int(obj, "end_offset"),
            _history(obj),
            obj.get("durable") is True,
            _int(obj, "start") if "start" in obj else -1,
        )
    if kind == WELCOME:
        reset = obj.get("reset")
        if reset is not None:
            if (
                not isinstance(reset, list)
                or len(reset) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in reset)
            ):
                raise ReplicationProtocolError(f"bad reset {reset!r}")
            reset = (reset[0], reset[1])
        return Welcome(
            _int(obj, "epoch"),
            _history(obj),
            _int(obj, "truncate_to"),
            reset,
            obj.get("durable") is True,
        )
    if kind == REFUSED:
        return Refused(_str(obj, "error"), _str(obj, "message"))
    channels = obj.get("channels")
    if not isinstance(channels, dict):
        raise ReplicationProtocolError("channels is not an object")
    out: dict[str, tuple[int, bool]] = {}
    for name, value in channels.items():
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not isinstance(value[0], int)
            or not isinstance(value[1], bool)
        ):
            raise ReplicationProtocolError(f"bad cursor for {name!r}: {value!r}")
        out[name] = (value[0], value[1])
    return Cursors(
        out,
        _int(obj, "hold_from"),
        _replay_marks(obj.get("replay_marks", {})),
        *_deferred(obj),
    )


def _replay_marks(value: Any) -> dict[str, dict[str, tuple[int, int]]]:
    """CURSORS' ``replay_marks`` (absent from a leader before them: none)."""
    if not isinstance(value, dict):
        raise ReplicationProtocolError("replay_marks is not an object")
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for channel, marks in value.items():
        if not isinstance(marks, dict):
            raise ReplicationProtocolError(f"bad replay marks for {channel!r}")
        for key, mark in marks.items():
            if (
                not isinstance(mark, list)
                or len(mark) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in mark)
            ):
                raise ReplicationProtocolError(f"bad replay mark {key!r}: {mark!r}")
            out.setdefault(channel, {})[key] = (mark[0], mark[1])
    return out


def _deferred(obj: dict[str, Any]) -> tuple[dict[str, list[Deferred]], int]:
    """CURSORS' ``deferred`` and ``now_ms`` (absent from a leader before them: none)."""
    raw = obj.get("deferred")
    if raw is None:
        return {}, 0
    if not isinstance(raw, dict):
        raise ReplicationProtocolError("deferred is not an object")
    out: dict[str, list[Deferred]] = {}
    for name, entries in raw.items():
        if not isinstance(entries, list):
            raise ReplicationProtocolError(f"bad deferred messages for {name!r}")
        got: list[Deferred] = []
        for e in entries:
            if (
                not isinstance(e, list)
                or len(e) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in e)
                or e[0] < 0
                or e[1] < 0
            ):
                raise ReplicationProtocolError(f"bad deferred message {e!r} for {name!r}")
            got.append((e[0], e[1], e[2]))
        out[name] = got
    now = obj.get("now_ms")
    if not isinstance(now, int) or isinstance(now, bool):
        raise ReplicationProtocolError(f"now_ms is not an integer: {now!r}")
    return out, now


def _decode_batches(data: bytes | bytearray | memoryview) -> Batches:
    if len(data) < _HEAD.size:
        raise ReplicationProtocolError("short BATCHES head")
    _, commit, n = _HEAD.unpack_from(data, 0)
    pos = _HEAD.size
    out: list[StoredBatch] = []
    view = memoryview(data)
    unpack = _BATCH.unpack_from
    for _ in range(n):
        if pos + _BATCH.size > len(data):
            raise ReplicationProtocolError("short batch head")
        first, offset, messages, deliver_at, stride, size = unpack(data, pos)
        pos += _BATCH.size
        if pos + size > len(data):
            raise ReplicationProtocolError("batch runs past the message")
        if messages == 0 or (stride and stride * messages != size):
            raise ReplicationProtocolError("batch size does not match its frames")
        out.append(
            StoredBatch(first, messages, offset, deliver_at, stride, bytes(view[pos : pos + size]))
        )
        pos += size
    if pos != len(data):
        raise ReplicationProtocolError("trailing bytes after the batches")
    return Batches(commit, out)


def epoch_end(history: Sequence[tuple[int, int]], epoch: int, log_end: int) -> int:
    """Where ``epoch``'s records end in a log with this history: the start of the next
    leadership after it, or ``log_end`` if it is the last."""
    for e, start in history:
        if e > epoch:
            return start
    return log_end


def divergence(
    leader_history: Sequence[tuple[int, int]],
    leader_end: int,
    follower_history: Sequence[tuple[int, int]],
    follower_end: int,
) -> int:
    """The sequence a follower must truncate its log to, so that what remains is a
    prefix of the leader's log: the end of the newest epoch both histories share
    (in whichever log ends it first). With no shared epoch, 0 (the follower's log
    had no leader in common: it starts over)."""
    leader_epochs = dict(leader_history)
    shared = [e for e, s in follower_history if leader_epochs.get(e) == s]
    if not shared:
        return 0
    newest = max(shared)
    return min(
        epoch_end(leader_history, newest, leader_end),
        epoch_end(follower_history, newest, follower_end),
    )
