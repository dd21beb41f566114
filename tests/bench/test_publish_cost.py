"""bench/publish_cost.py runs nsqd's publish path in-process and checks every publish
was answered before it prints a figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "publish_cost.py"


@pytest.mark.parametrize("mode", ["pub", "mpub"])
def test_it_answers_every_publish_and_prints_the_cost(mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--conns=3", "--turns=50", f"--mode={mode}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{mode} of 1 x 200 B, 3 connections:" in proc.stdout
    assert "µs of CPU per publish" in proc.stdout
