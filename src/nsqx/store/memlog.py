"""MemoryLog: a topic partition's records held in Python lists."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable

from nsqx.store.deferred import DeferredIndex
from nsqx.store.log import MessageLog, RangeFramesOut, split_chunk
from nsqx.wire.batch import StoredBatch
from nsqx.wire.frames import ATTEMPTS_AT, ID_AT, ID_END, TIMESTAMP_AT

# Trimming deletes from the front of a list (a memmove), so do it in big steps.
_TRIM_MIN = 4096


class MemoryLog(MessageLog):
    """An in-memory :class:`~nsqx.store.log.MessageLog`.

    Records live in two parallel lists (frames, ids); deferred ones (DPUB) are also
    listed in a :class:`DeferredIndex`. A record's virtual offset counts the bytes of
    the frames before it, as a DiskLog's would without batch headers. What only files
    need (sync, reclaim, close) does nothing here.
    """

    __slots__ = ("_base", "_deferred", "_end_offset", "_frames", "_ids", "_offsets")

    def __init__(self, start: int = 0) -> None:
        super().__init__()
        self._base = start
        self._frames: list[bytes] = []
        self._ids: list[bytes] = []
        self._offsets = array("q")
        self._end_offset = 0
        self._deferred = DeferredIndex()

    @property
    def durable(self) -> bool:
        """Never: records live in memory only (``#ephemeral`` topics)."""
        return False

    @property
    def start(self) -> int:
        return self._base

    @property
    def end(self) -> int:
        return self._base + len(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    def append(
        self, chunk: bytes, ids: list[bytes], deliver_at_ns: int = 0, stride: int = 0
    ) -> int:
        # held frame by frame: overflow (ephemeral topics) drops single records
        frames = split_chunk(chunk, len(ids), stride)
        first = self._base + len(self._frames)
        self._frames.extend(frames)
        self._ids.extend(ids)
        offsets = self._offsets
        pos = self._end_offset
        for f in frames:
            offsets.append(pos)
            pos += len(f)
        self._end_offset = pos
        if deliver_at_ns:
            self._deferred.add(first, len(frames), deliver_at_ns)
        return first

    @property
    def next_seq(self) -> int:
        return self.end

    @property
    def staged(self) -> bool:
        """Never: a stage is an append."""
        return False

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
        """Append now (there is nothing to write); returns the first frame's offset.
        ``ids`` None: the ``count`` frames' own ids."""
        offset = self._end_offset
        if ids is None:
            if count <= 0:
                raise ValueError("an empty batch")
            ids = [f[ID_AT:ID_END] for f in split_chunk(chunk, count, stride)]
        self.append(chunk, ids, deliver_at_ns, stride)
        return offset

    def commit(self) -> int:
        return 0

    def drop_staged(self) -> None:
        pass

    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        i = max(seq - self._base, 0)
        j = i + limit
        return self._frames[i:j], self._ids[i:j]

    def resume_at(self, seq: int) -> int:
        """Records are consecutive from ``start``: no gaps."""
        return max(seq, self._base)

    def get(self, seq: int) -> bytes | None:
        i = seq - self._base
        if 0 <= i < len(self._frames):
            return self._frames[i]
        return None

    @property
    def end_offset(self) -> int:
        return self._end_offset

    @property
    def next_offset(self) -> int:
        return self._end_offset

    def release(self, before: int) -> None:
        if self._frames:
            self.trim(before)

    def drop_before(self, seq: int) -> None:
        self.trim_to(seq)

    @property
    def reclaim_floor(self) -> int | None:
        return None  # memory is released as channels finish, not reclaimed

    def reclaim(
        self,
        before: int,
        retention: float = 0.0,
        remove: Callable[[str], None] | None = None,
    ) -> int:
        return 0

    @property
    def sync_pending(self) -> bool:
        return False

    def sync(self) -> None:
        """Nothing to make durable."""

    def close(self, *, sync: bool = True) -> None:
        pass

    def first_id(self) -> tuple[int, bytes] | None:
        """None: a memory log keeps no record across a restart, so no id rule to read."""
        return None

    def read_frames(
        self, seq: int, max_messages: int, max_bytes: int = 1 << 62, end: int | None = None
    ) -> RangeFramesOut:
        """Records from ``seq`` as runs of one frame each (a MemoryLog keeps no batches)."""
        i = max(seq, self._base) - self._base
        out = RangeFramesOut(self._base + i)
        stop = len(self._frames) if end is None else min(end - self._base, len(self._frames))
        taken = 0
        while i < stop and out.count < max_messages and taken < max_bytes:
            frame = self._frames[i]
            ts = int.from_bytes(frame[TIMESTAMP_AT:ATTEMPTS_AT], "big", signed=True)
            out.add_run(frame, 1, len(frame), self._offsets[i], ts)
            taken += len(frame)
            i += 1
        return out

    def destroy(self) -> None:
        self.drop_all()

    def offset_of(self, seq: int) -> int | None:
        i = seq - self._base
        if 0 <= i < len(self._offsets):
            return self._offsets[i]
        return None

    def seek_offset(self, offset: int) -> int:
        """The sequence of the first retained record at or after ``offset``."""
        return self._base + bisect_left(self._offsets, offset)

    def seek_time(self, timestamp_ns: int) -> int:
        """The sequence of the first retained record published at or after then."""
        frames = self._frames
        lo, hi = 0, len(frames)
        while lo < hi:
            mid = (lo + hi) // 2
            ts = int.from_bytes(frames[mid][TIMESTAMP_AT:ATTEMPTS_AT], "big", signed=True)
            if ts >= timestamp_ns:
                hi = mid
            else:
                lo = mid + 1
        return self._base + lo

    def batch_start(self, seq: int) -> int | None:
        """Every record is a batch of its own here."""
        return seq if self.start <= seq < self.end else None

    def read_batches(self, seq: int, max_bytes: int) -> list[StoredBatch]:
        """Records from ``seq`` as one-record batches (a MemoryLog keeps no batches)."""
        out: list[StoredBatch] = []
        taken = 0
        i = seq - self._base
        if i < 0:
            raise ValueError(f"sequence {seq} is gone (log starts at {self._base})")
        while i < len(self._frames) and (not out or taken < max_bytes):
            frame = self._frames[i]
            due = self._deferred.between(self._base + i, self._base + i + 1)
            out.append(
                StoredBatch(
                    self._base + i, 1, self._offsets[i], due[0][1] if due else 0, len(frame), frame
                )
            )
            taken += len(frame)
            i += 1
        return out

    def reset(self, seq: int, offset: int) -> None:
        """Forget every record; the next gets sequence ``seq`` at virtual ``offset``."""
        self._frames.clear()
        self._ids.clear()
        del self._offsets[:]
        self._base = seq
        self._end_offset = offset
        self._deferred = DeferredIndex()

    def truncate(self, seq: int) -> int:
        """Forget every record at or after ``seq``; returns the new end."""
        i = max(seq - self._base, 0)
        if i < len(self._frames):
            self._end_offset = self._offsets[i]
            del self._frames[i:]
            del self._ids[i:]
            del self._offsets[i:]
            self._deferred.forget_from(self.end)
        return self.end

    def deferred_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        return self._deferred.between(lo, hi)

    def trim(self, before: int) -> None:
        n = min(before - self._base, len(self._frames))
        # small trims are deferred until they add up, except one that empties the log
        if n < _TRIM_MIN and n < len(self._frames):
            return
        self.trim_to(before)

    def drop_all(self) -> None:
        """Forget every record (topic emptied); sequences keep growing."""
        self.trim_to(self.end)

    def trim_to(self, before: int) -> None:
        """Trim exactly (no batching): used when emptying and bounding ephemeral topics."""
        n = min(before - self._base, len(self._frames))
        if n <= 0:
            return
        del self._frames[:n]
        del self._ids[:n]
        del self._offsets[:n]
        self._base += n
        self._deferred.forget_below(self._base)
