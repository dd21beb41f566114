"""youzan/go-nsq itself against nsqx's cluster (nsqlookupd and two nsqd as processes):
its ordered and traced publishes (``PublishOrdered`` with a murmur3 hasher,
``PublishAndTrace``, ``MultiPublishAndTrace``) are answered with offsets and raw sizes
that chain, and a tracing consumer (SUB_ADVANCED) reads the same (tests/youzan/gonsq/
chaincheck.go; issue 42: "key-03|0 at offset 113 follows key-00|0 at 30+53").

Needs Go and the sources of youzan/go-nsq and the modules it builds with, which a clone
does not have and the tests do not download: NSQX_GO_MODULES names a folder holding
``go-nsq`` (youzan/go-nsq), ``snappy`` (golang/snappy v0.0.1), ``lz4`` (pierrec/lz4
v2.4.1) and ``murmur3`` (spaolacci/murmur3 v1.1.0) source trees; skipped otherwise.
tests/youzan/test_side_by_side_nsqx.py checks the same through raw frames on every run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from nsqdproc import start_nsqd

HERE = Path(__file__).resolve().parent
MODULES = {
    "github.com/youzan/go-nsq": "go-nsq",
    "github.com/golang/snappy": "snappy",
    "github.com/pierrec/lz4": "lz4",
    "github.com/spaolacci/murmur3": "murmur3",
}


def build(tmp_path: Path) -> Path:
    modules = Path(os.environ.get("NSQX_GO_MODULES", ""))
    if not os.environ.get("NSQX_GO_MODULES") or shutil.which("go") is None:
        pytest.skip("needs go and NSQX_GO_MODULES (see the module's docstring)")
    missing = [d for d in MODULES.values() if not (modules / d).is_dir()]
    if missing:
        pytest.skip(f"NSQX_GO_MODULES lacks {missing}")
    src = tmp_path / "chaincheck"
    src.mkdir()
    shutil.copy(HERE / "gonsq" / "chaincheck.go", src / "main.go")
    lines = [
        "module chaincheck",
        "",
        "go 1.13",
        "",
        "require (",
        "\tgithub.com/spaolacci/murmur3 v1.1.0",
        "\tgithub.com/youzan/go-nsq v1.0.0",
        ")",
    ]
    lines += [f"replace {mod} => {modules / d}" for mod, d in MODULES.items()]
    (src / "go.mod").write_text("\n".join(lines) + "\n")
    env = dict(
        os.environ,
        GOPROXY="off",
        GOSUMDB="off",
        GOFLAGS="-mod=mod",
        GOPATH=str(tmp_path / "gopath"),
        GOCACHE=str(tmp_path / "gocache"),
    )
    subprocess.run(["go", "build", "-o", "chaincheck", "."], cwd=src, env=env, check=True)
    return src / "chaincheck"


def test_youzan_go_nsq_sees_offsets_chain_by_raw_size(lookupd_factory: Any, tmp_path: Path) -> None:
    program = build(tmp_path)
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    args = (
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    )
    nodes = [start_nsqd(tmp_path / f"nsqd{i}", *args) for i in range(2)]
    try:
        deadline = time.monotonic() + 20
        while len(lookupd.json("/nodes")["producers"]) < 2:
            assert time.monotonic() < deadline, "both nsqd registered"
            time.sleep(0.05)
        for q in (
            "topic=gord&partition_num=2&replicator=1&orderedmulti=true",
            "topic=gtrace&partition_num=1&replicator=1",
        ):
            status, _, body = lookupd.post(f"/topic/create?{q}")
            assert status == 200, body
        proc = subprocess.run(
            [str(program), lookupd.http_address, "gord", "gtrace"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        failures = [line for line in proc.stdout.splitlines() if not line.startswith("ok")]
        assert proc.returncode == 0 and not failures, (failures, proc.stderr[-2000:])
        assert proc.stdout.count("\nok") >= 30
    finally:
        for n in nodes:
            n.stop()
