"""The latency bench runs each phase end to end against our own nsqd (briefly)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_phase_reports_against_our_nsqd(monkeypatch: pytest.MonkeyPatch) -> None:
    # the publisher processes (spawned) import the bench by name, from this sys.path
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    load("server_bench")
    lb = load("latency_bench")
    cfg, _ = lb.parse_args(
        [
            "--target=ours=ours",
            "--rates=2000",
            "--modes=timeout-1,size-1",
            "--seconds=1.2",
            "--warmup=0.2",
            "--cooldown=0.2",
            "--conns=2",
            "--generators=py",
            "--rtt-seconds=0.5",
            "--py-procs=1",
            "--defer-messages=20",
            "--rounds=1",
        ]
    )
    lines: list[str] = []
    results = lb.run(cfg, lines.append)
    by_phase = {(r["phase"], r.get("mode")): r for r in results}
    for phase, mode in itertools.product(("latency", "oneloop"), ("timeout-1", "size-1")):
        r = by_phase[(phase, mode)]
        # every message of the measured window came, each measured once
        assert r["undelivered"] == 0
        assert r["measured"] > 1000
        assert 0 < r["p50"] <= r["p99"] <= r["p999"] <= r["max"]
    rtt = by_phase[("pub-rtt", None)]
    assert rtt["msgs"] > 0 and rtt["conns"] == 2
    defer = by_phase[("defer", None)]
    # deferred messages never come before their time
    assert defer["dpub_early"] == 0 and defer["req_early"] == 0
    table = lb.latency_table(results, ["ours"])
    assert "| oneloop size-1 2,000 msgs/s |" in table and "| latency timeout-1" in table
    summary = lb.summary(cfg)
    assert (
        "latency timeout-1" in summary
        and "oneloop    size-1" in summary
        and "pub-rtt  py   2 conns" in summary
    )
