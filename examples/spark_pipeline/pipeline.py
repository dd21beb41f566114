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
4. Runs two streaming queries on the cluster over the same events, each with its own
   checkpoint: events by 5-second window of event time, with a 10-second watermark (a
   window is written once, when the watermark passes it), count and sum of amounts;
   one writes the windows to Parquet (Spark's file sink: exactly-once), the other
   publishes one summary message per window to the topic "events_per_window" (the
   "nsq" sink: at-least-once).
5. Stops both half-way while the producer goes on (a micro-batch may be cut short),
   and starts them again from their checkpoints: they resume at the offsets of their
   last micro-batch.
6. Once the producer is done, checks every window against the producer's tally: once
   in the Parquet table with its count and sum (no event lost, none counted twice),
   and at least once in the summary topic with the same figures; prints the table and
   saves a picture of it: .state/per_window.svg (--picture PATH saves it there too, as
   docs/images/spark_pipeline.svg was made). Spark's own log goes to .state/spark.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STATE = HERE / ".state"  # checkpoint, Parquet output and the producer's tally
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


def per_window(spark: Any, http: str, starting: str, channel: str | None) -> Any:
    """Events by window of event time, with the watermark: (window, events, amount)."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("nsq")
        .option("topic", "events")
        .option("nsqdHttpAddresses", http)
        .option("maxOffsetsPerTrigger", "20000")
        .option("startingOffsets", starting)  # a restart goes on from its checkpoint
    )
    if channel:
        reader = reader.option("channel", channel)  # its lag shows in nsqd's /stats
    events = reader.load().select(
        F.from_json(
            F.col("body").cast("string"), "id LONG, user STRING, amount DOUBLE, ts DOUBLE"
        ).alias("e")
    )
    return (
        events.select("e.amount", F.col("e.ts").cast("timestamp").alias("at"))
        .withWatermark("at", WATERMARK)
        .groupBy(F.window("at", f"{WINDOW} seconds").alias("w"))
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        .select(F.col("w.start").alias("window"), "events", "amount")
    )


def start_queries(spark: Any, http: str, tcp: str, out: Path, starting: str) -> list[Any]:
    """Two streaming queries on the same events, each with its own checkpoint:
    windows to Parquet (Spark's file sink: exactly-once, its log in
    ``_spark_metadata`` says which files count) and one summary message per window to
    the topic ``events_per_window`` (the nsq sink: at-least-once)."""
    from pyspark.sql import functions as F

    to_parquet = (
        per_window(spark, http, starting, "pipeline")
        .writeStream.outputMode("append")  # a window is written once its watermark passed
        .format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(STATE / "checkpoint-parquet"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    to_topic = (
        per_window(spark, http, starting, None)
        .select(F.to_json(F.struct("window", "events", "amount")).alias("body"))
        .writeStream.outputMode("append")
        .format("nsq")
        .option("topic", "events_per_window")
        .option("nsqdTcpAddresses", tcp)
        .option("checkpointLocation", str(STATE / "checkpoint-topic"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    return [to_parquet, to_topic]


def failed(queries: list[Any]) -> None:
    for q in queries:
        if q.exception() is not None:
            raise SystemExit(f"the query failed: {q.exception()}")


def shown(path: Path) -> str:
    """``path`` relative to the current directory when it is under it."""
    relative = os.path.relpath(path)
    return str(path.resolve()) if relative.startswith(os.pardir) else relative


def stop_between_batches(query: Any, timeout: float = 30) -> None:
    """Stop ``query`` while no micro-batch runs (``isTriggerActive`` false), so that
    none is cut short (Spark would log it as an aborted job, with a Java stack trace,
    though it simply runs again after the restart)."""
    deadline = time.monotonic() + timeout
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


@contextlib.contextmanager
def spark_log(path: Path) -> Iterator[None]:
    """Send this process's stderr (file descriptor 2) to ``path`` meanwhile: the driver's
    JVM and its Python workers, started now, inherit it for good. Spark's log lines and
    warnings go there, with the BrokenPipeError tracebacks that pyspark's streaming
    source runners print when a query stops (pyspark 4: the JVM closes their socket
    first). The pipeline's own lines are on stdout; a failure is said on the terminal
    once this ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def batches_done(query: Any) -> int:
    """Micro-batches of ``query`` that read rows and completed."""
    return sum(1 for p in query.recentProgress if p["numInputRows"])


def wait_mid_way(
    queries: list[Any],
    producer: subprocess.Popen[bytes],
    until: float,
    least: int = 2,
    timeout: float = 600,
) -> None:
    """While the producer goes on, let the queries run until ``until`` (monotonic) and
    until each has completed ``least`` micro-batches with rows; in any case until each
    has completed one micro-batch (a query is not stopped while it starts up)."""
    deadline = time.monotonic() + timeout

    def going_on() -> bool:
        return producer.poll() is None and (
            time.monotonic() < until or min(batches_done(q) for q in queries) < least
        )

    while going_on() or any(q.lastProgress is None for q in queries):
        failed(queries)
        if time.monotonic() > deadline:
            raise SystemExit("the queries completed no micro-batch in time")
        time.sleep(0.2)


def drain(
    spark: Any, queries: list[Any], tally: Path, out: Path, summaries: Any, timeout: float = 180
) -> None:
    """After the producer: wait until every window it tallied is in the table and in
    the summary topic (``summaries()`` reads the topic)."""
    want = set(json.loads(tally.read_text())["windows"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        failed(queries)
        if want <= {str(int(w)) for w, _, _ in read_table(spark, out)} and want <= {
            str(window_start(m)) for m in summaries()
        }:
            return
        time.sleep(1)
    raise SystemExit("the table or the summary topic did not get every window in time")


def window_start(summary: dict[str, Any]) -> int:
    """A summary message's window start, in epoch seconds (Spark writes a timestamp as
    ISO 8601 text with its zone)."""
    return int(datetime.fromisoformat(summary["window"]).timestamp())


def read_table(spark: Any, out: Path) -> list[tuple[float, int, float]]:
    """(window start in epoch seconds, events, amount) of every window in the Parquet
    table, as Spark reads it (the files its sink committed, no others)."""
    if not (out / "_spark_metadata").exists():
        return []
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r.window.timestamp(), int(r.events), float(r.amount)) for r in rows)


def read_summaries(spark: Any, http: str, starting: str) -> list[dict[str, Any]]:
    """The summary messages this run published (from the topic's end when it began)."""
    from pyspark.sql import functions as F

    rows = (
        spark.read.format("nsq")
        .option("topic", "events_per_window")
        .option("nsqdHttpAddresses", http)
        .option("startingOffsets", starting)
        .load()
        .select(F.col("body").cast("string").alias("json"))
        .collect()
    )
    return [json.loads(r.json) for r in rows]


def check(
    table: list[tuple[float, int, float]], summaries: list[dict[str, Any]], tally: Path
) -> list[tuple[float, int, float]]:
    """Every window of the producer's tally once in the table, with its count and sum;
    and at least once in the summary topic, with the same figures."""
    truth = json.loads(tally.read_text())
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
    published: dict[str, list[tuple[int, float]]] = {}
    for m in summaries:
        published.setdefault(str(window_start(m)), []).append(
            (int(m["events"]), float(m["amount"]))
        )
    missing = [w for w in truth["windows"] if w not in published]
    wrong = [
        w
        for w, (n, a) in truth["windows"].items()
        if w in published and any(pn != n or abs(pa - a) > 0.01 for pn, pa in published[w])
    ]
    if missing or wrong:
        raise SystemExit(f"summary topic: windows missing {missing[:5]}, differing {wrong[:5]}")
    again = sum(len(v) - 1 for v in published.values())
    print(
        f"summary topic: every window published with the same figures ({len(summaries)} "
        f"messages; {again} published again by a micro-batch replayed after the restart: "
        "at-least-once)"
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
        f'<text x="{rx + 4:.1f}" y="{top - 4}" fill="#555">queries stopped and restarted</text>',
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
    global STATE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="how long the producer runs")
    ap.add_argument("--rate", type=int, default=500, help="events per second")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of 'events'")
    ap.add_argument("--nsqd-http", default="127.0.0.1:4151")
    ap.add_argument("--nsqd-tcp", default="127.0.0.1:4150")
    ap.add_argument("--master", help="a Spark master URL (default: a local standalone cluster)")
    ap.add_argument(
        "--picture",
        help="also save the SVG here (docs/images/spark_pipeline.svg is one such run's)",
    )
    ap.add_argument(
        "--state",
        default=str(STATE),
        help="where the run keeps checkpoints, the table, the tally and Spark's log (emptied)",
    )
    ap.add_argument("--produce", nargs=2, metavar=("TALLY", "START"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce:  # the producer process
        asyncio.run(
            produce(args.nsqd_tcp, args.partitions, args.seconds, args.rate, Path(args.produce[0]))
        )
        return 0

    STATE = Path(args.state)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    from nsqx.spark.cluster import StandaloneCluster
    from nsqx.spark.java import JavaNotFound, ensure_java

    try:
        ensure_java()
    except JavaNotFound as err:
        raise SystemExit(str(err)) from None
    shutil.rmtree(STATE, ignore_errors=True)  # each run is a new pipeline
    STATE.mkdir(parents=True)
    out, tally = STATE / "per_window", STATE / "tally.json"
    nsq = None
    if not nsqd_alive(args.nsqd_http):
        print("no local nsqd: starting one for this run (make up keeps one)")
        nsq = start_nsq()
    cluster = None
    quiet = contextlib.ExitStack()
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
        post(args.nsqd_http, "/topic/create?topic=events_per_window")
        summary_start = json.dumps(
            {f"{args.nsqd_http}/0": rangeclient.bounds(args.nsqd_http, "events_per_window", 0)[1]}
        )
        print(f"Spark's log: {shown(STATE / 'spark.log')}")
        quiet.enter_context(spark_log(STATE / "spark.log"))  # before the driver's JVM starts
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
        queries = start_queries(spark, args.nsqd_http, args.nsqd_tcp, out, starting)
        wait_mid_way(queries, producer, t0 + args.seconds / 2)
        done = ", ".join(str(batches_done(q)) for q in queries)
        going = "the producer goes on" if producer.poll() is None else "the producer is done"
        print(f"stopping the queries after {done} micro-batches ({going})")
        for q in queries:
            stop_between_batches(q)
        restart_at = time.time()
        queries = start_queries(spark, args.nsqd_http, args.nsqd_tcp, out, starting)
        print("... and starting them again from their checkpoints")
        producer.wait()

        def summaries() -> list[dict[str, Any]]:
            return read_summaries(spark, args.nsqd_http, summary_start)

        drain(spark, queries, tally, out, summaries)
        for q in queries:
            stop_between_batches(q)
        table = check(read_table(spark, out), summaries(), tally)
        print(f"{'window':<22}{'events':>8}{'amount':>12}")
        for w, n, a in table:
            print(f"{time.strftime('%H:%M:%S', time.localtime(w)):<22}{n:>8}{a:>12.2f}")
        pictures = [STATE / "per_window.svg"] + ([Path(args.picture)] if args.picture else [])
        for path in pictures:
            plot(table, restart_at, path)
        print("picture:", ", ".join(shown(p) for p in pictures))
        spark.stop()
    finally:
        quiet.close()
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
