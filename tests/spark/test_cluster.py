"""The "nsq" source on a Spark standalone cluster: who does what, and empty reads.

The session's cluster (tests/spark/conftest.py) has two workers; each runs one executor,
a JVM of its own with its own Python workers. A recording HTTP proxy in front of each
nsqd shows which requests the driver makes while it plans and which the tasks make.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from test_spark import publish

from nsqdproc import NsqdProcess, start_nsqd

pytestmark = pytest.mark.spark


class _Server(ThreadingHTTPServer):
    # executors keep their keep-alive connections open: closing must not wait for them
    block_on_close = False


class RecordingProxy:
    """Forwards HTTP requests to one nsqd and records each (method, path, query)."""

    def __init__(self, target_port: int) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                url = urlsplit(self.path)
                with lock:
                    proxy.requests.append((self.command, url.path, parse_qs(url.query)))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                conn.request(self.command, self.path, body=body)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def data_reads(self) -> list[dict[str, list[str]]]:
        """The range reads that asked for records (bounds are asked with max_messages=0)."""
        return [
            q
            for method, path, q in self.requests
            if path == "/range" and q.get("max_messages", ["10000"])[0] != "0"
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def two_nsqd(tmp_path: Path) -> Iterator[list[NsqdProcess]]:
    started = [start_nsqd(tmp_path / f"n{i}", "--http-address=127.0.0.1:0") for i in range(2)]
    yield started
    for n in started:
        n.stop(signal.SIGKILL)


def test_executors_in_two_processes_read_what_the_driver_planned_without_data(
    spark: Any, two_nsqd: list[NsqdProcess]
) -> None:
    """Planning asks each nsqd for its partitions and bounds only; the two ranges are
    then read by tasks in two executor JVMs (one per worker), none in the driver's."""
    from pyspark.sql import functions as F

    a, b = two_nsqd
    publish(a, "spread", [b"a-%d" % i for i in range(3000)])
    publish(b, "spread", [b"b-%d" % i for i in range(2000)])
    proxies = [RecordingProxy(n.http_port) for n in two_nsqd]
    try:
        df = (
            spark.read.format("nsq")
            .option("topic", "spread")
            .option("nsqdHttpAddresses", ",".join(p.address for p in proxies))
            .option("readMessages", "500")  # several requests per range
            .load()
        )
        assert df.rdd.getNumPartitions() == 2  # planned: one range per nsqd
        for p in proxies:
            assert p.requests, "the driver asked nothing while planning"
            assert p.data_reads() == [], "the driver read records while planning"

        def jvm_of_this_process(_: int) -> int:
            """The pid of the JVM above this Python worker (defined here so that it is
            pickled by value: executors cannot import the tests)."""
            import os

            pid = os.getpid()
            while pid > 1:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
                if argv0.endswith(b"java"):
                    return pid
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            return 0

        jvm = F.udf(jvm_of_this_process, "long")
        rows = df.select(
            F.spark_partition_id().alias("task"), jvm("partition").alias("jvm"), "nsqd", "body"
        ).collect()
        assert sorted(r.body for r in rows) == sorted(
            [b"a-%d" % i for i in range(3000)] + [b"b-%d" % i for i in range(2000)]
        )
        by_task: dict[int, set[tuple[int, str]]] = {}
        for r in rows:
            by_task.setdefault(r.task, set()).add((r.jvm, r.nsqd))
        assert len(by_task) == 2
        jvms = {j for pairs in by_task.values() for j, _ in pairs}
        assert len(jvms) == 2, by_task  # the two tasks ran in two executor processes
        for pid in jvms:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert b"CoarseGrainedExecutorBackend" in f.read()
        driver_jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()
        assert driver_jvm not in jvms
        for p in proxies:  # and each range was read in requests of 500
            reads = p.data_reads()
            assert len(reads) >= 4 and all(q["max_messages"] == ["500"] for q in reads)
    finally:
        for p in proxies:
            p.close()


def test_empty_ranges_give_no_rows(spark: Any, two_nsqd: list[NsqdProcess], tmp_path: Path) -> None:
    """latest..latest of a quiet topic, JSON offsets with start = end, and a topic that
    no nsqd has: no rows and no error, in a batch read and in a stream."""
    a, _ = two_nsqd
    publish(a, "quiet", [b"old-%d" % i for i in range(10)])
    addr = f"127.0.0.1:{a.http_port}"

    def read(topic: str, **options: str) -> Any:
        r = spark.read.format("nsq").option("topic", topic).option("nsqdHttpAddresses", addr)
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    assert read("quiet", startingOffsets="latest").count() == 0
    same = json.dumps({f"{addr}/0": 4})
    assert read("quiet", startingOffsets=same, endingOffsets=same).count() == 0
    assert read("nowhere").count() == 0
    assert read("quiet").count() == 10
    for topic, start in (("quiet", "latest"), ("nowhere", "earliest")):
        q = (
            spark.readStream.format("nsq")
            .option("topic", topic)
            .option("nsqdHttpAddresses", addr)
            .option("startingOffsets", start)
            .load()
            .writeStream.format("memory")
            .queryName(f"empty_{topic}")
            .option("checkpointLocation", str(tmp_path / f"ckpt-{topic}"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None
        assert spark.table(f"empty_{topic}").count() == 0


def test_batch_write_appends_and_refuses_other_modes(
    spark: Any, two_nsqd: list[NsqdProcess]
) -> None:
    """What docs/spark.md shows: ``.mode("append").save()`` publishes; Spark refuses its
    default mode (errorifexists) for Python sources before the source is asked, and the
    source refuses "overwrite" (a topic is only appended to)."""
    a, _ = two_nsqd
    df = spark.createDataFrame([(f"w-{i}",) for i in range(50)], "value STRING")

    def writer() -> Any:
        # docs/spark.md's batch write, as it is there
        return (
            df.selectExpr("CAST(value AS BINARY) AS body")
            .write.format("nsq")
            .option("topic", "written")
            .option("nsqdTcpAddresses", f"127.0.0.1:{a.tcp_port}")
        )

    writer().mode("append").save()
    with pytest.raises(Exception, match=r"(?i)append"):
        writer().save()
    with pytest.raises(Exception, match="cannot be overwritten"):
        writer().mode("overwrite").save()
    got = (
        spark.read.format("nsq")
        .option("topic", "written")
        .option("nsqdHttpAddresses", f"127.0.0.1:{a.http_port}")
        .load()
    )
    assert sorted(r.body for r in got.select("body").collect()) == sorted(
        b"w-%d" % i for i in range(50)
    )
    # the topic per row, from topicColumn (the body a string column)
    (
        spark.createDataFrame(
            [(f"t{i % 2}", f"r-{i}") for i in range(10)], "dest STRING, text STRING"
        )
        .write.format("nsq")
        .option("topicColumn", "dest")
        .option("bodyColumn", "text")
        .option("nsqdTcpAddresses", f"127.0.0.1:{a.tcp_port}")
        .mode("append")
        .save()
    )
    for t in ("t0", "t1"):
        rows = (
            spark.read.format("nsq")
            .option("topic", t)
            .option("nsqdHttpAddresses", f"127.0.0.1:{a.http_port}")
            .load()
            .select("body")
            .collect()
        )
        assert sorted(r.body for r in rows) == sorted(
            b"r-%d" % i for i in range(10) if f"t{i % 2}" == t
        )


def test_stream_write_publishes_each_micro_batch(
    spark: Any, two_nsqd: list[NsqdProcess], tmp_path: Path
) -> None:
    """``writeStream.format("nsq")`` with its own checkpointLocation option (Spark passes
    it to the sink with the others): every row of every micro-batch is published, by
    tasks on the executors; a restarted query goes on from its checkpoint."""
    a, b = two_nsqd
    src = f"127.0.0.1:{a.http_port}"

    def run() -> None:
        q = (
            spark.readStream.format("nsq")
            .option("topic", "in")
            .option("nsqdHttpAddresses", src)
            .option("maxOffsetsPerTrigger", "40")
            .load()
            .selectExpr("concat(body, '!') AS body")
            .writeStream.format("nsq")
            .option("topic", "out")
            .option("nsqdTcpAddresses", f"127.0.0.1:{b.tcp_port}")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None

    publish(a, "in", [b"s-%d" % i for i in range(100)])
    run()
    publish(a, "in", [b"t-%d" % i for i in range(30)])
    run()
    got = (
        spark.read.format("nsq")
        .option("topic", "out")
        .option("nsqdHttpAddresses", f"127.0.0.1:{b.http_port}")
        .load()
    )
    assert sorted(r.body for r in got.select("body").collect()) == sorted(
        [b"s-%d!" % i for i in range(100)] + [b"t-%d!" % i for i in range(30)]
    )


def test_spark_submit_as_the_docs_show(
    spark_cluster: Any, two_nsqd: list[NsqdProcess], tmp_path: Path
) -> None:
    """docs/spark.md's ``PYSPARK_PYTHON=... spark-submit --master URL my_job.py`` on the
    tests' cluster: a driver of its own finds the "nsq" format registered by itself (the
    pyspark_nsq module) and its executors read the topic."""
    import os
    import subprocess
    import sys

    a, _ = two_nsqd
    publish(a, "submitted", [b"j-%d" % i for i in range(700)])
    job = tmp_path / "my_job.py"
    job.write_text(
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.appName('my-job').getOrCreate()\n"
        "df = (spark.read.format('nsq').option('topic', 'submitted')\n"
        "      .option('nsqdHttpAddresses', sys.argv[1]).load())\n"
        "print('ROWS', df.count())\n"
        "spark.stop()\n"
    )
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        # spark-submit finds Spark with the python on the PATH (an activated venv)
        "PATH": bin_dir + os.pathsep + os.environ["PATH"],
    }
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env.pop("PYTHONPATH", None)  # nsqx as installed, not the tests' source tree
    out = subprocess.run(
        [
            os.path.join(bin_dir, "spark-submit"),
            "--master",
            spark_cluster.master_url,
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.executor.memory=512m",
            str(job),
            f"127.0.0.1:{a.http_port}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ROWS 700" in out.stdout.splitlines()
