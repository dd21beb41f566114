"""Durable single-node ingest: ``--sync-before-ack`` against Go's nsqd and our default.

Runs server_bench's ``pub`` phase (one connection, MPUBs of ``--batch`` messages of
``--size`` bytes, ``--window`` outstanding) against each server in turn, the order
alternating from round to round, ``--rounds`` times, every server on a fresh data
directory under ``--data-dir`` (default: the system's temporary directory, which must
be on a real disk: tmpfs has no fsync worth the name, and the bench refuses
/dev/shm). Servers (``--targets``):

``go``       Go's nsqd 1.3.0 with its defaults (../shared/reference/go-nsq-1.3.0/nsqd)
``sba``      our nsqd with ``--sync-before-ack`` (every OK after an fsync)
``default``  our nsqd with its defaults (fsync every --sync-every / --sync-timeout)
``before``   our nsqd with its defaults from the sources at ``--before`` (another
             checkout's src/, e.g. ``git archive`` of the commit before a change)

It also measures the disk's own fsync time where the data goes (a 4 KiB write and an
fsync, ``--fsyncs`` times) and prints it beside the figures: the ratio of
``sba`` to ``go`` depends on it. Prints msgs/s per server per round, the median of
each, and the ratios of the medians (``--json`` for the report as JSON).

    .venv/bin/python bench/durable_bench.py --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from latency_bench import GO_NSQD, Target
from server_bench import BenchConfig, BenchError, run_bench

TARGETS = ("go", "sba", "default", "before")


def target(name: str, before: str | None, go: str) -> Target:
    ours = [sys.executable, "-m", "nsqx", "nsqd"]
    if name == "before":
        if before is None:
            raise BenchError("the before target needs --before SRC")
        return Target(name, name, ["env", f"PYTHONPATH={before}", *ours])
    if name == "go":
        if not os.path.exists(go):
            raise BenchError(f"Go's nsqd is not at {go} (--go PATH)")
        return Target(name, name, [go])
    if name == "sba":
        return Target(name, name, [*ours, "--sync-before-ack"])
    return Target(name, name, ours)


def fsync_times(directory: str, count: int) -> dict[str, float]:
    """The disk's fsync time in ``directory``: a 4 KiB append and an fsync, ``count``
    times (milliseconds: median, p99)."""
    path = os.path.join(directory, "fsync-probe")
    took = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        block = os.urandom(4096)
        for _ in range(count):
            os.write(fd, block)
            t0 = time.perf_counter()
            os.fsync(fd)
            took.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        os.remove(path)
    took.sort()
    return {"median_ms": statistics.median(took), "p99_ms": took[int(len(took) * 0.99) - 1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="go,sba,default", help="among " + ",".join(TARGETS))
    p.add_argument("--before", metavar="SRC", help="the sources of the before target")
    p.add_argument("--go", default=str(GO_NSQD), metavar="PATH", help="Go's nsqd binary")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0, help="pub phase per server per round")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--fsyncs", type=int, default=200)
    p.add_argument("--data-dir", default=tempfile.gettempdir())
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if os.path.realpath(args.data_dir).startswith("/dev/shm"):
        p.error("--data-dir on tmpfs measures no disk")
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    if set(names) - set(TARGETS) or not names:
        p.error(f"--targets: among {','.join(TARGETS)}")
    tempfile.tempdir = args.data_dir  # (each Target's data directory goes there)
    disk = fsync_times(args.data_dir, args.fsyncs)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            t = target(name, args.before, args.go)
            t.start()
            try:
                cfg = BenchConfig(
                    nsqd_tcp_address=f"{t.host}:{t.port}",
                    server_pid=t.pid,
                    pub_seconds=args.seconds,
                    size=args.size,
                    batch=args.batch,
                    window=args.window,
                    phases=("pub",),
                )
                report = run_bench(cfg)
                t.check_alive()
            finally:
                t.stop()
            pub = report["phases"]["pub"]
            rates[name].append(pub["msgs_per_s"])
            if not args.json:
                print(
                    f"round {r + 1} {name:8s} {pub['msgs_per_s']:>12,.0f} msgs/s  "
                    f"server cpu {pub.get('server_cpu_us_per_msg')} us/msg",
                    flush=True,
                )
    medians = {n: statistics.median(v) for n, v in rates.items()}
    ratios = {
        f"{a}/{b}": medians[a] / medians[b] for a in names for b in names if a != b and medians[b]
    }
    out: dict[str, Any] = {
        "disk_fsync": disk,
        "data_dir": args.data_dir,
        "size": args.size,
        "batch": args.batch,
        "window": args.window,
        "msgs_per_s": rates,
        "median_msgs_per_s": medians,
        "ratios": ratios,
        "load_at_end": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"disk fsync in {args.data_dir}: median {disk['median_ms']:.2f} ms, "
            f"p99 {disk['p99_ms']:.2f} ms"
        )
        for n, m in medians.items():
            print(f"median {n:8s} {m:>12,.0f} msgs/s")
        for k, v in ratios.items():
            print(f"ratio {k:16s} {v:6.2f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"durable_bench: {err}", file=sys.stderr)
        sys.exit(1)
