"""DiskLog: a topic partition's durable, segmented, append-only log.

Layout of a partition directory::

    00000000000000000000.seg   segments, named by their first sequence
    00000000000000052417.seg
    00000000000000052417.idx   sparse index of a sealed segment (rebuilt if missing)

A segment starts with a 24-byte header (magic, first sequence, first virtual offset)
followed by batch records. A batch is what one PUB, MPUB or DPUB appended::

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

import logging
import os
import struct
import threading
import time
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

import google_crc32c

from nsqx.store.batchcache import BatchCache, CachedBatch
from nsqx.store.deferred import DeferredIndex
from nsqx.store.log import frame_starts

log = logging.getLogger("nsqx.store")

SEGMENT_MAGIC = b"NSQXSEG1"
_SEG_HEAD = struct.Struct(">8sQQ")
_BATCH_HEAD = struct.Struct(">IIQIqH")
SEG_HEAD_SIZE = _SEG_HEAD.size
BATCH_HEAD_SIZE = _BATCH_HEAD.size
_I32 = struct.Struct(">i")
_TS = struct.Struct(">q")
# one sparse index entry per this many bytes of a segment (plus one per deferred batch)
INDEX_INTERVAL = 4096
_READ_CHUNK = 256 * 1024
_SCAN_CHUNK = 4 * 1024 * 1024
# frame layout: size(4) type(4) timestamp(8) attempts(2) id(16) body
_ID = slice(18, 34)


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
    last_write: float = field(default_factory=time.time)
    _last_indexed_pos: int = -INDEX_INTERVAL

    @property
    def idx_path(self) -> str:
        return self.path[:-4] + ".idx"

    def note_batch(self, seq: int, pos: int, deliver_at: int) -> None:
        if deliver_at or pos - self._last_indexed_pos >= INDEX_INTERVAL:
            self.index.extend((seq, pos, deliver_at))
            self._last_indexed_pos = pos

    def start_pos(self, seq: int) -> int:
        """The file position of an indexed batch at or before ``seq``'s batch."""
        idx = self.index
        lo, hi = 0, len(idx) // 3
        while lo < hi:  # bisect on the seq column
            mid = (lo + hi) // 2
            if idx[mid * 3] <= seq:
                lo = mid + 1
            else:
                hi = mid
        return idx[(lo - 1) * 3 + 1] if lo else SEG_HEAD_SIZE


def _segment_name(base_seq: int) -> str:
    return f"{base_seq:020d}.seg"


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
        #: the first failed fsync, kept: after one, the kernel may have dropped the dirty
        #: pages and a later fsync would succeed without them, so no sync succeeds again
        self.sync_error: OSError | None = None
        self._read_fds: dict[str, int] = {}
        # the last chunk read from a file: (path, file position, bytes)
        self._chunk: tuple[str, int, bytes] = ("", 0, b"")
        self.unsynced = 0
        self.last_sync = time.monotonic()
        os.makedirs(directory, exist_ok=True)
        self._open()
        self.cache = BatchCache(self.end)

    # -- opening and recovery ---------------------------------------------------------

    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".seg"))
        for name in names:
            path = os.path.join(self.directory, name)
            seg = self._load_segment(path)
            if seg is not None:
                if self.segments and seg.base_seq < self.segments[-1].end_seq:
                    self._set_aside(path, "overlaps the previous segment")
                    continue
                self.segments.append(seg)
        if not self.segments:
            self.segments.append(self._new_segment(0, 0))
        for seg in self.segments[:-1]:
            seg.sealed = True
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
        """Read a segment through: rebuild its index, cut a torn or corrupt tail."""
        seq = seg.base_seq
        good = SEG_HEAD_SIZE
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
                        log.error(
                            "STORE: %s: corrupt record at byte %d (%s)", seg.path, base + pos, err
                        )
                        done = True
                        break
                    seg.note_batch(seq, base + pos, deliver_at)
                    if deliver_at:
                        self._deferred.add(seq, count, deliver_at)
                    seq += count
                    good = base + pos + BATCH_HEAD_SIZE + plen
        size = os.path.getsize(seg.path)
        if good < size:
            log.warning(
                "STORE: %s: cutting %d bytes after the last whole record (torn or corrupt tail)",
                seg.path,
                size - good,
            )
            with open(seg.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        seg.size = good
        seg.end_seq = seq
        seg.verified_upto = good

    def _set_aside(self, path: str, why: str) -> None:
        bad = path + ".bad"
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

    def append(
        self, chunk: bytes, ids: list[bytes], deliver_at_ns: int = 0, stride: int = 0
    ) -> int:
        seg = self.segments[-1]
        # checks the chunk before it is written; its frames start after the batch header
        offset = seg.base_offset + seg.size - SEG_HEAD_SIZE + BATCH_HEAD_SIZE
        cached = CachedBatch(chunk, ids, stride, offset)
        first = seg.end_seq
        count = len(ids)
        rest = _BATCH_HEAD.pack(0, 0, first, count, deliver_at_ns, 0)[8:]
        crc = google_crc32c.extend(google_crc32c.value(rest), chunk)
        head = struct.pack(">II", len(chunk), crc) + rest
        try:
            written = os.writev(self._fd, (head, chunk))
            if written != len(head) + len(chunk):
                raise OSError(f"short write to {seg.path}: {written} bytes (disk full?)")
        except OSError:
            # leave no partial record behind: later batches must follow a whole one
            os.ftruncate(self._fd, seg.size)
            raise
        seg.note_batch(first, seg.size, deliver_at_ns)
        if seg.verified_upto == seg.size:
            seg.verified_upto += written
        seg.size += written
        seg.end_seq = first + count
        self.unsynced += count
        if deliver_at_ns:
            self._deferred.add(first, count, deliver_at_ns)
        cache = self.cache
        cache.append(cached)
        if len(cache) > self.cache_size + self._cache_slack:
            # trimming shifts the lists: do it every cache_size/4 records, not each time
            cache.trim_to(cache.end - self.cache_size)
        if seg.size >= self.max_bytes_per_file:
            self._roll()
        return first

    def _roll(self) -> None:
        """Seal the active segment (index file) and start the next one; the fsyncs
        are left to the next :meth:`sync` (``unsynced`` still counts the sealed
        segment's messages, so --sync-every / --sync-timeout call for it)."""
        seg = self.segments[-1]
        self._write_index(seg)
        seg.sealed = True
        seg.last_write = time.time()  # retention counts from a segment's last write
        nxt = self._new_segment(
            seg.end_seq, seg.base_offset + seg.size - SEG_HEAD_SIZE, fsync=False
        )
        fd = os.open(nxt.path, os.O_WRONLY | os.O_APPEND)
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
        segs = self.segments
        i = bisect_right([s.base_seq for s in segs], seq) - 1
        while 0 <= i < len(segs):
            seg = segs[i]
            if seq < seg.end_seq:
                return seg
            i += 1  # a gap (segment set aside): continue at the next one
            if i < len(segs) and segs[i].base_seq > seq:
                return segs[i]
        return None

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

    def _read_disk(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq`` on, from one segment's file: frames as
        chunks (a run of equal-sized frames of one batch is one chunk) and ids."""
        chunks: list[bytes] = []
        ids: list[bytes] = []
        seg = self._segment_for(seq)
        if seg is None or limit <= 0:
            return chunks, ids
        seq = max(seq, seg.base_seq)
        pos = seg.start_pos(seq)
        while pos < seg.size and len(ids) < limit:
            buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
            off = pos - base
            if off + BATCH_HEAD_SIZE > len(buf):
                break
            plen, crc, first, count, _deliver_at, _flags = _BATCH_HEAD.unpack_from(buf, off)
            rec_end = pos + BATCH_HEAD_SIZE + plen
            if first + count <= seq:  # before the wanted sequence: skip the batch
                pos = rec_end
                continue
            if off + BATCH_HEAD_SIZE + plen > len(buf):
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
                off = pos - base
            skip = seq - first if seq > first else 0
            take = min(count - skip, limit - len(ids))
            try:
                if pos >= seg.verified_upto:
                    # written by an earlier process and not read since: check it once
                    check_batch(buf, off, plen, crc)
                    if pos == seg.verified_upto:
                        seg.verified_upto = rec_end
                self._cut_batch(buf, off + BATCH_HEAD_SIZE, plen, count, skip, take, chunks, ids)
            except CorruptRecord as err:
                log.error(
                    "STORE: %s: corrupt record at byte %d (%s); skipping the rest of the segment",
                    seg.path,
                    pos,
                    err,
                )
                seg.size = pos
                seg.end_seq = first
                break
            seq = first + count
            pos = rec_end
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
        ids.extend([f[_ID] for f in frames])

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
        (a read stops at a gap left by a segment set aside, once it has records)."""
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
            pos = seg.start_pos(seq)
            progressed = False
            while pos < seg.size and seq < stop and out.count < max_messages and taken < max_bytes:
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
                off = pos - base
                plen, crc, first, count, _d, _f = _BATCH_HEAD.unpack_from(buf, off)
                rec_end = pos + BATCH_HEAD_SIZE + plen
                if first + count <= seq:
                    pos = rec_end
                    continue
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
                off = pos - base
                if pos >= seg.verified_upto:
                    check_batch(buf, off, plen, crc)
                    if pos == seg.verified_upto:
                        seg.verified_upto = rec_end
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
                pos = rec_end if seq >= first + count else pos
                progressed = True
            if not progressed:
                break
        return out

    def locate(self, seq: int) -> tuple[int, int] | None:
        """(virtual offset, timestamp ns) of the message at ``seq``, or None."""
        seg = self._segment_for(seq)
        if seg is None:
            return None
        pos = seg.start_pos(seq)
        while pos < seg.size:
            buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
            off = pos - base
            plen, _crc, first, count, _d, _f = _BATCH_HEAD.unpack_from(buf, off)
            if first <= seq < first + count:
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
                off = pos - base
                p = off + BATCH_HEAD_SIZE
                size = _equal_frames(buf, p, plen, count)
                if size:
                    p += (seq - first) * size
                else:
                    for _ in range(seq - first):
                        p += 4 + _I32.unpack_from(buf, p)[0]
                ts = _TS.unpack_from(buf, p + 8)[0]
                return seg.base_offset + (base + p) - SEG_HEAD_SIZE, ts
            pos += BATCH_HEAD_SIZE + plen
        return None

    def seek_offset(self, offset: int) -> int:
        """The sequence of the first message at or after virtual offset ``offset``."""
        for seg in self.segments:
            seg_end = seg.base_offset + seg.size - SEG_HEAD_SIZE
            if offset >= seg_end:
                continue
            # start at the last indexed batch at or before the offset's file position
            target = offset - seg.base_offset + SEG_HEAD_SIZE
            idx = seg.index
            pos = SEG_HEAD_SIZE
            lo, hi = 0, len(idx) // 3
            while lo < hi:  # bisect on the file position column
                mid = (lo + hi) // 2
                if idx[mid * 3 + 1] <= target:
                    lo = mid + 1
                else:
                    hi = mid
            if lo:
                pos = idx[(lo - 1) * 3 + 1]
            while pos < seg.size:
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE)
                off = pos - base
                plen, _crc, first, count, _d, _f = _BATCH_HEAD.unpack_from(buf, off)
                buf, base = self._chunk_at(seg, pos, BATCH_HEAD_SIZE + plen)
                off = pos - base
                p = off + BATCH_HEAD_SIZE
                for k in range(count):
                    if seg.base_offset + (base + p) - SEG_HEAD_SIZE >= offset:
                        return int(first + k)
                    p += 4 + _I32.unpack_from(buf, p)[0]
                pos += BATCH_HEAD_SIZE + plen
        return self.end

    def seek_time(self, timestamp_ns: int) -> int:
        """The sequence of the first message published at or after ``timestamp_ns``."""
        for seg in self.segments:
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

    def reclaim(self, before: int, retention: float = 0.0) -> int:
        """Delete sealed segments wholly below ``before`` and idle for ``retention``
        seconds. Returns the bytes freed."""
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
                try:
                    os.remove(p)
                except FileNotFoundError:
                    pass
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
        closed."""
        with self._syncing:
            try:
                if sync and not self._closed:
                    self._sync()
            finally:
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
            os.remove(os.path.join(self.directory, name))
        os.rmdir(self.directory)


def fsync_dir(path: str) -> None:
    """fsync a directory (its entries: files created, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
