"""Range reads: the binary body nsqd returns for a stateless read of a partition.

Used by range consumers such as the Spark data source. Layout (big-endian)::

    [u64 partition end sequence][u64 partition end virtual offset][u64 start sequence]
    [u32 record count]
    count x ([u64 sequence][u64 virtual offset][u32 frame size][frame])

Each frame is a message frame exactly as consumers receive it (timestamp, attempts,
16-hex-digit id, body). The trace id is 0 until tracing lands.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import decode_message

_HEAD = struct.Struct(">QQQI")
_REC = struct.Struct(">QQI")


class RangeRecord(NamedTuple):
    """One message of a range read."""

    sequence: int
    offset: int
    timestamp: int
    attempts: int
    id: bytes
    trace_id: int
    body: bytes


class RangeResult(NamedTuple):
    end_sequence: int
    end_offset: int
    start_sequence: int
    records: list[RangeRecord]

    @property
    def next_sequence(self) -> int:
        """Where the next read continues."""
        return self.records[-1].sequence + 1 if self.records else self.start_sequence


def encode_range(
    end_sequence: int,
    end_offset: int,
    start_sequence: int,
    records: list[tuple[int, int, bytes]],
) -> bytes:
    """Encode (sequence, virtual offset, frame) records; frames include their size."""
    parts = [_HEAD.pack(end_sequence, end_offset, start_sequence, len(records))]
    pack = _REC.pack
    for seq, offset, frame in records:
        # the frame's own [size][type] prefix is replaced by the record header
        parts.append(pack(seq, offset, len(frame) - 8))
        parts.append(frame[8:])
    return b"".join(parts)


def decode_range(data: bytes) -> RangeResult:
    """Decode a range body; a malformed one raises ProtocolError."""
    if len(data) < _HEAD.size:
        raise ProtocolError("E_BAD_RANGE", "range body too short")
    end_seq, end_off, start_seq, n = _HEAD.unpack_from(data, 0)
    pos = _HEAD.size
    records: list[RangeRecord] = []
    unpack = _REC.unpack_from
    for _ in range(n):
        if pos + _REC.size > len(data):
            raise ProtocolError("E_BAD_RANGE", "range body truncated")
        seq, offset, size = unpack(data, pos)
        pos += _REC.size
        if pos + size > len(data):
            raise ProtocolError("E_BAD_RANGE", "range record truncated")
        msg = decode_message(data[pos : pos + size])
        pos += size
        records.append(RangeRecord(seq, offset, msg.timestamp, msg.attempts, msg.id, 0, msg.body))
    if pos != len(data):
        raise ProtocolError("E_BAD_RANGE", "range body has trailing bytes")
    return RangeResult(end_seq, end_off, start_seq, records)
