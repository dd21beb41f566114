"""DiskLog: a topic partition's durable, segmented, append-only log.

Layout of a partition directory::

    00000000000000000000.seg   segments, named by their first sequence
    00000000000000052417.seg
    00000000000000052417.idx   sparse index of a sealed segment (rebuilt if missing)

A segment starts with a 24-byte header (magic, first sequence, first virtual offset)
followed by batch records. A batch is what one PUB, MPUB or DPUB appended, or the
publishes staged together for one commit (consecutive ones with the same deliver-at
time and kind of frame: see :meth:`DiskLog.stage`)::

    [u32 payload length][u32 crc32c][u64 first seq][u32 count][i64 deliver-at ns][u16 flags]
    [payload: the batch's message frames, exactly as nsqd sends them with attempts=1]

Storing frames means a publish is one join and one write, and a read from disk splits
the payload at the frames' own size prefixes. The crc covers everything after itself,
so a torn or corrupt record is recognised and never delivered. (CRC-32C: hardware
accelerated, five times faster than zlib's CRC-32 here.)

Positions: a message's *sequence* counts messages over the partition's life (ids are
built from it); its *virtual offset* is the byte position of its frame in the
partition's life (segment base offset + position in the file). Both only grow.

The newest records are also kept in memory (a :class:`MemoryLog` bounded by
``cache_size`` messages), so consumers that keep up never touch the files.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import google_crc32c

from nsqx.store.batchcache import BatchCache, CachedBatch
from nsqx.store.deferred import DeferredIndex
from nsqx.store.log import frame_starts
from nsqx.wire.batch import StoredBatch

log = logging.getLogger("nsqx.store")

SEGMENT_MAGIC: Final = b"NSQXSEG1"
_SEG_HEAD: Final = struct.Struct(">8sQQ")
_BATCH_HEAD: Final = struct.Struct(">IIQIqH")
SEG_HEAD_SIZE: Final = _SEG_HEAD.size
BATCH_HEAD_SIZE: Final = _BATCH_HEAD.size
_I32: Final = struct.Struct(">i")
_TS: Final = struct.Struct(">q")
# one sparse index entry per this many bytes of a segment (plus one per deferred batch)
INDEX_INTERVAL: Final = 4096
_READ_CHUNK: Final = 256 * 1024
_SCAN_CHUNK: Final = 4 * 1024 * 1024
# frame layout: size(4) type(4) timestamp(8) attempts(2) id(16) body
# (written [18:34] where used: mypyc, setup.py, compiles bytes[slice object] as an
# index by int, a TypeError)
#: the smallest frame (an empty body)
MIN_FRAME_SIZE: Final = 34
#: a batch header announcing more is not believed (nsqd's --max-body-size is far less)
_MAX_BATCH: Final = 1 << 31


class RangeFramesOut:
    """What a range read found (see DiskLog.read_frames): runs of frames from one stored
    batch each (length, timestamp, virtual offset of the first), every frame's size,
    and the frames themselves as chunks of consecutive frames."""

    __slots__ = (
        "chunks",
        "count",
        "first",
        "run_lengths",
        "run_offsets",
        "run_timestamps",
        "sizes",
    )

    def __init__(self, first: int) -> None:
        #: the sequence of the first record (records are consecutive from it)
        self.first = first
        self.run_lengths: array[int] = array("i")
        self.run_timestamps: array[int] = array("q")
        self.run_offsets: array[int] = array("q")
        self.sizes: array[int] = array("i")
        self.chunks: list[bytes] = []
        self.count = 0

    def add_run(self, chunk: bytes, n: int, size: int, offset: int, ts: int) -> None:
        """``n`` frames of ``size`` bytes each."""
        self.run_lengths.append(n)
        self.run_timestamps.append(ts)
        self.run_offsets.append(offset)
        self.sizes += array("i", [size]) * n
        self.chunks.append(chunk)
        self.count += n


class CorruptRecord(Exception):
    """A record failed its checks (length or crc)."""


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
    #: records below this file position were checked (written or scanned by us)
    verified_upto: int = SEG_HEAD_SIZE
    #: bytes of damage moved out of the file at start (see DiskLog's corruption policy)
    set_aside: int = 0
    #: how many records those bytes may have held
    set_aside_records: int = 0
    last_write: float = field(default_factory=time.time)
    _last_indexed_pos: int = -INDEX_INTERVAL

    @property
    def idx_path(self) -> str:
        return self.path[:-4] + ".idx"

    def note_batch(self, seq: int, pos: int, deliver_at: int) -> None:
        if deliver_at or pos - self._last_indexed_pos >= INDEX_INTERVAL:
            self.index.extend((seq, pos, deliver_at))
            self._last_indexed_pos = pos

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


def _segment_name(base_seq: int) -> str:
    return f"{base_seq:020d}.seg"


def _name_seq(name: str) -> int | None:
    """The first sequence a segment's file name gives (None if it is not one of ours)."""
    stem = name[:-4]
    return int(stem) if len(stem) == 20 and stem.isdigit() else None


def _max_records(nbytes: int) -> int:
    """The most records ``nbytes`` of segment can hold (every frame is at least
    MIN_FRAME_SIZE bytes): what bytes set aside may have held."""
    return max(-(-nbytes // MIN_FRAME_SIZE), 0)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _free_name(path: str) -> str:
    """``path``, or ``path.1``, ``path.2``...: never overwrite what was set aside."""
    name, n = path, 0
    while os.path.exists(name):
        n += 1
        name = f"{path}.{n}"
    return name


def iter_batches(buf: bytes, pos: int, limit: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """Walk batch headers in ``buf[pos:limit]``: (pos, payload_len, crc, seq, count,
    deliver_at). Stops at the first incomplete record."""
    unpack = _BATCH_HEAD.unpack_from
    while pos + BATCH_HEAD_SIZE <= limit:
        plen, crc, seq, count, deliver_at, _flags = unpack(buf, pos)
        if pos + BATCH_HEAD_SIZE + plen > limit:
            return
        yield pos, plen, crc, seq, count, deliver_at
        pos += BATCH_HEAD_SIZE + plen


def check_batch(buf: bytes, pos: int, plen: int, crc: int) -> None:
    """Raise CorruptRecord unless the crc of ``buf[pos+8 : pos+head+plen]`` is ``crc``."""
    if google_crc32c.value(bytes(buf[pos + 8 : pos + BATCH_HEAD_SIZE + plen])) != crc:
        raise CorruptRecord(f"crc mismatch at {pos}")


def _equal_frames(buf: bytes, p0: int, plen: int, count: int) -> int:
    """The frames' common size if the ``count`` frames of the payload at ``buf[p0:]``
    all have the first one's size prefix (checked with four strided slices, not a
    loop), else 0. Sizes that merely add up (10, 5, 15) are not equal."""
    size: int = 4 + _I32.unpack_from(buf, p0)[0]
    if size * count != plen:
        return 0
    end = p0 + plen
    prefix = buf[p0 : p0 + 4]
    if all(buf[p0 + k : end : size] == prefix[k : k + 1] * count for k in range(4)):
        return size
    return 0


def split_frames(payload: memoryview | bytes, count: int) -> list[bytes]:
    """Cut a batch payload into its ``count`` frames (checking their sizes add up)."""
    try:
        starts = frame_starts(payload, count)
    except ValueError as err:
        raise CorruptRecord(str(err)) from None
    return [bytes(payload[starts[k] : starts[k + 1]]) for k in range(count)]


_LEN_CRC: Final = struct.Struct(">II")
_CRC_VALUE: Final = google_crc32c.value
_CRC_EXTEND: Final = google_crc32c.extend
# (compiled: bound methods made once, C statics; ``_LEN_CRC.pack`` makes one per use)
_LEN_CRC_PACK: Final = _LEN_CRC.pack
#: a batch head after its length and crc (what the crc covers, with the chunk)
_HEAD_REST_PACK: Final = struct.Struct(">QIqH").pack
#: chunks up to this size get their crc from one call over head and chunk joined (a
#: copy of a small chunk costs less than a second call into google_crc32c)
_CRC_JOIN_MAX: Final = 4096
#: staged batches smaller than _MERGE_CHUNK are merged into one record up to _MERGE_MAX
#: bytes (small publishes: their per-record cost matters); bigger ones are records of
#: their own (merging would only copy them)
_MERGE_CHUNK: Final = 16 * 1024
_MERGE_MAX: Final = 64 * 1024
#: buffers per writev (the kernel's IOV_MAX is 1024)
_IOV_MAX: Final = 1024


def _writev_all(fd: int, buffers: list[bytes]) -> int:
    """writev ``buffers`` (in IOV_MAX slices); the bytes written."""
    if len(buffers) <= _IOV_MAX:
        return os.writev(fd, buffers)
    written = 0
    for i in range(0, len(buffers), _IOV_MAX):
        part = buffers[i : i + _IOV_MAX]
        n = os.writev(fd, part)
        written += n
        if n != sum(map(len, part)):
            break
    return written


class _StagedBatch:
    """Batches staged together that become one batch record: their chunks, ids and
    frame layout (a common stride, else each chunk's stride or start positions)."""

    __slots__ = (
        "chunks",
        "count",
        "deliver_at",
        "ids",
        "kind",
        "own",
        "parts",
        "size",
        "stride",
    )

    def __init__(
        self,
        chunk: bytes,
        ids: list[bytes] | None,
        stride: int,
        starts: array[int] | None,
        deliver_at: int,
        kind: int,
        count: int,
    ) -> None:
        self.chunks = [chunk]
        #: None: read from the frames when first needed (a replicated record)
        self.ids = ids
        self.count = count
        self.size = len(chunk)
        self.stride = stride
        #: (stride, starts, chunk length) per chunk, kept once the strides differ
        self.parts: list[tuple[int, array[int] | None, int]] | None = (
            None if stride else [(0, starts, len(chunk))]
        )
        self.deliver_at = deliver_at
        self.kind = kind
        #: a record of its own (a replicated record): nothing is merged into it
        self.own = False

    def add(self, chunk: bytes, ids: list[bytes], stride: int, starts: array[int] | None) -> None:
        chunks = self.chunks
        own = self.ids
        assert own is not None  # (a record without ids is one of its own: never added to)
        if len(chunks) == 1:
            self.ids = own + ids  # the first list may be the caller's
        else:
            own.extend(ids)
        self.count += len(ids)
        chunks.append(chunk)
        self.size += len(chunk)
        parts = self.parts
        if parts is not None:
            parts.append((stride, starts, len(chunk)))
        elif stride != self.stride:
            # frame sizes differ from here on: keep the layout of every chunk
            common = self.stride
            self.parts = [(common, None, len(c)) for c in chunks[:-1]]
            self.parts.append((stride, starts, len(chunk)))
            self.stride = 0

    def batch(self) -> tuple[bytes, list[bytes] | None, int, array[int] | None]:
        """(chunk, ids, stride, starts) of the whole record."""
        chunks = self.chunks
        parts = self.parts
        if len(chunks) == 1:
            return chunks[0], self.ids, self.stride, parts[0][1] if parts else None
        chunk = b"".join(chunks)
        if parts is None:
            return chunk, self.ids, self.stride, None
        starts = array("q")
        base = 0
        for stride, part_starts, length in parts:
            if part_starts is None:
                starts.extend(range(base, base + length, stride))
            else:
                starts.extend(x + base for x in part_starts[:-1])
            base += length
        starts.append(base)
        return chunk, self.ids, 0, starts


class DiskLog:
    """A :class:`~nsqx.store.log.MessageLog` kept in segment files.

    ``append`` writes each batch with one ``os.write`` before it returns, so an
    acknowledged message is in the file (the OS page cache) and survives the process
    being killed; :meth:`sync` makes it survive a power loss (nsqd calls it per
    --sync-every / --sync-timeout, from a thread). A roll to a new segment does no
    fsync on the caller's thread: the sealed segment, the new one and the directory
    are fsynced by the next :meth:`sync` (a 100 MB segment's fsync takes tens of ms).
    """

    #: records are in files and survive a restart
    durable = True

    def __init__(
        self,
        directory: str,
        *,
        max_bytes_per_file: int = 100 * 1024 * 1024,
        cache_size: int = 10000,
    ) -> None:
        self.directory = directory
        self.max_bytes_per_file = max_bytes_per_file
        self.cache_size = max(cache_size, 1)
        self._cache_slack = max(self.cache_size // 4, 1)
        self.segments: list[Segment] = []
        self._deferred = DeferredIndex()
        self._fd = -1  # the active segment, open for appending
        # segments sealed by a roll but not yet fsynced (fd, path), and whether the
        # directory has entries not yet fsynced; swapped under _sync_lock (held briefly,
        # also by the loop), while _syncing is held for a whole sync or close so that no
        # fd is closed under an fsync
        self._sealed_fds: list[tuple[int, str]] = []
        self._dir_dirty = False
        self._sync_lock = threading.Lock()
        self._syncing = threading.Lock()
        self._closed = False
        # a failed write whose partial record could not be cut off yet
        self._tail_dirty = False
        self._roll_failing = False
        #: the first failed fsync, kept: after one, the kernel may have dropped the dirty
        #: pages and a later fsync would succeed without them, so no sync succeeds again
        self.sync_error: OSError | None = None
        self._read_fds: dict[str, int] = {}
        # the last chunk read from a file: (path, file position, bytes)
        self._chunk: tuple[str, int, bytes] = ("", 0, b"")
        self.unsynced = 0
        self.last_sync = time.monotonic()
        # batches waiting for commit(), the sequence and virtual offset after them
        self._staged: list[_StagedBatch] = []
        self._staged_end = 0
        self._staged_offset = 0
        os.makedirs(directory, exist_ok=True)
        self._open()
        self.cache = BatchCache(self.end)

    # -- opening and recovery ---------------------------------------------------------
    #
    # The corruption policy, applied here and in _damaged() only (docs/reliability.md):
    # no sequence (so no message id) and no virtual offset is ever given twice, and no
    # damaged byte is ever delivered.
    # - A segment with a bad header, or that overlaps the one before, is set aside whole
    #   (renamed *.bad).
    # - Damage found at start (a torn tail, a crc mismatch, a record out of sequence) ends
    #   the segment there: the bytes from the damage on are moved to <segment>.<pos>.bad
    #   and the file is truncated, with a log line. Every whole record before is served.
    # - Sequences that bytes set aside may have held are never given again: when they
    #   were at the log's end (a power loss tears the newest segment), appends go on in a
    #   new segment that starts past them (and past their virtual offsets).
    # - Damage found while reading (the file changed under nsqd) ends the segment's
    #   readable records there, in memory; the segment being written is sealed first, so
    #   appends go on in a new one and the log's end never moves back.
    # Sequences without a record form a gap: read() returns nothing there and
    # resume_at() names the next sequence that has one.

    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".seg"))
        #: the lowest sequence and virtual offset the next append may have: past all
        #: that was set aside
        floor_seq = floor_offset = 0
        for name in names:
            path = os.path.join(self.directory, name)
            size = _file_size(path)
            seg = self._load_segment(path)
            if seg is None:
                # what the file may have held (its name says where it started)
                base = _name_seq(name)
                if base is not None:
                    floor_seq = max(floor_seq, base + _max_records(size - SEG_HEAD_SIZE))
                continue
            if self.segments and seg.base_seq < self.segments[-1].end_seq:
                size = seg.size + seg.set_aside
                self._set_aside(path, "overlaps the previous segment")
                floor_seq = max(floor_seq, seg.base_seq + _max_records(size - SEG_HEAD_SIZE))
                floor_offset = max(floor_offset, seg.base_offset + size - SEG_HEAD_SIZE)
                continue
            self.segments.append(seg)
            if seg.set_aside:
                floor_seq = max(floor_seq, seg.end_seq + seg.set_aside_records)
                floor_offset = max(
                    floor_offset, seg.base_offset + seg.size + seg.set_aside - SEG_HEAD_SIZE
                )
        if not self.segments:
            self.segments.append(self._new_segment(floor_seq, floor_offset))
        for seg in self.segments[:-1]:
            seg.sealed = True
        active = self.segments[-1]
        active_offset = active.base_offset + active.size - SEG_HEAD_SIZE
        if floor_seq > active.end_seq or floor_offset > active_offset:
            nxt = max(floor_seq, active.end_seq)
            log.warning(
                "STORE: %s: sequences %d to %d are skipped (what was set aside may have "
                "held them); the next message is %d",
                self.directory,
                active.end_seq,
                nxt - 1,
                nxt,
            )
            self._write_index(active)
            active.sealed = True
            self.segments.append(self._new_segment(nxt, max(floor_offset, active_offset)))
            active = self.segments[-1]
        self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND)

    def _load_segment(self, path: str) -> Segment | None:
        try:
            with open(path, "rb") as f:
                head = f.read(SEG_HEAD_SIZE)
        except OSError as err:
            log.error("STORE: cannot read %s: %s", path, err)
            return None
        if len(head) < SEG_HEAD_SIZE or head[:8] != SEGMENT_MAGIC:
            self._set_aside(path, "bad segment header")
            return None
        _, base_seq, base_offset = _SEG_HEAD.unpack(head)
        seg = Segment(path, base_seq, base_offset, end_seq=base_seq)
        seg.last_write = os.path.getmtime(path)
        if not self._load_index(seg):
            self._scan(seg)
        return seg

    def _load_index(self, seg: Segment) -> bool:
        """Use a sealed segment's index file if it matches the segment's size."""
        try:
            with open(seg.idx_path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        if len(data) < 24 or (len(data) - 24) % 24:
            return False
        size, end_seq, crc = struct.unpack(">QQQ", data[:24])
        if size != os.path.getsize(seg.path) or zlib.crc32(data[24:]) != crc:
            return False
        seg.index = array("q")
        seg.index.frombytes(data[24:])
        if struct.pack("=q", 1) != struct.pack(">q", 1):
            seg.index.byteswap()  # stored big-endian
        seg.size = size
        seg.end_seq = end_seq
        idx = seg.index
        for i in range(0, len(idx), 3):
            if idx[i + 2]:
                self._add_deferred_from_file(seg, idx[i], idx[i + 1], idx[i + 2])
        return True

    def _add_deferred_from_file(self, seg: Segment, seq: int, pos: int, deliver_at: int) -> None:
        with open(seg.path, "rb") as f:
            f.seek(pos)
            head = f.read(BATCH_HEAD_SIZE)
        if len(head) == BATCH_HEAD_SIZE:
            count = _BATCH_HEAD.unpack(head)[3]
            self._deferred.add(seq, count, deliver_at)

    def _scan(self, seg: Segment) -> None:
        """Read a segment through: rebuild its index; set aside a torn or damaged tail."""
        seq = seg.base_seq
        good = SEG_HEAD_SIZE
        damage = "an incomplete record (torn write)"
        with open(seg.path, "rb") as f:
            f.seek(good)
            buf = b""
            base = good  # file position of buf[0]
            done = False
            while not done:
                more = f.read(_SCAN_CHUNK)
                done = not more
                buf = buf[good - base :] + more
                base = good
                for pos, plen, crc, first, count, deliver_at in iter_batches(buf, 0, len(buf)):
                    try:
                        if first != seq:
                            raise CorruptRecord(f"sequence {first} where {seq} was expected")
                        check_batch(buf, pos, plen, crc)
                    except CorruptRecord as err:
                        damage = f"a corrupt record ({err})"
                        done = True
                        break
                    seg.note_batch(seq, base + pos, deliver_at)
                    if deliver_at:
                        self._deferred.add(seq, count, deliver_at)
                    seq += count
                    good = base + pos + BATCH_HEAD_SIZE + plen
        seg.size = good
        seg.end_seq = seq
        seg.verified_upto = good
        size = os.path.getsize(seg.path)
        if good < size:
            # what the bytes set aside may have held: as many records as fit in them, or
            # as the first batch header there says if it is whole and sane (a torn write
            # may have cut off records it announces)
            held = _max_records(size - good)
            with open(seg.path, "rb") as f:
                f.seek(good)
                head = f.read(BATCH_HEAD_SIZE)
            if len(head) == BATCH_HEAD_SIZE:
                plen, _crc, first, count, _d, _f = _BATCH_HEAD.unpack(head)
                if first == seq and 0 < count * MIN_FRAME_SIZE <= plen <= _MAX_BATCH:
                    held = max(held, count)
            seg.set_aside_records = held
            self._set_aside_tail(seg, good, size, damage)

    def _set_aside_tail(self, seg: Segment, pos: int, size: int, damage: str) -> None:
        """Move the bytes of ``seg`` from ``pos`` on to a .bad file; truncate there."""
        bad = _free_name(f"{seg.path}.{pos}.bad")
        log.error(
            "STORE: %s: %s at byte %d; setting aside the %d bytes from there as %s",
            seg.path,
            damage,
            pos,
            size - pos,
            bad,
        )
        with open(seg.path, "r+b") as f:
            f.seek(pos)
            with open(bad, "wb") as out:
                while chunk := f.read(_SCAN_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        seg.set_aside += size - pos
        try:
            os.remove(seg.idx_path)  # made for the whole file
        except FileNotFoundError:
            pass

    def _set_aside(self, path: str, why: str) -> None:
        bad = _free_name(path + ".bad")
        log.error("STORE: setting aside %s as %s: %s", path, bad, why)
        os.replace(path, bad)
        try:
            os.remove(path[:-4] + ".idx")
        except OSError:
            pass

    def _new_segment(self, base_seq: int, base_offset: int, *, fsync: bool = True) -> Segment:
        path = os.path.join(self.directory, _segment_name(base_seq))
        with open(path, "wb") as f:
            f.write(_SEG_HEAD.pack(SEGMENT_MAGIC, base_seq, base_offset))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if fsync:
            fsync_dir(self.directory)
        return Segment(path, base_seq, base_offset, end_seq=base_seq)

    # -- positions --------------------------------------------------------------------

    @property
    def start(self) -> int:
        return self.segments[0].base_seq

    @property
    def end(self) -> int:
        return self.segments[-1].end_seq

    @property
    def end_offset(self) -> int:
        """Virtual offset just past the last record."""
        seg = self.segments[-1]
        return seg.base_offset + seg.size - SEG_HEAD_SIZE

    @property
    def next_offset(self) -> int:
        """The next append's first frame comes after its batch header."""
        return self.end_offset + BATCH_HEAD_SIZE

    @property
    def disk_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def __len__(self) -> int:
        return self.end - self.start

    # -- writing ----------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence the next staged batch gets (after those staged already)."""
        return self._staged_end if self._staged else self.end

    @property
    def staged(self) -> bool:
        """Whether batches wait for :meth:`commit`."""
        return bool(self._staged)

    def stage(
        self,
        chunk: bytes,
        ids: list[bytes] | None,
        deliver_at_ns: int = 0,
        stride: int = 0,
        kind: int = 0,
        merge: bool = True,
        count: int = 0,
    ) -> int:
        """Add a batch to the group that the next :meth:`commit` writes with one system
        call; returns the virtual offset its first frame will have. Readers see it once
        committed (``end`` does not count it before). Consecutive staged batches with
        the same deliver-at time and ``kind`` (frames of different kinds never share a
        stored batch) become one batch record: one header, one crc, one cache entry
        (small ones, up to 64 KiB: a batch of 16 KiB or more, an MPUB, is a record of
        its own, written without a copy). ``merge=False`` keeps the batch a record of
        its own (a follower stores its leader's records as they are, at the same
        offsets). ``ids`` None: ``count`` frames whose ids are read from the frames
        when first needed (a follower's records, which no consumer may ever read; only
        with ``merge=False``). Raises ValueError (nothing staged) if the frames do not
        tile the chunk."""
        if ids is not None:
            count = len(ids)
        elif merge:
            raise ValueError("a batch without ids must be a record of its own")
        if count <= 0:
            raise ValueError("an empty batch")  # a record holds one message or more
        starts = None
        if stride:
            if stride * count != len(chunk):
                raise ValueError("chunk length does not match its frames")
        else:
            starts = frame_starts(chunk, count)
        staged = self._staged
        if not staged:
            self._staged_end = self.end
            self._staged_offset = self.end_offset
        last = staged[-1] if staged else None
        if (
            merge
            and last is not None
            and not last.own
            and ids is not None
            and last.deliver_at == deliver_at_ns
            and last.kind == kind
            and len(chunk) < _MERGE_CHUNK
            and last.size + len(chunk) <= _MERGE_MAX
            and len(last.chunks[0]) < _MERGE_CHUNK
        ):
            offset = self._staged_offset
            last.add(chunk, ids, stride, starts)
        else:
            offset = self._staged_offset + BATCH_HEAD_SIZE
            batch = _StagedBatch(chunk, ids, stride, starts, deliver_at_ns, kind, count)
            batch.own = not merge
            staged.append(batch)
        self._staged_offset = offset + len(chunk)
        self._staged_end += count
        return offset

    def commit(self) -> int:
        """Write every staged batch record with one ``writev`` (so an acknowledged
        message is in the file, the OS page cache, and survives the process being
        killed); returns the number of records committed. On an OSError nothing staged
        is kept (their sequences are given again) and no partial record stays behind."""
        staged = self._staged
        if not staged:
            return 0
        self._staged = []
        seg = self.segments[-1]
        seq = seg.end_seq
        pos = seg.size
        buffers: list[bytes] = []
        cached_batches: list[CachedBatch] = []
        for st in staged:
            chunk, ids, stride, starts = st.batch()
            count = st.count
            deliver_at = st.deliver_at
            rest = _HEAD_REST_PACK(seq, count, deliver_at, 0)
            if len(chunk) <= _CRC_JOIN_MAX:
                crc = _CRC_VALUE(rest + chunk)
            else:
                crc = _CRC_EXTEND(_CRC_VALUE(rest), chunk)
            head = _LEN_CRC_PACK(len(chunk), crc) + rest
            offset = seg.base_offset + pos - SEG_HEAD_SIZE + BATCH_HEAD_SIZE
            cached_batches.append(CachedBatch(chunk, ids, stride, offset, starts, count))
            buffers.append(head)
            buffers.append(chunk)
            pos += BATCH_HEAD_SIZE + len(chunk)
            seq += count
        total = pos - seg.size
        if self._tail_dirty:
            # a failed write left bytes that could not be cut then: cut them first (the
            # file is appended to at its end, which must be the last whole record's)
            os.ftruncate(self._fd, seg.size)
            self._tail_dirty = False
        try:
            written = _writev_all(self._fd, buffers)
            if written != total:
                raise OSError(
                    errno.ENOSPC, f"short write to {seg.path}: {written} bytes (disk full?)"
                )
        except OSError:
            # leave no partial record behind: later batches must follow a whole one
            try:
                os.ftruncate(self._fd, seg.size)
            except OSError:
                self._tail_dirty = True
            raise
        cache = self.cache
        # each record's first sequence and position again, as the loop above went
        first = seg.end_seq
        at = seg.size
        for i in range(len(staged)):
            st = staged[i]
            cached = cached_batches[i]
            deliver_at = st.deliver_at
            seg.note_batch(first, at, deliver_at)
            if deliver_at:
                self._deferred.add(first, st.count, deliver_at)
            cache.append(cached)
            first += st.count
            at += BATCH_HEAD_SIZE + len(cached.chunk)
        if seg.verified_upto == seg.size:
            seg.verified_upto += total
        self.unsynced += seq - seg.end_seq
        seg.size = pos
        seg.end_seq = seq
        if len(cache) > self.cache_size + self._cache_slack:
            # trimming shifts the lists: do it every cache_size/4 records, not each time
            cache.trim_to(cache.end - self.cache_size)
        if seg.size >= self.max_bytes_per_file:
            try:
                self._roll()
            except OSError as err:
                # the batch is written: it must not be reported failed. This segment
                # grows until a roll succeeds (a full or read-only directory)
                if not self._roll_failing:
                    log.error("STORE: %s: cannot start a new segment: %s", self.directory, err)
                self._roll_failing = True
            else:
                self._roll_failing = False
        return len(staged)

    def drop_staged(self) -> None:
        """Forget what is staged, unwritten (its sequences are given again)."""
        self._staged = []

    def append(
        self, chunk: bytes, ids: list[bytes], deliver_at_ns: int = 0, stride: int = 0
    ) -> int:
        """Write one batch record now (after whatever was staged), as its own record."""
        self.commit()
        first = self.end
        self.stage(chunk, ids, deliver_at_ns, stride)
        self.commit()
        return first

    def _roll(self) -> None:
        """Seal the active segment (index file) and start the next one; the fsyncs
        are left to the next :meth:`sync` (``unsynced`` still counts the sealed
        segment's messages, so --sync-every / --sync-timeout call for it)."""
        seg = self.segments[-1]
        # nothing changes until every file is made (any step may fail on a full disk)
        self._write_index(seg)
        nxt = self._new_segment(
            seg.end_seq, seg.base_offset + seg.size - SEG_HEAD_SIZE, fsync=False
        )
        fd = os.open(nxt.path, os.O_WRONLY | os.O_APPEND)
        seg.sealed = True
        seg.last_write = time.time()  # retention counts from a segment's last write
        with self._sync_lock:
            self._sealed_fds.append((self._fd, seg.path))
            self._dir_dirty = True
            self._fd = fd
        self.segments.append(nxt)

    def _write_index(self, seg: Segment) -> None:
        idx = array("q", seg.index)
        if struct.pack("=q", 1) != struct.pack(">q", 1):
            idx.byteswap()
        body = idx.tobytes()
        data = struct.pack(">QQQ", seg.size, seg.end_seq, zlib.crc32(body)) + body
        tmp = seg.idx_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, seg.idx_path)

    @property
    def sync_pending(self) -> bool:
        """Whether a roll left segments or directory entries to fsync."""
        return bool(self._sealed_fds) or self._dir_dirty

    def sync(self) -> None:
        """fsync everything appended so far: segments sealed since the last sync (then
        closed), the directory entries of new segments, the active segment. Safe to
        call from a thread. An OSError is raised to the caller (the data is not known
        to be on disk) and kept: every later sync raises it too (see ``sync_error``)."""
        with self._syncing:
            self._sync()

    def _sync(self) -> None:
        if self.sync_error is not None:
            raise self.sync_error
        if self._closed:
            return
        with self._sync_lock:
            sealed, self._sealed_fds = self._sealed_fds, []
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            fd = self._fd
        try:
            while sealed:
                os.fsync(sealed[0][0])
                os.close(sealed.pop(0)[0])
            if fd >= 0:
                os.fsync(fd)
            if dir_dirty:
                fsync_dir(self.directory)
        except OSError as err:
            self.sync_error = err
            with self._sync_lock:  # close() closes them
                self._sealed_fds[:0] = sealed
            raise

    # -- reading ----------------------------------------------------------------------

    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        seq = max(seq, self.start)
        cache = self.cache
        if seq >= cache.start:
            return cache.read(seq, limit)
        return self._read_disk(seq, min(limit, cache.start - seq))

    def get(self, seq: int) -> bytes | None:
        if seq >= self.cache.start:
            return self.cache.get(seq)
        if seq < self.start:
            return None
        chunks, _ = self._read_disk(seq, 1)
        return chunks[0] if chunks else None

    def deferred_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        return self._deferred.between(lo, hi)

    def offset_of(self, seq: int) -> int | None:
        """One record's virtual offset (from memory when cached), or None if gone."""
        if seq >= self.cache.start:
            return self.cache.offset_of(seq)
        if seq < self.start:
            return None
        found = self.locate(seq)
        return found[0] if found is not None else None

    def _segment_for(self, seq: int) -> Segment | None:
        """The segment holding ``seq``, or the first one after it when ``seq`` is in a
        gap (sequences skipped after damage), or None past the end."""
        segs = self.segments
        i = bisect_right([s.base_seq for s in segs], seq) - 1
        while 0 <= i < len(segs):
            seg = segs[i]
            if seq < seg.end_seq:
                return seg
            i += 1  # a gap: continue at the next one
            if i < len(segs) and segs[i].base_seq > seq:
                return segs[i]
        return None

    def resume_at(self, seq: int) -> int:
        """The first sequence at or after ``seq`` that has a record (or the end): where
        a reader goes on when :meth:`read` finds none at ``seq`` (a gap left by damage,
        see the corruption policy above)."""
        seq = max(seq, self.start)
        cache_start = self.cache.start
        if seq >= cache_start:
            return seq
        seg = self._segment_for(seq)
        if seg is None:
            return cache_start
        return min(max(seq, seg.base_seq), cache_start)

    def _chunk_at(self, seg: Segment, pos: int, need: int) -> tuple[bytes, int]:
        """Bytes of ``seg`` from ``pos`` (at least ``need`` if the file has them), and the
        file position of their first byte."""
        path, cpos, data = self._chunk
        if path == seg.path and cpos <= pos and pos + need <= cpos + len(data):
            return data, cpos
        fd = self._read_fds.get(seg.path)
        if fd is None:
            fd = self._read_fds[seg.path] = os.open(seg.path, os.O_RDONLY)
        data = os.pread(fd, max(_READ_CHUNK, need), pos)
        self._chunk = (seg.path, pos, data)
        return data, pos

    def _head_at(self, seg: Segment, pos: int, expect: int) -> tuple[int, int, int]:
        """The header of the batch at file position ``pos`` of ``seg``, which must start
        with sequence ``expect``: (payload length, crc, count). Raises CorruptRecord
        when it is not what it must be."""
        buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
        off = pos - base
        if pos + BATCH_HEAD_SIZE > seg.size or off + BATCH_HEAD_SIZE > len(buf):
            raise CorruptRecord("a batch header past the segment's end")
        plen, crc, first, count, _deliver_at, _flags = _BATCH_HEAD.unpack_from(buf, off)
        if first != expect:
            raise CorruptRecord(f"sequence {first} where {expect} was expected")
        if pos + BATCH_HEAD_SIZE + plen > seg.size or not 0 < count * MIN_FRAME_SIZE <= plen:
            raise CorruptRecord(f"a batch of {count} records in {plen} bytes")
        return plen, crc, count

    def _batch_at(self, seg: Segment, pos: int, plen: int, crc: int) -> tuple[bytes, int]:
        """The whole batch at ``pos`` (its header read by :meth:`_head_at`): bytes that
        hold it from ``off`` on. A batch an earlier process wrote is crc-checked once."""
        buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
        off = pos - base
        if off + BATCH_HEAD_SIZE + plen > len(buf):
            raise CorruptRecord("the file is shorter than its records")
        if pos >= seg.verified_upto:
            check_batch(buf, off, plen, crc)
            if pos == seg.verified_upto:
                seg.verified_upto = pos + BATCH_HEAD_SIZE + plen
        return buf, off

    def _damaged(self, seg: Segment, pos: int, seq: int, err: Exception) -> None:
        """Damage found while reading at ``pos`` of ``seg``, where sequence ``seq`` must
        start: the segment's readable records end there (a gap up to the next segment);
        the one being written is sealed first, so the log's end never moves back."""
        log.error(
            "STORE: %s: corrupt record at byte %d (%s); sequences %d to %d of it are skipped",
            seg.path,
            pos,
            err,
            seq,
            seg.end_seq - 1,
        )
        if seg is self.segments[-1]:
            self._roll()  # appends go on at the same end, in a new segment
        seg.size = pos
        seg.end_seq = seq
        if self._chunk[0] == seg.path:
            self._chunk = ("", 0, b"")

    def _read_disk(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq`` on, from one segment's file: frames as
        chunks (a run of equal-sized frames of one batch is one chunk) and ids. Nothing
        when ``seq`` is in a gap (see :meth:`resume_at`)."""
        chunks: list[bytes] = []
        ids: list[bytes] = []
        seg = self._segment_for(seq)
        if seg is None or limit <= 0 or seq < seg.base_seq:
            return chunks, ids
        pos, first = seg.start_at(seq)
        try:
            while pos < seg.size and len(ids) < limit:
                plen, crc, count = self._head_at(seg, pos, first)
                if first + count > seq:
                    buf, off = self._batch_at(seg, pos, plen, crc)
                    skip = seq - first if seq > first else 0
                    take = min(count - skip, limit - len(ids))
                    self._cut_batch(
                        buf, off + BATCH_HEAD_SIZE, plen, count, skip, take, chunks, ids
                    )
                    seq = first + skip + take
                first += count
                pos += BATCH_HEAD_SIZE + plen
        except CorruptRecord as err:
            self._damaged(seg, pos, first, err)
            # what was cut before the damage is good; a partial batch is not taken
            return chunks, ids
        return chunks, ids

    @staticmethod
    def _cut_batch(
        buf: bytes,
        p0: int,
        plen: int,
        count: int,
        skip: int,
        take: int,
        chunks: list[bytes],
        ids: list[bytes],
    ) -> None:
        """Append frames ``skip .. skip+take`` of the batch payload at ``buf[p0:]``."""
        end = p0 + plen
        size = _equal_frames(buf, p0, plen, count)
        if size:
            # equal-sized frames (an MPUB's usual shape): one chunk; only ids are cut
            a = p0 + skip * size
            b = a + take * size
            chunks.append(buf[a:b])
            ids.extend([buf[o + 18 : o + 34] for o in range(a, b, size)])
            return
        frames = split_frames(memoryview(buf)[p0:end], count)[skip : skip + take]
        chunks.extend(frames)
        ids.extend([f[18:34] for f in frames])

    def read_range(
        self, seq: int, max_messages: int, max_bytes: int = 1 << 62, end: int | None = None
    ) -> list[tuple[int, int, bytes]]:
        """:meth:`read_frames` record by record, as (sequence, virtual offset, frame):
        the simple form, for tools and tests."""
        found = self.read_frames(seq, max_messages, max_bytes, end)
        out: list[tuple[int, int, bytes]] = []
        sizes = iter(found.sizes)
        for chunk, length, offset in zip(
            found.chunks, found.run_lengths, found.run_offsets, strict=True
        ):
            pos = 0
            for _ in range(length):
                size = next(sizes)
                out.append((found.first + len(out), offset + pos, chunk[pos : pos + size]))
                pos += size
        return out

    def read_frames(
        self, seq: int, max_messages: int, max_bytes: int = 1 << 62, end: int | None = None
    ) -> RangeFramesOut:
        """A stateless read for range consumers (Spark): up to ``max_messages`` records
        from ``seq`` (below ``end``), stopping once ``max_bytes`` of frames are taken (so
        at least one record if there is one). Reads through the files (the page cache),
        checks crcs like any read and touches no channel. The stored frames are cut once
        per stored batch (a run of equal-sized frames), with no work per message; a batch
        of unequal frames is cut frame by frame (one run each). The records are
        consecutive from ``first``, which is past ``seq`` if the records there are gone
        (a read stops at a gap left by damage, once it has records)."""
        seq = max(seq, self.start)
        out = RangeFramesOut(seq)
        stop = self.end if end is None else min(end, self.end)
        taken = 0
        while seq < stop and out.count < max_messages and taken < max_bytes:
            seg = self._segment_for(seq)
            if seg is None or (out.count and seg.base_seq > seq):
                break
            seq = max(seq, seg.base_seq)
            if not out.count:
                out.first = seq
            pos, first = seg.start_at(seq)
            progressed = False
            try:
                while (
                    pos < seg.size and seq < stop and out.count < max_messages and taken < max_bytes
                ):
                    plen, crc, count = self._head_at(seg, pos, first)
                    if first + count <= seq:
                        first += count
                        pos += BATCH_HEAD_SIZE + plen
                        continue
                    buf, off = self._batch_at(seg, pos, plen, crc)
                    base = pos - off
                    p0 = off + BATCH_HEAD_SIZE
                    vbase = seg.base_offset + base - SEG_HEAD_SIZE
                    skip = seq - first if seq > first else 0
                    room = min(count - skip, stop - seq, max_messages - out.count)
                    size = _equal_frames(buf, p0, plen, count)
                    if size:
                        # frames while fewer than max_bytes are taken, as for unequal ones
                        take = min(room, -(-(max_bytes - taken) // size))
                        a = p0 + skip * size
                        b = a + take * size
                        ts = _TS.unpack_from(buf, a + 8)[0]  # one publish: one timestamp
                        out.add_run(buf[a:b], take, size, vbase + a, ts)
                        taken += take * size
                    else:
                        frames = split_frames(memoryview(buf)[p0 : p0 + plen], count)
                        p = p0 + sum(len(f) for f in frames[:skip])
                        take = 0
                        for f in frames[skip : skip + room]:
                            if take and taken >= max_bytes:
                                break
                            out.add_run(f, 1, len(f), vbase + p, _TS.unpack_from(f, 8)[0])
                            p += len(f)
                            taken += len(f)
                            take += 1
                    seq = first + skip + take
                    if seq >= first + count:
                        first += count
                        pos += BATCH_HEAD_SIZE + plen
                    progressed = True
            except CorruptRecord as err:
                self._damaged(seg, pos, first, err)
                if out.count:
                    break
                continue  # nothing yet: go on after the gap
            if not progressed:
                break
        return out

    def _find(self, seq: int) -> tuple[Segment, int, int, int, int, bytes, int] | None:
        """The batch holding ``seq``: (segment, file position, first sequence, count,
        payload length, bytes, where they hold it), or None if ``seq`` has no record."""
        if seq < self.start:
            return None
        seg = self._segment_for(seq)
        if seg is None or seq < seg.base_seq:
            return None
        pos, first = seg.start_at(seq)
        try:
            while pos < seg.size:
                plen, crc, count = self._head_at(seg, pos, first)
                if first <= seq < first + count:
                    buf, off = self._batch_at(seg, pos, plen, crc)
                    return seg, pos, first, count, plen, buf, off
                first += count
                pos += BATCH_HEAD_SIZE + plen
        except CorruptRecord as err:
            self._damaged(seg, pos, first, err)
        return None

    def batch_start(self, seq: int) -> int | None:
        """The first sequence of the stored batch that holds ``seq`` (None if no record
        holds it: gone, in a gap, or past the end)."""
        if not self.start <= seq < self.end:
            return None
        if seq >= self.cache.start:
            return self.cache.batch_at(seq)[1]
        found = self._find(seq)
        return found[2] if found is not None else None

    def read_batches(self, seq: int, max_bytes: int) -> list[StoredBatch]:
        """Whole stored batches from ``seq`` on, as they were appended (replication ships
        them so a follower stores the same bytes at the same offsets), until at least
        ``max_bytes`` of frames are taken (at least one batch if there is one). ``seq``
        must be where a batch starts (ValueError otherwise); an empty list at the end."""
        if seq >= self.end:
            return []
        if seq < self.start:
            raise ValueError(f"sequence {seq} is gone (log starts at {self.start})")
        out: list[StoredBatch] = []
        taken = 0
        cache = self.cache
        while seq < self.end and (not out or taken < max_bytes):
            if seq >= cache.start:
                batch, first = cache.batch_at(seq)
                if first != seq:
                    raise ValueError(f"sequence {seq} is inside a batch starting at {first}")
                count = batch.count
                due = self._deferred.between(seq, seq + 1)
                deliver_at = due[0][1] if due else 0
                out.append(
                    StoredBatch(seq, count, batch.offset, deliver_at, batch.stride, batch.chunk)
                )
                taken += len(batch.chunk)
                seq += count
                continue
            try:
                found = self._disk_batch(seq)
            except ValueError:
                if not out:
                    raise
                break  # a gap (damage set aside): what comes before it goes first
            out.append(found)
            taken += len(found.chunk)
            seq += found.messages
        return out

    def _disk_batch(self, seq: int) -> StoredBatch:
        """The stored batch that starts at ``seq``, read from its segment file and
        crc-checked (replication ships it as it is). Damage found on the way is set
        aside as any read does (a gap, see :meth:`_damaged`): ValueError then."""
        seg = self._segment_for(seq)
        if seg is None or seg.base_seq > seq:
            raise ValueError(f"sequence {seq} is not in the log")
        pos, first = seg.start_at(seq)
        try:
            while pos < seg.size:
                plen, crc, count = self._head_at(seg, pos, first)
                if first + count <= seq:
                    pos += BATCH_HEAD_SIZE + plen
                    first += count
                    continue
                if first != seq:
                    raise ValueError(f"sequence {seq} is inside a batch starting at {first}")
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
                off = pos - base
                if off + BATCH_HEAD_SIZE + plen > len(buf):
                    raise CorruptRecord("the file is shorter than its records")
                check_batch(buf, off, plen, crc)
                deliver_at = _BATCH_HEAD.unpack_from(buf, off)[4]
                p0 = off + BATCH_HEAD_SIZE
                chunk = bytes(buf[p0 : p0 + plen])
                stride = _equal_frames(buf, p0, plen, count)
                offset = seg.base_offset + pos + BATCH_HEAD_SIZE - SEG_HEAD_SIZE
                return StoredBatch(first, count, offset, deliver_at, stride, chunk)
        except CorruptRecord as err:
            self._damaged(seg, pos, first, err)
            raise ValueError(f"sequence {seq} was in damaged records (set aside)") from None
        raise ValueError(f"sequence {seq} is not in {seg.path}")

    def reset(self, seq: int, offset: int) -> None:
        """Forget every record and start over empty at sequence ``seq``, the next
        record's frame at virtual offset ``offset`` (a follower too far behind its
        leader, whose log starts there now)."""
        if offset < BATCH_HEAD_SIZE:
            raise ValueError(f"offset {offset} is before the first batch header")
        self.close(sync=False)
        for name in os.listdir(self.directory):
            if name.endswith((".seg", ".idx")):
                os.remove(os.path.join(self.directory, name))
        log.warning("STORE: %s: reset to start at sequence %d", self.directory, seq)
        self._closed = False
        self.sync_error = None
        self._tail_dirty = self._roll_failing = False
        self.segments = [self._new_segment(seq, offset - BATCH_HEAD_SIZE)]
        self._deferred = DeferredIndex()
        self._fd = os.open(self.segments[0].path, os.O_WRONLY | os.O_APPEND)
        self.cache = BatchCache(seq)

    def truncate(self, seq: int) -> int:
        """Forget every record at or after ``seq`` (a follower's tail that its new leader
        never had): the files are cut at the batch that holds ``seq`` (so to its first
        sequence, if ``seq`` is inside a batch) and fsynced. Returns the new end."""
        self._staged = []  # (nothing staged survives a cut: Partition.truncate)
        if seq >= self.end:
            return self.end
        seq = max(seq, self.start)
        while len(self.segments) > 1 and self.segments[-1].base_seq >= seq:
            seg = self.segments.pop()
            with self._sync_lock:
                fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)
            self._close_reader(seg.path)
            for p in (seg.path, seg.idx_path):
                try:
                    os.remove(p)
                except FileNotFoundError:
                    pass
            log.warning("STORE: truncated: removed %s", seg.path)
            prev = self.segments[-1]
            self._forget_sealed(prev.path)
            prev.sealed = False
            try:
                os.remove(prev.idx_path)
            except FileNotFoundError:
                pass
            with self._sync_lock:
                self._fd = os.open(prev.path, os.O_WRONLY | os.O_APPEND)
        seg = self.segments[-1]
        pos = seg.start_at(seq)[0]
        cut = seg.end_seq
        while pos < seg.size:
            buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
            plen, _crc, first, count, _d, _f = _BATCH_HEAD.unpack_from(buf, pos - base)
            if first + count > seq:
                cut = first
                break
            pos += BATCH_HEAD_SIZE + plen
        if cut < seg.end_seq:
            log.warning("STORE: %s: truncating to sequence %d (byte %d)", seg.path, cut, pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
            self._close_reader(seg.path)
            seg.size = pos
            seg.end_seq = cut
            seg.verified_upto = min(seg.verified_upto, pos)
            idx = seg.index
            keep = 0
            while keep < len(idx) and idx[keep] < cut:
                keep += 3
            del idx[keep:]
            seg._last_indexed_pos = idx[-2] if idx else -INDEX_INTERVAL
        fsync_dir(self.directory)
        self._deferred.forget_from(self.end)
        self.cache = BatchCache(self.end)
        return self.end

    def first_id(self) -> tuple[int, bytes] | None:
        """The sequence and hex id of the oldest record, read from its file with one
        small read (no cache, no crc check: nsqd reads its id rule from it, see
        nsqx.nsqd.guid), or None if the log has no record."""
        for seg in self.segments:
            if seg.end_seq <= seg.base_seq:
                continue
            with open(seg.path, "rb") as f:
                f.seek(SEG_HEAD_SIZE)
                head = f.read(BATCH_HEAD_SIZE + MIN_FRAME_SIZE)
            if len(head) < BATCH_HEAD_SIZE + MIN_FRAME_SIZE:
                return None
            first = _BATCH_HEAD.unpack_from(head, 0)[2]
            return first, head[BATCH_HEAD_SIZE + 18 : BATCH_HEAD_SIZE + 34]
        return None

    def locate(self, seq: int) -> tuple[int, int] | None:
        """(virtual offset, timestamp ns) of the message at ``seq``, or None."""
        found = self._find(seq)
        if found is None:
            return None
        seg, pos, first, count, plen, buf, off = found
        p0 = off + BATCH_HEAD_SIZE
        size = _equal_frames(buf, p0, plen, count)
        if size:
            p = p0 + (seq - first) * size
        else:
            try:
                p = p0 + frame_starts(memoryview(buf)[p0 : p0 + plen], count)[seq - first]
            except ValueError as err:
                self._damaged(seg, pos, first, err)
                return None
        ts = _TS.unpack_from(buf, p + 8)[0]
        return seg.base_offset + (pos - off + p) - SEG_HEAD_SIZE, ts

    def seek_offset(self, offset: int) -> int:
        """The sequence of the first message at or after virtual offset ``offset``."""
        for seg in list(self.segments):
            if offset >= seg.base_offset + seg.size - SEG_HEAD_SIZE:
                continue
            # from the last indexed batch at or before the offset's file position
            target = offset - seg.base_offset + SEG_HEAD_SIZE
            pos, first = seg.start_at_pos(target)
            try:
                while pos < seg.size:
                    plen, crc, count = self._head_at(seg, pos, first)
                    p0 = pos + BATCH_HEAD_SIZE
                    if p0 + plen > target:  # frames at or after the target in this one
                        buf, off = self._batch_at(seg, pos, plen, crc)
                        b0 = off + BATCH_HEAD_SIZE
                        starts = frame_starts(memoryview(buf)[b0 : b0 + plen], count)
                        for k in range(count):
                            if p0 + starts[k] >= target:
                                return first + k
                    first += count
                    pos = p0 + plen
            except (CorruptRecord, ValueError) as err:
                self._damaged(seg, pos, first, err)
        return self.end

    def seek_time(self, timestamp_ns: int) -> int:
        """The sequence of the first message published at or after ``timestamp_ns``."""
        for seg in list(self.segments):
            if seg.end_seq == seg.base_seq:
                continue
            last = self.locate(seg.end_seq - 1)
            if last is None or last[1] < timestamp_ns:
                continue
            lo, hi = seg.base_seq, seg.end_seq - 1
            while lo < hi:  # publish times grow with the sequence
                mid = (lo + hi) // 2
                at = self.locate(mid)
                if at is not None and at[1] >= timestamp_ns:
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        return self.end

    # -- space ------------------------------------------------------------------------

    def trim(self, before: int) -> None:
        """Consumers are done below ``before``: release memory (files: :meth:`reclaim`)."""
        self.cache.trim(min(before, self.cache.end))

    def release(self, before: int) -> None:
        """Nothing: the memory cache is bounded by ``cache_size``."""

    @property
    def reclaim_floor(self) -> int | None:
        """The end of the oldest segment, if a newer one exists (else nothing to
        delete)."""
        segs = self.segments
        return segs[0].end_seq if len(segs) > 1 else None

    def reclaim(
        self,
        before: int,
        retention: float = 0.0,
        remove: Callable[[str], None] | None = None,
    ) -> int:
        """Delete sealed segments wholly below ``before`` and idle for ``retention``
        seconds. Returns the bytes freed. The files are unlinked by ``remove`` (nsqd
        passes one that runs in a thread: unlinking a 100 MB segment takes 5-30 ms),
        else at once."""
        freed = 0
        now = time.time()
        while len(self.segments) > 1:
            seg = self.segments[0]
            if not seg.sealed or seg.end_seq > before or now - seg.last_write < retention:
                break
            self.segments.pop(0)
            self._close_reader(seg.path)
            self._forget_sealed(seg.path)
            for p in (seg.path, seg.idx_path):
                (remove or remove_file)(p)
            freed += seg.size
            log.info("STORE: deleted %s", seg.path)
        self._deferred.forget_below(self.start)
        return freed

    def drop_before(self, seq: int) -> None:
        """Forget everything below ``seq`` now (a topic or channel emptied): roll so the
        active segment can go too, then reclaim."""
        if seq >= self.end and self.segments[-1].end_seq > self.segments[-1].base_seq:
            self._roll()
        self.cache.trim_to(min(seq, self.cache.end))
        self.reclaim(seq)

    def _forget_sealed(self, path: str) -> None:
        """A deleted segment needs no fsync: close its fd if a sync has not taken it yet
        (one that has closes it when done), so its disk space comes back now."""
        with self._sync_lock:
            gone = [fd for fd, p in self._sealed_fds if p == path]
            self._sealed_fds = [(fd, p) for fd, p in self._sealed_fds if p != path]
        for fd in gone:
            os.close(fd)

    def _close_reader(self, path: str) -> None:
        fd = self._read_fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        if self._chunk[0] == path:
            self._chunk = ("", 0, b"")

    def close(self, *, sync: bool = True) -> None:
        """fsync (unless ``sync`` is false) and close: a clean shutdown. Waits for a
        sync running in another thread; a failed fsync is raised after the files are
        closed. Staged batches are committed first (dropped without ``sync``)."""
        with self._syncing:
            try:
                if sync and not self._closed:
                    self.commit()
                    self._sync()
            finally:
                self._staged = []
                with self._sync_lock:
                    fds = [fd for fd, _ in self._sealed_fds] + [self._fd]
                    self._sealed_fds, self._fd = [], -1
                    self._closed = True
                for fd in fds:
                    if fd >= 0:
                        os.close(fd)
                for path in list(self._read_fds):
                    self._close_reader(path)

    def destroy(self) -> None:
        """Close and delete every file (the topic was deleted: nothing to fsync)."""
        self.close(sync=False)
        for name in os.listdir(self.directory):
            remove_file(os.path.join(self.directory, name))  # (a reclaim may race us)
        os.rmdir(self.directory)


def remove_file(path: str) -> None:
    """Unlink ``path`` if it is there."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def fsync_dir(path: str) -> None:
    """fsync a directory (its entries: files created, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
