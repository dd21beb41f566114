"""Our nsqd with probes, to find where latency comes from.

Runs ``nsqx nsqd`` in this process (same flags as ``nsqx nsqd``) with three probes:

- loop lag: a task sleeps 1 ms again and again and records how late it wakes (the
  event loop was busy, or the process was not scheduled);
- garbage collection: every collection's generation and duration (``gc.callbacks``);
- slow calls: the CPU time (``time.thread_time``, so a process that is descheduled
  does not count) of every call of nsqd's hot methods (reads, flushes, pumps,
  commits, the scan loop's work, checkpoints); calls over ``--slow-ms`` (1) are counted.

SIGUSR1 prints the figures (and SIGUSR2 resets them); SIGTERM/SIGINT print them and
stop. Point a bench at it, e.g.::

    python bench/nsqd_probe.py --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 &
    python bench/latency_bench.py --target probe=tcp:127.0.0.1:4150:$! --phases latency
    kill -USR1 %1
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from nsqx.cli.nsqd_flags import parse_nsqd_args
from nsqx.nsqd import channel, client_v2, loopturn, nsqd, partition, syncer

#: (class, method) pairs timed
HOT = [
    (client_v2.ClientV2, "data_received"),
    (client_v2.ClientV2, "flush"),
    (client_v2.ClientV2, "tick"),
    (channel.Channel, "pump"),
    (channel.Channel, "finish"),
    (channel.Channel, "scan"),
    (channel.Channel, "cursor_state"),
    (partition.Partition, "commit"),
    (partition.Partition, "trim"),
    (partition.Partition, "reclaim"),
    (syncer.Checkpointer, "run_round"),
    (syncer.LogSyncer, "request"),
    (loopturn.LoopTurn, "_end"),
]


class Probes:
    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.calls: collections.Counter[str] = collections.Counter()
        self.slow: collections.Counter[str] = collections.Counter()
        self.slow_max: dict[str, float] = collections.defaultdict(float)
        self.gcs: list[tuple[int, float]] = []
        self.lags: list[float] = []
        self._gc_start = 0.0

    def wrap(self, cls: type, name: str) -> None:
        func = getattr(cls, name)
        label = f"{cls.__name__}.{name}"
        probes = self

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                d = time.thread_time() - t
                probes.calls[label] += 1
                if d > probes.slow_s:
                    probes.slow[label] += 1
                    probes.slow_max[label] = max(probes.slow_max[label], d)

        setattr(cls, name, timed)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gcs.append((info["generation"], time.perf_counter() - self._gc_start))

    async def lag_probe(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(time.perf_counter() - t0 - 0.001)

    def reset(self) -> None:
        self.calls.clear()
        self.slow.clear()
        self.slow_max.clear()
        self.gcs.clear()
        self.lags.clear()

    def report(self) -> None:
        out: list[str] = []
        slow = ", ".join(
            f"{k} {n}x (max {self.slow_max[k] * 1e3:.1f} ms)" for k, n in self.slow.most_common()
        )
        out.append(f"calls over {self.slow_s * 1e3:g} ms of CPU: {slow or 'none'}")
        out.append("calls: " + ", ".join(f"{k} {n}" for k, n in self.calls.most_common()))
        by_gen: dict[int, list[float]] = collections.defaultdict(list)
        for g, d in self.gcs:
            by_gen[g].append(d)
        for g, ds in sorted(by_gen.items()):
            out.append(f"gc generation {g}: {len(ds)} collections, max {max(ds) * 1e3:.2f} ms")
        if not self.gcs:
            out.append("gc: no collection")
        if self.lags:
            s = sorted(self.lags)
            n = len(s)
            out.append(
                f"loop lag (1 ms timer): {n} samples, p50 {s[n // 2] * 1e3:.2f} p99 "
                f"{s[int(n * 0.99)] * 1e3:.2f} p99.9 {s[int(n * 0.999)] * 1e3:.2f} max "
                f"{s[-1] * 1e3:.2f} ms"
            )
        print("\n".join(out), flush=True)


async def main(argv: list[str], slow_ms: float) -> None:
    opts = parse_nsqd_args(argv)
    probes = Probes(slow_ms / 1000)
    for cls, name in HOT:
        probes.wrap(cls, name)
    gc.callbacks.append(probes.on_gc)
    daemon = nsqd.NSQD(opts)
    await daemon.start()
    print(f"nsqd_probe: TCP {daemon.tcp_address}, HTTP {daemon.http_address}", flush=True)
    lag = asyncio.create_task(probes.lag_probe())
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, probes.report)
    loop.add_signal_handler(signal.SIGUSR2, probes.reset)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    lag.cancel()
    probes.report()
    await daemon.close()


def run(argv: list[str]) -> None:
    slow_ms = 1.0
    rest: list[str] = []
    for arg in argv:
        if arg.startswith("--slow-ms="):
            slow_ms = float(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    runner: Callable[..., Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    runner(main(rest, slow_ms))


if __name__ == "__main__":
    run(sys.argv[1:])
