"""Frames nsqd sends, the message layout inside them, and a client-side frame decoder.

A frame is ``[i32 size][i32 type][data]`` where size counts type + data. A message
frame's data is ``[i64 timestamp ns][u16 attempts][16-byte hex id][body]``.

Youzan's extensions change what some clients get (their layout is written here once):
a client in Youzan mode gets the id as 8 bytes (big-endian u64) followed by the 8-byte
trace id; on an ext topic, if it IDENTIFYed with ``extend_support``, the ext version
byte (and, unless 0, a u16 length and the ext data) follows the id; after SUB_ORDERED or
SUB_ADVANCED, the record's ``[u64 offset][u32 raw size]`` comes before the body.

nsqd stores each message as the frame a vanilla client gets, built once at publish time.
A message with a trace id or ext data is stored as an *extended record* instead, a frame
whose type is :data:`RECORD_EXTENDED` (never sent as is)::

    [i32 size][i32 0x102][i64 ts][u16 attempts][16-byte hex id]
    [u64 trace id][u8 ext version][u16 ext length][ext][body]
"""

from __future__ import annotations

import json
import struct
from binascii import unhexlify
from typing import Final, NamedTuple

from nsqx.wire.errors import ProtocolError

FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

MAGIC_V2: Final = b"  V2"
HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"
#: nsqx: a response nsqd sends unasked to a consumer that IDENTIFYed with
#: ``channel_policy``: this prefix and the JSON ``{"max_attempts": N}`` of its channel
#: (0: none), when it subscribes to a channel whose policy has max_attempts and whenever
#: that changes. The consumer then leaves giving up on a message to the channel.
CHANNEL_POLICY: Final = b"_channel_policy_ "

# The layout, written once (tracing and ext headers shift what follows the id). Slices
# with these bounds compile (mypyc) to the same code as literal ones: a Final int is
# inlined; only a slice() object held in a variable would not be.

#: a frame's head: ``[i32 size][i32 type]``, then its data
FRAME_TYPE_AT: Final = 4
FRAME_DATA_AT: Final = 8

#: positions inside a message, i.e. a message frame's data (what a client is handed):
#: ``[i64 timestamp][u16 attempts][16-byte id][body]``; in a Youzan client's layout the
#: 16 id bytes are the 8-byte id and the 8-byte trace id, and ext data, an offset or
#: a raw size may come before the body
MSG_TIMESTAMP_AT: Final = 0
MSG_ATTEMPTS_AT: Final = 8
MSG_ID_AT: Final = 10
MSG_ID_END: Final = 26
#: Youzan's layout: the trace id, the second half of the 16 id bytes
MSG_TRACE_AT: Final = 18
#: where a vanilla message's body starts
MSG_BODY_AT: Final = 26
#: a Youzan client's layout with extend_support, on an ext topic: after the id, the ext
#: version byte and, unless it is 0, the u16 length and the ext data
MSG_EXT_VER_AT: Final = 26
MSG_EXT_LEN_AT: Final = 27
MSG_EXT_AT: Final = 29
#: a Youzan client's ``[u64 offset][u32 raw size]`` (SUB_ORDERED, SUB_ADVANCED)
MSG_DETAIL_SIZE: Final = 12

MSG_ID_LENGTH: Final = 16
#: timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_SIZE: Final = 26
#: a message frame's bytes besides the body: size (4) + type (4) + the message header
MESSAGE_FRAME_OVERHEAD: Final = 8 + MESSAGE_HEADER_SIZE

#: The type field of a stored extended record (see the module's doc).
RECORD_EXTENDED: Final = 0x0102
_RECORD_EXTENDED_BYTES: Final = RECORD_EXTENDED.to_bytes(4, "big")
#: positions inside a whole frame, as stored (of either kind) and as sent: the message
#: positions above plus FRAME_DATA_AT
TIMESTAMP_AT: Final = 8
ATTEMPTS_AT: Final = 16
ID_AT: Final = 18
ID_END: Final = 34
#: where a vanilla message frame's body starts
BODY_AT: Final = 34
#: extended records: trace id, ext version, ext length, then the ext data
TRACE_AT: Final = 34
EXT_VER_AT: Final = 42
EXT_LEN_AT: Final = 43
EXT_AT: Final = 45
#: bytes of an extended record besides the body and ext data
EXTENDED_FRAME_OVERHEAD: Final = EXT_AT

_FRAME_HEAD: Final = struct.Struct(">ii")
_EXT_HEAD: Final = struct.Struct(">QBH")
_DETAIL: Final = struct.Struct(">QI")
_U64: Final = struct.Struct(">Q")
# size, frame type, timestamp, attempts: everything before the id
_MSG_FRAME_HEAD: Final = struct.Struct(">iiqH")
# (compiled: the bound method made once, a C static)
_MSG_FRAME_HEAD_PACK: Final = _MSG_FRAME_HEAD.pack
_MSG_HEAD: Final = struct.Struct(">qH")
_I32: Final = struct.Struct(">i")


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One frame: ``[size][type][data]``."""
    return _FRAME_HEAD.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return _FRAME_HEAD.pack(len(data) + 4, FRAME_RESPONSE) + data


def encode_policy_notice(max_attempts: int) -> bytes:
    """The response frame that tells a consumer its channel's max_attempts."""
    return encode_response(CHANNEL_POLICY + b'{"max_attempts":%d}' % max_attempts)


def policy_notice_attempts(data: bytes) -> int | None:
    """The max_attempts of a policy notice's data (a response's); None if ``data`` is
    not one."""
    if not data.startswith(CHANNEL_POLICY):
        return None
    try:
        doc = json.loads(data[len(CHANNEL_POLICY) :])
        value = doc["max_attempts"]
    except (ValueError, TypeError, KeyError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def encode_error(err: ProtocolError | bytes) -> bytes:
    data = err if isinstance(err, bytes) else err.to_bytes()
    return _FRAME_HEAD.pack(len(data) + 4, FRAME_ERROR) + data


def encode_message_frame(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A whole message frame, ready to write to a consumer."""
    return (
        _MSG_FRAME_HEAD_PACK(len(body) + 30, FRAME_MESSAGE, timestamp_ns, attempts) + msg_id + body
    )


def encode_message_batch(
    timestamp_ns: int, msg_ids: list[bytes], bodies: list[bytes]
) -> tuple[bytes, int]:
    """The frames of a batch published at one instant (attempts=1), concatenated, and
    their common size (0 if the bodies differ in size).

    Built once at publish time: it is what the log writes and what every channel sends.
    One join over (header, id, body) parts makes no per-message object, about three
    times faster than building each frame and joining those.
    """
    pack = _MSG_FRAME_HEAD_PACK
    n = len(bodies)
    if len(msg_ids) != n:
        raise ValueError(f"{len(msg_ids)} ids for {n} bodies")
    if n == 1:  # a PUB: the hot path of single-message round trips
        body = bodies[0]
        size = len(body) + 30
        return pack(size, FRAME_MESSAGE, timestamp_ns, 1) + msg_ids[0] + body, size + 4
    parts: list[bytes] = [b""] * (3 * n)
    parts[1::3] = msg_ids
    parts[2::3] = bodies
    sizes = set(map(len, bodies))
    if len(sizes) == 1:
        # the common case: equal sizes share one header
        size = sizes.pop()
        parts[0::3] = [pack(size + 30, FRAME_MESSAGE, timestamp_ns, 1)] * n
        return b"".join(parts), size + MESSAGE_FRAME_OVERHEAD
    heads = {k: pack(k + 30, FRAME_MESSAGE, timestamp_ns, 1) for k in sizes}
    parts[0::3] = [heads[len(body)] for body in bodies]
    return b"".join(parts), 0


def encode_extended_batch(
    timestamp_ns: int,
    msg_ids: list[bytes],
    bodies: list[bytes],
    trace_ids: list[int],
    ext_vers: list[int],
    exts: list[bytes],
) -> tuple[bytes, int]:
    """Extended records of a batch published at one instant (see the module's doc),
    concatenated, and their common size (0 if they differ)."""
    n = len(bodies)
    if not len(msg_ids) == len(trace_ids) == len(ext_vers) == len(exts) == n:
        raise ValueError("one id, trace id and ext per body")
    pack, ext_pack = _MSG_FRAME_HEAD_PACK, _EXT_HEAD.pack
    parts: list[bytes] = []
    sizes = set()
    for mid, body, trace, ver, ext in zip(msg_ids, bodies, trace_ids, ext_vers, exts, strict=True):
        size = EXT_AT - 4 + len(ext) + len(body)
        sizes.add(size)
        parts += (
            pack(size, RECORD_EXTENDED, timestamp_ns, 1),
            mid,
            ext_pack(trace, ver, len(ext)),
            ext,
            body,
        )
    return b"".join(parts), (sizes.pop() + 4 if len(sizes) == 1 else 0)


def is_extended(chunk: bytes | memoryview) -> bool:
    """Whether the stored frame(s) starting ``chunk`` are extended records (a chunk of
    frames always comes from one batch, all of one kind)."""
    return chunk[FRAME_TYPE_AT:FRAME_DATA_AT] == _RECORD_EXTENDED_BYTES


class RecordParts(NamedTuple):
    """The fields of a stored frame (vanilla or extended)."""

    trace_id: int
    ext_ver: int
    ext: bytes
    body_at: int


def record_parts(frame: bytes) -> RecordParts:
    """Trace id, ext version and data, and where the body starts, of a stored frame."""
    if frame[FRAME_TYPE_AT:FRAME_DATA_AT] != _RECORD_EXTENDED_BYTES:
        return RecordParts(0, 0, b"", ID_END)
    trace, ver, elen = _EXT_HEAD.unpack_from(frame, TRACE_AT)
    return RecordParts(trace, ver, frame[EXT_AT : EXT_AT + elen], EXT_AT + elen)


def vanilla_frame(frame: bytes) -> bytes:
    """The frame an NSQ 1.3 client gets for a stored frame (the record as is, or an
    extended record without its trace id and ext data)."""
    if frame[FRAME_TYPE_AT:FRAME_DATA_AT] != _RECORD_EXTENDED_BYTES:
        return frame
    body_at = EXT_AT + int.from_bytes(frame[EXT_LEN_AT:EXT_AT], "big")
    return (
        _FRAME_HEAD.pack(len(frame) - body_at + MESSAGE_HEADER_SIZE + 4, FRAME_MESSAGE)
        + frame[FRAME_DATA_AT:ID_END]
        + frame[body_at:]
    )


def binary_id(hex_id: bytes, trace_id: int = 0) -> bytes:
    """The 16-byte id a Youzan client gets: the u64 id, then the trace id."""
    return _U64.pack(int(hex_id, 16)) + _U64.pack(trace_id)


def hex_id(full_id: bytes) -> bytes:
    """The hex id of a 16-byte Youzan id (FIN, REQ and TOUCH use its first 8 bytes)."""
    return b"%016x" % _U64.unpack_from(full_id)[0]


def equal_frame_size(chunk: bytes) -> int:
    """The common size of the frames of ``chunk`` if they all have the first one's size
    prefix (checked with four strided slices, not a loop), else 0."""
    size = 4 + int.from_bytes(chunk[:4], "big", signed=True)
    n = len(chunk)
    if size < 8 or n % size:
        return 0
    count = n // size
    prefix = chunk[:4]
    if all(chunk[k::size] == prefix[k : k + 1] * count for k in range(4)):
        return size
    return 0


def youzan_ids(chunk: bytes, hex_ids: list[bytes], size: int) -> bytes:
    """Equal-sized vanilla frames with Youzan's 16-byte ids (the binary id, then a zero
    trace id) in place of the hex ones: the frames keep their size, so sixteen strided
    slice assignments rewrite every id, with no work per message in Python. A Youzan
    consumer of an NSQ 1.3-style topic costs little more than a vanilla one."""
    out = bytearray(chunk)
    binary = b"".join(map(unhexlify, hex_ids))
    for j in range(8):
        out[ID_AT + j :: size] = binary[j::8]
    zeros = bytes(len(hex_ids))
    for j in range(8, 16):
        out[ID_AT + j :: size] = zeros
    return bytes(out)


def youzan_frame(frame: bytes, with_ext: bool, detail: tuple[int, int] | None) -> bytes:
    """The frame a Youzan client gets for a stored frame: binary id and trace id, the
    ext part if ``with_ext`` (ext topic, client with extend_support), and ``(offset,
    raw size)`` if ``detail`` (after SUB_ORDERED or SUB_ADVANCED)."""
    trace, ver, ext, body_at = record_parts(frame)
    parts = [b"", frame[FRAME_DATA_AT:ID_AT], binary_id(frame[ID_AT:ID_END], trace)]
    if with_ext:
        parts.append(bytes((ver,)))
        if ver:
            parts += (len(ext).to_bytes(2, "big"), ext)
    if detail is not None:
        parts.append(_DETAIL.pack(*detail))
    parts.append(frame[body_at:])
    data_len = sum(map(len, parts))
    parts[0] = _FRAME_HEAD.pack(data_len + 4, FRAME_MESSAGE)
    return b"".join(parts)


class YouzanMessage(NamedTuple):
    """A message frame's data as a Youzan client reads it."""

    timestamp: int
    attempts: int
    #: the 16 bytes to send back in FIN / REQ / TOUCH
    id: bytes
    trace_id: int
    ext_ver: int
    ext: bytes
    #: -1 unless the subscription gets positions (SUB_ORDERED, SUB_ADVANCED)
    offset: int
    raw_size: int
    body: bytes

    @property
    def internal_id(self) -> int:
        """The u64 message id (partition << 50 | sequence + 1: nsqx.nsqd.guid)."""
        return int(_U64.unpack_from(self.id)[0])


def decode_youzan_message(data: bytes, with_ext: bool, detail: bool) -> YouzanMessage:
    """Decode a message frame's data sent to a Youzan-mode client (see the module's doc)."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ProtocolError("E_BAD_MESSAGE", f"message frame too short ({len(data)} bytes)")
    ts, attempts = _MSG_HEAD.unpack_from(data, 0)
    mid = bytes(data[MSG_ID_AT:MSG_ID_END])
    trace = _U64.unpack_from(data, MSG_TRACE_AT)[0]
    pos = MSG_ID_END
    ver, ext = 0, b""
    try:
        if with_ext:
            ver = data[pos]
            pos += 1
            if ver:
                elen = int.from_bytes(data[pos : pos + 2], "big")
                ext = bytes(data[pos + 2 : pos + 2 + elen])
                pos += 2 + elen
        offset, raw = -1, 0
        if detail:
            offset, raw = _DETAIL.unpack_from(data, pos)
            pos += _DETAIL.size
    except (IndexError, struct.error):
        raise ProtocolError("E_BAD_MESSAGE", "message frame too short") from None
    if pos > len(data):
        raise ProtocolError("E_BAD_MESSAGE", "message frame too short")
    return YouzanMessage(ts, attempts, mid, trace, ver, ext, offset, raw, bytes(data[pos:]))


def attempts_of(frame: bytes) -> int:
    """The attempts count of a whole message frame (stored or sent)."""
    return int.from_bytes(frame[ATTEMPTS_AT:ID_AT], "big")


def timestamp_of(frame: bytes) -> int:
    """The publish time (ns) of a whole message frame (stored or sent)."""
    return int.from_bytes(frame[TIMESTAMP_AT:ATTEMPTS_AT], "big", signed=True)


def with_attempts(frame: bytes, attempts: int) -> bytes:
    """The same message frame with another attempts count (redelivery)."""
    return frame[:ATTEMPTS_AT] + attempts.to_bytes(2, "big") + frame[ID_AT:]


class Message(NamedTuple):
    """A decoded message frame's data."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> Message:
    """Decode a message frame's data (the part after the frame type)."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ProtocolError("E_BAD_MESSAGE", f"message frame too short ({len(data)} bytes)")
    ts, attempts = _MSG_HEAD.unpack_from(data, 0)
    return Message(ts, attempts, bytes(data[MSG_ID_AT:MSG_ID_END]), bytes(data[MSG_BODY_AT:]))


def encode_message(msg: Message) -> bytes:
    """The data part of a message frame (inverse of :func:`decode_message`)."""
    return _MSG_HEAD.pack(msg.timestamp, msg.attempts) + msg.id + msg.body


class FrameDecoder:
    """Incremental decoder of nsqd's frames, for clients.

    Feed bytes as they arrive; get ``(frame_type, data)`` pairs for every complete frame.
    A size below 4 or above ``max_frame_size`` raises :class:`ProtocolError`.
    """

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = b""
        self._max = max_frame_size

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf + data if self._buf else data
        out: list[tuple[int, bytes]] = []
        pos = 0
        n = len(buf)
        unpack = _FRAME_HEAD.unpack_from
        while n - pos >= 8:
            size, ftype = unpack(buf, pos)
            if size < 4 or size > self._max:
                raise ProtocolError("E_BAD_FRAME", f"invalid frame size {size}")
            end = pos + 4 + size
            if end > n:
                break
            out.append((ftype, buf[pos + 8 : end]))
            pos = end
        self._buf = buf[pos:]
        return out

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)
