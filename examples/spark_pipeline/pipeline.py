"""Example pipeline: events -> NSQ -> Structured Streaming -> Parquet + a summary topic.

    python examples/spark_pipeline/pipeline.py          # or: make example-spark

1. Uses the local cluster of `make up` (nsqd on 127.0.0.1:4150/4151) if one is running;
   otherwise starts one (`nsqx up`) in a temporary folder for the run.
2. Creates the topic "events" with --partitions partitions (4) on that nsqd
   (``POST /topic/create?topic=events&partition=p&partition_num=4``, what nsqlookupd asks
   of each node it places a partition on) and publishes --events JSON events ({"user",
   "amount", "ts"}) to them, each to the partition of its user (the same user, the same
   partition, so one user's events stay in order).
3. Runs a Structured Streaming query (trigger availableNow, at most --per-batch rows per
   micro-batch) that reads every partition of "events" with the "nsq" data source,
   counts events and sums amounts per minute of event time, writes the per-minute table
   to Parquet and publishes one summary message per minute to the topic
   "events_per_minute".
4. Prints what each micro-batch read from each partition, where the query's offsets
   stand against each partition's end, the Parquet table, and the summaries read back.

Run it twice: the second run resumes from the query's checkpoint and only reads the new
events (the per-minute table then covers both runs). Run it with more --partitions: the
new partitions join the query at their first message.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STATE = HERE / ".state"  # checkpoint and Parquet output, kept between runs


def nsqd_alive(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/ping", timeout=1) as resp:
            return bool(resp.read() == b"OK")
    except OSError:
        return False


def start_cluster() -> tuple[subprocess.Popen[bytes], str]:
    data = tempfile.mkdtemp(prefix="nsqx-example-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqx", "up", "--data-dir", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        if nsqd_alive("127.0.0.1:4151"):
            return proc, data
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("could not start a local cluster (nsqx up); is port 4150/4151 taken?")


def post(http: str, path: str, data: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{http}{path}", data=data, method="POST")
    with urllib.request.urlopen(req) as resp:
        resp.read()


def create_topic(http: str, partitions: int) -> None:
    """The partitioned topic "events": each partition made on this nsqd (idempotent; a
    topic of an earlier run keeps its messages and gains any new partitions)."""
    for p in range(partitions):
        post(http, f"/topic/create?topic=events&partition={p}&partition_num={partitions}")


def partition_of(user: str, partitions: int) -> int:
    # any stable hash does; nsqx.client picks partitions by key as Youzan's clients do
    return zlib.crc32(user.encode()) % partitions


def publish_events(http: str, n: int, partitions: int) -> None:
    now = time.time()
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for _ in range(n):
        user = f"user-{random.randrange(20)}"
        event = {
            "user": user,
            "amount": round(random.uniform(1, 100), 2),
            "ts": now - random.uniform(0, 300),  # the last five minutes
        }
        by_partition[partition_of(user, partitions)].append(json.dumps(event).encode())
    for p, events in by_partition.items():
        for i in range(0, len(events), 500):
            batch = events[i : i + 500]
            body = struct.pack(">i", len(batch)) + b"".join(
                struct.pack(">i", len(e)) + e for e in batch
            )
            post(http, f"/mpub?topic=events&partition={p}&binary=true", body)
    counts = ", ".join(f"{p}: {len(e)}" for p, e in by_partition.items())
    print(f"published {n} events to topic 'events', by partition {{{counts}}}")


def _offsets(value: Any) -> dict[str, int]:
    """A source offset of a progress report ({"host:port/partition": sequence})."""
    if isinstance(value, str):
        value = json.loads(value) if value else {}
    return {str(k): int(v) for k, v in (value or {}).items()}


def print_progress(query: Any, http: str) -> None:
    """What each micro-batch read from each partition, then each partition's lag."""
    from nsqx.spark import rangeclient

    last: dict[str, int] = {}
    for progress in query.recentProgress:
        source = progress["sources"][0]
        # the first micro-batch of a query has no start offset: it starts at the first
        # retained message of each partition (startingOffsets=earliest); a partition
        # that appears later joins at its first retained message, read from the next
        start, end = _offsets(source["startOffset"]), _offsets(source["endOffset"])
        ranges = "  ".join(
            f"{k.rpartition('/')[2]}: "
            + (f"{start[k]}-{v}" if k in start else f"..-{v}" if not start else f"joins at {v}")
            for k, v in sorted(end.items())
        )
        rows = source["numInputRows"]
        print(f"micro-batch {progress['batchId']}: {rows:>5} rows, by partition {ranges}")
        last = end
    if not last:
        print("no micro-batch ran: nothing new in 'events'")
        return
    print(f"{'partition':<22}{'offset':>8}{'end':>8}{'lag':>6}")
    for key, offset in sorted(last.items()):
        address, _, p = key.rpartition("/")
        end = rangeclient.bounds(address, "events", int(p))[1]
        print(f"{key:<22}{offset:>8}{end:>8}{end - offset:>6}")


def run_query(http: str, tcp: str, per_batch: int) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsqx-example")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    events = (
        spark.readStream.format("nsq")
        .option("topic", "events")
        .option("nsqdHttpAddresses", http)
        .option("channel", "pipeline")  # its lag shows in nsqd's /stats
        .option("maxOffsetsPerTrigger", str(per_batch))  # shared by the partitions
        .load()
        .select(
            F.from_json(
                F.col("body").cast("string"), "user STRING, amount DOUBLE, ts DOUBLE"
            ).alias("e")
        )
        .select(F.col("e.user"), F.col("e.amount"), F.col("e.ts").cast("timestamp").alias("at"))
    )
    per_minute = (
        events.groupBy(F.window("at", "1 minute").alias("w"))
        .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
        .select(F.col("w.start").alias("minute"), "events", "amount")
    )
    parquet = str(STATE / "per_minute.parquet")

    def each_batch(df: Any, batch_id: int) -> None:
        if df.isEmpty():
            return
        df.write.mode("overwrite").parquet(parquet)  # complete mode: the whole table
        (
            df.select(F.to_json(F.struct("minute", "events", "amount")).alias("body"))
            .write.format("nsq")
            .option("topic", "events_per_minute")
            .option("nsqdTcpAddresses", tcp)
            .mode("append")
            .save()
        )

    query = (
        per_minute.writeStream.outputMode("complete")
        .foreachBatch(each_batch)
        .option("checkpointLocation", str(STATE / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print_progress(query, http)
    print("per-minute table (Parquet):")
    spark.read.parquet(parquet).orderBy("minute").show(truncate=False)
    summaries = (
        spark.read.format("nsq")
        .option("topic", "events_per_minute")
        .option("nsqdHttpAddresses", http)
        .load()
    )
    print(f"{summaries.count()} summary messages in topic 'events_per_minute', the latest:")
    for row in summaries.orderBy(F.col("offset").desc()).limit(3).collect():
        print("  ", row.body.decode())
    spark.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--partitions", type=int, default=4, help="partitions of 'events'")
    ap.add_argument("--per-batch", type=int, default=2000, help="rows per micro-batch at most")
    ap.add_argument("--nsqd-http", default="127.0.0.1:4151")
    ap.add_argument("--nsqd-tcp", default="127.0.0.1:4150")
    ap.add_argument("--reset", action="store_true", help="forget the checkpoint and output")
    args = ap.parse_args()
    if args.reset:
        shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(exist_ok=True)
    cluster = None
    if not nsqd_alive(args.nsqd_http):
        print("no local cluster running: starting one for this run (make up keeps one)")
        cluster = start_cluster()
        shutil.rmtree(STATE, ignore_errors=True)  # a new cluster: old offsets mean nothing
        STATE.mkdir()
    try:
        create_topic(args.nsqd_http, args.partitions)
        publish_events(args.nsqd_http, args.events, args.partitions)
        run_query(args.nsqd_http, args.nsqd_tcp, args.per_batch)
    finally:
        if cluster is not None:
            proc, data = cluster
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
