#!/bin/bash
# The 16-core run of bench/scaling_bench.py on a lent machine (issue 30), in two steps:
#
#   bench/scaling_device.sh prepare   # here: .dev/ gets a compiled cp312 wheel of this
#                                     # tree, its dependencies' wheels and Go's binaries
#   bench/scaling_device.sh run ARGS  # there (the device tool, carrying .dev): installs
#                                     # the wheels, runs scaling_bench.py with ARGS
#
# The lent machines run Python 3.12 with uvloop, aiohttp and prometheus-client already
# installed, and cannot download: so the wheel is built here with a Python 3.12 (pyenv's
# by default, PY312=...) and carried. .dev/ must be ignored (.git/info/exclude).
set -eu
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    PY312=${PY312:-$(command -v python3.12)}
    GO_DIR=${GO_DIR:-../shared/reference/go-nsq-1.3.0}
    rm -rf .dev && mkdir -p .dev/go .dev/whl
    cp "$GO_DIR"/{nsqd,bench_writer,bench_reader} .dev/go/
    "$PY312" -m venv .dev/build-venv
    .dev/build-venv/bin/pip install -q mypy setuptools wheel
    tree=$(mktemp -d)
    git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c | tar -x -C "$tree"
    (cd "$tree" && NSQX_COMPILE=1 "$OLDPWD"/.dev/build-venv/bin/pip wheel -q --no-deps \
        --no-build-isolation -w "$OLDPWD"/.dev/whl .)
    rm -rf "$tree" .dev/build-venv
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .dev/whl cramjam google-crc32c
    du -sh .dev
    ;;
run)
    shift
    PY=${PY:-python3}
    SITE=${SITE:-/tmp/site}
    OUT=${OUT:-/tmp/scaling-out}
    mkdir -p "$OUT"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .dev/whl/*.whl
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
    (cd /tmp && "$PY" -c "from nsqx.compiled import build_description as b; print(b())")
    echo "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo)"
    "$PY" bench/scaling_bench.py --go-dir .dev/go --nsqd-python "$PY" "$@" \
        --json "$OUT/scaling.json" 2>&1 | tee "$OUT/scaling.log"
    ;;
*)
    echo "usage: $0 prepare | run [scaling_bench.py arguments]" >&2
    exit 2
    ;;
esac
