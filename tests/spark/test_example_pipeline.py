"""`make example-spark`'s pipeline, short and in local mode, against an nsqd of the test
(never the fixed ports): it checks its windows and says so, prints no stack trace that
looks like a failure, and writes only under its --state directory, not the tracked
docs/images/spark_pipeline.svg (issue 28)."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nsqdproc import start_nsqd

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
PICTURE = REPO / "docs" / "images" / "spark_pipeline.svg"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Opt-in (-m slow): two minutes of Spark, and on a loaded machine the producer can end
# before the queries' first micro-batches, after which the restarted queries get no
# event to move their watermark past the last windows (the example waits for them in
# vain). tests/spark/test_worker_python.py covers the source's own part (the workers'
# Python) in seconds.
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_example_pipeline_runs_quietly_and_writes_only_its_state(tmp_path: Path) -> None:
    nsqd = start_nsqd(tmp_path / "nsqd", "--http-address=127.0.0.1:0")
    state = tmp_path / "state"
    before = digest(PICTURE)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "examples/spark_pipeline/pipeline.py",
                f"--nsqd-http=127.0.0.1:{nsqd.http_port}",
                f"--nsqd-tcp=127.0.0.1:{nsqd.tcp_port}",
                "--master=local[2]",
                "--seconds=8",
                "--rate=100",
                "--partitions=2",
                f"--state={state}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        nsqd.stop(signal.SIGKILL)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "checked: " in done.stdout and "no loss, no duplicates" in done.stdout
    assert "Traceback" not in said and "\tat " not in said, said[-4000:]
    assert (state / "per_window.svg").exists()
    assert (state / "spark.log").exists()
    assert digest(PICTURE) == before
