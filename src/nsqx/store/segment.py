"""Segment files: a DiskLog's partition directory, one file per stretch of the log.

Layout of a partition directory::

    00000000000000000000.seg   segments, named by their first sequence
    00000000000000052417.seg
    00000000000000052417.idx   sparse index of a sealed segment (rebuilt if missing)

A segment starts with a 24-byte header (magic, first sequence, first virtual offset)
followed by batch records (:mod:`nsqx.store.record`). Its sparse index maps sequences
and file positions to batches, one entry per INDEX_INTERVAL bytes and one per deferred
batch, so a read seeks near its batch and walks a few headers from there.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Final

from nsqx.store.durable_file import fsync_dir

SEGMENT_MAGIC: Final = b"NSQXSEG1"
SEG_HEAD: Final = struct.Struct(">8sQQ")
SEG_HEAD_SIZE: Final = SEG_HEAD.size
# one sparse index entry per this many bytes of a segment (plus one per deferred batch)
INDEX_INTERVAL: Final = 4096
_INDEX_HEAD: Final = struct.Struct(">QQQ")
#: index files are big-endian; this host's arrays may not be
_BYTESWAP: Final = struct.pack("=q", 1) != struct.pack(">q", 1)


@dataclass
class Segment:
    """One segment file and what is known about it without reading it whole."""

    path: str
    base_seq: int
    base_offset: int
    end_seq: int = 0
    size: int = SEG_HEAD_SIZE
    #: flat (seq, file position, deliver-at) triples, one per INDEX_INTERVAL bytes
    index: array[int] = field(default_factory=lambda: array("q"))
    sealed: bool = False
    #: damaged stretches of the file that records follow, left in place and passed
    #: over by every walk (see nsqx.store.recovery): file position -> (the position of
    #: the record after them, the first sequence they held, that record's sequence)
    holes: dict[int, tuple[int, int, int]] | None = None
    last_write: float = field(default_factory=time.time)
    _last_indexed_pos: int = -INDEX_INTERVAL

    @property
    def idx_path(self) -> str:
        return self.path[:-4] + ".idx"

    def note_batch(self, seq: int, pos: int, deliver_at: int) -> None:
        if deliver_at or pos - self._last_indexed_pos >= INDEX_INTERVAL:
            self.index.extend((seq, pos, deliver_at))
            self._last_indexed_pos = pos

    def forget_index_from(self, seq: int) -> None:
        """Drop the index entries of batches at or after ``seq`` (the file was cut)."""
        idx = self.index
        keep = 0
        while keep < len(idx) and idx[keep] < seq:
            keep += 3
        del idx[keep:]
        self._last_indexed_pos = idx[-2] if idx else -INDEX_INTERVAL

    def add_hole(self, pos: int, end: int, first: int, nxt: int) -> None:
        """Bytes ``pos .. end`` are damage that held sequences ``first .. nxt-1``: walks
        pass over them from now on (index entries inside them are dropped: they point
        at damaged bytes)."""
        if self.holes is None:
            self.holes = {}
        self.holes[pos] = (end, first, nxt)
        idx = self.index
        keep = array("q")
        for i in range(0, len(idx), 3):
            if not pos < idx[i + 1] < end:
                keep.extend(idx[i : i + 3])
        self.index = keep

    def hole_holding(self, seq: int) -> tuple[int, int, int, int] | None:
        """(position, end, first, next sequence) of the hole that held ``seq``, if any."""
        if self.holes is not None:
            for pos, (end, first, nxt) in self.holes.items():
                if first <= seq < nxt:
                    return pos, end, first, nxt
        return None

    def forget_holes_from(self, pos: int) -> None:
        """Drop the holes at or after file position ``pos`` (the file was cut there)."""
        if self.holes is not None:
            self.holes = {p: h for p, h in self.holes.items() if p < pos} or None

    def start_at(self, seq: int) -> tuple[int, int]:
        """(file position, first sequence) of an indexed batch at or before ``seq``'s."""
        return self._indexed(seq, 0)

    def start_at_pos(self, pos: int) -> tuple[int, int]:
        """(file position, first sequence) of an indexed batch at or before ``pos``."""
        return self._indexed(pos, 1)

    def _indexed(self, key: int, column: int) -> tuple[int, int]:
        idx = self.index
        lo, hi = 0, len(idx) // 3
        while lo < hi:  # bisect on the column
            mid = (lo + hi) // 2
            if idx[mid * 3 + column] <= key:
                lo = mid + 1
            else:
                hi = mid
        if not lo:
            return SEG_HEAD_SIZE, self.base_seq
        return idx[(lo - 1) * 3 + 1], idx[(lo - 1) * 3]


def segment_name(base_seq: int) -> str:
    """The file name of the segment whose first sequence is ``base_seq``."""
    return f"{base_seq:020d}.seg"


def name_seq(name: str) -> int | None:
    """The first sequence a segment's file name gives (None if it is not one of ours)."""
    stem = name[:-4]
    return int(stem) if len(stem) == 20 and stem.isdigit() else None


def new_segment(directory: str, base_seq: int, base_offset: int, *, fsync: bool = True) -> Segment:
    """Create an empty segment file (fsynced with its directory entry unless ``fsync``
    is false: a roll leaves that to the next sync)."""
    path = os.path.join(directory, segment_name(base_seq))
    with open(path, "wb") as f:
        f.write(SEG_HEAD.pack(SEGMENT_MAGIC, base_seq, base_offset))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    if fsync:
        fsync_dir(directory)
    return Segment(path, base_seq, base_offset, end_seq=base_seq)


def write_index(seg: Segment) -> None:
    """Write a sealed segment's index file (its size, end and a crc first)."""
    idx = array("q", seg.index)
    if _BYTESWAP:
        idx.byteswap()
    body = idx.tobytes()
    data = _INDEX_HEAD.pack(seg.size, seg.end_seq, zlib.crc32(body)) + body
    tmp = seg.idx_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, seg.idx_path)


def read_index(seg: Segment) -> bool:
    """Load a sealed segment's index file into ``seg`` if it matches the segment's size
    (then ``seg``'s size and end come from it); False if there is none that does."""
    try:
        with open(seg.idx_path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if len(data) < 24 or (len(data) - 24) % 24:
        return False
    size, end_seq, crc = _INDEX_HEAD.unpack(data[:24])
    if size != os.path.getsize(seg.path) or zlib.crc32(data[24:]) != crc:
        return False
    seg.index = array("q")
    seg.index.frombytes(data[24:])
    if _BYTESWAP:
        seg.index.byteswap()  # stored big-endian
    seg.size = size
    seg.end_seq = end_seq
    return True
