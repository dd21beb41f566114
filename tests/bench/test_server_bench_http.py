"""The bench's HTTP phases run end to end against our own nsqd (briefly)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "server_bench.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("server_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["server_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_http_phases_publish_and_report() -> None:
    sb = load_bench()
    cfg = sb.BenchConfig(
        phases=("http-pub", "http-mpub"), http_seconds=0.3, http_concurrency=2, batch=10
    )
    report = sb.run_bench(cfg)
    phases = report["phases"]
    assert set(phases) == {"http-pub", "http-mpub"}
    for name, p in phases.items():
        assert p["msgs"] > 0, name
        assert p["requests_per_s"] > 0, name
    assert phases["http-mpub"]["msgs"] % 10 == 0
    text = sb.format_report(report)
    assert "http-pub: " in text and "requests/s" in text
