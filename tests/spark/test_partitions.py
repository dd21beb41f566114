"""Partitioned topics through the "nsq" source: every partition on every nsqd, a
partition that appears while a stream runs, ordered topics, trace ids and ext headers."""

from __future__ import annotations

import json
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nsqx.spark import rangeclient
from nsqx.spark.options import NsqOptions
from nsqx.spark.source import NsqStreamReader, nsqd_http_addresses, read_range, share_budget
from nsqx.wire import commands as cmd
from nsqx.wire.frames import FRAME_RESPONSE, MAGIC_V2, FrameDecoder

from nsqdproc import NsqdProcess, start_nsqd

PARTITION_SHIFT = 50


def http(node: NsqdProcess) -> str:
    return f"127.0.0.1:{node.http_port}"


def post(node: NsqdProcess, path: str, data: bytes | None = None) -> bytes:
    req = urllib.request.Request(f"{node.http_url}{path}", data=data, method="POST")
    with urllib.request.urlopen(req) as resp:
        body: bytes = resp.read()
    return body


def create(node: NsqdProcess, topic: str, partition: int, num: int, extra: str = "") -> None:
    post(node, f"/topic/create?topic={topic}&partition={partition}&partition_num={num}{extra}")


def publish(node: NsqdProcess, topic: str, partition: int, bodies: list[bytes]) -> None:
    data = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    assert post(node, f"/mpub?topic={topic}&partition={partition}&binary=true", data) == b"OK"


def publish_tcp(node: NsqdProcess, commands: list[bytes]) -> None:
    """Send commands on one connection and wait for as many OK answers (PUB_TRACE's
    answer is OK followed by the trace reply)."""
    with socket.create_connection(node.tcp_address, timeout=10) as s:
        s.sendall(MAGIC_V2 + b"".join(commands))
        decoder, answers = FrameDecoder(), 0
        while answers < len(commands):
            data = s.recv(1 << 16)
            assert data, "nsqd closed the connection"
            for ftype, payload in decoder.feed(data):
                assert ftype == FRAME_RESPONSE and payload.startswith(b"OK"), payload
                answers += 1


def reclaim_old_segments(node: NsqdProcess, topic: str, partition: int) -> int:
    """Let a channel finish the partition so nsqd deletes its old segments (--retention
    is 0); the partition's first retained sequence, now above 0."""
    end = rangeclient.bounds(http(node), topic, partition)[1]
    q = f"topic={topic}&channel=drain&partition={partition}"
    post(node, f"/channel/create?{q}")
    post(node, f"/channel/setoffset?{q}&sequence={end}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lo = rangeclient.bounds(http(node), topic, partition)[0]
        if lo > 0:
            return lo
        time.sleep(0.1)
    raise AssertionError("nsqd deleted no segment")


def small_segments(tmp_path: Path, name: str = "n") -> NsqdProcess:
    # segments of 2 KiB roll every few dozen messages, so some can be deleted
    return start_nsqd(tmp_path / name, "--http-address=127.0.0.1:0", "--max-bytes-per-file=2048")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[NsqdProcess]]:
    started = [small_segments(tmp_path, f"n{i}") for i in range(2)]
    yield started
    for n in started:
        n.stop(signal.SIGKILL)


def fill(node: NsqdProcess, topic: str, partition: int, n: int, tag: str) -> list[bytes]:
    bodies = [f"{tag}-{partition}-{i}".encode() * 4 for i in range(n)]
    for i in range(0, n, 20):  # several publishes: several runs, segments roll between
        publish(node, topic, partition, bodies[i : i + 20])
    return bodies


# -- the reader's planning, without Spark ---------------------------------------------


def test_lookup_finds_producers_and_partition_nodes() -> None:
    """NSQ 1.3's /lookup (producers), Youzan's (plus the partitions map) and its V1
    envelope, plus the holders of the topic's partitions in /nodes: every nsqd once."""

    def peer(port: int) -> dict[str, Any]:
        return {"broadcast_address": "127.0.0.1", "tcp_port": port - 1, "http_port": port}

    answers = [
        {"channels": [], "producers": [peer(4151)]},
        {
            "channels": [],
            "meta": {"partition_num": 3},
            "producers": [peer(4151)],
            "partitions": {"0": peer(4151), "1": peer(4251), "2": peer(4151)},
        },
        {"status_code": 200, "status_txt": "OK", "data": {"producers": [peer(4351)]}},
    ]
    # /nodes: the nodes that registered the topic's partitions (followers of replicated
    # ones too); a node of another topic and an NSQ 1.3 node (no map) are not taken
    nodes = {
        "producers": [
            {**peer(4451), "partitions": {"t": ["1"]}},
            {**peer(4551), "partitions": {"other": ["0"]}},
            peer(4651),
        ]
    }
    asked: list[str] = []

    class Lookupd(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/nodes"):
                body = json.dumps(nodes).encode()
            else:
                asked.append(self.path)
                body = json.dumps(answers[len(asked) - 1]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Lookupd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lookupd = f"127.0.0.1:{server.server_address[1]}"
        opts = NsqOptions.parse({"topic": "t", "lookupdHttpAddresses": lookupd})
        assert nsqd_http_addresses(opts) == ["127.0.0.1:4151", "127.0.0.1:4451"]
        assert nsqd_http_addresses(opts) == [
            "127.0.0.1:4151",
            "127.0.0.1:4251",
            "127.0.0.1:4451",
        ]
        assert [p["tcp_port"] for p in rangeclient.lookup(lookupd, "t")] == [4350]
        assert all(a.startswith("/lookup?topic=t") for a in asked)
    finally:
        server.shutdown()
        server.server_close()


def test_a_small_budget_is_shared_out_exactly() -> None:
    """maxOffsetsPerTrigger below the number of partitions still moves the stream."""
    assert share_budget({"a": 1, "b": 1, "c": 1}, 2) in (
        {"a": 1, "b": 1, "c": 0},
        {"a": 1, "b": 0, "c": 1},
        {"a": 0, "b": 1, "c": 1},
    )
    assert share_budget({"a": 100, "b": 1}, 10) == {"a": 10, "b": 0}
    assert share_budget({"a": 30, "b": 20, "c": 10}, 7) == {"a": 4, "b": 2, "c": 1}
    assert share_budget({"a": 3, "b": 0}, 10) == {"a": 3, "b": 0}
    for n in range(1, 40):
        backlog = {str(k): (k * 7919) % 13 + 1 for k in range(n)}
        for budget in (1, 5, n, 3 * n):
            shares = share_budget(backlog, budget)
            assert sum(shares.values()) == min(budget, sum(backlog.values()))
            assert all(0 <= shares[k] <= backlog[k] for k in backlog)


def test_stream_reader_adds_a_partition_at_its_first_retained_sequence(
    nodes: list[NsqdProcess],
) -> None:
    a, _ = nodes
    create(a, "grow", 0, 2)
    fill(a, "grow", 0, 5, "a")
    k0, k1 = f"{http(a)}/0", f"{http(a)}/1"
    dead = "127.0.0.1:1"  # nothing listens there
    reader = NsqStreamReader(NsqOptions.parse({"topic": "grow", "nsqdHttpAddresses": http(a)}))
    start = reader.initialOffset()
    assert start == {k0: 0}
    # partition 1 appears, fills and loses its first segments before the stream looks
    create(a, "grow", 1, 2)
    p1 = fill(a, "grow", 1, 120, "b")
    lo = reclaim_old_segments(a, "grow", 1)
    p1 += fill(a, "grow", 1, 10, "c")
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    end = reader.latestOffset(start, ReadAllAvailable())
    # it enters at its lower bound with nothing to read in this batch
    assert end == {k0: 5, k1: lo}
    assert [(p.key, p.start, p.end) for p in reader.partitions(start, end)] == [(k0, 0, 5)]
    fill(a, "grow", 0, 5, "a2")
    nxt = reader.latestOffset(end, ReadMaxRows(1000))
    assert nxt == {k0: 10, k1: 130}
    parts = reader.partitions(end, nxt)
    assert [(p.key, p.start, p.end) for p in parts] == [(k0, 5, 10), (k1, lo, 130)]
    # failOnDataLoss is on (the default): the read must not find a gap
    rows = [r for b in read_range(reader.opts, parts[1]) for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(lo, 130))
    assert [r["body"] for r in rows] == p1[lo:]
    # an unreachable nsqd is skipped by a running stream: its offsets stay as they are
    both = NsqOptions.parse({"topic": "grow", "nsqdHttpAddresses": f"{http(a)},{dead}"})
    running = NsqStreamReader(both)
    with pytest.raises(rangeclient.NsqUnreachable):
        running.initialOffset()  # but a query does not start without it
    assert running.latestOffset({**nxt, f"{dead}/0": 7}, ReadAllAvailable()) == {
        **nxt,
        f"{dead}/0": 7,
    }
    # availableNow: a partition that appears after the run started stays at its bound
    create(a, "late", 0, 2)
    fill(a, "late", 0, 3, "l")
    pinned = NsqStreamReader(NsqOptions.parse({"topic": "late", "nsqdHttpAddresses": http(a)}))
    first = pinned.initialOffset()
    pinned.prepareForTriggerAvailableNow()
    create(a, "late", 1, 2)
    fill(a, "late", 1, 3, "l")
    fill(a, "late", 0, 3, "l")  # after the run started too
    g0, g1 = f"{http(a)}/0", f"{http(a)}/1"
    assert pinned.latestOffset(first, ReadAllAvailable()) == {g0: 3, g1: 0}
    assert pinned.latestOffset({g0: 3, g1: 0}, ReadAllAvailable()) == {g0: 3, g1: 0}


# -- Spark ------------------------------------------------------------------------------


@pytest.mark.spark
def test_batch_reads_every_partition_on_every_nsqd_once(
    spark: Any, nodes: list[NsqdProcess]
) -> None:
    """Partitions 0 and 2 on one nsqd, 1 on the other (as lookupd places them): one
    Spark partition each, every message once with its partition, offset and id."""
    a, b = nodes
    expected = []
    for node, partition in ((a, 0), (b, 1), (a, 2)):
        create(node, "p3", partition, 3)
        bodies = fill(node, "p3", partition, 30 + 25 * partition, "m")
        expected += [
            # (ids are partition << 50 | sequence + 1: never 0)
            (http(node), partition, i, f"{partition << PARTITION_SHIFT | (i + 1):016x}", body)
            for i, body in enumerate(bodies)
        ]
    df = (
        spark.read.format("nsq")
        .option("topic", "p3")
        .option("nsqdHttpAddresses", f"{http(a)},{http(b)}")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("nsqd", "partition", "offset", "id", "body").collect()
    assert sorted(tuple(r) for r in rows) == sorted(expected)
    from_offsets = (
        spark.read.format("nsq")
        .option("topic", "p3")
        .option("nsqdHttpAddresses", f"{http(a)},{http(b)}")
        .option("startingOffsets", f'{{"{http(a)}/2": 60}}')
        .option("endingOffsets", f'{{"{http(b)}/1": 10}}')
        .load()
    )
    # partition 0 whole, 1 up to 10, 2 from 60 (of 80)
    assert from_offsets.count() == 30 + 10 + 20


@pytest.mark.spark
def test_ordered_ext_topic_rows_in_offset_order_with_trace_ids_and_headers(
    spark: Any, nodes: list[NsqdProcess]
) -> None:
    """An orderedmulti ext topic: each partition's rows come in offset order in one
    Spark partition (read in chunks of 7); trace ids and ext headers fill their columns,
    ``body`` holds the body only."""
    a, _ = nodes
    expected: dict[int, list[tuple[int, Any, bytes]]] = {0: [], 1: []}
    commands = []
    for p in (0, 1):
        create(a, "oe", p, 2, "&orderedmulti=true&extend=true")
    for i in range(24):
        p = i % 2
        body = b"body-%d" % i
        if i % 3 == 0:
            header = b'{"k":"v%d"}' % i
            commands.append(cmd.pub_ext("oe", p, header, body))
            expected[p].append((0, header.decode(), body))
        elif i % 3 == 1:
            commands.append(cmd.pub_trace("oe", p, 1000 + i, body))
            expected[p].append((1000 + i, None, body))
        else:
            commands.append(cmd.pub("oe", body, p))
            expected[p].append((0, None, body))
    commands.append(cmd.mpub_trace("oe", 1, [7, 8], [b"m7", b"m8"]))
    expected[1] += [(7, None, b"m7"), (8, None, b"m8")]
    publish_tcp(a, commands)
    from pyspark.sql.functions import spark_partition_id

    df = (
        spark.read.format("nsq")
        .option("topic", "oe")
        .option("nsqdHttpAddresses", http(a))
        .option("readMessages", "7")
        .load()
    )
    assert df.rdd.getNumPartitions() == 2
    rows = df.select(
        spark_partition_id().alias("task"), "partition", "offset", "trace_id", "ext", "body"
    ).collect()
    tasks: dict[int, list[Any]] = {}
    for r in rows:  # collect keeps each task's rows in the order the task made them
        tasks.setdefault(r.task, []).append(r)
    assert len(tasks) == 2
    for task_rows in tasks.values():
        (p,) = {r.partition for r in task_rows}
        assert [r.offset for r in task_rows] == list(range(len(expected[p])))
        assert [(r.trace_id, r.ext, r.body) for r in task_rows] == expected[p]


@pytest.mark.spark
def test_stream_picks_up_a_partition_created_while_it_runs(spark: Any, tmp_path: Path) -> None:
    """A running query finds a new partition at its first retained sequence (its old
    segments were deleted before the query saw it): no failOnDataLoss, nothing missed
    from there, nothing read twice."""
    node = small_segments(tmp_path)
    try:
        create(node, "grow", 0, 2)
        p0 = fill(node, "grow", 0, 30, "a")
        seen: list[tuple[int, int, bytes]] = []
        first, go = threading.Event(), threading.Event()

        def each_batch(df: Any, batch_id: int) -> None:
            seen.extend(tuple(r) for r in df.select("partition", "offset", "body").collect())
            first.set()
            go.wait(60)  # the first batch holds the query until partition 1 is ready

        q = (
            spark.readStream.format("nsq")
            .option("topic", "grow")
            .option("nsqdHttpAddresses", http(node))
            .load()
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:
            assert first.wait(60), q.exception()
            create(node, "grow", 1, 2)
            p1 = fill(node, "grow", 1, 120, "b")
            lo = reclaim_old_segments(node, "grow", 1)
            p1 += fill(node, "grow", 1, 10, "c")
            p0 += fill(node, "grow", 0, 10, "a2")
            go.set()
            want = sorted(
                [(0, i, b) for i, b in enumerate(p0)]
                + [(1, i, b) for i, b in enumerate(p1) if i >= lo]
            )
            deadline = time.monotonic() + 60
            while sorted(seen) != want and time.monotonic() < deadline:
                assert q.exception() is None, q.exception()
                time.sleep(0.1)
            assert q.exception() is None
            assert sorted(seen) == want
        finally:
            go.set()
            q.stop()
    finally:
        node.stop(signal.SIGKILL)


def _role(node: NsqdProcess, topic: str) -> str | None:
    """The replica role of the topic's partition 0 on ``node`` once confirmed."""
    stats = json.loads(urllib.request.urlopen(f"{node.http_url}/stats?format=json").read())
    for t in stats["topics"] or ():
        rep = t.get("replication") or {}
        if t["topic_name"] == topic and rep.get("confirmed"):
            return str(rep["role"])
    return None


def test_a_replicated_topic_is_read_once_through_spark(
    spark: Any, lookupd_factory: Any, tmp_path: Path
) -> None:
    """Replicator 2: both nsqd hold the partition (and are named), Spark reads each
    message once, from the leader, under the key "*/0"."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    started = [
        start_nsqd(
            tmp_path / f"r{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(lookupd.json("/nodes")["producers"]) < 2:
            assert time.monotonic() < deadline, "two nsqd registered"
            time.sleep(0.05)
        status, _, body = lookupd.post("/topic/create?topic=rp&partition_num=1&replicator=2")
        assert status == 200, body
        bodies = [b"r%d" % i for i in range(40)]
        leader = None
        while leader is None:  # until nsqlookupd told the roles
            assert time.monotonic() < deadline, "a confirmed leader"
            leader = next((n for n in started if _role(n, "rp") == "leader"), None)
            time.sleep(0.05)
        publish(leader, "rp", 0, bodies)  # answered once both replicas hold it
        both = ",".join(http(n) for n in started)
        df = spark.read.format("nsq").option("topic", "rp").option("nsqdHttpAddresses", both).load()
        rows = df.select("nsqd", "partition", "body").collect()
        assert sorted(r.body for r in rows) == sorted(bodies)
        assert {r.nsqd for r in rows} == {http(leader)}
        keyed = (
            spark.read.format("nsq")
            .option("topic", "rp")
            .option("lookupdHttpAddresses", lookupd.http_address)
            .option("startingOffsets", '{"*/0": 30}')
            .load()
        )
        assert sorted(r.body for r in keyed.select("body").collect()) == bodies[30:]
    finally:
        for n in started:
            n.stop(signal.SIGKILL)
