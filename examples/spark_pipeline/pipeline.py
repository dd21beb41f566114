"""Example pipeline: a producer -> NSQ -> Structured Streaming on a Spark cluster ->
Parquet + a summary topic, restarted mid-way without loss or duplicates.

    python examples/spark_pipeline/pipeline.py          # or: make example-spark

1. Uses the local nsqd of `make up` (127.0.0.1:4150/4151) if one runs, else starts one
   (`nsqx up`) for the run; makes the topic "events" with --partitions (4) partitions.
2. Starts a Spark standalone cluster on loopback (a master and two workers, each a JVM
   of its own, from the pyspark package; nsqx.spark.cluster), or uses --master.
3. Starts a producer (a process of its own) that publishes JSON events ({"id", "user",
   "amount", "ts"}) for --seconds, --rate per second, each to the partition of its user
   (the same user, the same partition), with event times up to 3 s late; it keeps its
   own tally of every window's events, the ground truth.
4. Runs a streaming query on the cluster: events by 5-second window of event time, with
   a 10-second watermark (a window is written once, when the watermark passes it),
   count and sum of amounts; each micro-batch writes its closed windows to Parquet
   (a folder per micro-batch, replaced if Spark replays the batch: exactly-once) and
   publishes one summary message per window to the topic "events_per_window".
5. Stops the query half-way while the producer goes on, and starts it again from its
   checkpoint: it resumes at the offsets of its last micro-batch.
6. Once the producer is done, checks every closed window against the producer's tally
   (no event lost, none counted twice), prints the table and saves a picture of it:
   docs/images/spark_pipeline.svg (and .state/per_window.svg).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STATE = HERE / ".state"  # checkpoint, Parquet output and the producer's tally
PICTURE = HERE.parents[1] / "docs" / "images" / "spark_pipeline.svg"
WINDOW = 5  # seconds of event time per window
WATERMARK = "10 seconds"
LATE = 3.0  # events are stamped up to this many seconds before they are published


def nsqd_alive(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/ping", timeout=1) as resp:
            return bool(resp.read() == b"OK")
    except OSError:
        return False


def start_nsq() -> tuple[subprocess.Popen[bytes], str]:
    data = tempfile.mkdtemp(prefix="nsqx-example-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqx", "up", "--data-dir", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not nsqd_alive("127.0.0.1:4151"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("could not start nsqx up; is port 4150/4151 taken?")
        time.sleep(0.1)
    return proc, data


def post(http: str, path: str) -> None:
    req = urllib.request.Request(f"http://{http}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req) as resp:
        resp.read()


def partition_of(user: str, partitions: int) -> int:
    # any stable hash does; nsqx.client's PartitionProducer picks them as Youzan's do
    return zlib.crc32(user.encode()) % partitions


# -- the producer (a process of its own) ---------------------------------------------


async def produce(tcp: str, partitions: int, seconds: float, rate: int, tally: Path) -> None:
    """Publish events at ``rate``/s for ``seconds``; write the tally of each window."""
    from nsqx.client import Producer

    producer = Producer(tcp)
    windows: dict[int, list[float]] = {}  # window start -> [events, amount]
    start = time.time()
    sent = 0
    while (now := time.time()) - start < seconds:
        due = start + sent / rate
        if due > now:
            await asyncio.sleep(due - now)
        batch = []
        for _ in range(max(1, int((time.time() - due) * rate) + 1)):
            user = f"user-{random.randrange(50)}"
            ts = time.time() - random.uniform(0, LATE)
            amount = round(random.uniform(1, 100), 2)
            batch.append((user, {"id": sent, "user": user, "amount": amount, "ts": ts}))
            w = windows.setdefault(int(ts // WINDOW) * WINDOW, [0, 0.0])
            w[0] += 1
            w[1] += amount
            sent += 1
        await asyncio.gather(
            *(
                producer.publish("events", json.dumps(e).encode(), partition_of(u, partitions))
                for u, e in batch
            )
        )
    # one last event far ahead moves the watermark past every window of the run
    flush = {"id": -1, "user": "flush", "amount": 0.0, "ts": time.time() + 60}
    await producer.publish("events", json.dumps(flush).encode(), 0)
    await producer.close()
    tally.write_text(json.dumps({"sent": sent, "windows": windows}))


# -- the streaming job ----------------------------------------------------------------


def start_query(spark: Any, http: str, tcp: str, out: Path, starting: str) -> Any:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("nsq")
        .option("topic", "events")
        .option("nsqdHttpAddresses", http)
        .option("channel", "pipeline")  # its lag shows in nsqd's /stats
        .option("maxOffsetsPerTrigger", "20000")
        .option("startingOffsets", starting)  # a restart goes on from its checkpoint
        .load()
        .select(
            F.from_json(
                F.col("body").cast("string"), "id LONG, user STRING, amount DOUBLE, ts DOUBLE"
            ).alias("e")
        )
        .select("e.id", "e.amount", F.col("e.ts").cast("timestamp").alias("at"))
    )
    per_window = (
        events.withWatermark("at", WATERMARK)
        .groupBy(F.window("at", f"{WINDOW} seconds").alias("w"))
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        .select(F.col("w.start").alias("window"), "events", "amount")
    )

    def each_batch(df: Any, batch_id: int) -> None:
        if df.isEmpty():
            return
        df = df.cache()
        # a folder per micro-batch, replaced if Spark runs the batch again after a
        # restart: the Parquet table has each window once (exactly-once)
        df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))
        # the summary topic: at-least-once (a replayed batch publishes again; readers
        # keep the last message of each window)
        (
            df.select(F.to_json(F.struct("window", "events", "amount")).alias("body"))
            .write.format("nsq")
            .option("topic", "events_per_window")
            .option("nsqdTcpAddresses", tcp)
            .mode("append")
            .save()
        )
        df.unpersist()

    return (
        per_window.writeStream.outputMode("append")
        .foreachBatch(each_batch)
        .option("checkpointLocation", str(STATE / "checkpoint"))
        .trigger(processingTime="2 seconds")
        .start()
    )


def wait_rows(query: Any, producer: subprocess.Popen[bytes], until: float) -> None:
    """Let the query run until ``until`` (monotonic) or the producer ends."""
    while time.monotonic() < until and producer.poll() is None:
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        time.sleep(0.2)


def drain(query: Any, tally: Path, out: Path, timeout: float = 120) -> None:
    """After the producer: wait until every window it tallied is in the table."""
    want = set(json.loads(tally.read_text())["windows"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        if want <= {str(int(w)) for w, _, _ in read_table(out)}:
            return
        time.sleep(0.5)
    raise SystemExit("the table did not get every window in time")


def read_table(out: Path) -> list[tuple[float, int, float]]:
    """(window start in epoch seconds, events, amount) of every window written."""
    import pyarrow.parquet as pq

    rows = []
    for part in out.glob("batch=*/*.parquet"):
        t = pq.read_table(part)
        for w, n, a in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            rows.append((w.timestamp(), int(n), float(a)))
    return sorted(rows)


def check(out: Path, tally: Path) -> list[tuple[float, int, float]]:
    """Every window of the producer's tally, once, with its count and sum."""
    truth = json.loads(tally.read_text())
    table = read_table(out)
    starts = [w for w, _, _ in table]
    dup = len(starts) - len(set(starts))
    got = {str(int(w)): (n, a) for w, n, a in table}
    bad = [
        (w, got.get(w), (n, round(a, 2)))
        for w, (n, a) in truth["windows"].items()
        if w not in got or got[w][0] != n or abs(got[w][1] - a) > 0.01
    ]
    if dup or bad:
        raise SystemExit(f"mismatch: {dup} windows written twice; differing: {bad[:5]}")
    total = sum(n for w, n, _ in table if str(int(w)) in truth["windows"])
    print(
        f"checked: {len(truth['windows'])} windows, {total} events = the {truth['sent']} "
        "the producer sent, each counted once (no loss, no duplicates across the restart)"
    )
    return [r for r in table if str(int(r[0])) in truth["windows"]]


def plot(table: list[tuple[float, int, float]], restart_at: float, path: Path) -> None:
    """An SVG of events per window (bars) and amount per window (line), the restart
    marked: drawn by hand, no plotting library needed."""
    width, height, left, bottom, top = 760, 320, 60, 40, 40
    inner_w, inner_h = width - left - 60, height - top - bottom
    n = len(table)
    most = max(c for _, c, _ in table) or 1
    most_amount = max(a for _, _, a in table) or 1
    t0 = table[0][0]
    bar = inner_w / n
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">Events and amount per {WINDOW}-second '
        "window (Spark on a standalone cluster, read from NSQ)</text>",
    ]
    for i, (w, c, _) in enumerate(table):
        h = inner_h * c / most
        x = left + i * bar
        out.append(
            f'<rect x="{x + 2:.1f}" y="{top + inner_h - h:.1f}" width="{bar - 4:.1f}" '
            f'height="{h:.1f}" fill="#4e79a7"/>'
        )
        if i % max(1, n // 8) == 0:
            out.append(
                f'<text x="{x + bar / 2:.1f}" y="{height - bottom + 15}" '
                f'text-anchor="middle">+{w - t0:.0f}s</text>'
            )
    points = " ".join(
        f"{left + (i + 0.5) * bar:.1f},{top + inner_h - inner_h * a / most_amount:.1f}"
        for i, (_, _, a) in enumerate(table)
    )
    out.append(f'<polyline points="{points}" fill="none" stroke="#e15759" stroke-width="2"/>')
    rx = left + (restart_at - t0) / WINDOW * bar
    out += [
        f'<line x1="{rx:.1f}" y1="{top - 12}" x2="{rx:.1f}" y2="{top + inner_h}" '
        'stroke="#555" stroke-dasharray="4,3"/>',
        f'<text x="{rx + 4:.1f}" y="{top - 4}" fill="#555">query restarted</text>',
        f'<line x1="{left}" y1="{top + inner_h}" x2="{left + inner_w}" y2="{top + inner_h}" '
        'stroke="black"/>',
        f'<text x="{left - 8}" y="{top + 4}" text-anchor="end">{most}</text>',
        f'<text x="{left - 8}" y="{top + inner_h}" text-anchor="end">0</text>',
        f'<text x="{left + inner_w + 8}" y="{top + 4}" fill="#e15759">{most_amount:,.0f}</text>',
        f'<rect x="{left}" y="{height - 14}" width="10" height="10" fill="#4e79a7"/>',
        f'<text x="{left + 14}" y="{height - 5}">events per window</text>',
        f'<line x1="{left + 140}" y1="{height - 9}" x2="{left + 160}" y2="{height - 9}" '
        'stroke="#e15759" stroke-width="2"/>',
        f'<text x="{left + 164}" y="{height - 5}">amount per window</text>',
        "</svg>",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="how long the producer runs")
    ap.add_argument("--rate", type=int, default=500, help="events per second")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of 'events'")
    ap.add_argument("--nsqd-http", default="127.0.0.1:4151")
    ap.add_argument("--nsqd-tcp", default="127.0.0.1:4150")
    ap.add_argument("--master", help="a Spark master URL (default: a local standalone cluster)")
    ap.add_argument("--picture", default=str(PICTURE), help="where to save the SVG")
    ap.add_argument("--produce", nargs=2, metavar=("TALLY", "START"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce:  # the producer process
        asyncio.run(
            produce(args.nsqd_tcp, args.partitions, args.seconds, args.rate, Path(args.produce[0]))
        )
        return 0

    from nsqx.spark.cluster import StandaloneCluster
    from nsqx.spark.java import JavaNotFound, ensure_java

    try:
        ensure_java()
    except JavaNotFound as err:
        raise SystemExit(str(err)) from None
    shutil.rmtree(STATE, ignore_errors=True)  # each run is a new pipeline
    STATE.mkdir()
    out, tally = STATE / "per_window", STATE / "tally.json"
    nsq = None
    if not nsqd_alive(args.nsqd_http):
        print("no local nsqd: starting one for this run (make up keeps one)")
        nsq = start_nsq()
    cluster = None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        for p in range(args.partitions):
            post(
                args.nsqd_http,
                f"/topic/create?topic=events&partition={p}&partition_num={args.partitions}",
            )
        # the pipeline starts at the topic's current end (an earlier run's events stay
        # out of it): offsets taken before the producer starts
        from nsqx.spark import rangeclient

        starting = json.dumps(
            {
                f"{args.nsqd_http}/{p}": rangeclient.bounds(args.nsqd_http, "events", p)[1]
                for p in rangeclient.local_partitions(args.nsqd_http, "events")
            }
        )
        if args.master:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.master(args.master).appName("nsqx-example").getOrCreate()
        else:
            cluster = StandaloneCluster(workers=2, work_dir=str(STATE / "spark-cluster")).start()
            print(f"Spark standalone cluster: {cluster.master_url} (a master, two workers)")
            spark = cluster.session(
                "nsqx-example", {"spark.sql.shuffle.partitions": "2"}, executor_memory="768m"
            )
        spark.sparkContext.setLogLevel("ERROR")
        producer = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--produce",
                str(tally),
                "now",
                "--seconds",
                str(args.seconds),
                "--rate",
                str(args.rate),
                "--partitions",
                str(args.partitions),
                "--nsqd-tcp",
                args.nsqd_tcp,
            ]
        )
        t0 = time.monotonic()
        query = start_query(spark, args.nsqd_http, args.nsqd_tcp, out, starting)
        wait_rows(query, producer, t0 + args.seconds / 2)
        print(f"stopping the query after {len(query.recentProgress)} micro-batches ...")
        query.stop()
        restart_at = time.time()
        query = start_query(spark, args.nsqd_http, args.nsqd_tcp, out, starting)
        print("... and starting it again from its checkpoint")
        producer.wait()
        drain(query, tally, out)
        query.stop()
        table = check(out, tally)
        print(f"{'window':<22}{'events':>8}{'amount':>12}")
        for w, n, a in table:
            print(f"{time.strftime('%H:%M:%S', time.localtime(w)):<22}{n:>8}{a:>12.2f}")
        summaries = (
            spark.read.format("nsq")
            .option("topic", "events_per_window")
            .option("nsqdHttpAddresses", args.nsqd_http)
            .load()
            .count()
        )
        print(f"{summaries} summary messages in the topic 'events_per_window'")
        for path in {Path(args.picture), STATE / "per_window.svg"}:
            plot(table, restart_at, path)
        print(f"picture: {args.picture}")
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        if nsq is not None:
            proc, data = nsq
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
