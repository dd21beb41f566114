"""Recent history of every topic and channel, sampled from ``/stats``, for rates and charts.

NSQ's nsqadmin draws rates from Graphite, fed by nsqd's statsd pushes; a cluster
without Graphite gets no rates at all. nsqx's admin samples the counters itself: every
``interval`` it reads each nsqd's ``/stats`` (without clients) and keeps the last
``length`` of samples in memory. A rate is the difference of a counter between two
samples over their time apart. Nothing is stored on disk: a restarted admin starts a
new history.

:class:`History` is the store (no I/O; the clock is an argument); the admin's sampler
task feeds it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNTERS", "GAUGES", "History", "Sample"]

#: Per-key counters (rates are computed from these) and gauges, in sample order.
COUNTERS = ("message_count", "requeue_count", "timeout_count")
GAUGES = ("depth", "in_flight_count", "deferred_count", "client_count")
_FIELDS = COUNTERS + GAUGES


@dataclass(frozen=True)
class Sample:
    """The cluster's totals at one instant: key -> values in :data:`_FIELDS` order.

    A key is a topic name or ``topic/channel`` (names cannot contain ``/``).
    """

    ts: float
    values: Mapping[str, tuple[int, ...]]


def sample_from_topics(ts: float, topics: Iterable[Mapping[str, Any]]) -> Sample:
    """A :class:`Sample` from aggregated topics (each with its ``channels``)."""
    values: dict[str, tuple[int, ...]] = {}
    for t in topics:
        name = str(t["topic_name"])
        values[name] = tuple(int(t.get(f, 0) or 0) for f in _FIELDS)
        for c in t.get("channels") or []:
            key = f"{name}/{c['channel_name']}"
            values[key] = tuple(int(c.get(f, 0) or 0) for f in _FIELDS)
    return Sample(ts, values)


class History:
    """The last ``length`` seconds of samples, ``interval`` seconds apart."""

    def __init__(self, interval: float, length: float) -> None:
        if interval <= 0 or length < interval:
            raise ValueError("history interval must be > 0 and at most its length")
        self.interval = interval
        self.length = length
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=int(length // interval) + 1
        )

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> None:
        """Append a sample (older ones beyond ``length`` fall off)."""
        self._samples.append(sample)

    def series(self, topic: str, channel: str = "") -> dict[str, Any]:
        """The points of one topic or channel, oldest first, as the admin's JSON.

        Each point: ``ts`` (Unix seconds), the gauges, the counters, and for each
        counter a ``..._rate`` per second since the previous sample (``null`` for the
        first point, or after a counter went backwards: a restarted nsqd, an emptied or
        re-created topic).
        """
        key = f"{topic}/{channel}" if channel else topic
        points: list[dict[str, Any]] = []
        prev: tuple[float, tuple[int, ...]] | None = None
        for s in self._samples:
            values = s.values.get(key)
            if values is None:
                prev = None
                continue
            point: dict[str, Any] = {"ts": s.ts}
            point.update(zip(_FIELDS, values, strict=True))
            for i, name in enumerate(COUNTERS):
                rate: float | None = None
                if prev is not None and s.ts > prev[0] and values[i] >= prev[1][i]:
                    rate = (values[i] - prev[1][i]) / (s.ts - prev[0])
                point[name.removesuffix("_count") + "_rate"] = rate
            points.append(point)
            prev = (s.ts, values)
        return {"interval": self.interval, "length": self.length, "points": points}

    def rates(self) -> dict[str, float | None]:
        """Key -> messages per second between the last two samples (None if unknown)."""
        if len(self._samples) < 2:
            return {}
        a, b = self._samples[-2], self._samples[-1]
        dt = b.ts - a.ts
        out: dict[str, float | None] = {}
        for key, values in b.values.items():
            old = a.values.get(key)
            if old is None or dt <= 0 or values[0] < old[0]:
                out[key] = None
            else:
                out[key] = (values[0] - old[0]) / dt
        return out
