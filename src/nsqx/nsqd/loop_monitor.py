"""LoopMonitor: how long nsqd's event-loop turns last and how late its timers fire.

Every connection, channel and timer of an nsqd shares one event loop, so one long turn
(periodic work done in one piece, a garbage collection of a large heap, a blocking
system call) delays every message that was due meanwhile: that is what makes the
latency tail. Three measurements, each costing next to nothing per message:

- **turns** that read from clients, first read to the end of the group commit: timed by
  the compiled LoopTurn (one clock read and a few additions per turn, not per message);
- **timer lateness**: a probe timer every PROBE_INTERVAL (IDLE_PROBE_INTERVAL while no
  client reads) records how late it fires. It sees every kind of turn (the scan
  loop's, a flush timer's, a collection's), one sample per interval; uvloop's timers have a resolution of 1 ms, so lateness
  under 1 ms is the clock's, not the loop's. On Linux the probe also reads how long the
  loop's thread waited for a CPU meanwhile (``/proc/thread-self/schedstat``): lateness
  less that wait is what nsqd's own work (or a blocking call) cost, the rest is the
  machine's (a loaded host, a throttled container);
- **periodic work**: the scan loop's rounds (timeouts, deferred messages, heartbeats,
  checkpoints, reclaims), timed whole.

Garbage collections are timed by generation by nsqx.nsqd.stats.GcPauses, and
freeze_startup_heap() keeps the full ones short. Uvloop has no
hook per loop iteration; a ``call_soon`` chain re-arming itself would see every turn,
but it costs a handle per turn and keeps the loop from ever sleeping (an idle nsqd
would spin). /stats (``event_loop``) and /metrics (``nsq_loop_*``, ``nsq_gc_*``) report
these; docs/metrics.md says how to read them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from nsqx.nsqd.loopturn import TURN_BUCKETS, LoopTurn
from nsqx.nsqd.stats import GcPauses

#: Seconds between two probe timers while clients are active (reading turns since the
#: last probe): a stall of this length or more is always seen by the probe.
PROBE_INTERVAL = 0.005
#: ... and while none are: 200 wake-ups a second cost an idle nsqd 2-3% of a core on
#: the 2-core test machine, 10 (as many as the scan loop's) 0.2-0.3%.
IDLE_PROBE_INTERVAL = 0.1
#: The longest turn and lateness are reported over a window of this many seconds (the
#: current and the previous half), so that one stall at start does not mask the rest.
MAX_WINDOW = 20.0

#: The upper bounds of the histogram buckets, in seconds (the last is +Inf).
BUCKET_BOUNDS: tuple[float, ...] = (
    *((1 << i) / 1e6 for i in range(TURN_BUCKETS - 1)),
    float("inf"),
)


_frozen = False


def freeze_startup_heap() -> bool:
    """Move every object alive after start-up (modules, classes, nsqd's own long-lived
    state) to the collector's permanent generation, once per process; True if it did.

    A full (generation 2) collection traverses every tracked object, and the loop
    stands still meanwhile: with nsqx, aiohttp and prometheus-client loaded, about 43k
    objects, 16-60 ms per full collection on the 2-core test machine (measured with a
    started nsqd, 2026-11-27), 0.05 ms once they are frozen. Full collections are rare
    (nsqd allocates few tracked objects per message), but when one came it was the
    longest turn of a run (72 ms). Objects frozen are never collected: a reference
    cycle among them that becomes garbage later stays, which bounds the cost to what
    existed at start. Once per process, so that test processes running many nsqd do
    not freeze their tests' garbage again and again.
    """
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()  # garbage of the start itself is not frozen
    gc.freeze()
    return True


class Histogram:
    """Durations by power-of-two buckets (as LoopTurn's turn counts), their sum and the
    longest one over the last MAX_WINDOW seconds and since start."""

    def __init__(self) -> None:
        self.counts = [0] * TURN_BUCKETS
        self.seconds = 0.0
        self.max_ever = 0.0
        self._max_now = 0.0
        self._max_before = 0.0

    def add(self, seconds: float) -> None:
        """Count one duration."""
        seconds = max(seconds, 0.0)
        self.counts[min(int(seconds * 1e6).bit_length(), TURN_BUCKETS - 1)] += 1
        self.seconds += seconds
        if seconds > self._max_now:
            self._max_now = seconds

    def note_max(self, seconds: float) -> None:
        """A longest duration measured elsewhere (LoopTurn's) for the current window."""
        if seconds > self._max_now:
            self._max_now = seconds

    def rotate(self) -> None:
        """Begin a new half window."""
        self.max_ever = max(self.max_ever, self._max_now)
        self._max_before, self._max_now = self._max_now, 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def recent_max(self) -> float:
        """The longest duration in the last MAX_WINDOW seconds (at least half of it)."""
        return max(self._max_now, self._max_before)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket that holds quantile ``q`` (0 if empty)."""
        total = self.count
        if not total:
            return 0.0
        rank = q * total
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank and n:
                return min(BUCKET_BOUNDS[i], max(self.max_ever, self._max_now))
        return max(self.max_ever, self._max_now)

    def to_json(self) -> dict[str, Any]:
        """Counts, sum, longest and percentiles in microseconds; the non-empty buckets
        as [upper bound in us (null: +Inf), count]."""
        return {
            "count": self.count,
            "total_us": round(self.seconds * 1e6),
            "max_us": round(max(self.max_ever, self._max_now) * 1e6),
            "recent_max_us": round(self.recent_max * 1e6),
            "p50_us": round(self.quantile(0.5) * 1e6),
            "p99_us": round(self.quantile(0.99) * 1e6),
            "p999_us": round(self.quantile(0.999) * 1e6),
            "buckets": [
                [None if b == float("inf") else round(b * 1e6), n]
                for b, n in zip(BUCKET_BOUNDS, self.counts, strict=True)
                if n
            ],
        }

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (le, cumulative count)."""
        out: list[tuple[str, float]] = []
        seen = 0
        for b, n in zip(BUCKET_BOUNDS, self.counts, strict=True):
            seen += n
            out.append(("+Inf" if b == float("inf") else repr(b), float(seen)))
        return out


class LoopMonitor:
    """One nsqd's loop measurements: turns (read from its LoopTurn), the probe timer's
    lateness and the scan loop's rounds. start() arms the probe, stop() disarms it."""

    def __init__(self, turn: LoopTurn, interval: float = PROBE_INTERVAL) -> None:
        self.turn = turn
        self.interval = interval
        self.turns = Histogram()
        self.lateness = Histogram()
        #: lateness less the time the loop's thread waited for a CPU meanwhile
        self.lateness_running = Histogram()
        #: seconds the loop's thread waited for a CPU while runnable, per probe interval
        self.cpu_wait = Histogram()
        #: the scan loop's rounds (NSQD._scan_loop reports them with scan_took)
        self.scans = Histogram()
        self._schedstat = -1  # a file descriptor, where the kernel has the file
        self._run_delay = 0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self._rotate_at = 0.0
        self._turn_seconds_seen = -1.0  # LoopTurn.turn_seconds at the last probe

    def start(self) -> None:
        """Arm the probe timer (in the running loop)."""
        self._loop = asyncio.get_running_loop()
        try:
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self._run_delay = self._read_run_delay()
        except (OSError, ValueError, IndexError):
            self._close_schedstat()
        now = time.monotonic()
        self._rotate_at = now + MAX_WINDOW / 2
        self._arm(now)

    def stop(self) -> None:
        """Disarm the probe timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._close_schedstat()

    def _close_schedstat(self) -> None:
        if self._schedstat >= 0:
            os.close(self._schedstat)
            self._schedstat = -1

    def _read_run_delay(self) -> int:
        # schedstat: "<ns on a CPU> <ns runnable, waiting for one> <timeslices>"
        return int(os.pread(self._schedstat, 128, 0).split()[1])

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        # often while clients read (their messages are what a stall delays), seldom when
        # idle; lateness does not depend on the interval, only how many stalls are seen
        busy = self.turn.turn_seconds != self._turn_seconds_seen
        self._turn_seconds_seen = self.turn.turn_seconds
        interval = self.interval if busy else IDLE_PROBE_INTERVAL
        self._due = now + interval
        self._handle = self._loop.call_later(interval, self._probe)

    def _probe(self) -> None:
        now = time.monotonic()
        late = now - self._due
        self.lateness.add(late)
        if self._schedstat >= 0:
            try:
                delay = self._read_run_delay()
            except (OSError, ValueError, IndexError):
                self._close_schedstat()
            else:
                waited = (delay - self._run_delay) / 1e9
                self._run_delay = delay
                self.cpu_wait.add(waited)
                self.lateness_running.add(late - waited)
        if now >= self._rotate_at:
            self._rotate_at = now + MAX_WINDOW / 2
            self._take_turns()
            self.turns.rotate()
            self.lateness.rotate()
            self.lateness_running.rotate()
            self.cpu_wait.rotate()
            self.scans.rotate()
        self._arm(now)

    def scan_took(self, seconds: float) -> None:
        """The scan loop's round lasted ``seconds``."""
        self.scans.add(seconds)

    def _take_turns(self) -> None:
        """Bring LoopTurn's counts (kept there: it is compiled, and counts every turn)."""
        t = self.turn
        h = self.turns
        h.counts = list(t.turn_counts)
        h.seconds = t.turn_seconds
        h.note_max(t.turn_max)
        t.turn_max = 0.0

    def snapshot(self) -> dict[str, Any]:
        """What /stats reports under ``event_loop``: turns, timer lateness, the scan
        loop's rounds and the garbage collections, durations in microseconds."""
        self._take_turns()
        return {
            "probe_interval_us": round(self.interval * 1e6),
            "turns": self.turns.to_json(),
            "timer_lateness": self.lateness.to_json(),
            "timer_lateness_running": self.lateness_running.to_json(),
            "cpu_wait": self.cpu_wait.to_json(),
            "scan": self.scans.to_json(),
            "gc": GcPauses.by_generation(),
        }
