"""BatchCache: a DiskLog's newest records, kept as the batches they were appended in.

A batch (one PUB, MPUB or DPUB) is held as the one bytes object that was written to
the file: its frames, concatenated. So an append adds two objects, not two per
message, and a consumer that keeps up is handed whole batches without a copy (a read
that starts or ends inside a batch slices it). Frames are cut by arithmetic when they
are all one size (an MPUB's usual shape), else by their size prefixes, found once.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Final

from nsqx.store.log import frame_starts
from nsqx.wire.frames import ID_AT, ID_END

# Trimming deletes from the front of lists: do it in steps of at least this many records.
_TRIM_MIN: Final = 4096


class CachedBatch:
    """One batch as the cache holds it. Made before the batch is written, so that a
    chunk whose frames do not tile it (ValueError) is refused before anything changes."""

    __slots__ = ("_ids", "chunk", "count", "offset", "starts", "stride")

    def __init__(
        self,
        chunk: bytes,
        ids: list[bytes] | None,
        stride: int = 0,
        offset: int = 0,
        starts: array[int] | None = None,
        count: int = 0,
    ) -> None:
        """``ids`` None: ``count`` frames, whose ids are read from the frames the first
        time they are asked for (a follower's records: no consumer may ever read them)."""
        if ids is not None:
            count = len(ids)
        if stride and stride * count != len(chunk):
            raise ValueError("chunk length does not match its frames")
        self.chunk = chunk
        self._ids = ids
        #: frames in the batch
        self.count = count
        self.stride = stride
        #: the virtual offset of the first frame (set by the log that appends it)
        self.offset = offset
        # frame start positions (count + 1 of them) when sizes differ; ``starts`` when
        # the caller found them already (checked: they tile the chunk)
        if stride:
            starts = None
        elif starts is None:
            starts = frame_starts(chunk, count)
        self.starts: array[int] | None = starts

    @property
    def ids(self) -> list[bytes]:
        """The frames' message ids."""
        ids = self._ids
        if ids is None:
            chunk = self.chunk
            starts = self.starts
            if starts is None:
                stride = self.stride
                ids = [chunk[o + ID_AT : o + ID_END] for o in range(0, len(chunk), stride)]
            else:
                ids = [chunk[o + ID_AT : o + ID_END] for o in starts[:-1]]
            self._ids = ids
        return ids

    def frame_offset(self, a: int) -> int:
        """The virtual offset of frame ``a``."""
        if self.stride:
            return self.offset + a * self.stride
        starts = self.starts
        assert starts is not None
        return self.offset + starts[a]

    def cut(self, a: int, b: int) -> bytes:
        """Frames ``a .. b`` of the batch as one bytes object (the batch itself if all)."""
        if a == 0 and b == self.count:
            return self.chunk
        if self.stride:
            return self.chunk[a * self.stride : b * self.stride]
        starts = self.starts
        assert starts is not None
        return self.chunk[starts[a] : starts[b]]


class BatchCache:
    """Records ``start .. end`` of a log, by batch. Not thread-safe (the event loop's)."""

    __slots__ = ("_batches", "_end", "_firsts", "_start")

    def __init__(self, start: int = 0) -> None:
        self._start = start
        self._end = start
        self._firsts: list[int] = []  # first sequence of each batch, ascending
        self._batches: list[CachedBatch] = []

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, batch: CachedBatch) -> int:
        """Add a batch; returns its first sequence."""
        first = self._end
        if batch.count:
            self._firsts.append(first)
            self._batches.append(batch)
            self._end = first + batch.count
        return first

    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq``: chunks of consecutive frames, and ids."""
        seq = max(seq, self._start)
        chunks: list[bytes] = []
        ids: list[bytes] = []
        if seq >= self._end or limit <= 0:
            return chunks, ids
        firsts, batches = self._firsts, self._batches
        i = bisect_right(firsts, seq) - 1
        left = limit
        while left > 0 and i < len(batches):
            batch = batches[i]
            a = seq - firsts[i]
            b = min(batch.count, a + left)
            chunks.append(batch.cut(a, b))
            ids += batch.ids[a:b]
            left -= b - a
            seq = firsts[i] + b
            i += 1
        return chunks, ids

    def batch_at(self, seq: int) -> tuple[CachedBatch, int]:
        """The held batch that holds ``seq``, and its first sequence (KeyError if none)."""
        if not self._start <= seq < self._end:
            raise KeyError(seq)
        i = bisect_right(self._firsts, seq) - 1
        return self._batches[i], self._firsts[i]

    def get(self, seq: int) -> bytes | None:
        """One record's frame, or None if it is not held."""
        if not self._start <= seq < self._end:
            return None
        i = bisect_right(self._firsts, seq) - 1
        a = seq - self._firsts[i]
        return self._batches[i].cut(a, a + 1)

    def offset_of(self, seq: int) -> int | None:
        """One record's virtual offset, or None if it is not held."""
        if not self._start <= seq < self._end:
            return None
        i = bisect_right(self._firsts, seq) - 1
        return self._batches[i].frame_offset(seq - self._firsts[i])

    def trim(self, before: int) -> None:
        """Forget records below ``before``, in big steps (or when it empties the cache)."""
        n = min(before, self._end) - self._start
        if n < _TRIM_MIN and before < self._end:
            return
        self.trim_to(before)

    def trim_to(self, before: int) -> None:
        """Forget records below ``before`` now. A batch straddling ``before`` is kept
        whole but its records below are no longer served."""
        before = min(before, self._end)
        if before <= self._start:
            return
        self._start = before
        firsts = self._firsts
        k = bisect_right(firsts, before)  # batches 0 .. k-1 start at or below `before`
        if k and firsts[k - 1] + self._batches[k - 1].count > before:
            k -= 1  # the last of them straddles
        del firsts[:k]
        del self._batches[:k]
