"""Range reads: the body nsqd returns for a stateless read of a partition.

Used by range consumers such as the Spark data source. The body is *columnar*, so that a
reader can hand each column to Arrow without touching every record in Python::

    [u64 partition end sequence][u64 partition end virtual offset][u64 start sequence]
    [u32 n]
    sequences        n x i64
    virtual offsets  n x i64
    timestamps       n x i64 (ns)
    attempts         n x i32
    ids              n x 16 bytes (hex)
    body offsets     (n + 1) x i32 (body i is bodies[offsets[i]:offsets[i+1]])
    bodies

The header is big-endian like the rest of NSQ's wire; the columns are little-endian
(Arrow's layout). The trace id is 0 until tracing lands.
"""

from __future__ import annotations

import struct
import sys
from array import array
from itertools import accumulate
from typing import NamedTuple

from nsqx.wire.errors import ProtocolError

_HEAD = struct.Struct(">QQQI")
_LITTLE = sys.byteorder == "little"


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


class RangeColumns(NamedTuple):
    """A range body cut into its column buffers (views into the body, no copies)."""

    end_sequence: int
    end_offset: int
    start_sequence: int
    size: int
    sequences: memoryview
    offsets: memoryview
    timestamps: memoryview
    attempts: memoryview
    ids: memoryview
    body_offsets: memoryview
    bodies: memoryview

    @property
    def next_sequence(self) -> int:
        if not self.size:
            return self.start_sequence
        return _ints("q", self.sequences[-8:])[0] + 1


def _le(values: array[int]) -> bytes:
    if not _LITTLE:
        values.byteswap()
    return values.tobytes()


def _ints(code: str, view: memoryview) -> array[int]:
    a = array(code)
    a.frombytes(view)
    if not _LITTLE:
        a.byteswap()
    return a


def encode_range_columns(
    end_sequence: int,
    end_offset: int,
    start_sequence: int,
    sequences: array[int],
    offsets: array[int],
    timestamps: array[int],
    ids: list[bytes],
    bodies: list[bytes],
    attempts: array[int] | None = None,
) -> bytes:
    """Encode columns (attempts default to 1: a range read is not a delivery)."""
    n = len(sequences)
    if attempts is None:
        attempts = array("i", [1]) * n
    body_offsets = array("i", [0])
    body_offsets.extend(accumulate(map(len, bodies)))
    return b"".join(
        (
            _HEAD.pack(end_sequence, end_offset, start_sequence, n),
            _le(array("q", sequences)),
            _le(array("q", offsets)),
            _le(array("q", timestamps)),
            _le(array("i", attempts)),
            b"".join(ids),
            _le(body_offsets),
            *bodies,
        )
    )


def encode_range(
    end_sequence: int,
    end_offset: int,
    start_sequence: int,
    records: list[tuple[int, int, bytes]],
) -> bytes:
    """Encode (sequence, virtual offset, message frame) records, column by column."""
    frames = [r[2] for r in records]
    # fields of the frames ([size][type][ts][attempts][id][body]), big-endian there
    ts = array("q")
    ts.frombytes(b"".join([f[8:16] for f in frames]))
    attempts16 = array("H")
    attempts16.frombytes(b"".join([f[16:18] for f in frames]))
    if _LITTLE:
        ts.byteswap()
        attempts16.byteswap()
    return encode_range_columns(
        end_sequence,
        end_offset,
        start_sequence,
        array("q", [r[0] for r in records]),
        array("q", [r[1] for r in records]),
        ts,
        [f[18:34] for f in frames],
        [f[34:] for f in frames],
        array("i", attempts16),
    )


def decode_range_columns(data: bytes) -> RangeColumns:
    """Cut a range body into column views; a malformed one raises ProtocolError."""
    if len(data) < _HEAD.size:
        raise ProtocolError("E_BAD_RANGE", "range body too short")
    end_seq, end_off, start_seq, n = _HEAD.unpack_from(data, 0)
    view = memoryview(data)
    pos = _HEAD.size
    cols = []
    for width in (8 * n, 8 * n, 8 * n, 4 * n, 16 * n, 4 * (n + 1)):
        if pos + width > len(data):
            raise ProtocolError("E_BAD_RANGE", "range body truncated")
        cols.append(view[pos : pos + width])
        pos += width
    body_offsets = cols[5]
    first, last = _ints("i", body_offsets[:4])[0], _ints("i", body_offsets[-4:])[0]
    if first != 0 or pos + last != len(data):
        raise ProtocolError("E_BAD_RANGE", "range body sizes do not add up")
    seqs, offs, tss, atts, ids, _ = cols
    return RangeColumns(
        end_seq, end_off, start_seq, n, seqs, offs, tss, atts, ids, body_offsets, view[pos:]
    )


def decode_range(data: bytes) -> RangeResult:
    """Decode a range body into records (for tools and tests; readers use columns)."""
    c = decode_range_columns(data)
    seqs = _ints("q", c.sequences)
    offs = _ints("q", c.offsets)
    tss = _ints("q", c.timestamps)
    atts = _ints("i", c.attempts)
    bounds = _ints("i", c.body_offsets)
    ids = bytes(c.ids)
    bodies = bytes(c.bodies)
    records = [
        RangeRecord(
            seqs[i],
            offs[i],
            tss[i],
            atts[i],
            ids[16 * i : 16 * i + 16],
            0,
            bodies[bounds[i] : bounds[i + 1]],
        )
        for i in range(c.size)
    ]
    return RangeResult(c.end_sequence, c.end_offset, c.start_sequence, records)
