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

- ceiling: the same reads of a source that yields ready Arrow batches of the same rows
          (built once, no I/O): what Spark itself costs, the most any Python source can
          give here; each nsq rate is printed as a ratio to raw and to this;
- channel: ``mode=channel`` against Go's nsqd 1.3 (``--go-nsqd``, found in
          ../shared/reference when there), beside nsqx.client's Consumer on the same
          nsqd and data;
- latency: a live consumer's end-to-end latency (p50 / p99 / max) on one nsqd, idle
          and while Spark batch reads of that nsqd run (``--latency``).

    python bench/spark_bench.py --messages 1000000 --partitions 2
    python bench/spark_bench.py --messages 1000000 --partitions 2 --topic-partitions 2
    python bench/spark_bench.py --messages 1000000 --latency --go-nsqd path/to/nsqd
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
        self,
        topic: str,
        partition: int | None,
        want: int,
        done: asyncio.Future[None],
        channel: str = "raw",
    ) -> None:
        self.topic, self.partition, self.want, self.done = topic, partition, want, done
        self.channel = channel
        self.got = 0
        self.decoder = FrameDecoder()

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        sub = cmd.sub(self.topic, self.channel, self.partition)
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


async def client_consume(
    tcp_ports: list[int], topic: str, total: int, channel: str = "client"
) -> float:
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
        channel,
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


async def raw_consume(
    subs: list[tuple[int, int | None]], topic: str, per_partition: int, channel: str = "raw"
) -> float:
    """One connection per (tcp port, topic partition or None for an NSQ 1.3 SUB)."""
    loop = asyncio.get_running_loop()
    futures = []
    t0 = time.perf_counter()
    for port, partition in subs:
        fut: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(
            lambda f=fut, p=partition: _Consumer(topic, p, per_partition, f, channel),
            "127.0.0.1",
            port,
        )
        futures.append(fut)
    await asyncio.gather(*futures)
    return time.perf_counter() - t0


def make_ceiling_source(rows: int, parts: int, batch_rows: int, size: int) -> Any:
    """A data source of ``parts`` partitions of ``rows`` rows each, the nsq source's
    schema, yielding one ready Arrow batch of ``batch_rows`` rows again and again
    (built once per task with Arrow's kernels): Spark's own cost, no I/O, no decoding.
    Batch and stream (offsets per partition, like the nsq source's)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )

    from nsqx.spark.source import SCHEMA, SCHEMA_NAMES

    class Part(InputPartition):
        def __init__(self, index: int, start: int, end: int) -> None:
            self.index, self.start, self.end = index, start, end

    def batch_of(n: int, index: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        ones = pa.repeat(pa.scalar(1, pa.int64()), n)
        return pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar("bench", pa.string()), n),
                pa.repeat(pa.scalar("127.0.0.1:4151", pa.string()), n),
                pa.repeat(pa.scalar(index, pa.int32()), n),
                pc.cumulative_sum(ones),
                pa.repeat(pa.scalar("0123456789abcdef", pa.string()), n).cast(pa.string()),
                pa.repeat(pa.scalar(0, pa.int64()), n),
                pa.repeat(pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC")), n),
                pa.repeat(pa.scalar(1, pa.int32()), n),
                pa.repeat(pa.scalar(b"x" * size, pa.binary()), n),
                pa.nulls(n, pa.string()),
            ],
            names=SCHEMA_NAMES,
        )

    def read(part: Any) -> Any:
        n = part.end - part.start
        full = batch_of(min(batch_rows, n), part.index)
        while n > 0:
            yield full if n >= full.num_rows else full.slice(0, n)
            n -= full.num_rows

    class Reader(DataSourceReader):
        def partitions(self) -> list[Any]:
            return [Part(i, 0, rows) for i in range(parts)]

        def read(self, partition: Any) -> Any:
            return read(partition)

    class StreamReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {str(i): 0 for i in range(parts)}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {str(i): rows for i in range(parts)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return [Part(int(k), start[k], end[k]) for k in end if end[k] > start[k]]

        def read(self, partition: Any) -> Any:
            return read(partition)

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ceiling"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema: Any) -> Any:
            return Reader()

        def streamReader(self, schema: Any) -> Any:
            return StreamReader()

    return Ceiling


def find_go_nsqd() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "shared", "reference", "go-nsq-1.3.0", "nsqd")
    return os.path.normpath(path) if os.path.exists(path) else None


def start_go_nsqd(binary: str, data: str) -> tuple[subprocess.Popen[str], int, int]:
    os.makedirs(data, exist_ok=True)
    proc = subprocess.Popen(
        [binary, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    ports: dict[str, int] = {}
    for line in proc.stderr:
        m = re.search(r"(TCP|HTTP): listening on [\d.]+:(\d+)", line)
        if m:
            ports[m.group(1)] = int(m.group(2))
        if len(ports) == 2:
            return proc, ports["TCP"], ports["HTTP"]
    raise RuntimeError("Go's nsqd did not start")


async def live_latency(tcp: int, seconds: float, rate: int) -> dict[str, float]:
    """Publish ``rate`` messages/s (each carrying its send time) to the topic "live" and
    consume them on another connection: end-to-end latency percentiles in ms."""
    from nsqx.client import Consumer, Producer

    lat: list[float] = []
    consumer = Consumer(
        "live",
        "probe",
        lambda m: lat.append((time.time_ns() - int(m.body)) / 1e6),
        nsqd_tcp_addresses=[f"127.0.0.1:{tcp}"],
        max_in_flight=100,
        # every message leaves nsqd at once (no output buffering, which would add up to
        # its 250 ms timeout to each latency)
        output_buffer_size=-1,
    )
    producer = Producer(f"127.0.0.1:{tcp}")
    await producer.publish("live", b"%d" % time.time_ns())  # the topic exists
    await consumer.start()
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < seconds:
        due = t0 + sent / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await producer.publish("live", b"%d" % time.time_ns())
        sent += 1
    await asyncio.sleep(0.5)
    await consumer.close()
    await producer.close()
    lat.sort()
    n = len(lat)
    return {
        "n": n,
        "p50": lat[n // 2],
        "p99": lat[min(n - 1, int(n * 0.99))],
        "max": lat[-1],
    }


def latency_probe(tcp: int, seconds: float, rate: int) -> subprocess.Popen[str]:
    """The probe in a process of its own (this one runs Spark's driver)."""
    return subprocess.Popen(
        [sys.executable, __file__, "--latency-probe", str(tcp), str(seconds), str(rate)],
        stdout=subprocess.PIPE,
        text=True,
    )


def probe_result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=600)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def fmt_latency(r: dict[str, float]) -> str:
    return (
        f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, max {r['max']:.1f} ms ({r['n']:.0f} msgs)"
    )


def channel_phase(spark: Any, args: Any, tmp: str) -> None:
    """mode=channel on Go's nsqd beside nsqx.client's Consumer, on the same messages."""
    proc, tcp, http = start_go_nsqd(args.go_nsqd, os.path.join(tmp, "go"))
    try:
        n = args.channel_messages or args.messages
        for path in (
            "/topic/create?topic=bench",
            "/channel/create?topic=bench&channel=client",
            "/channel/create?topic=bench&channel=spark",
        ):
            urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST")
            ).close()
        publish(http, "bench", n, args.size)
        client_s = asyncio.run(client_consume([tcp], "bench", n, "client"))
        client = n / client_s
        print(f"channel: nsqx.client Consumer on Go's nsqd {client:>11,.0f} msgs/s")
        t0 = time.perf_counter()
        q = (
            spark.readStream.format("nsq")
            .option("mode", "channel")
            .option("topic", "bench")
            .option("channel", "spark")
            .option("nsqdTcpAddresses", f"127.0.0.1:{tcp}")
            .option("maxOffsetsPerTrigger", str(args.channel_batch))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", os.path.join(tmp, "ckpt-channel"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        wall = time.perf_counter() - t0
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        busy = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress) / 1000
        if os.environ.get("NSQX_BENCH_DEBUG"):
            print([(p["batchId"], p["numInputRows"], p["durationMs"]) for p in q.recentProgress])
        if rows < n:
            raise RuntimeError(f"mode=channel read {rows:,} rows, not {n:,}")
        rate = rows / busy
        print(
            f"channel: Spark mode=channel on Go's nsqd {rate:>11,.0f} rows/s in micro-batches "
            f"({len(q.recentProgress)} of up to {args.channel_batch:,}), {rows / wall:,.0f} "
            f"with the query's start"
        )
        print(f"SUMMARY channel: {rate / client:.2f} of nsqx.client on Go's nsqd")
    finally:
        proc.terminate()
        proc.wait()


def latency_phase(spark: Any, args: Any, nodes: list[Any], addrs: str) -> None:
    """A live consumer's latency on the first nsqd: idle, then while Spark batch reads
    of both nsqd run back to back (default request sizes, then the largest nsqd
    allows: 100,000 messages or 64 MiB per request)."""
    tcp = nodes[0][1]
    secs, rate = args.latency_seconds, args.latency_rate
    idle = probe_result(latency_probe(tcp, secs, rate))
    print(f"latency idle             : {fmt_latency(idle)}")
    for label, opts in (
        ("during batch reads      ", {}),
        ("during 64 MiB range reads", {"readMessages": "100000", "readBytes": str(64 << 20)}),
    ):
        probe = latency_probe(tcp, secs, rate)
        reads = 0
        while probe.poll() is None:
            reader = spark.read.format("nsq").option("topic", "bench")
            reader = reader.option("nsqdHttpAddresses", addrs)
            for k, v in opts.items():
                reader = reader.option(k, v)
            reader.load().write.format("noop").mode("overwrite").save()
            reads += 1
        busy = probe_result(probe)
        print(f"latency {label}: {fmt_latency(busy)} ({reads} reads)")
        print(
            f"SUMMARY latency p99 {label.strip()}: {busy['p99']:.2f} ms (idle {idle['p99']:.2f} ms)"
        )


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
    ap.add_argument(
        "--go-nsqd",
        default=find_go_nsqd(),
        help="Go nsqd 1.3 binary for mode=channel (default: ../shared/reference's, if there)",
    )
    ap.add_argument("--channel-messages", type=int, default=0, help="default: --messages")
    ap.add_argument(
        "--channel-batch", type=int, default=50_000, help="maxOffsetsPerTrigger in mode=channel"
    )
    ap.add_argument(
        "--latency",
        action="store_true",
        help="measure a live consumer's latency, idle and during batch reads",
    )
    ap.add_argument("--latency-seconds", type=float, default=8.0)
    ap.add_argument("--latency-rate", type=int, default=2000, help="messages/s of the probe")
    if len(sys.argv) == 5 and sys.argv[1] == "--latency-probe":
        tcp, seconds, rate = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(asyncio.run(live_latency(tcp, seconds, rate))))
        return 0
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
                f"/channel/create?topic=bench&channel={name}{r}"
                for r in range(1, args.rounds + 1)
                for name in ("raw", "client")
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
        rounds = args.rounds
        subs = [(nodes[i][1], p) for i, p in layout]
        raw_rates, client_rates = [], []
        for r in range(1, rounds + 1):
            # each round consumes the same data again: a fresh channel starts at the end,
            # so the channels were made before publishing, one per round
            raw_s = asyncio.run(raw_consume(subs, "bench", per, channel=f"raw{r}"))
            raw_rates.append(total / raw_s)
            print(f"raw {r}   : {total / raw_s:>11,.0f} msgs/s  ({raw_s:.2f}s, bare asyncio)")
            if not k:  # nsqx.client's Consumer reads one partition per nsqd here
                client_s = asyncio.run(
                    client_consume([t for _, t, _ in nodes], "bench", total, f"client{r}")
                )
                client_rates.append(total / client_s)
                print(f"client {r}: {total / client_s:>11,.0f} msgs/s  (nsqx.client Consumer)")
        raw = statistics.median(raw_rates)
        print(f"raw (median of {rounds}): {raw:,.0f} msgs/s")

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
        from nsqx.spark.options import NsqOptions

        batch_rows = NsqOptions.read_messages  # the nsq source's rows per Arrow batch
        spark.dataSource.register(
            make_ceiling_source(per, len(layout), min(batch_rows, per), args.size)
        )
        addrs = ",".join(f"127.0.0.1:{h}" for _, _, h in nodes)

        def nsq_reader() -> Any:
            return (
                spark.read.format("nsq").option("topic", "bench").option("nsqdHttpAddresses", addrs)
            )

        nsq_reader().load().limit(10).collect()  # start the Python workers
        out = os.path.join(tmp, "out")

        def batch_round(fmt: str, r: int) -> float:
            t0 = time.perf_counter()
            df = nsq_reader().load() if fmt == "nsq" else spark.read.format(fmt).load()
            if args.sink == "noop":
                df.write.format("noop").mode("overwrite").save()
            else:
                df.write.mode("overwrite").parquet(f"{out}-{fmt}-batch{r}")
            return total / (time.perf_counter() - t0)

        def stream_round(fmt: str, r: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            reader = spark.readStream.format(fmt)
            if fmt == "nsq":
                reader = reader.option("topic", "bench").option("nsqdHttpAddresses", addrs)
            stream = (
                reader.load()
                .writeStream.option("checkpointLocation", os.path.join(tmp, f"ckpt-{fmt}{r}"))
                .trigger(availableNow=True)
            )
            q = (
                stream.format("noop")
                if args.sink == "noop"
                else stream.format("parquet").option("path", f"{out}-{fmt}-stream{r}")
            ).start()
            q.awaitTermination()
            wall = time.perf_counter() - t0
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            if rows != total:
                raise RuntimeError(f"the {fmt} stream read {rows:,} rows, not {total:,}")
            if os.environ.get("NSQX_BENCH_DEBUG"):
                print(
                    [(p["batchId"], p["numInputRows"], p["durationMs"]) for p in q.recentProgress]
                )
            # Spark's own ingest figure: rows over the time its micro-batches ran (the
            # wall time also holds starting the query and its source process)
            busy = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress) / 1000
            return rows / busy, rows / wall

        # Round 1 runs on a cold JVM (its JIT compiles the row conversion as it goes);
        # later rounds read the same data again: the steady state of a long-running job.
        # nsq and ceiling alternate, so that both see the same JVM and machine.
        rates: dict[str, list[float]] = {"nsq": [], "ceiling": []}
        for r in range(1, rounds + 1):
            for fmt in ("nsq", "ceiling"):
                rate = batch_round(fmt, r)
                rates[fmt].append(rate)
                print(
                    f"batch {r} {fmt:<8}: {rate:>11,.0f} rows/s = {rate / raw:.2f} of raw"
                    + (" (cold JVM)" if r == 1 else "")
                )
        srates: dict[str, list[float]] = {"nsq": [], "ceiling": []}
        for r in range(1, rounds + 1):
            for fmt in ("nsq", "ceiling"):
                rate, wall_rate = stream_round(fmt, r)
                srates[fmt].append(rate)
                print(
                    f"stream {r} {fmt:<7}: {rate:>11,.0f} rows/s in micro-batches = "
                    f"{rate / raw:.2f} of raw; {wall_rate:,.0f} rows/s with the query's start"
                )
        if rounds > 1:
            med = {f: statistics.median(v[1:]) for f, v in rates.items()}
            smed = {f: statistics.median(v[1:]) for f, v in srates.items()}
            print(
                f"SUMMARY warm batch: nsq {med['nsq']:,.0f} rows/s = {med['nsq'] / raw:.2f} of "
                f"raw, {med['nsq'] / med['ceiling']:.2f} of the ceiling "
                f"({med['ceiling']:,.0f} = {med['ceiling'] / raw:.2f} of raw)"
            )
            print(
                f"SUMMARY warm stream: nsq {smed['nsq']:,.0f} rows/s = {smed['nsq'] / raw:.2f} "
                f"of raw, {smed['nsq'] / smed['ceiling']:.2f} of the ceiling "
                f"({smed['ceiling']:,.0f} = {smed['ceiling'] / raw:.2f} of raw)"
            )
            if client_rates:
                print(f"SUMMARY client: {statistics.median(client_rates) / raw:.2f} of raw")

        if args.go_nsqd:
            channel_phase(spark, args, tmp)
        else:
            print("channel: no Go nsqd (--go-nsqd): skipped")
        if args.latency:
            latency_phase(spark, args, nodes, addrs)
        spark.stop()
        return 0
    finally:
        for p in procs:
            p.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
