"""MemoryLog: a topic partition's records held in Python lists."""

from __future__ import annotations

from nsqx.store.deferred import DeferredIndex
from nsqx.store.log import split_chunk

# Trimming deletes from the front of a list (a memmove), so do it in big steps.
_TRIM_MIN = 4096


class MemoryLog:
    """An in-memory :class:`~nsqx.store.log.MessageLog`.

    Records live in two parallel lists (frames, ids); deferred ones (DPUB) are also
    listed in a :class:`DeferredIndex`.
    """

    __slots__ = ("_base", "_deferred", "_frames", "_ids")

    def __init__(self, start: int = 0) -> None:
        self._base = start
        self._frames: list[bytes] = []
        self._ids: list[bytes] = []
        self._deferred = DeferredIndex()

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
        if deliver_at_ns:
            self._deferred.add(first, len(frames), deliver_at_ns)
        return first

    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        i = max(seq - self._base, 0)
        j = i + limit
        return self._frames[i:j], self._ids[i:j]

    def get(self, seq: int) -> bytes | None:
        i = seq - self._base
        if 0 <= i < len(self._frames):
            return self._frames[i]
        return None

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
        self._base += n
        self._deferred.forget_below(self._base)
