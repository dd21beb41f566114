"""The fault suite's storage scenarios that CI runs (issue 43): nodes whose data
directories are on faultfs (tests/faultfs), power cuts of every node at once, whole and
torn, and of one nsqd, with publishers and consumers through them. Each run must keep
every invariant of the checker (tests/chaos/checker.py): nothing acknowledged lost, no
phantom, order kept, no fenced acknowledgement, no message id reused, deferred messages
not early, positions not moved back.

Runs marked xfail(strict=True) fail today for the reason given (issue 43); once storage
or replication is fixed they pass, XPASS fails the suite, and the mark comes off. Needs
root, network namespaces and FUSE; skips cleanly without them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.netns import Lab
from faultfs import unavailable

RUN = Path(__file__).with_name("run.py")

CASES = [
    pytest.param("power: all nodes, sync-before-ack", 7, id="all-nodes-sync"),
    pytest.param("flip: a follower's segment, failover", 7, id="flip-follower"),
    pytest.param(
        "power: one nsqd, sync-before-ack",
        7,
        id="one-nsqd-sync",
        marks=pytest.mark.xfail(
            strict=True,
            reason="issue 43: nsqd does not fsync a topic's directory after making its "
            "partition's: the cut loses the whole log, and its ids are given again",
        ),
    ),
    pytest.param(
        "torn: all nodes, sync-before-ack",
        7,
        id="torn-all-nodes-sync",
        marks=pytest.mark.xfail(
            strict=True,
            reason="issue 43: replicas that set their torn tails aside no longer line up "
            "with the leader's log and never rejoin: writes never resume",
        ),
    ),
]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("scenario,seed", CASES)
def test_storage_scenario_keeps_every_invariant(tmp_path: Path, scenario: str, seed: int) -> None:
    why = Lab.unavailable() or unavailable()
    if why:
        pytest.skip(f"needs a network lab and FUSE: {why}")
    out = tmp_path / "verdicts.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "--scenario",
            scenario,
            "--seed",
            str(seed),
            "--scale",
            "0.5",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=380,
    )
    print(proc.stdout[-4000:])
    (v,) = json.loads(out.read_text())
    assert v["acknowledged"] > 0, f"{v['details']}\n{proc.stderr[-2000:]}"
    assert v["ok"], f"{scenario}: {v['details']}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
