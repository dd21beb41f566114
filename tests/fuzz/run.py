"""Run a fuzz target under atheris (libFuzzer, coverage-guided).

    python tests/fuzz/run.py --list
    python tests/fuzz/run.py commands --seconds 60
    python tests/fuzz/run.py nsqd_tcp --seconds 600 --out /tmp/finds
    python tests/fuzz/run.py nsqd_tcp --merge-from /tmp/finds   # keep what adds coverage
    python tests/fuzz/run.py wire --seconds 3                     # every wire target at once

The corpus of each target is tests/fuzz/corpus/<target>/ (replayed by pytest on every
run). New inputs go to --out (default: a scratch directory), so the corpus in the
repository changes only by --merge-from, which adds the inputs that reach new coverage.
``wire`` and ``live`` run several targets in one process (the first byte of an input
picks one; their corpora are the targets' corpora, prefixed): what `make test` runs for
a few seconds. A crash writes the input to --artifacts (default: the scratch
directory) and exits non-zero. Arguments after ``--`` go to libFuzzer.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the fuzz package and the test helpers

import atheris  # noqa: E402

with atheris.instrument_imports(include=["nsqx"]):
    from fuzz import live_targets, wire_targets
from fuzz.dicts import write_dict  # noqa: E402

TARGETS: dict[str, Callable[[bytes], None]] = {**wire_targets.TARGETS, **live_targets.TARGETS}
GROUPS = {"wire": sorted(wire_targets.TARGETS), "live": sorted(live_targets.TARGETS)}


def dispatcher(names: list[str]) -> Callable[[bytes], None]:
    """One target over several: the input's first byte picks which."""
    targets = [TARGETS[n] for n in names]

    def run(data: bytes) -> None:
        if data:
            targets[data[0] % len(targets)](data[1:])

    return run


def main() -> None:
    if any(a.startswith("-merge_inner") for a in sys.argv):
        # libFuzzer's -merge runs us again with its own flags: hand them straight over
        atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[sys.argv[1]])
        atheris.Fuzz()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("target", nargs="?", choices=sorted([*TARGETS, *GROUPS]))
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--seconds", type=int, default=60, help="stop after this long")
    ap.add_argument("--runs", type=int, default=-1, help="stop after this many inputs")
    ap.add_argument("--out", help="where new interesting inputs go (default: scratch)")
    ap.add_argument(
        "--merge-from",
        help="add the inputs of this directory that reach new coverage to the corpus",
    )
    ap.add_argument("--artifacts", help="where crashing inputs are written")
    ap.add_argument("libfuzzer", nargs="*", help="more libFuzzer flags (after --)")
    args = ap.parse_args()
    if args.list or not args.target:
        for name, fn in sorted(TARGETS.items()):
            print(f"{name:10} {(fn.__doc__ or '').splitlines()[0]}")
        for name, names in GROUPS.items():
            print(f"{name:10} all of: {', '.join(names)}")
        return
    scratch = tempfile.mkdtemp(prefix=f"nsqx-fuzz-{args.target}-")
    if args.target in GROUPS:
        names = GROUPS[args.target]
        target = dispatcher(names)
        # the group's corpus: each target's inputs behind the byte that picks it
        corpus = Path(scratch) / "corpus"
        corpus.mkdir()
        for i, name in enumerate(names):
            for f in (HERE / "corpus" / name).glob("*"):
                (corpus / f"{name}-{f.name}").write_bytes(bytes((i,)) + f.read_bytes())
        dirs = [str(corpus)]
        dict_ok = any(write_dict(n, os.path.join(scratch, f"{n}.dict")) for n in names[:1])
        dict_path = os.path.join(scratch, f"{names[0]}.dict")
    else:
        target = TARGETS[args.target]
        corpus = HERE / "corpus" / args.target
        corpus.mkdir(parents=True, exist_ok=True)
        if args.merge_from:
            dirs = [str(corpus), args.merge_from]
        else:
            out = args.out or os.path.join(scratch, "new")
            os.makedirs(out, exist_ok=True)
            dirs = [out, str(corpus)]
        dict_path = os.path.join(scratch, "tokens.dict")
        dict_ok = write_dict(args.target, dict_path)
    artifacts = args.artifacts or scratch
    flags = [
        f"-max_total_time={args.seconds}",
        f"-runs={args.runs}",
        f"-artifact_prefix={os.path.join(artifacts, '')}",
        "-max_len=4096",
        "-rss_limit_mb=4096",
        "-timeout=30",  # an input that takes this long is a hang (a finding)
        "-print_final_stats=1",
        *args.libfuzzer,
    ]
    if args.merge_from:
        flags.append("-merge=1")
    if dict_ok:
        flags.insert(0, f"-dict={dict_path}")
    # libFuzzer runs argv[0] again through the shell for -merge: say how to
    argv0 = f"{sys.executable} {Path(__file__).resolve()} {args.target}"
    atheris.Setup([argv0, *flags, *dirs], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
