"""Frames nsqd sends, the message layout inside them, and a client-side frame decoder.

A frame is ``[i32 size][i32 type][data]`` where size counts type + data. A message
frame's data is ``[i64 timestamp ns][u16 attempts][16-byte hex id][body]``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from nsqx.wire.errors import ProtocolError

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

MAGIC_V2 = b"  V2"
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

MSG_ID_LENGTH = 16
#: timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_SIZE = 26
#: a message frame's bytes besides the body: size (4) + type (4) + the message header
MESSAGE_FRAME_OVERHEAD = 8 + MESSAGE_HEADER_SIZE

_FRAME_HEAD = struct.Struct(">ii")
# size, frame type, timestamp, attempts: everything before the id
_MSG_FRAME_HEAD = struct.Struct(">iiqH")
_MSG_HEAD = struct.Struct(">qH")
_I32 = struct.Struct(">i")


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One frame: ``[size][type][data]``."""
    return _FRAME_HEAD.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return _FRAME_HEAD.pack(len(data) + 4, FRAME_RESPONSE) + data


def encode_error(err: ProtocolError | bytes) -> bytes:
    data = err if isinstance(err, bytes) else err.to_bytes()
    return _FRAME_HEAD.pack(len(data) + 4, FRAME_ERROR) + data


def encode_message_frame(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A whole message frame, ready to write to a consumer."""
    return (
        _MSG_FRAME_HEAD.pack(len(body) + 30, FRAME_MESSAGE, timestamp_ns, attempts) + msg_id + body
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
    pack = _MSG_FRAME_HEAD.pack
    n = len(bodies)
    if len(msg_ids) != n:
        raise ValueError(f"{len(msg_ids)} ids for {n} bodies")
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


def with_attempts(frame: bytes, attempts: int) -> bytes:
    """The same message frame with another attempts count (redelivery)."""
    return frame[:16] + attempts.to_bytes(2, "big") + frame[18:]


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
    return Message(ts, attempts, bytes(data[10:26]), bytes(data[26:]))


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
