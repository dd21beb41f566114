"""Range reads: the body nsqd returns for a stateless read of a partition.

Used by range consumers such as the Spark data source. The body carries the message
frames as they are stored, so nsqd builds it with one slice per stored batch and no
work per message, plus small tables from which a reader derives every column with
vectorised code (Arrow) instead of a Python loop per record::

    [u64 partition end sequence][u64 partition end virtual offset][u64 start sequence]
    [u32 n records][u32 b runs]
    run lengths      b x i32 (they add up to n)
    run timestamps   b x i64 (ns; one publish, one timestamp)
    run offsets      b x i64 (virtual offset of the run's first frame)
    frame sizes      n x i32
    frames           the n stored frames, concatenated

Record i has sequence ``start + i``; within a run its virtual offset grows with the
frames' sizes. The header is big-endian like the rest of NSQ's wire; the tables are
little-endian (Arrow's layout). Frames are as nsqd stores them: message frames
(``[size][type 2][ts][attempts=1][id][body]``) or, for a message with a trace id or an
ext header, extended records (type 0x102, with ``[u64 trace id][u8 ext version][u16 ext
length][ext]`` before the body; see nsqx.wire.frames). A reader decodes both.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import NamedTuple

from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import (
    EXTENDED_FRAME_OVERHEAD,
    ID_AT,
    ID_END,
    TIMESTAMP_AT,
    is_extended,
    record_parts,
)

_HEAD = struct.Struct(">QQQII")
_LITTLE = sys.byteorder == "little"
_I32 = struct.Struct(">i")
_MSG = struct.Struct(">qH")  # timestamp, attempts (after the frame's size and type)


class RangeRecord(NamedTuple):
    """One message of a range read."""

    sequence: int
    offset: int
    timestamp: int
    attempts: int
    id: bytes
    trace_id: int
    body: bytes
    #: Youzan's ext version (0: no ext header) and ext data, from an extended record
    ext_ver: int = 0
    ext: bytes = b""


class RangeResult(NamedTuple):
    end_sequence: int
    end_offset: int
    start_sequence: int
    records: list[RangeRecord]

    @property
    def next_sequence(self) -> int:
        """Where the next read continues."""
        return self.records[-1].sequence + 1 if self.records else self.start_sequence


class RangeFrames(NamedTuple):
    """A range body cut into its tables and frames (views into the body, no copies)."""

    end_sequence: int
    end_offset: int
    start_sequence: int
    size: int
    run_lengths: memoryview
    run_timestamps: memoryview
    run_offsets: memoryview
    sizes: memoryview
    frames: memoryview

    @property
    def next_sequence(self) -> int:
        return self.start_sequence + self.size


def _le(values: array[int]) -> bytes:
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _ints(code: str, view: memoryview) -> array[int]:
    a = array(code)
    a.frombytes(view)
    if not _LITTLE:
        a.byteswap()
    return a


def encode_range_frames(
    end_sequence: int,
    end_offset: int,
    start_sequence: int,
    run_lengths: array[int],
    run_timestamps: array[int],
    run_offsets: array[int],
    sizes: array[int],
    frames: list[bytes],
) -> bytes:
    """Encode a range body (the frames as chunks of consecutive frames)."""
    return b"".join(
        (
            _HEAD.pack(end_sequence, end_offset, start_sequence, len(sizes), len(run_lengths)),
            _le(run_lengths),
            _le(run_timestamps),
            _le(run_offsets),
            _le(sizes),
            *frames,
        )
    )


def encode_range(
    end_sequence: int,
    end_offset: int,
    start_sequence: int,
    records: list[tuple[int, int, bytes]],
) -> bytes:
    """Encode (sequence, virtual offset, message frame) records, one run each (the
    simple form, for tools and tests; nsqd encodes whole stored batches as runs)."""
    if records and [r[0] for r in records] != list(
        range(start_sequence, start_sequence + len(records))
    ):
        raise ValueError("range records must be consecutive from start_sequence")
    frames = [r[2] for r in records]
    return encode_range_frames(
        end_sequence,
        end_offset,
        start_sequence,
        array("i", [1]) * len(records),
        array("q", [_MSG.unpack_from(f, TIMESTAMP_AT)[0] for f in frames]),
        array("q", [r[1] for r in records]),
        array("i", map(len, frames)),
        frames,
    )


def decode_range_frames(data: bytes) -> RangeFrames:
    """Cut a range body into its tables and frames; a malformed one raises
    ProtocolError (the frames themselves are checked where they are cut)."""
    if len(data) < _HEAD.size:
        raise ProtocolError("E_BAD_RANGE", "range body too short")
    end_seq, end_off, start_seq, n, runs = _HEAD.unpack_from(data, 0)
    view = memoryview(data)
    pos = _HEAD.size
    cols = []
    for width in (4 * runs, 8 * runs, 8 * runs, 4 * n):
        if pos + width > len(data):
            raise ProtocolError("E_BAD_RANGE", "range body truncated")
        cols.append(view[pos : pos + width])
        pos += width
    lengths, tss, offs, sizes = cols
    if sum(_ints("i", lengths)) != n or min(_ints("i", lengths), default=1) <= 0:
        raise ProtocolError("E_BAD_RANGE", "range runs do not add up")
    return RangeFrames(end_seq, end_off, start_seq, n, lengths, tss, offs, sizes, view[pos:])


def decode_range(data: bytes) -> RangeResult:
    """Decode a range body into records (for tools and tests; readers use the tables)."""
    r = decode_range_frames(data)
    sizes = _ints("i", r.sizes)
    frames = bytes(r.frames)
    if sum(sizes) != len(frames):
        raise ProtocolError("E_BAD_RANGE", "range frame sizes do not add up")
    records: list[RangeRecord] = []
    pos = 0
    seq = r.start_sequence
    for length, offset in zip(_ints("i", r.run_lengths), _ints("q", r.run_offsets), strict=True):
        run_start = pos
        for _ in range(length):
            frame = frames[pos : pos + sizes[seq - r.start_sequence]]
            if len(frame) < ID_END or 4 + _I32.unpack_from(frame, 0)[0] != len(frame):
                raise ProtocolError("E_BAD_RANGE", f"bad frame at sequence {seq}")
            if is_extended(frame) and len(frame) < EXTENDED_FRAME_OVERHEAD:
                raise ProtocolError("E_BAD_RANGE", f"bad extended record at sequence {seq}")
            trace, ver, ext, body_at = record_parts(frame)
            if body_at > len(frame):
                raise ProtocolError("E_BAD_RANGE", f"bad extended record at sequence {seq}")
            ts, attempts = _MSG.unpack_from(frame, TIMESTAMP_AT)
            records.append(
                RangeRecord(
                    seq,
                    offset + pos - run_start,
                    ts,
                    attempts,
                    frame[ID_AT:ID_END],
                    trace,
                    frame[body_at:],
                    ver,
                    ext,
                )
            )
            pos += len(frame)
            seq += 1
    return RangeResult(r.end_sequence, r.end_offset, r.start_sequence, records)
