"""Spark benchmark: rows/s of the "nsq" data source beside a raw consumer on the same data.

Starts PARTITIONS nsqd processes (one topic partition each, or --topic-partitions each
of a partitioned topic), publishes MESSAGES messages of SIZE bytes spread over them, then
measures, on the same data:

- raw:    consuming every message with FINs over plain asyncio connections (one per topic
          partition, RDY 2500, FINs of one read in one write): what a fast client does;
- batch:  ``spark.read.format("nsq")...write.format("noop")`` (one Spark partition per
          topic partition);
- stream: ``spark.readStream.format("nsq")`` with ``trigger(availableNow=True)`` into a
          noop sink (or --sink parquet).

Batch and stream each read the whole data ``--rounds`` times (3). The first read of each
runs on a colder JVM, whose JIT compiles the Arrow-to-row conversion while it reads: it
is reported but left out of the median, which is the rate of a job that has been running.
A stream's rate is Spark's own (rows over the time its micro-batches ran, as in
``processedRowsPerSecond``); the wall time with the query's start-up is printed beside it.

    python bench/spark_bench.py --messages 1000000 --partitions 2
    python bench/spark_bench.py --messages 1000000 --partitions 2 --topic-partitions 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from nsqx.wire import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2, FrameDecoder
from nsqx.wire import commands as cmd


def start_nsqd(data: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqx",
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
            # range reads are stateless: keep what the raw consumer finishes readable
            "--retention=1h",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    tcp = http = 0
    for line in proc.stderr:
        m = re.search(r"(TCP|HTTP): listening on [\d.]+:(\d+)", line)
        if m:
            if m.group(1) == "TCP":
                tcp = int(m.group(2))
            else:
                http = int(m.group(2))
        if tcp and http:
            return proc, tcp, http
    raise RuntimeError("nsqd did not start")


def publish(http: int, topic: str, n: int, size: int, partition: int | None = None) -> None:
    body_one = struct.pack(">i", size) + b"x" * size
    batch = 1000
    where = "" if partition is None else f"&partition={partition}"
    for i in range(0, n, batch):
        k = min(batch, n - i)
        data = struct.pack(">i", k) + body_one * k
        req = urllib.request.Request(
            f"http://127.0.0.1:{http}/mpub?topic={topic}&binary=true{where}", data=data
        )
        with urllib.request.urlopen(req) as resp:
            assert resp.read() == b"OK"


class _Consumer(asyncio.Protocol):
    def __init__(
        self, topic: str, partition: int | None, want: int, done: asyncio.Future[None]
    ) -> None:
        self.topic, self.partition, self.want, self.done = topic, partition, want, done
        self.got = 0
        self.decoder = FrameDecoder()

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        sub = cmd.sub(self.topic, "raw", self.partition)
        transport.write(MAGIC_V2 + sub + cmd.rdy(2500))

    def data_received(self, data: bytes) -> None:
        fins = []
        for ftype, payload in self.decoder.feed(data):
            if ftype == FRAME_MESSAGE:
                fins.append(payload[10:26])
            elif ftype == FRAME_RESPONSE and payload == HEARTBEAT:
                self.t.write(cmd.nop())
        if fins:
            self.got += len(fins)
            self.t.write(cmd.fin_many(fins))
        if self.got >= self.want and not self.done.done():
            self.done.set_result(None)


async def client_consume(tcp_ports: list[int], topic: str, total: int) -> float:
    """nsqx.client's Consumer with a plain-function handler (FIN on return)."""
    from nsqx.client import Consumer

    done = asyncio.get_running_loop().create_future()
    count = 0

    def handle(msg: Any) -> None:
        nonlocal count
        count += 1
        if count >= total and not done.done():
            done.set_result(None)

    consumer = Consumer(
        topic,
        "client",
        handle,
        nsqd_tcp_addresses=[f"127.0.0.1:{p}" for p in tcp_ports],
        max_in_flight=2500 * len(tcp_ports),
    )
    t0 = time.perf_counter()
    await consumer.start()
    await done
    elapsed = time.perf_counter() - t0
    await consumer.close()
    return elapsed


async def raw_consume(subs: list[tuple[int, int | None]], topic: str, per_partition: int) -> float:
    """One connection per (tcp port, topic partition or None for an NSQ 1.3 SUB)."""
    loop = asyncio.get_running_loop()
    futures = []
    t0 = time.perf_counter()
    for port, partition in subs:
        fut: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(
            lambda f=fut, p=partition: _Consumer(topic, p, per_partition, f), "127.0.0.1", port
        )
        futures.append(fut)
    await asyncio.gather(*futures)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=2, help="nsqd processes")
    ap.add_argument(
        "--topic-partitions",
        type=int,
        default=0,
        help="make the topic partitioned, with this many partitions on each nsqd "
        "(default: an NSQ 1.3 topic, partition 0 on each)",
    )
    ap.add_argument("--sink", choices=["noop", "parquet"], default="noop")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="reads of the same data by each of batch and stream (the first batch one on "
        "a cold JVM)",
    )
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="nsqx-sparkbench-")
    procs = []
    try:
        nodes = [start_nsqd(os.path.join(tmp, f"n{i}")) for i in range(args.partitions)]
        procs = [p for p, _, _ in nodes]
        k = args.topic_partitions
        # (nsqd index, topic partition): an NSQ 1.3 topic is partition 0 on each nsqd; a
        # partitioned one has its own partitions on each, as lookupd would place them
        layout = [(i, i * k + j if k else None) for i in range(len(nodes)) for j in range(k or 1)]
        per = args.messages // len(layout)
        t0 = time.perf_counter()
        for i, (_, _, http) in enumerate(nodes):
            # the consumers' channels exist before publishing: a later channel starts at
            # the end of the topic and would see none of it
            paths = [
                f"/topic/create?topic=bench&partition={p}&partition_num={k * len(nodes)}"
                for n, p in layout
                if n == i and p is not None
            ] or ["/topic/create?topic=bench"]
            paths += [
                "/channel/create?topic=bench&channel=raw",
                "/channel/create?topic=bench&channel=client",
            ]
            for path in paths:
                urllib.request.urlopen(
                    urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST")
                ).close()
        for i, p in layout:
            publish(nodes[i][2], "bench", per, args.size, p)
        total = per * len(layout)
        print(
            f"published {total:,} messages of {args.size} B over {args.partitions} nsqd, "
            f"{len(layout)} topic partitions, in {time.perf_counter() - t0:.1f}s"
        )

        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        subs = [(nodes[i][1], p) for i, p in layout]
        raw_s = asyncio.run(raw_consume(subs, "bench", per))
        raw = total / raw_s
        print(f"raw     : {raw:>11,.0f} msgs/s  ({raw_s:.2f}s, bare asyncio, consume + FIN)")
        client = 0.0
        if not k:  # nsqx.client's Consumer reads one partition per nsqd here
            client_s = asyncio.run(client_consume([t for _, t, _ in nodes], "bench", total))
            client = total / client_s
            print(f"client  : {client:>11,.0f} msgs/s  ({client_s:.2f}s, nsqx.client Consumer)")

        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        addrs = ",".join(f"127.0.0.1:{h}" for _, _, h in nodes)
        reader = (
            spark.read.format("nsq").option("topic", "bench").option("nsqdHttpAddresses", addrs)
        )
        reader.load().limit(10).collect()  # start the Python workers
        out = os.path.join(tmp, "out")
        # Round 1 runs on a cold JVM (its JIT compiles the row conversion as it goes);
        # later rounds read the same data again: the steady state of a long-running job.
        batch_rates: list[float] = []
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            df = reader.load()
            if args.sink == "noop":
                df.write.format("noop").mode("overwrite").save()
            else:
                df.write.mode("overwrite").parquet(f"{out}-batch{r}")
            batch_s = time.perf_counter() - t0
            batch_rates.append(total / batch_s)
            print(
                f"batch {r} : {total / batch_s:>11,.0f} rows/s  ({batch_s:.2f}s, {args.sink}"
                f"{', cold JVM' if r == 1 else ''}) = {total / batch_s / raw:.0%} of raw"
            )

        stream_rates: list[float] = []
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            stream = (
                spark.readStream.format("nsq")
                .option("topic", "bench")
                .option("nsqdHttpAddresses", addrs)
                .load()
                .writeStream.option("checkpointLocation", os.path.join(tmp, f"ckpt{r}"))
                .trigger(availableNow=True)
            )
            q = (
                stream.format("noop")
                if args.sink == "noop"
                else stream.format("parquet").option("path", f"{out}-stream{r}")
            ).start()
            q.awaitTermination()
            stream_s = time.perf_counter() - t0
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            if rows != total:
                raise RuntimeError(f"the stream read {rows:,} rows, not {total:,}")
            if os.environ.get("NSQX_BENCH_DEBUG"):
                print(
                    [(p["batchId"], p["numInputRows"], p["durationMs"]) for p in q.recentProgress]
                )
            # Spark's own ingest figure: rows over the time its micro-batches ran (the
            # wall time also holds starting the query and its source process, ~1.5 s)
            busy = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress) / 1000
            stream_rates.append(rows / busy)
            print(
                f"stream {r}: {rows / busy:>11,.0f} rows/s in micro-batches = "
                f"{rows / busy / raw:.0%} of raw; {rows / stream_s:,.0f} rows/s over "
                f"{stream_s:.2f}s with the query's start ({rows:,} rows, {args.sink})"
            )
        if args.rounds > 1:
            warm_b = statistics.median(batch_rates[1:])
            warm_s = statistics.median(stream_rates[1:])
            print(
                f"median of warm rounds: batch {warm_b:,.0f} rows/s = {warm_b / raw:.0%} of "
                f"raw, stream {warm_s:,.0f} rows/s = {warm_s / raw:.0%} of raw"
                + (f" (client {client / raw:.0%} of raw)" if client else "")
            )
        spark.stop()
        return 0
    finally:
        for p in procs:
            p.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
