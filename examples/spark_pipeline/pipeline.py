"""Example pipeline: events -> NSQ -> Structured Streaming -> Parquet + a summary topic.

    python examples/spark_pipeline/pipeline.py          # or: make example-spark

1. Uses the local cluster of `make up` (nsqd on 127.0.0.1:4150/4151) if one is running;
   otherwise starts one (`nsqx up`) in a temporary folder for the run.
2. Publishes --events JSON events ({"user", "amount", "ts"}) to the topic "events".
3. Runs a Structured Streaming query (trigger availableNow) that reads "events" with the
   "nsq" data source, counts events and sums amounts per minute of event time, writes
   the per-minute table to Parquet and publishes one summary message per minute to the
   topic "events_per_minute".
4. Prints the Parquet table and reads the summaries back from NSQ.

Run it twice: the second run resumes from the query's checkpoint and only reads the new
events (the per-minute table then covers both runs).
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


def publish_events(http: str, n: int) -> None:
    now = time.time()
    events = [
        json.dumps(
            {
                "user": f"user-{random.randrange(20)}",
                "amount": round(random.uniform(1, 100), 2),
                "ts": now - random.uniform(0, 300),  # the last five minutes
            }
        ).encode()
        for _ in range(n)
    ]
    for i in range(0, n, 500):
        batch = events[i : i + 500]
        body = struct.pack(">i", len(batch)) + b"".join(
            struct.pack(">i", len(e)) + e for e in batch
        )
        req = urllib.request.Request(f"http://{http}/mpub?topic=events&binary=true", data=body)
        with urllib.request.urlopen(req) as resp:
            assert resp.read() == b"OK"
    print(f"published {n} events to topic 'events'")


def run_query(http: str, tcp: str) -> None:
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
        publish_events(args.nsqd_http, args.events)
        run_query(args.nsqd_http, args.nsqd_tcp)
    finally:
        if cluster is not None:
            proc, data = cluster
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
