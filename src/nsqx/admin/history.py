"""Recent history of every topic and channel, sampled from ``/stats``, for rates and charts.

NSQ's nsqadmin draws rates from Graphite, fed by nsqd's statsd pushes; a cluster
without Graphite gets no rates at all. nsqx's admin samples the counters itself: every
``interval`` it reads each nsqd's ``/stats`` (without clients) and keeps the last
``length`` of samples in memory. Nothing is stored on disk: a restarted admin starts a
new history.

Rates are counted per node, over the time between two readings of that node's
counter (each node's reading carries the time its answer arrived), and then added up:

- a chart point's rate covers the time since the previous sample; it is None (a gap,
  not a guess) for the first point, after a gap in sampling, when the set of nodes
  that answered changed (a node not answering would look like a drop, its return like
  a burst), or when a counter went backwards (a restarted nsqd, an emptied topic);
- the rate a page shows (:meth:`History.live_rates`) covers the time from the newest
  earlier reading at least ``min_window`` old up to the reading the page just made, so
  a stopped flow shows 0 at the next refresh rather than the last sample's rate; a
  paused channel (or a channel of a paused topic) has no rate.

:class:`History` is the store (no I/O; the times are arguments); the admin's sampler
task and its pages feed it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNTERS", "GAUGES", "History", "Sample", "readings_from_rows", "sample_from_rows"]

#: Per-key counters (rates are computed from these) and gauges, in sample order.
COUNTERS = ("message_count", "requeue_count", "timeout_count")
GAUGES = ("depth", "in_flight_count", "deferred_count", "client_count")
_FIELDS = COUNTERS + GAUGES
#: a gap between samples longer than this many intervals has no rate
_GAP = 2.5

#: key -> node -> (when the node answered, values in _FIELDS order)
Readings = dict[str, dict[str, tuple[float, tuple[int, ...]]]]


@dataclass(frozen=True)
class Sample:
    """The cluster at one instant: key -> node -> (ts of its answer, values).

    A key is a topic name or ``topic/channel`` (names cannot contain ``/``).
    """

    ts: float
    values: Mapping[str, Mapping[str, tuple[float, tuple[int, ...]]]]


def _values(entry: Mapping[str, Any]) -> tuple[int, ...]:
    out = []
    for f in _FIELDS:
        try:
            out.append(int(entry.get(f, 0) or 0))
        except (TypeError, ValueError):
            out.append(0)
    return tuple(out)


def readings_from_rows(rows: Iterable[Mapping[str, Any]], ts: float = 0.0) -> Readings:
    """Per-node readings from :func:`nsqx.clusterinfo.aggregate.node_topics` rows (each with
    ``node``, ``channels`` and ``ts``, the time its node answered; else ``ts``)."""
    out: Readings = {}
    for row in rows:
        node = str(row.get("node", ""))
        when = float(row.get("ts") or ts)
        name = str(row["topic_name"])
        out.setdefault(name, {})[node] = (when, _values(row))
        for c in row.get("channels") or []:
            key = f"{name}/{c['channel_name']}"
            out.setdefault(key, {})[node] = (when, _values(c))
    return out


def sample_from_rows(ts: float, rows: Iterable[Mapping[str, Any]]) -> Sample:
    """A :class:`Sample` taken at ``ts`` from per-node rows."""
    return Sample(ts, readings_from_rows(rows, ts))


def _paused_keys(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """Channels paused on every node that has them (or whose topic is paused there)."""
    paused: dict[str, bool] = {}
    for row in rows:
        name = str(row["topic_name"])
        for c in row.get("channels") or []:
            key = f"{name}/{c['channel_name']}"
            here = bool(c.get("paused")) or bool(row.get("paused"))
            paused[key] = paused.get(key, True) and here
    return {k for k, v in paused.items() if v}


class History:
    """The last ``length`` seconds of samples, ``interval`` seconds apart, and the
    recent readings of each node that pages measure their rates against."""

    def __init__(self, interval: float, length: float, min_window: float | None = None) -> None:
        if interval <= 0 or length < interval:
            raise ValueError("history interval must be > 0 and at most its length")
        self.interval = interval
        self.length = length
        #: the shortest time a page's rate is measured over
        self.min_window = min(1.0, interval) if min_window is None else min_window
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=int(length // interval) + 1
        )
        #: (key, node) -> recent (ts, values), oldest first
        self._recent: dict[tuple[str, str], collections.deque[tuple[float, tuple[int, ...]]]]
        self._recent = {}
        #: how long recent readings are kept
        self._keep = 2 * interval + 2 * self.min_window

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> None:
        """Append a sample (older ones beyond ``length`` fall off)."""
        self._samples.append(sample)
        self._remember(sample.values, sample.ts)

    def _remember(self, readings: Readings | Mapping[str, Any], now: float) -> None:
        for key, nodes in readings.items():
            for node, (ts, values) in nodes.items():
                ring = self._recent.get((key, node))
                if ring is None:
                    ring = self._recent[(key, node)] = collections.deque(maxlen=64)
                if not ring or ts > ring[-1][0]:
                    ring.append((ts, values))
        horizon = now - self._keep
        for k in [k for k, ring in self._recent.items() if ring[-1][0] < horizon]:
            del self._recent[k]
        for ring in self._recent.values():
            while ring[0][0] < horizon:
                ring.popleft()

    def live_rates(
        self, rows: Iterable[Mapping[str, Any]], now: float | None = None
    ) -> dict[str, float | None]:
        """Key -> messages per second up to the readings in ``rows`` (then kept).

        Per node: from the newest earlier reading at least ``min_window`` older than
        this one (and not older than two sampling intervals and a bit). None when no
        node has such a reading, and for paused channels.
        """
        rows = list(rows)
        readings = readings_from_rows(rows)
        paused = _paused_keys(rows)
        out: dict[str, float | None] = {}
        latest = 0.0
        for key, nodes in readings.items():
            total: float | None = None
            for node, (ts, values) in nodes.items():
                latest = max(latest, ts)
                base = self._baseline(key, node, ts)
                if base is None or values[0] < base[1][0]:
                    continue
                total = (total or 0.0) + (values[0] - base[1][0]) / (ts - base[0])
            out[key] = None if key in paused else total
        self._remember(readings, latest if now is None else now)
        return out

    def _baseline(self, key: str, node: str, ts: float) -> tuple[float, tuple[int, ...]] | None:
        ring = self._recent.get((key, node))
        if not ring:
            return None
        for when, values in reversed(ring):
            if when < ts - self._keep:
                return None  # too old: a rate over it would not be a rate of now
            if when <= ts - self.min_window:
                return when, values
        return None

    def series(self, topic: str, channel: str = "") -> dict[str, Any]:
        """The points of one topic or channel, oldest first, as the admin's JSON.

        Each point: ``ts`` (Unix seconds), the gauges and counters summed over nodes,
        and for each counter a ``..._rate`` per second since the previous sample, or
        None (see the module's notes).
        """
        key = f"{topic}/{channel}" if channel else topic
        points: list[dict[str, Any]] = []
        prev: Sample | None = None
        for s in self._samples:
            nodes = s.values.get(key)
            if not nodes:
                prev = None
                continue
            sums = [sum(v[1][i] for v in nodes.values()) for i in range(len(_FIELDS))]
            point: dict[str, Any] = {"ts": s.ts}
            point.update(zip(_FIELDS, sums, strict=True))
            before = prev.values.get(key) if prev is not None else None
            gap = prev is None or s.ts - prev.ts > _GAP * self.interval
            for i, name in enumerate(COUNTERS):
                rate: float | None = None
                if before is not None and not gap and set(before) == set(nodes):
                    rate = 0.0
                    for node, (ts, values) in nodes.items():
                        old_ts, old = before[node]
                        if ts <= old_ts or values[i] < old[i]:
                            rate = None
                            break
                        rate += (values[i] - old[i]) / (ts - old_ts)
                point[name.removesuffix("_count") + "_rate"] = rate
            points.append(point)
            prev = s
        return {"interval": self.interval, "length": self.length, "points": points}
