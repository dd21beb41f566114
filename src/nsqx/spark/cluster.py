"""A Spark standalone cluster on loopback, for the tests, the example and the benchmark.

A master and ``workers`` workers, each a JVM process of its own started with the pyspark
package's ``bin/spark-class`` (the classes ``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``: what Spark's ``sbin`` scripts run, which pip's pyspark does not
ship). Every port is chosen by the JVM (``--port 0``) and read back from its log, so
nothing races for a port. Each worker starts one executor per application, a JVM of its
own, which runs its own Python workers (``spark.pyspark.python``).

    with StandaloneCluster(workers=2) as cluster:
        spark = cluster.session("my-app")
        ...
        spark.stop()

On a real cluster nothing here is needed: see docs/spark.md (spark-submit).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from nsqx.spark.java import ensure_java

#: the master's URL, as its log announces it
_MASTER_RE = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"


def spark_home() -> str:
    """The pyspark package's folder: its ``bin/`` and ``jars/`` are a Spark install."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


class ClusterError(RuntimeError):
    """A master or worker did not start (the message has its log's tail)."""


class _Daemon:
    """One JVM daemon (master or worker) and its log file."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        self._out: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        self.proc = subprocess.Popen(
            cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float) -> re.Match[str] | str:
        """Wait until the log shows ``pattern``; raise ClusterError if the JVM exits or
        the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log.read_text(errors="replace")
            if isinstance(pattern, str):
                if pattern in text:
                    return pattern
            else:
                m = pattern.search(text)
                if m:
                    return m
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.proc.poll() is not None else "is not ready"
                tail = "\n".join(text.splitlines()[-15:])
                raise ClusterError(f"Spark {self.name} {why}; its log ({self.log}):\n{tail}")
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            # the whole process group: spark-class's bash and the JVM under it (a worker's
            # executors are its children; it stops them on SIGTERM)
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._out.close()


class StandaloneCluster:
    """A Spark standalone master and workers on 127.0.0.1 (see the module's doc).

    ``cores`` and ``memory`` are each worker's. ``work_dir`` keeps the logs and each
    worker's folder (a temporary one, deleted by :meth:`stop`, if not given).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        work_dir: str | None = None,
        daemon_java_options: str = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    ) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="nsqx-spark-cluster-"))
        self.daemon_java_options = daemon_java_options
        self.master_url = ""
        self._daemons: list[_Daemon] = []

    def _env(self) -> dict[str, str]:
        ensure_java()
        env = dict(os.environ)
        env["SPARK_HOME"] = spark_home()
        env["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only
        env.setdefault("SPARK_DAEMON_MEMORY", "512m")  # master and workers do little
        env["SPARK_DAEMON_JAVA_OPTS"] = self.daemon_java_options
        # executors run this interpreter (with nsqx) unless the application says otherwise
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        return env

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker registered."""
        env = self._env()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            master = _Daemon(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                ],
                self.work_dir / "master.log",
                env,
            )
            self._daemons.append(master)
            m = master.wait_for(_MASTER_RE, timeout)
            assert isinstance(m, re.Match)
            self.master_url = m.group(1)
            started = []
            for i in range(self.workers):
                wdir = self.work_dir / f"worker{i}"
                wdir.mkdir(exist_ok=True)
                w = _Daemon(
                    f"worker {i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "0",
                        "--webui-port",
                        "0",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(wdir),
                        self.master_url,
                    ],
                    self.work_dir / f"worker{i}.log",
                    env,
                )
                self._daemons.append(w)
                started.append(w)
            for w in started:
                w.wait_for(_REGISTERED, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def session(
        self,
        app_name: str,
        conf: dict[str, str] | None = None,
        *,
        executor_memory: str | None = None,
    ) -> Any:
        """A SparkSession on this cluster, returned once one executor per worker has
        registered (so that a job's tasks spread over them)."""
        from pyspark.sql import SparkSession

        builder = (
            SparkSession.builder.master(self.master_url)
            .appName(app_name)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.executor.cores", str(self.cores))
            .config("spark.cores.max", str(self.cores * self.workers))
            .config("spark.executor.memory", executor_memory or self.memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
        if os.environ.get("PYTHONPATH"):
            builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        wait_for_executors(spark, self.workers)
        return spark

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master."""
        for d in reversed(self._daemons):
            d.stop()
        self._daemons.clear()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def executor_count(spark: Any) -> int:
    """Executors registered with the driver (the driver's own block manager excluded)."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return int(status.size()) - 1


def wait_for_executors(spark: Any, n: int, timeout: float = 120.0) -> None:
    """Wait until ``n`` executors have registered with ``spark``'s driver."""
    deadline = time.monotonic() + timeout
    while executor_count(spark) < n:
        if time.monotonic() > deadline:
            raise ClusterError(f"{executor_count(spark)} of {n} executors registered")
        time.sleep(0.1)
