"""Spark benchmark: rows/s of the "nsq" data source beside a raw consumer on the same data.

Starts PARTITIONS nsqd processes (one topic partition each, or --topic-partitions each
of a partitioned topic), publishes MESSAGES messages of SIZE bytes spread over them, then
reads the same data again and again, in rounds. Each round measures, one after the other:

- raw:     consuming every message with FINs over plain asyncio connections (one per
           topic partition, RDY 2500, FINs of one read in one write): what a fast client
           does (a fresh channel each round);
- client:  nsqx.client's Consumer on the same data;
- batch:   ``spark.read.format("nsq")...write.format("noop")`` (one Spark partition per
           topic partition), wall clock;
- ceiling: the same read of a source that yields ready Arrow batches of the same rows
           (built once, no I/O): what Spark itself costs, the most any Python source
           can give here;
- stream:  ``spark.readStream.format("nsq")`` with ``trigger(availableNow=True)`` into a
           noop sink (or --sink parquet), and the ceiling's stream; a stream's rate is
           Spark's own (rows over the time its micro-batches ran, as in
           ``processedRowsPerSecond``), the wall time with the query's start beside it.

Each ratio is taken within its round (the machine is shared: its speed changes from
minute to minute) and the summary gives the median and range over the warm rounds;
round 0 runs on a cold JVM and is reported apart. Then:

- channel: ``mode=channel`` against Go's nsqd 1.3 (``--go-nsqd``, found in
           ../shared/reference when there), beside nsqx.client's Consumer on the same
           nsqd and data, in --channel-rounds rounds;
- latency: a live consumer's end-to-end latency (p50 / p99 / max) on one nsqd, idle,
           during Spark reads of the ceiling source (Spark's CPU load alone) and during
           batch reads of that nsqd (``--latency``).

    python bench/spark_bench.py --messages 1000000 --partitions 2 --rounds 4
    python bench/spark_bench.py --messages 1000000 --partitions 2 --topic-partitions 2
    python bench/spark_bench.py --messages 1000000 --latency --channel-rounds 3
    python bench/spark_bench.py --cluster        # a standalone cluster, not local[2]
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
import threading
import time
import urllib.request
from typing import Any

from nsqx.wire import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2, FrameDecoder
from nsqx.wire import commands as cmd
from nsqx.wire.frames import MSG_ID_AT, MSG_ID_END


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
            _drain(proc)
            return proc, tcp, http
    raise RuntimeError("nsqd did not start")


def _drain(proc: subprocess.Popen[str]) -> None:
    """Read the rest of a server's log, so that it never blocks on a full pipe (a Go
    nsqd that cannot write its log stops answering)."""
    assert proc.stderr is not None
    threading.Thread(target=proc.stderr.read, daemon=True).start()


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
                fins.append(payload[MSG_ID_AT:MSG_ID_END])
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


def ready_batch(n: int, index: int, size: int) -> Any:
    """``n`` rows of the nsq source's schema, built with Arrow's kernels."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsqx.spark.source import SCHEMA_NAMES

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

    from nsqx.spark.source import SCHEMA

    class Part(InputPartition):
        def __init__(self, index: int, start: int, end: int) -> None:
            self.index, self.start, self.end = index, start, end

    def read(part: Any) -> Any:
        n = part.end - part.start
        full = ready_batch(min(batch_rows, n), part.index, size)
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


def make_simple_ceiling_source(total: int, batch: int, size: int) -> Any:
    """The ceiling of mode=channel: a simple stream reader (Spark's kind for a source
    that reads on the driver, as mode=channel does) whose micro-batches are ``batch``
    ready Arrow rows, ``total`` in all: what Spark costs for such a source."""
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from nsqx.spark.source import SCHEMA

    class SimpleReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
        def prepareForTriggerAvailableNow(self) -> None:
            """As mode=channel: a run ends when a read finds nothing more."""

        def initialOffset(self) -> dict[str, int]:
            return {"taken": 0}

        def read(self, start: dict[str, int]) -> tuple[Any, dict[str, int]]:
            n = min(batch, total - start["taken"])
            if n <= 0:
                return iter(()), start
            return iter([ready_batch(n, 0, size)]), {"taken": start["taken"] + n}

        def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Any:
            return iter(())

    class SimpleCeiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ceiling_simple"

        def schema(self) -> str:
            return SCHEMA

        def simpleStreamReader(self, schema: Any) -> Any:
            return SimpleReader()

    return SimpleCeiling


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
            _drain(proc)
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


def channel_stream(
    spark: Any, args: Any, tmp: str, name: str, topic: str | None, tcp: int, n: int
) -> tuple[float, float, int]:
    """One availableNow stream of mode=channel (or, without a topic, of the simple
    ceiling source) into noop: rows/s in micro-batches, rows/s with the query's start,
    and how many micro-batches."""
    t0 = time.perf_counter()
    if topic is None:
        reader = spark.readStream.format("ceiling_simple")
    else:
        reader = (
            spark.readStream.format("nsq")
            .option("mode", "channel")
            .option("topic", topic)
            .option("channel", "spark")
            .option("nsqdTcpAddresses", f"127.0.0.1:{tcp}")
            .option("maxOffsetsPerTrigger", str(args.channel_batch))
        )
    q = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", os.path.join(tmp, f"ckpt-channel-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    wall = time.perf_counter() - t0
    progress = q.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    if os.environ.get("NSQX_BENCH_DEBUG"):
        print([(p["batchId"], p["numInputRows"], p["durationMs"]) for p in progress])
    if rows < n:
        raise RuntimeError(f"{name} read {rows:,} rows, not {n:,}")
    return rows / busy, rows / wall, len([p for p in progress if p["numInputRows"]])


def channel_phase(spark: Any, args: Any, tmp: str) -> None:
    """mode=channel on Go's nsqd beside nsqx.client's Consumer on the same messages, in
    rounds: each round publishes to a fresh topic with both channels, then the client
    and Spark each read all of it through their own channel."""
    proc, tcp, http = start_go_nsqd(args.go_nsqd, os.path.join(tmp, "go"))
    n = args.channel_messages or args.messages
    spark.dataSource.register(make_simple_ceiling_source(n, args.channel_batch, args.size))
    ratios: list[float] = []
    of_ceiling: list[float] = []
    try:
        # unreported: a JVM's first streaming query is slower (its code is compiled
        # then), which would count against round 1's mode=channel alone
        channel_stream(spark, args, tmp, "warm-up", None, tcp, n)
        for r in range(1, args.channel_rounds + 1):
            topic = f"bench{r}"
            for path in (
                f"/topic/create?topic={topic}",
                f"/channel/create?topic={topic}&channel=client",
                f"/channel/create?topic={topic}&channel=spark",
            ):
                urllib.request.urlopen(
                    urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST")
                ).close()
            publish(http, topic, n, args.size)
            client = n / asyncio.run(client_consume([tcp], topic, n, "client"))
            rate, wall_rate, batches = channel_stream(spark, args, tmp, f"nsq{r}", topic, tcp, n)
            ceiling, _, _ = channel_stream(spark, args, tmp, f"ceiling{r}", None, tcp, n)
            ratios.append(rate / client)
            of_ceiling.append(rate / ceiling)
            print(
                f"channel {r}: nsqx.client on Go's nsqd {client:,.0f} msgs/s; Spark mode=channel "
                f"{rate:,.0f} rows/s in micro-batches ({batches} of up to "
                f"{args.channel_batch:,}) = {rate / client:.2f} of the client, "
                f"{rate / ceiling:.2f} of the ceiling ({ceiling:,.0f} = {ceiling / client:.2f} "
                f"of the client); {wall_rate:,.0f} rows/s with the query's start"
            )
        print(
            f"SUMMARY channel mode: {_spread(ratios)} of nsqx.client on Go's nsqd; "
            f"{_spread(of_ceiling)} of the ceiling (a simple reader of ready Arrow batches)"
        )
    finally:
        proc.terminate()
        proc.wait()


def latency_phase(spark: Any, args: Any, nodes: list[Any], addrs: str) -> None:
    """A live consumer's latency on the first nsqd, in rounds: idle; while Spark batch
    reads of the ceiling source run back to back (Spark's load on the machine, no
    request to nsqd); while batch reads of both nsqd run (default request sizes); and
    while reads with the largest requests nsqd allows run (100,000 messages or 64 MiB)."""
    tcp = nodes[0][1]
    secs, rate = args.latency_seconds, args.latency_rate
    cases: list[tuple[str, str | None, dict[str, str]]] = [
        ("idle", None, {}),
        ("during ceiling reads", "ceiling", {}),
        ("during nsq batch reads", "nsq", {}),
        (
            "during 64 MiB range reads",
            "nsq",
            {"readMessages": "100000", "readBytes": str(64 << 20)},
        ),
    ]
    p99: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for r in range(1, args.latency_rounds + 1):
        for label, fmt, opts in cases:
            probe = latency_probe(tcp, secs, rate)
            reads = 0
            while fmt is not None and probe.poll() is None:
                reader = spark.read.format(fmt)
                if fmt == "nsq":
                    reader = reader.option("topic", "bench").option("nsqdHttpAddresses", addrs)
                for k, v in opts.items():
                    reader = reader.option(k, v)
                reader.load().write.format("noop").mode("overwrite").save()
                reads += 1
            result = probe_result(probe)
            p99[label].append(result["p99"])
            print(
                f"latency {r} {label:<26}: {fmt_latency(result)}"
                + (f" ({reads} reads)" if fmt else "")
            )
    for label, values in p99.items():
        print(
            f"SUMMARY latency p99 {label}: {statistics.median(values):.2f} ms "
            f"({min(values):.2f}-{max(values):.2f})"
        )


def _spread(values: list[float]) -> str:
    """``median (min-max)`` of per-round ratios."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


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
        help="warm rounds, each: raw, client, batch and stream reads (nsq and ceiling), "
        "after one round on a cold JVM that is reported apart",
    )
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="run Spark on a standalone cluster on loopback (a master, two workers of one "
        "core each) instead of local[2]",
    )
    ap.add_argument(
        "--go-nsqd",
        default=find_go_nsqd(),
        help="Go nsqd 1.3 binary for mode=channel (default: ../shared/reference's, if there)",
    )
    ap.add_argument("--no-channel", action="store_true", help="skip the mode=channel phase")
    ap.add_argument(
        "--skip-reads",
        action="store_true",
        help="skip the rounds of range reads (channel, latency only)",
    )
    ap.add_argument("--channel-messages", type=int, default=0, help="default: --messages")
    ap.add_argument(
        "--channel-batch", type=int, default=50_000, help="maxOffsetsPerTrigger in mode=channel"
    )
    ap.add_argument("--channel-rounds", type=int, default=1, help="mode=channel rounds")
    ap.add_argument(
        "--latency",
        action="store_true",
        help="measure a live consumer's latency, idle and during batch reads",
    )
    ap.add_argument("--latency-seconds", type=float, default=8.0)
    ap.add_argument("--latency-rate", type=int, default=2000, help="messages/s of the probe")
    ap.add_argument("--latency-rounds", type=int, default=2)
    if len(sys.argv) == 5 and sys.argv[1] == "--latency-probe":
        tcp, seconds, rate = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(asyncio.run(live_latency(tcp, seconds, rate))))
        return 0
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="nsqx-sparkbench-")
    procs = []
    cluster = None
    try:
        nodes = [start_nsqd(os.path.join(tmp, f"n{i}")) for i in range(args.partitions)]
        procs = [p for p, _, _ in nodes]
        k = args.topic_partitions
        # (nsqd index, topic partition): an NSQ 1.3 topic is partition 0 on each nsqd; a
        # partitioned one has its own partitions on each, as lookupd would place them
        layout = [(i, i * k + j if k else None) for i in range(len(nodes)) for j in range(k or 1)]
        per = args.messages // len(layout)
        rounds = args.rounds
        t0 = time.perf_counter()
        for i, (_, _, http) in enumerate(nodes):
            # the consumers' channels exist before publishing (a later channel starts at
            # the end of the topic and would see none of it): one per round, round 0 the
            # cold one
            paths = [
                f"/topic/create?topic=bench&partition={p}&partition_num={k * len(nodes)}"
                for n, p in layout
                if n == i and p is not None
            ] or ["/topic/create?topic=bench"]
            paths += [
                f"/channel/create?topic=bench&channel={name}{r}"
                for r in range(rounds + 1)
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
        subs = [(nodes[i][1], p) for i, p in layout]

        if args.cluster:
            from nsqx.spark.cluster import StandaloneCluster

            cluster = StandaloneCluster(workers=2, cores=1, work_dir=os.path.join(tmp, "spark"))
            cluster.start()
            spark = cluster.session("nsqx-bench", {"spark.sql.shuffle.partitions": "2"})
            where = f"a standalone cluster ({cluster.master_url}, two workers of one core)"
        else:
            from pyspark.sql import SparkSession

            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            where = "local[2]"
        spark.sparkContext.setLogLevel("ERROR")
        print(f"Spark {spark.version} on {where}")
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

        # Every round measures each reader on the same data, one after the other (raw,
        # the client, then Spark's reads, nsq and ceiling alternating), and each ratio is
        # taken within its round: the machine is shared, its speed changes from minute to
        # minute. Round 0 runs on a cold JVM (its JIT compiles the row conversion as it
        # goes) and is reported apart; rounds 1.. are the steady state of a running job.
        ratio: dict[str, list[float]] = {
            k: [] for k in ("batch", "stream", "stream_wall", "batch_c", "stream_c", "client")
        }
        ceiling: dict[str, list[float]] = {"batch": [], "stream": []}
        for r in range(0 if args.skip_reads else rounds + 1):
            tag = " (cold JVM)" if r == 0 else ""
            raw = total / asyncio.run(raw_consume(subs, "bench", per, channel=f"raw{r}"))
            line = f"round {r}{tag}: raw {raw:,.0f} msgs/s"
            client = 0.0
            if not k:  # nsqx.client's Consumer reads one partition per nsqd here
                secs = asyncio.run(
                    client_consume([t for _, t, _ in nodes], "bench", total, f"client{r}")
                )
                client = total / secs
                line += f", nsqx.client {client:,.0f} ({client / raw:.2f})"
            print(line)
            b_nsq, b_ceil = batch_round("nsq", r), batch_round("ceiling", r)
            (s_nsq, s_nsq_wall), (s_ceil, _) = stream_round("nsq", r), stream_round("ceiling", r)
            print(
                f"  batch  nsq {b_nsq:>10,.0f} rows/s = {b_nsq / raw:.2f} of raw, "
                f"{b_nsq / b_ceil:.2f} of the ceiling ({b_ceil:,.0f} = {b_ceil / raw:.2f} of raw)"
            )
            print(
                f"  stream nsq {s_nsq:>10,.0f} rows/s = {s_nsq / raw:.2f} of raw, "
                f"{s_nsq / s_ceil:.2f} of the ceiling ({s_ceil:,.0f} = {s_ceil / raw:.2f} of raw)"
                f"; {s_nsq_wall:,.0f} rows/s with the query's start"
            )
            if r == 0:
                continue
            ratio["batch"].append(b_nsq / raw)
            ratio["batch_c"].append(b_nsq / b_ceil)
            ratio["stream"].append(s_nsq / raw)
            ratio["stream_c"].append(s_nsq / s_ceil)
            ratio["stream_wall"].append(s_nsq_wall / raw)
            ceiling["batch"].append(b_ceil / raw)
            ceiling["stream"].append(s_ceil / raw)
            if client:
                ratio["client"].append(client / raw)
        if rounds and not args.skip_reads:
            print(f"SUMMARY over {rounds} warm rounds, median (min-max) of each round's ratio:")
            print(
                f"SUMMARY batch read : {_spread(ratio['batch'])} of raw; "
                f"{_spread(ratio['batch_c'])} of the ceiling, which is "
                f"{_spread(ceiling['batch'])} of raw"
            )
            print(
                f"SUMMARY stream read: {_spread(ratio['stream'])} of raw in micro-batches "
                f"({_spread(ratio['stream_wall'])} with the query's start); "
                f"{_spread(ratio['stream_c'])} of the ceiling, which is "
                f"{_spread(ceiling['stream'])} of raw"
            )
            if ratio["client"]:
                print(f"SUMMARY nsqx.client: {_spread(ratio['client'])} of raw")

        if args.go_nsqd and not args.no_channel:
            channel_phase(spark, args, tmp)
        elif not args.no_channel:
            print("channel: no Go nsqd (--go-nsqd): skipped")
        if args.latency:
            latency_phase(spark, args, nodes, addrs)
        spark.stop()
        return 0
    finally:
        if cluster is not None:
            cluster.stop()
        for p in procs:
            p.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
