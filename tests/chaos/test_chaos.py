"""The fault-injection suite's short run (what CI runs): a leader killed, drained
(SIGTERM), stopped, and isolated, and replication links with 200 ms of delay and 5 % loss, each with publishers
and consumers through it. Nothing acknowledged is lost, nothing appears that was not
published, ordered keys stay in order, no node acknowledges after it was replaced, and
writes resume (how fast is measured by `make chaos`, not asserted here). Needs root and
network namespaces (tests/chaos/netns.py); skips cleanly without them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.netns import Lab

RUN = Path(__file__).with_name("run.py")


@pytest.mark.timeout(900)
def test_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    why = Lab.unavailable()
    if why:
        pytest.skip(f"network lab unavailable: {why}")
    out = tmp_path / "verdicts.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--short", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    print(proc.stdout[-6000:])
    verdicts = json.loads(out.read_text())
    assert len(verdicts) == 5, proc.stderr[-3000:]
    for v in verdicts:
        failed = f"{v['scenario']}: {v['details']}"
        assert v["lost"] == 0, failed
        assert v["phantoms"] == 0, failed
        assert v["order_violations"] == 0, failed
        assert v["fenced_acks"] == 0, failed
        assert v["acknowledged"] > 0, failed
        # writes resumed: something was acknowledged after the fault on every partition
        assert v["resumed_after"] > 0, failed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
