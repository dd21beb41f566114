"""DiskLog: a topic partition's durable, segmented, append-only log.

The log is a directory of segment files (:mod:`nsqx.store.segment`) holding batch
records (:mod:`nsqx.store.record`); this module is the log itself: appending (staged
batches, :mod:`nsqx.store.staging`, written by one ``writev`` per group commit), syncing,
reading (every file read is one walk, :mod:`nsqx.store.walk`), seeking, reclaiming space
and the cuts replication needs. Opening it after a stop, and what happens to damage,
is :mod:`nsqx.store.recovery`.

Storing frames means a publish is one join and one write, and a read from disk splits
the payload at the frames' own size prefixes.

Positions: a message's *sequence* counts messages over the partition's life (ids are
built from it); its *virtual offset* is the byte position of its frame in the
partition's life (segment base offset + position in the file). Both only grow.

The newest records are also kept in memory (a :class:`BatchCache` bounded by
``cache_size`` messages), so consumers that keep up never touch the files.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable

from nsqx.store.batchcache import BatchCache, CachedBatch
from nsqx.store.deferred import DeferredIndex
from nsqx.store.durable_file import fsync_dir, makedirs_durable
from nsqx.store.fsutil import remove_file
from nsqx.store.lease import LEASE_BYTES, LEASE_SEQUENCES, SequenceLease
from nsqx.store.log import MessageLog, RangeFramesOut, frame_starts
from nsqx.store.record import (
    BATCH_HEAD,
    BATCH_HEAD_SIZE,
    TS,
    CorruptRecord,
    batch_head,
    equal_frames,
    split_frames,
)
from nsqx.store.recovery import open_segments
from nsqx.store.segment import SEG_HEAD_SIZE, Segment, new_segment, segment_name, write_index
from nsqx.store.staging import MERGE_CHUNK, MERGE_MAX, StagedBatch, writev_all
from nsqx.store.walk import BatchWalk, SegmentReader
from nsqx.wire.batch import StoredBatch
from nsqx.wire.frames import ID_AT, ID_END, TIMESTAMP_AT

__all__ = [
    "BATCH_HEAD_SIZE",
    "SEG_HEAD_SIZE",
    "CorruptRecord",
    "DiskLog",
    "RangeFramesOut",
    "remove_file",
    "segment_name",
]

log = logging.getLogger("nsqx.store")


class DiskLog(MessageLog):
    """A :class:`~nsqx.store.log.MessageLog` kept in segment files.

    ``append`` writes each batch with one ``os.write`` before it returns, so an
    acknowledged message is in the file (the OS page cache) and survives the process
    being killed; :meth:`sync` makes it survive a power loss (nsqd calls it per
    --sync-every / --sync-timeout, from a thread). A roll to a new segment does no
    fsync on the caller's thread: the sealed segment, the new one and the directory
    are fsynced by the next :meth:`sync` (a 100 MB segment's fsync takes tens of ms).

    Damage found when the log is opened, or while reading, is set aside by the
    corruption policy (:mod:`nsqx.store.recovery`) and listed in ``set_aside``.
    ``skip_lost`` (a single node's log): the sequences that bytes set aside at the
    log's end may have held are skipped, so that no id is ever given twice; a replica
    opens its log with ``skip_lost=False``: it ends at its last whole record, and its
    leader ships what follows.
    """

    def __init__(
        self,
        directory: str,
        *,
        max_bytes_per_file: int = 100 * 1024 * 1024,
        cache_size: int = 10000,
        skip_lost: bool = True,
    ) -> None:
        super().__init__()
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
        self._reader = SegmentReader(self.set_aside.append)
        self.last_sync = time.monotonic()
        # batches waiting for commit(), the sequence and virtual offset after them
        self._staged: list[StagedBatch] = []
        self._staged_end = 0
        self._staged_offset = 0
        makedirs_durable(directory)  # (the topic's and the partition's directories)
        #: how far sequences and offsets may have been given out (a single node's log:
        #: a replica's come from its leader)
        self._lease: SequenceLease | None = SequenceLease(directory) if skip_lost else None
        leased = (self._lease.seq, self._lease.offset) if self._lease is not None else (0, 0)
        self.segments = open_segments(
            directory, self._deferred, self.set_aside, skip_lost=skip_lost, leased=leased
        )
        self._fd = os.open(self.segments[-1].path, os.O_WRONLY | os.O_APPEND)
        self.cache = BatchCache(self.end)

    def __repr__(self) -> str:
        return f"<DiskLog {self.directory}>"

    # -- positions --------------------------------------------------------------------

    @property
    def durable(self) -> bool:
        """Always: records are in files and survive a restart."""
        return True

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
            and len(chunk) < MERGE_CHUNK
            and last.size + len(chunk) <= MERGE_MAX
            and len(last.chunks[0]) < MERGE_CHUNK
        ):
            offset = self._staged_offset
            last.add(chunk, ids, stride, starts)
        else:
            offset = self._staged_offset + BATCH_HEAD_SIZE
            batch = StagedBatch(chunk, ids, stride, starts, deliver_at_ns, kind, count)
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
            head = batch_head(chunk, seq, count, deliver_at)
            offset = seg.base_offset + pos - SEG_HEAD_SIZE + BATCH_HEAD_SIZE
            cached_batches.append(CachedBatch(chunk, ids, stride, offset, starts, count))
            buffers.append(head)
            buffers.append(chunk)
            pos += BATCH_HEAD_SIZE + len(chunk)
            seq += count
        total = pos - seg.size
        lease = self._lease
        if lease is not None and lease.needs(seq, seg.base_offset + pos - SEG_HEAD_SIZE):
            # (the sync renews it long before this: only a stalled sync gets here)
            self._renew_lease(seq, seg.base_offset + pos - SEG_HEAD_SIZE)
        if self._tail_dirty:
            # a failed write left bytes that could not be cut then: cut them first (the
            # file is appended to at its end, which must be the last whole record's)
            os.ftruncate(self._fd, seg.size)
            self._tail_dirty = False
        try:
            written = writev_all(self._fd, buffers)
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
        write_index(seg)
        nxt = new_segment(
            self.directory, seg.end_seq, seg.base_offset + seg.size - SEG_HEAD_SIZE, fsync=False
        )
        fd = os.open(nxt.path, os.O_WRONLY | os.O_APPEND)
        seg.sealed = True
        seg.last_write = time.time()  # retention counts from a segment's last write
        with self._sync_lock:
            self._sealed_fds.append((self._fd, seg.path))
            self._dir_dirty = True
            self._fd = fd
        self.segments.append(nxt)

    @property
    def sync_pending(self) -> bool:
        """Whether a roll left segments or directory entries to fsync."""
        return bool(self._sealed_fds) or self._dir_dirty

    def sync(self) -> None:
        """fsync everything appended so far: segments sealed since the last sync (then
        closed), the directory entries of new segments, the active segment; and renew
        the sequence lease when half of it is used. Safe to call from a thread. An
        OSError is raised to the caller (the data is not known to be on disk) and kept:
        every later sync raises it too (see ``sync_error``)."""
        with self._syncing:
            self._sync()
            lease = self._lease
            if lease is not None and not self._closed:
                end, end_offset = self.end, self.end_offset
                if lease.needs(end + LEASE_SEQUENCES // 2, end_offset + LEASE_BYTES // 2):
                    self._renew_lease(end, end_offset)

    def _renew_lease(self, seq: int, offset: int) -> None:
        """Lease sequences and offsets ahead of ``seq`` and ``offset`` before they are
        given out (see nsqx.store.lease). The first commit after the log is opened
        takes the first lease: an idle log writes none."""
        if self._lease is not None:
            self._lease.set(seq + LEASE_SEQUENCES, offset + LEASE_BYTES)

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

    def missing_between(self, lo: int, hi: int) -> int:
        """Sequences in ``lo .. hi-1`` without a record: between segments (a skip
        after damage or a crash) and in holes (a damaged record). Rare, so a walk over
        the segments, with no state to keep in step."""
        lo = max(lo, self.start)
        if lo >= hi:
            return 0
        missing = 0
        prev_end: int | None = None
        for seg in self.segments:
            if prev_end is not None and seg.base_seq > prev_end:
                missing += _overlap(prev_end, seg.base_seq, lo, hi)
            prev_end = seg.end_seq
            if seg.holes is not None:
                for _end, first, nxt in seg.holes.values():
                    missing += _overlap(first, nxt, lo, hi)
        return missing

    def resume_at(self, seq: int) -> int:
        """The first sequence at or after ``seq`` that has a record (or the end): where
        a reader goes on when :meth:`read` finds none at ``seq`` (a gap left by damage,
        between segments or in a hole: see the corruption policy in
        nsqx.store.recovery)."""
        seq = max(seq, self.start)
        cache_start = self.cache.start  # (the cache's records are whole, in memory)
        if seq >= cache_start:
            return seq
        while True:
            seg = self._segment_for(seq)
            if seg is None:
                return cache_start
            seq = max(seq, seg.base_seq)
            hole = seg.hole_holding(seq) if seg.holes is not None else None
            if hole is None:
                return min(seq, cache_start)
            seq = hole[3]  # past it (to the segment's end, if no record follows it)
            if seq >= cache_start:
                return cache_start

    def _read_disk(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq`` on, from one segment's file: frames as
        chunks (a run of equal-sized frames of one batch is one chunk) and ids. Nothing
        when ``seq`` is in a gap (see :meth:`resume_at`)."""
        chunks: list[bytes] = []
        ids: list[bytes] = []
        seg = self._segment_for(seq)
        if seg is None or limit <= 0 or seq < seg.base_seq:
            return chunks, ids
        walk = self._reader.walk(seg, seq)
        while len(ids) < limit and walk.advance():
            first = walk.first
            if first > seq:
                break  # a hole: what is read is consecutive from the sequence asked
            skip = seq - first
            take = min(walk.count - skip, limit - len(ids))
            try:
                self._cut_batch(
                    walk.buf,
                    walk.off + BATCH_HEAD_SIZE,
                    walk.plen,
                    walk.count,
                    skip,
                    take,
                    chunks,
                    ids,
                )
            except CorruptRecord as err:
                # what was cut before the damage is good; a partial batch is not taken
                walk.damaged(err)
                break
            seq = first + skip + take
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
        size = equal_frames(buf, p0, plen, count)
        if size:
            # equal-sized frames (an MPUB's usual shape): one chunk; only ids are cut
            a = p0 + skip * size
            b = a + take * size
            chunks.append(buf[a:b])
            # (a local length, not ID_END's global lookup per id in pure Python)
            idlen = ID_END - ID_AT
            ids.extend([buf[o : o + idlen] for o in range(a + ID_AT, b + ID_AT, size)])
            return
        frames = split_frames(memoryview(buf)[p0:end], count)[skip : skip + take]
        chunks.extend(frames)
        lo, hi = ID_AT, ID_END
        ids.extend([f[lo:hi] for f in frames])

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
            walk = self._reader.walk(seg, seq)
            budget = False  # a budget ran out
            while seq < stop:
                if not walk.advance():
                    break
                buf = walk.buf
                first = walk.first
                if first > seq:  # a hole passed over: the records after it go next time
                    if out.count:
                        return out
                    seq = first
                    if seq >= stop:
                        break
                count = walk.count
                plen = walk.plen
                p0 = walk.off + BATCH_HEAD_SIZE
                vbase = seg.base_offset + walk.pos - walk.off - SEG_HEAD_SIZE
                skip = seq - first
                room = min(count - skip, stop - seq, max_messages - out.count)
                size = equal_frames(buf, p0, plen, count)
                if size:
                    # frames while fewer than max_bytes are taken, as for unequal ones
                    take = min(room, -(-(max_bytes - taken) // size))
                    a = p0 + skip * size
                    b = a + take * size
                    ts = TS.unpack_from(buf, a + TIMESTAMP_AT)[0]  # one publish: one timestamp
                    if not out.count:
                        out.first = seq
                    out.add_run(buf[a:b], take, size, vbase + a, ts)
                    taken += take * size
                else:
                    try:
                        frames = split_frames(memoryview(buf)[p0 : p0 + plen], count)
                    except CorruptRecord as err:
                        walk.damaged(err)
                        break
                    if not out.count:
                        out.first = seq
                    p = p0 + sum(len(f) for f in frames[:skip])
                    take = 0
                    for f in frames[skip : skip + room]:
                        if take and taken >= max_bytes:
                            break
                        out.add_run(f, 1, len(f), vbase + p, TS.unpack_from(f, TIMESTAMP_AT)[0])
                        p += len(f)
                        taken += len(f)
                        take += 1
                seq = first + skip + take
                if seq < first + count or out.count >= max_messages or taken >= max_bytes:
                    budget = True
                    break
            if budget or seq >= stop:
                break
            if walk.broken:
                if out.count:
                    break
                continue  # its batch is a hole now: the next walk passes over it
            if walk.first > seq:  # the segment ends in a hole
                if out.count:
                    break
                seq = walk.first
            seq = max(seq, seg.end_seq)  # on to the next segment
        if not out.count:
            out.first = seq
        return out

    def _find(self, seq: int) -> BatchWalk | None:
        """A walk at the batch holding ``seq`` (loaded), or None if ``seq`` has no
        record."""
        if seq < self.start:
            return None
        seg = self._segment_for(seq)
        if seg is None or seq < seg.base_seq:
            return None
        walk = self._reader.walk(seg, seq)
        return walk if walk.advance() and walk.first <= seq else None

    def batch_start(self, seq: int) -> int | None:
        """The first sequence of the stored batch that holds ``seq`` (None if no record
        holds it: gone, in a gap, or past the end)."""
        if not self.start <= seq < self.end:
            return None
        if seq >= self.cache.start:
            return self.cache.batch_at(seq)[1]
        found = self._find(seq)
        return found.first if found is not None else None

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
        aside as any read does (a hole, see nsqx.store.walk): ValueError then."""
        seg = self._segment_for(seq)
        if seg is None or seg.base_seq > seq:
            raise ValueError(f"sequence {seq} is not in the log")
        walk = self._reader.walk(seg, seq)
        if not walk.advance() or walk.first > seq:
            if seg.hole_holding(seq) is not None:
                raise ValueError(f"sequence {seq} was in damaged records (set aside)")
            raise ValueError(f"sequence {seq} is not in {seg.path}")
        first = walk.first
        if first != seq:
            raise ValueError(f"sequence {seq} is inside a batch starting at {first}")
        buf = walk.buf
        off = walk.off
        plen = walk.plen
        count = walk.count
        deliver_at = BATCH_HEAD.unpack_from(buf, off)[4]
        p0 = off + BATCH_HEAD_SIZE
        chunk = bytes(buf[p0 : p0 + plen])
        stride = equal_frames(buf, p0, plen, count)
        offset = seg.base_offset + walk.pos + BATCH_HEAD_SIZE - SEG_HEAD_SIZE
        return StoredBatch(first, count, offset, deliver_at, stride, chunk)

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
        self.segments = [new_segment(self.directory, seq, offset - BATCH_HEAD_SIZE)]
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
            self._reader.close_file(seg.path)
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
        walk = self._reader.walk(seg, seq, load=False)
        found = walk.advance()  # (damage found on the way becomes a hole)
        hole = seg.hole_holding(seq) if seg.holes is not None else None
        if hole is not None:  # a hole held seq: cut where it starts
            pos, cut = hole[0], hole[2]
        elif found:  # the batch that holds seq
            cut, pos = walk.first, walk.pos
        else:  # seq is past the segment's records (in a gap after them)
            cut, pos = seg.end_seq, seg.size
        # (a file longer than its records holds a failed write's bytes: cut too)
        if cut < seg.end_seq or os.fstat(self._fd).st_size > pos:
            log.warning("STORE: %s: truncating to sequence %d (byte %d)", seg.path, cut, pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
            self._reader.close_file(seg.path)
            seg.size = pos
            seg.end_seq = cut
            seg.forget_index_from(cut)
            seg.forget_holes_from(pos)
        fsync_dir(self.directory)
        self._deferred.forget_from(self.end)
        self.cache = BatchCache(self.end)
        return self.end

    def first_id(self) -> tuple[int, bytes] | None:
        """The sequence and hex id of the oldest record, read from its file (no cache:
        nsqd reads its id rule from it, see nsqx.nsqd.guid; crc-checked, past damage),
        or None if the log has no record."""
        for seg in self.segments:
            if seg.end_seq <= seg.base_seq:
                continue
            walk = self._reader.walk(seg, seg.base_seq)
            if walk.advance():
                p = walk.off + BATCH_HEAD_SIZE
                return walk.first, bytes(walk.buf[p + ID_AT : p + ID_END])
        return None

    def locate(self, seq: int) -> tuple[int, int] | None:
        """(virtual offset, timestamp ns) of the message at ``seq``, or None."""
        walk = self._find(seq)
        if walk is None:
            return None
        buf = walk.buf
        first = walk.first
        count = walk.count
        plen = walk.plen
        p0 = walk.off + BATCH_HEAD_SIZE
        size = equal_frames(buf, p0, plen, count)
        if size:
            p = p0 + (seq - first) * size
        else:
            try:
                p = p0 + frame_starts(memoryview(buf)[p0 : p0 + plen], count)[seq - first]
            except ValueError as err:
                walk.damaged(err)
                return None
        ts = TS.unpack_from(buf, p + TIMESTAMP_AT)[0]
        return walk.seg.base_offset + (walk.pos - walk.off + p) - SEG_HEAD_SIZE, ts

    def seek_offset(self, offset: int) -> int:
        """The sequence of the first message at or after virtual offset ``offset``."""
        for seg in list(self.segments):
            if offset >= seg.base_offset + seg.size - SEG_HEAD_SIZE:
                continue
            # from the last indexed batch at or before the offset's file position
            target = offset - seg.base_offset + SEG_HEAD_SIZE
            walk = self._reader.walk_to_pos(seg, target)
            # the first batch with frames past the target, then the ones after it: a
            # target inside a batch's last frame is answered by the next batch's first
            while walk.advance():
                b0 = walk.off + BATCH_HEAD_SIZE
                p0 = walk.pos + BATCH_HEAD_SIZE
                try:
                    starts = frame_starts(memoryview(walk.buf)[b0 : b0 + walk.plen], walk.count)
                except ValueError as err:
                    walk.damaged(err)  # a hole now: walk again, past it
                    walk = self._reader.walk_to_pos(seg, target)
                    continue
                for k in range(walk.count):
                    if p0 + starts[k] >= target:
                        return walk.first + k
        return self.end

    def seek_time(self, timestamp_ns: int) -> int:
        """The sequence of the first message published at or after ``timestamp_ns``."""
        lo, hi = self.start, self.end
        while lo < hi:  # publish times grow with the sequence
            mid = (lo + hi) // 2
            if self._time_from(mid) >= timestamp_ns:
                hi = mid
            else:
                lo = mid + 1
        return self.resume_at(lo) if lo < self.end else self.end

    def _time_from(self, seq: int) -> int:
        """The publish time of the first record at or after ``seq`` (past a gap), or one
        later than any if there is none."""
        while seq < self.end:
            found = self.locate(seq)
            if found is not None:
                return found[1]
            nxt = self.resume_at(seq)
            if nxt <= seq:
                break
            seq = nxt
        return 1 << 62

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
            self._reader.close_file(seg.path)
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

    def close(self, *, sync: bool = True) -> None:
        """fsync (unless ``sync`` is false) and close: a clean shutdown. Waits for a
        sync running in another thread; a failed fsync is raised after the files are
        closed. Staged batches are committed first (dropped without ``sync``)."""
        with self._syncing:
            try:
                if sync and not self._closed:
                    self.commit()
                    self._sync()
                    lease = self._lease
                    if lease is not None and (
                        lease.seq > self.end or lease.offset > self.end_offset
                    ):
                        # everything given out is on disk: a restart skips nothing
                        lease.set(self.end, self.end_offset)
            finally:
                if self._lease is not None:
                    self._lease.close()
                self._staged = []
                with self._sync_lock:
                    fds = [fd for fd, _ in self._sealed_fds] + [self._fd]
                    self._sealed_fds, self._fd = [], -1
                    self._closed = True
                for fd in fds:
                    if fd >= 0:
                        os.close(fd)
                self._reader.close()

    def destroy(self) -> None:
        """Close and delete every file (the topic was deleted: nothing to fsync)."""
        self.close(sync=False)
        for name in os.listdir(self.directory):
            remove_file(os.path.join(self.directory, name))  # (a reclaim may race us)
        os.rmdir(self.directory)


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    """How many of ``a .. b-1`` lie in ``lo .. hi-1``."""
    return max(0, min(b, hi) - max(a, lo))
