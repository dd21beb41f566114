"""bench/scaling_bench.py: its targets, its tables, and (with Go's bench_writer at hand)
a short run of N separate nsqx processes, the load shared out among them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scaling_bench", BENCH_DIR / "scaling_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sb = load()


def test_separate_processes_are_a_target_per_count_above_one() -> None:
    targets = sb.make_targets(
        ["nsqx", "nsqx-sep"], Path("/nowhere"), [1, 2, 4], "py", ["--x=1"], print
    )
    by_name = {t.name: t for t in targets}
    assert list(by_name) == ["nsqx-1w", "nsqx-2w", "nsqx-4w", "nsqx-2p", "nsqx-4p"]
    assert by_name["nsqx-4w"].argv == ["py", "-m", "nsqx", "nsqd", "--workers=4", "--x=1"]
    # separate processes: each a whole nsqd of one process, with the flags given
    assert by_name["nsqx-4p"].argv == ["py", "-m", "nsqx", "nsqd", "--x=1"]
    assert (by_name["nsqx-4p"].processes, by_name["nsqx-4p"].workers) == (4, 1)
    # not among the defaults
    cfg = sb.parse_args(["--go-dir=/nowhere", "--workers=1,2"], print)
    assert [t.name for t in cfg.targets] == ["go", "go-mem", "nsqx-1w", "nsqx-2w"]


def result(target: str, rnd: int, rate: float) -> dict[str, Any]:
    return {
        "target": target,
        "round": rnd,
        "phase": "pub16",
        "msgs_per_s": rate,
        "server_cores": 1.0,
        "generator_cores": 0.5,
    }


def test_tables_give_ratios_to_one_process_round_by_round() -> None:
    targets = [sb.Target(n, [], "nsqx") for n in ("nsqx-1w", "nsqx-2w", "nsqx-2p")]
    cfg = sb.Config(go_dir=Path("/nowhere"), targets=targets, phases=("pub16",), rounds=3)
    # round 2 is slow for everyone: the ratio is taken within each round
    rates = {"nsqx-1w": (100, 50, 100), "nsqx-2w": (90, 45, 120), "nsqx-2p": (110, 55, 130)}
    cfg.results = [
        result(name, rnd + 1, rate) for name, rs in rates.items() for rnd, rate in enumerate(rs)
    ]
    text = sb.tables(cfg)
    assert "no ratios" not in text
    ratios = text.split("rate / nsqx-1w's rate")[1]
    assert "| nsqx-2w | 0.90 |" in ratios and "| nsqx-2p | 1.10 |" in ratios
    assert "| nsqx-1w | 100 (1.0 / 0.5) |" in text
    assert "go-mem's rate" not in text


@pytest.mark.skipif(
    not sb.executable(sb.default_go_dir() / "bench_writer"), reason="Go's bench_writer absent"
)
def test_separate_processes_share_the_load(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = sb.main(
        [
            "--targets=nsqx-sep",
            "--workers=2",
            "--phases=pub16",
            "--seconds=1",
            f"--nsqd-python={sys.executable}",
            f"--json={out}",
        ]
    )
    assert code == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["target"] == "nsqx-2p" and r["server_processes"] == 2
    assert r["msgs"] > 0
