"""The fuzz corpus replayed on every run, and a short coverage-guided run (atheris).

The long runs and their figures: docs/reliability.md.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuzz.live_targets import TARGETS as LIVE
from fuzz.live_targets import LiveNsqd
from fuzz.wire_targets import TARGETS as WIRE

HERE = Path(__file__).resolve().parent


def _corpus(target: str) -> list[Path]:
    return sorted((HERE / "corpus" / target).glob("*"))


@pytest.mark.parametrize("target", sorted(WIRE))
def test_wire_corpus_replays(target: str) -> None:
    files = _corpus(target)
    assert files, f"no corpus for {target}"
    for f in files:
        WIRE[target](f.read_bytes())


@pytest.fixture(scope="module")
def lives() -> Iterator[None]:
    yield
    for live in list(LiveNsqd._instances.values()):
        live.close()


@pytest.mark.parametrize("target", sorted(LIVE))
def test_live_corpus_replays(target: str, lives: None) -> None:
    """Every input of the corpus against one live nsqd, which stays healthy."""
    files = _corpus(target)
    assert files, f"no corpus for {target}"
    for f in files:
        LIVE[target](f.read_bytes())
    live = LiveNsqd.get(auth=target == "nsqd_auth")
    if not live.auth:
        live.loop.run_until_complete(live.healthy())


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed")
@pytest.mark.parametrize("group", ["wire", "live"])
def test_short_coverage_guided_run(group: str, tmp_path: Path) -> None:
    """A few seconds of atheris over every target of the group (mutating the corpus)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "run.py"),
            group,
            "--seconds=4",
            f"--artifacts={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    tail = proc.stderr[-4000:]
    assert proc.returncode == 0, tail
    assert "stat::number_of_executed_units" in proc.stderr, tail
    assert not list(tmp_path.glob("crash-*")), tail
