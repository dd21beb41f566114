"""The batch walk: reading a DiskLog's segment files, one batch record after another.

Every read of a segment file (a consumer behind the cache, a range read, a seek,
replication, a cut) walks the batch headers from an indexed position to the batch it
wants, and on from there: :class:`BatchWalk` is that walk, written once. It checks
each header (its sequence follows the one before, its length fits the segment), checks
the crc of every batch it loads, passes over the holes damage left (see
:mod:`nsqx.store.recovery`), and applies the corruption policy to damage it finds, or
that its caller finds in a batch's frames (:meth:`BatchWalk.damaged`): the damaged
bytes become a hole, from there to the next sound record, and the records after it
are read as before (:meth:`SegmentReader.damaged`).

One walk is one object; a batch costs no allocation but its bytes, read in large
chunks (:class:`SegmentReader`). (An object with a method rather than a generator:
compiled, a generator boxes a tuple of ints per batch, and disk reads were 3-8% slower
than the hand-written loops this replaced; with the object, 0-4%.)
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from typing import Final

from nsqx.store.fsutil import keep_bad_bytes
from nsqx.store.log import SetAside
from nsqx.store.record import (
    BATCH_HEAD,
    BATCH_HEAD_SIZE,
    MAX_BATCH,
    MIN_FRAME_SIZE,
    CorruptRecord,
    check_batch,
    find_record,
)
from nsqx.store.segment import Segment

log = logging.getLogger("nsqx.store")

_READ_CHUNK: Final = 256 * 1024


class SegmentReader:
    """Reads segment files for one DiskLog: one read-only fd per file, and the last
    chunk read kept, so that a walk through consecutive batches reads each byte once.

    ``report`` is told of each stretch of damage found while reading (the log keeps
    the list: ``DiskLog.set_aside``)."""

    __slots__ = ("_chunk", "_fds", "_report")

    def __init__(self, report: Callable[[SetAside], None]) -> None:
        self._fds: dict[str, int] = {}
        # the last chunk read from a file: (path, file position, bytes)
        self._chunk: tuple[str, int, bytes] = ("", 0, b"")
        self._report = report

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def chunk_at(self, seg: Segment, pos: int, need: int) -> tuple[bytes, int]:
        """Bytes of ``seg`` from ``pos`` (at least ``need`` if the file has them), and the
        file position of their first byte."""
        path, cpos, data = self._chunk
        if path == seg.path and cpos <= pos and pos + need <= cpos + len(data):
            return data, cpos
        data = os.pread(self._fd(seg.path), max(_READ_CHUNK, need), pos)
        self._chunk = (seg.path, pos, data)
        return data, pos

    def head_at(self, seg: Segment, pos: int, expect: int) -> tuple[int, int, int]:
        """The header of the batch at file position ``pos`` of ``seg``, which must start
        with sequence ``expect``: (payload length, crc, count). Raises CorruptRecord
        when it is not what it must be."""
        buf, base = self.chunk_at(seg, pos, BATCH_HEAD_SIZE)
        off = pos - base
        if pos + BATCH_HEAD_SIZE > seg.size or off + BATCH_HEAD_SIZE > len(buf):
            raise CorruptRecord("a batch header past the segment's end")
        plen, crc, first, count, _deliver_at, _flags = BATCH_HEAD.unpack_from(buf, off)
        if first != expect:
            raise CorruptRecord(f"sequence {first} where {expect} was expected")
        if pos + BATCH_HEAD_SIZE + plen > seg.size or not 0 < count * MIN_FRAME_SIZE <= plen:
            raise CorruptRecord(f"a batch of {count} records in {plen} bytes")
        return plen, crc, count

    def batch_at(self, seg: Segment, pos: int, plen: int, crc: int) -> tuple[bytes, int]:
        """The whole batch at ``pos`` (its header read by :meth:`head_at`), crc-checked:
        bytes that hold it from ``off`` on. Every batch read from a file is checked
        (a page the kernel reads again from a disk that flipped a bit is found here;
        a crc costs about 5 us per 64 KiB)."""
        buf, base = self.chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
        off = pos - base
        if off + BATCH_HEAD_SIZE + plen > len(buf):
            raise CorruptRecord("the file is shorter than its records")
        check_batch(buf, off, plen, crc)
        return buf, off

    def damaged(self, seg: Segment, pos: int, seq: int, err: Exception) -> None:
        """The read side of the corruption policy: damage found at ``pos`` of ``seg``,
        where sequence ``seq`` must start. The bytes from there to the next sound record
        (or to the segment's end, if none follows) become a hole that every walk passes
        over: its sequences are never served, nor given again, and the records after it
        are read as before; the bytes stay in the file (copied to a .bad file) and the
        log's end does not move."""
        end, nxt = seg.size, seg.end_seq
        fd = self._fd(seg.path)
        if os.fstat(fd).st_size >= seg.size:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                hint = -1
                if pos + BATCH_HEAD_SIZE <= seg.size:
                    plen = BATCH_HEAD.unpack_from(mm, pos)[0]
                    if plen <= MAX_BATCH:
                        hint = pos + BATCH_HEAD_SIZE + plen  # where its length says
                found = find_record(mm, pos, pos + 1, seg.size, seq, seg.end_seq - 1, hint)
                if found >= 0:
                    end, nxt = found, BATCH_HEAD.unpack_from(mm, found)[2]
                bad = keep_bad_bytes(seg.path, pos, bytes(mm[pos:end]))
        else:  # the file was cut under us: what is gone is gone
            bad = ""
        seg.add_hole(pos, end, seq, nxt)
        log.error(
            "STORE: %s: corrupt record at byte %d (%s): sequences %d to %d are lost "
            "(bytes %d to %d, kept in %s); the records after them are served",
            seg.path,
            pos,
            err,
            seq,
            nxt - 1,
            pos,
            end,
            bad or "nothing: the file is shorter",
        )
        self._report(SetAside(seg.path, pos, end - pos, seq, nxt, bad, "hole"))

    def close_file(self, path: str) -> None:
        """Close ``path``'s fd and forget what was read from it."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        if self._chunk[0] == path:
            self._chunk = ("", 0, b"")

    def close(self) -> None:
        for path in list(self._fds):
            self.close_file(path)

    def walk(self, seg: Segment, seq: int, *, load: bool = True) -> BatchWalk:
        """A walk of ``seg`` from the batch that holds ``seq`` (see :class:`BatchWalk`)."""
        pos, first = seg.start_at(seq)
        return BatchWalk(self, seg, pos, first, seq, 0, load)

    def walk_to_pos(self, seg: Segment, target: int) -> BatchWalk:
        """A walk of ``seg`` from the batch whose frames reach past file position
        ``target``."""
        pos, first = seg.start_at_pos(target)
        return BatchWalk(self, seg, pos, first, 0, target, True)


class BatchWalk:
    """The batch records of one segment, in order, from the first one that holds a
    sequence at or after ``seq`` and has frames past file position ``target`` (batches
    before it are passed over by their headers alone).

    :meth:`advance` moves to the next batch and says whether there is one; the batch is
    then ``first`` (its first sequence), ``count``, ``pos`` (the file position of its
    header), ``plen`` (its payload's length) and, when the walk loads batches, ``buf``
    with the whole record from ``off`` on (crc-checked). Holes are passed over, so a
    batch's ``first`` may be past the end of the one before (a reader that wants
    consecutive records stops there); damage found on the way becomes a hole. A walk
    ends at the segment's end, or where its caller found damage (``broken``)."""

    __slots__ = (
        "_load",
        "_reader",
        "_seq",
        "_started",
        "_target",
        "broken",
        "buf",
        "count",
        "first",
        "off",
        "plen",
        "pos",
        "seg",
    )

    def __init__(
        self,
        reader: SegmentReader,
        seg: Segment,
        pos: int,
        first: int,
        seq: int,
        target: int,
        load: bool,
    ) -> None:
        self._reader = reader
        self.seg = seg
        self.pos = pos
        self.first = first
        self.count = 0
        self.plen = 0
        self.buf = b""
        self.off = 0
        self._seq = seq
        self._target = target
        self._load = load
        self._started = False
        #: the walk ended where its caller found damage (see :meth:`damaged`)
        self.broken = False

    def advance(self) -> bool:
        """Move to the next batch (the first one, on the first call); False when there
        is none: the segment's end, or damage its caller found (``broken``)."""
        if self.broken:
            return False
        # (locals in the loop, attributes set once per batch: this runs per batch read)
        pos = self.pos
        first = self.first
        if self._started:
            pos += BATCH_HEAD_SIZE + self.plen
            first += self.count
        self._started = True
        reader = self._reader
        seg = self.seg
        seq = self._seq
        target = self._target
        while pos < seg.size:
            holes = seg.holes
            if holes is not None and pos in holes:
                pos, _, first = holes[pos]
                continue
            try:
                plen, crc, count = reader.head_at(seg, pos, first)
                if first + count <= seq or pos + BATCH_HEAD_SIZE + plen <= target:
                    pos += BATCH_HEAD_SIZE + plen
                    first += count
                    continue
                if self._load:
                    self.buf, self.off = reader.batch_at(seg, pos, plen, crc)
            except CorruptRecord as err:
                reader.damaged(seg, pos, first, err)  # a hole now: passed over
                continue
            self.pos = pos
            self.first = first
            self.plen = plen
            self.count = count
            return True
        self.pos = pos
        self.first = first
        self.plen = self.count = 0
        return False

    def damaged(self, err: Exception) -> None:
        """The batch the walk is at is damaged (its caller found its frames do not tile
        it, say): it becomes a hole (see :meth:`SegmentReader.damaged`) and the walk
        ends; a later walk passes over it."""
        self.broken = True
        pos, first = self.pos, self.first
        self.plen = self.count = 0
        self._reader.damaged(self.seg, pos, first, err)
