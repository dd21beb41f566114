"""End-to-end processing latency: publish time to FIN, as percentiles over a window.

NSQ keeps, per channel, a targeted-quantile stream over two half windows
(--e2e-processing-latency-window-time / 2 each) and reports their merge; a topic reports
the merge of its channels. We keep the same two half windows, but each holds a fixed-size
uniform sample (a reservoir) of the latencies finished in it, so that the cost of a FIN
batch does not grow with its size: Li's "algorithm L" computes how many FINs to skip
before the next one enters the sample, and only those are looked up. Percentiles are
computed at query time over the weighted union of the samples.

Nothing here runs unless percentiles are configured: a channel then has ``e2e`` set and
:meth:`Channel.finish` calls :meth:`LatencyWindow.record`.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from nsqx.nsqd.guid import seq_of

if TYPE_CHECKING:
    from nsqx.nsqd.options import NsqdOptions
    from nsqx.store.log import MessageLog

#: Samples kept per half window: percentile error stays around 1/sqrt(SAMPLES) in rank.
SAMPLES = 1024

_TS = struct.Struct(">q")
# a message frame: size(4) type(4) timestamp(8) ...
_TS_OFFSET = 8


class _Reservoir:
    """A uniform sample of at most ``k`` of the values offered since the last reset."""

    __slots__ = ("k", "next", "seen", "values", "w")

    def __init__(self, k: int) -> None:
        self.k = k
        self.values: list[int] = []
        self.seen = 0
        self.w = 1.0
        self.next = 0

    def reset(self) -> None:
        self.values = []
        self.seen = 0
        self.w = 1.0
        self.next = 0

    def _advance(self) -> None:
        # algorithm L: the gap to the next accepted item is geometric in (1 - w)
        self.w *= math.exp(math.log(random.random() or 1e-300) / self.k)
        gap = math.floor(math.log(random.random() or 1e-300) / math.log1p(-self.w))
        self.next += gap + 1

    def offer(self, n: int) -> list[tuple[int, int]]:
        """``n`` more items arrive: the (batch index, slot) pairs to fill, in order.

        The caller computes only those items' values and stores them with :meth:`put`.
        """
        k = self.k
        start = self.seen
        end = start + n
        picks: list[tuple[int, int]] = []
        # the first k items fill the reservoir
        while start < k and start < end:
            picks.append((start - self.seen, start))
            start += 1
            if start == k:
                self.w = 1.0
                self.next = k - 1
                self._advance()
        if start >= k:
            while self.next < end:
                picks.append((self.next - self.seen, random.randrange(k)))
                self._advance()
        self.seen = end
        return picks

    def put(self, slot: int, value: int) -> None:
        if slot == len(self.values):
            self.values.append(value)
        else:
            self.values[slot] = value

    def weighted(self) -> list[tuple[int, float]]:
        """(value, weight) pairs: each sample stands for seen / len(sample) items."""
        if not self.values:
            return []
        w = self.seen / len(self.values)
        return [(v, w) for v in self.values]


class LatencyWindow:
    """Latencies (ns) of recent FINs over a sliding window of two halves."""

    __slots__ = ("_current", "_half_ns", "_last_move", "_previous", "percentiles")

    def __init__(
        self, window_s: float, percentiles: Sequence[float], samples: int = SAMPLES
    ) -> None:
        self.percentiles = list(percentiles)
        self._half_ns = max(int(window_s * 1e9) // 2, 1)
        self._current = _Reservoir(samples)
        self._previous = _Reservoir(samples)
        self._last_move = time.monotonic_ns()

    def _roll(self, now: int) -> None:
        # as NSQ: every half window the older half is dropped and a new one begins
        while now - self._last_move > self._half_ns:
            self._previous, self._current = self._current, self._previous
            self._current.reset()
            self._last_move += self._half_ns
            if now - self._last_move > 2 * self._half_ns:
                # idle for a whole window: both halves are stale
                self._previous.reset()
                self._last_move = now

    def add(self, latencies_ns: Sequence[int]) -> None:
        """Record latencies directly (tests, and callers that have them already)."""
        self._roll(time.monotonic_ns())
        res = self._current
        for index, slot in res.offer(len(latencies_ns)):
            res.put(slot, latencies_ns[index])

    def record(self, log: MessageLog, ids: Sequence[bytes], id_base: int) -> None:
        """FINs of ``ids`` (of a log with ``id_base``, guid.py) happened now: sample
        their publish-to-FIN latencies."""
        self._roll(time.monotonic_ns())
        res = self._current
        picks = res.offer(len(ids))
        if not picks:
            return
        now = time.time_ns()
        get = log.get
        unpack = _TS.unpack_from
        for index, slot in picks:
            try:
                frame = get(seq_of(ids[index], id_base))
            except ValueError:  # not one of our ids
                frame = None
            # a FINed record is still in the log (trimming waits for the scan loop)
            res.put(slot, 0 if frame is None else max(now - unpack(frame, _TS_OFFSET)[0], 0))

    def samples(self) -> tuple[int, list[tuple[int, float]]]:
        """(count, weighted samples) over the window."""
        self._roll(time.monotonic_ns())
        cur, prev = self._current, self._previous
        return cur.seen + prev.seen, cur.weighted() + prev.weighted()


def quantiles(
    percentiles: Sequence[float], samples: Iterable[tuple[int, float]]
) -> list[tuple[float, int]]:
    """Weighted percentiles: for each q, the smallest value with q of the weight below it."""
    pairs = sorted(samples)
    if not pairs:
        return [(q, 0) for q in percentiles]
    total = sum(w for _, w in pairs)
    out: list[tuple[float, int]] = []
    for q in percentiles:
        target = q * total
        acc = 0.0
        value = pairs[-1][0]
        for v, w in pairs:
            acc += w
            if acc >= target:
                value = v
                break
        out.append((q, value))
    return out


class E2eResult:
    """What /stats shows: the FIN count over the window and each percentile's value."""

    __slots__ = ("count", "percentiles")

    def __init__(self, count: int, percentiles: list[tuple[float, int]] | None) -> None:
        self.count = count
        #: None when no percentile is configured (NSQ then shows ``null``)
        self.percentiles = percentiles

    @classmethod
    def merge(cls, windows: Iterable[LatencyWindow]) -> E2eResult:
        """One result over several windows (a topic over its channels)."""
        count = 0
        pooled: list[tuple[int, float]] = []
        qs: list[float] | None = None
        for w in windows:
            n, s = w.samples()
            count += n
            pooled.extend(s)
            qs = w.percentiles
        if qs is None:
            return cls(0, None)
        return cls(count, quantiles(qs, pooled))

    def to_json(self) -> dict[str, object]:
        return {
            "count": self.count,
            "percentiles": None
            if self.percentiles is None
            else [{"quantile": q, "value": v} for q, v in self.percentiles],
        }

    def __str__(self) -> str:
        return ", ".join(ns_to_human(v) for _, v in self.percentiles or ())


def ns_to_human(v: float) -> str:
    """NSQ's rendering of a duration in ns: one decimal and the largest fitting unit."""
    if v > 1e9:
        return f"{v / 1e9:.1f}s"
    if v > 1e6:
        return f"{v / 1e6:.1f}ms"
    if v > 1e3:
        return f"{v / 1e3:.1f}us"
    return f"{v:.1f}ns"


def new_window(options: NsqdOptions) -> LatencyWindow | None:
    """A channel's window, or None when no percentile is configured (no cost at all)."""
    if not options.e2e_processing_latency_percentiles:
        return None
    return LatencyWindow(
        options.e2e_processing_latency_window_time, options.e2e_processing_latency_percentiles
    )
