"""bench/server_instructions.py runs a real nsqd under callgrind, publishes through it
(every answer checked) and prints the instructions per publish."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "server_instructions.py"


@pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
    reason="valgrind is not installed",
)
def test_it_counts_a_real_servers_instructions_per_publish() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--conns=2", "--count=40", "--mode=pub"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"PUB of 200 B, 2 connections, 80 publishes: ([\d,]+) instructions", proc.stdout)
    assert m, proc.stdout
    # a publish takes thousands of instructions: a count near zero means nothing was
    # measured (the counters zeroed after the work, or the wrong dump read)
    assert int(m.group(1).replace(",", "")) > 1000
