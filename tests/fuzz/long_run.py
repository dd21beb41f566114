"""The long fuzzing run: every target for a while, its figures in a table, and the
inputs that reach new coverage merged into the corpus.

    python tests/fuzz/long_run.py --minutes 6 --live-minutes 12 > fuzz-figures.md

For each target: inputs executed, execs/s, coverage (libFuzzer's cov: edges of the
instrumented nsqx code reached; ft: features), corpus size before and after, crashes.
A crash stops that target; its input is kept under the printed artifacts directory.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIRE = ["commands", "frames", "identify", "lookupd", "range", "snappy", "deflate", "ext"]
LIVE = ["nsqd_tcp", "nsqd_http", "nsqd_auth"]
_STAT = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


def run_target(target: str, seconds: int, work: Path) -> dict[str, object]:
    out = work / target
    out.mkdir()
    before = len(list((HERE / "corpus" / target).glob("*")))
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "run.py"),
            target,
            f"--seconds={seconds}",
            f"--out={out}",
            f"--artifacts={work}/",
        ],
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    (work / f"{target}.log").write_text(proc.stderr)
    stats = _STAT.findall(proc.stderr)
    execs, cov, ft, _corp = (int(x) for x in stats[-1]) if stats else (0, 0, 0, 0)
    m = re.search(r"stat::number_of_executed_units: (\d+)", proc.stderr)
    if m:
        execs = int(m.group(1))
    crashes = sorted(p.name for p in work.glob("crash-*"))
    # keep what adds coverage to the corpus in the repository
    subprocess.run(
        [sys.executable, str(HERE / "run.py"), target, f"--merge-from={out}"],
        capture_output=True,
        text=True,
    )
    after = len(list((HERE / "corpus" / target).glob("*")))
    return {
        "target": target,
        "seconds": round(took),
        "execs": execs,
        "per_s": round(execs / took) if took else 0,
        "cov": cov,
        "ft": ft,
        "corpus": f"{before} -> {after}",
        "result": "crash " + ", ".join(crashes) if proc.returncode else "no failure",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=6, help="per wire target")
    ap.add_argument("--live-minutes", type=float, default=12, help="per live target")
    ap.add_argument("--targets", nargs="*", default=WIRE + LIVE)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nsqx-fuzz-long-"))
    print(f"work directory (logs, crashes): {work}", file=sys.stderr)
    print("| target | seconds | inputs | inputs/s | cov | ft | corpus | result |")
    print("|---|---|---|---|---|---|---|---|")
    for target in args.targets:
        minutes = args.live_minutes if target in LIVE else args.minutes
        r = run_target(target, int(minutes * 60), work)
        print(
            f"| {r['target']} | {r['seconds']} | {r['execs']} | {r['per_s']} | {r['cov']} "
            f"| {r['ft']} | {r['corpus']} | {r['result']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
