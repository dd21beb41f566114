"""DeferredIndex: which records of a log are deferred (DPUB), and until when."""

from __future__ import annotations

from bisect import bisect_left


class DeferredIndex:
    """Deferred records are rare, so they live aside: a sorted list of sequences and a
    dict of due times (wall-clock ns). A read range is checked with one bisect."""

    __slots__ = ("_at", "_seqs")

    def __init__(self) -> None:
        self._seqs: list[int] = []
        self._at: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, first: int, count: int, deliver_at_ns: int) -> None:
        """Records ``first .. first+count-1`` are due at ``deliver_at_ns`` (appended in order)."""
        seqs = range(first, first + count)
        self._seqs.extend(seqs)
        self._at.update(dict.fromkeys(seqs, deliver_at_ns))

    def between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(seq, due) for deferred records with lo <= seq < hi."""
        seqs = self._seqs
        if not seqs or seqs[-1] < lo:
            return []
        i = bisect_left(seqs, lo)
        j = bisect_left(seqs, hi, i)
        at = self._at
        return [(s, at[s]) for s in seqs[i:j]]

    def forget_below(self, seq: int) -> None:
        k = bisect_left(self._seqs, seq)
        if k:
            for s in self._seqs[:k]:
                del self._at[s]
            del self._seqs[:k]

    def forget_from(self, seq: int) -> None:
        """Drop entries at or above ``seq`` (a truncated tail)."""
        k = bisect_left(self._seqs, seq)
        for s in self._seqs[k:]:
            del self._at[s]
        del self._seqs[k:]
