"""What faultfs costs: nsqd's publish rate with its data directory on a plain directory
and on a faultfs mount, alternating, and the faultfs daemon's CPU per message.

    .venv/bin/python tests/faultfs/bench.py [--rounds 3] [--seconds 5]

Each round runs bench/server_bench.py's ``pub`` phase against a fresh nsqd (defaults:
fsync every 2,500 messages or 2 s) for each workload: ``mpub`` (MPUB of 200 messages
of 200 bytes, 16 in flight: a large write per loop turn) and ``small`` (MPUB of 1
message of 100 bytes, 16 in flight: the many small writes of single publishes), first
on a plain directory, then on faultfs. Prints one line per run and the ratio of the
medians. Needs FUSE (root, /dev/fuse, Debian's fuse3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from faultfs import FaultFS, unavailable  # noqa: E402
from nsqdproc import start_nsqd  # noqa: E402

SERVER_BENCH = TESTS.parent / "bench" / "server_bench.py"
WORKLOADS = {"mpub": ("200", "200"), "small": ("1", "100")}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(base: Path, where: str, workload: str, seconds: float) -> dict[str, float]:
    run = Path(tempfile.mkdtemp(dir=base))
    fs = None
    if where == "faultfs":
        fs = FaultFS(run / "disk", run / "data")
        fs.mount()
    nsqd = start_nsqd(run / "data")
    try:
        daemon0 = cpu_seconds(fs.proc.pid) if fs and fs.proc else 0.0
        batch, size = WORKLOADS[workload]
        out = subprocess.run(
            [
                sys.executable,
                str(SERVER_BENCH),
                "--nsqd-tcp-address",
                f"127.0.0.1:{nsqd.tcp_port}",
                "--server-pid",
                str(nsqd.proc.pid),
                "--phases",
                "pub",
                "--pub-seconds",
                str(seconds),
                "--batch",
                batch,
                "--size",
                size,
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        pub = json.loads(out.stdout)["phases"]["pub"]
        daemon = cpu_seconds(fs.proc.pid) - daemon0 if fs and fs.proc else 0.0
        stats = fs.stats() if fs else {}
    finally:
        nsqd.stop()
        if fs is not None:
            fs.close()
    msgs = pub["msgs"]
    return {
        "msgs_per_s": pub["msgs_per_s"],
        "nsqd_us_per_msg": pub["server_cpu_us_per_msg"],
        "faultfs_us_per_msg": round(daemon * 1e6 / msgs, 3) if msgs else 0.0,
        "faultfs_writes": stats.get("counts", {}).get("write", 0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"faultfs unavailable: {why}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="faultfs-bench-"))
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for workload in WORKLOADS:
            for where in ("plain", "faultfs"):
                res = one(base, where, workload, args.seconds)
                rates.setdefault((workload, where), []).append(res["msgs_per_s"])
                print(f"round {r + 1} {workload:<6} {where:<8} {json.dumps(res)}", flush=True)
    for workload in WORKLOADS:
        plain = statistics.median(rates[(workload, "plain")])
        ffs = statistics.median(rates[(workload, "faultfs")])
        print(
            f"{workload:<6} median msgs/s: plain {plain:,.0f}, faultfs {ffs:,.0f}, "
            f"ratio {ffs / plain:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
