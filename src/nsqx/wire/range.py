"""Range reads: the binary body nsqd returns for a stateless read of a partition.

Used by range consumers such as the Spark data source. Layout (big-endian)::

    [u64 partition end sequence][u64 partition end virtual offset][u64 start sequence]
    [u32 record count]
    count x ([u64 sequence][u64 virtual offset][message frame])

Each frame is a message frame exactly as consumers receive it ([u32 size][u32 type 2]
[i64 timestamp][u16 attempts][16-hex-digit id][body]), copied as stored. The trace id
is 0 until tracing lands.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from nsqx.wire.errors import ProtocolError

_HEAD = struct.Struct(">QQQI")
_REC = struct.Struct(">QQ")
# a record's fixed part: sequence, offset, frame size, frame type, timestamp, attempts, id
_FIXED = struct.Struct(">QQiiqH16s")


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
    """Encode (sequence, virtual offset, frame) records."""
    parts = [_HEAD.pack(end_sequence, end_offset, start_sequence, len(records))]
    pack = _REC.pack
    for seq, offset, frame in records:
        parts.append(pack(seq, offset))
        parts.append(frame)
    return b"".join(parts)


class RangeColumns(NamedTuple):
    """A range body decoded column by column (what a columnar reader wants)."""

    end_sequence: int
    end_offset: int
    start_sequence: int
    sequences: list[int]
    offsets: list[int]
    timestamps: list[int]
    attempts: list[int]
    ids: list[bytes]
    bodies: list[bytes]


def decode_range_columns(data: bytes) -> RangeColumns:
    """Decode a range body into columns; a malformed one raises ProtocolError."""
    total = len(data)
    if total < _HEAD.size:
        raise ProtocolError("E_BAD_RANGE", "range body too short")
    end_seq, end_off, start_seq, n = _HEAD.unpack_from(data, 0)
    seqs: list[int] = []
    offs: list[int] = []
    tss: list[int] = []
    atts: list[int] = []
    ids: list[bytes] = []
    bodies: list[bytes] = []
    unpack = _FIXED.unpack_from
    fixed = _FIXED.size
    pos = _HEAD.size
    for _ in range(n):
        if pos + fixed > total:
            raise ProtocolError("E_BAD_RANGE", "range body truncated")
        seq, off, size, _ftype, ts, att, mid = unpack(data, pos)
        end = pos + 20 + size  # 16 bytes of record header, 4 of frame size, then size
        if size < 30 or end > total:
            raise ProtocolError("E_BAD_RANGE", "range record truncated")
        seqs.append(seq)
        offs.append(off)
        tss.append(ts)
        atts.append(att)
        ids.append(mid)
        bodies.append(data[pos + fixed : end])
        pos = end
    if pos != total:
        raise ProtocolError("E_BAD_RANGE", "range body has trailing bytes")
    return RangeColumns(end_seq, end_off, start_seq, seqs, offs, tss, atts, ids, bodies)


def decode_range(data: bytes) -> RangeResult:
    """Decode a range body into records; a malformed one raises ProtocolError."""
    c = decode_range_columns(data)
    records = [
        RangeRecord(s, o, t, a, i, 0, b)
        for s, o, t, a, i, b in zip(
            c.sequences, c.offsets, c.timestamps, c.attempts, c.ids, c.bodies, strict=True
        )
    ]
    return RangeResult(c.end_sequence, c.end_offset, c.start_sequence, records)
