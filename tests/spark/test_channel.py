"""``mode=channel`` (how a Go nsqd is read) on the cluster, against our nsqd and Go's.

Go's nsqd 1.3.0 is taken from ../shared/reference/go-nsq-1.3.0 (or $NSQX_GO_NSQD); its
tests are skipped when it is not there (a user's clone has no ../shared).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_spark import publish

from nsqdproc import start_nsqd

pytestmark = pytest.mark.spark

GO_NSQD = Path(
    os.environ.get(
        "NSQX_GO_NSQD",
        Path(__file__).resolve().parents[3] / "shared/reference/go-nsq-1.3.0/nsqd",
    )
)


@dataclass
class Node:
    """An nsqd (ours or Go's) with the attributes the helpers use."""

    proc: Any
    tcp_port: int
    http_port: int

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def start_go_nsqd(data: Path) -> Node:
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            str(GO_NSQD),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    ports: dict[str, int] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"(TCP|HTTP): listening on [\d.]+:(\d+)", line)
        if m:
            ports[m.group(1)] = int(m.group(2))
        if len(ports) == 2:
            break
    # keep reading its log so that it never blocks on a full pipe
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return Node(proc, ports["TCP"], ports["HTTP"])


@pytest.fixture(params=["nsqx", "go"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    if request.param == "go":
        if not GO_NSQD.exists():
            pytest.skip(f"Go's nsqd is not at {GO_NSQD}")
        n = start_go_nsqd(tmp_path / "go")
        yield n
        n.proc.send_signal(signal.SIGKILL)
        n.proc.wait()
    else:
        ours = start_nsqd(tmp_path / "nsqx", "--http-address=127.0.0.1:0")
        yield Node(ours.proc, ours.tcp_port, ours.http_port)
        ours.stop(signal.SIGKILL)


def channel_stats(node: Node, topic: str, channel: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{node.http_url}/stats?format=json&topic={topic}") as resp:
        data = json.load(resp)
    data = data.get("data", data)  # Go's V1 envelope, if any
    for t in data["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    raise AssertionError(f"no channel {channel}")


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_channel_mode_batches_up_to_max_offsets_and_gives_back_on_stop(
    spark: Any, node: Node, tmp_path: Path
) -> None:
    """12,000 messages with maxOffsetsPerTrigger=5000 make micro-batches of up to 5,000
    (nsqd lets one connection hold 2,500 in flight: the source holds more over several
    connections). When the query stops (here its sink fails on the last batch), what it
    took but did not commit is given back (REQ, deferred a second), not left in flight
    for msgTimeout (60 s here); the next run reads it again, so nothing is lost
    (at-least-once: given-back messages come again with attempts > 1)."""
    published = [b"c-%d" % i for i in range(12_000)]
    for i in range(0, len(published), 2000):
        publish(node, "chan", published[i : i + 2000])  # type: ignore[arg-type]
    batches: list[list[tuple[bytes, int]]] = []

    def each_batch(df: Any, batch_id: int) -> None:
        batches.append([(r.body, r.attempts) for r in df.select("body", "attempts").collect()])
        if sum(map(len, batches)) >= len(published) and len(batches[-1]) < 5000:
            raise RuntimeError("the sink fails: this batch is not committed")

    def query(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.format("nsq")
            .option("mode", "channel")
            .option("topic", "chan")
            .option("channel", "spark")
            .option("nsqdTcpAddresses", f"127.0.0.1:{node.tcp_port}")
            .option("maxOffsetsPerTrigger", "5000")
            .option("msgTimeout", "60000")
            .load()
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(**trigger)
            .start()
        )

    q = query({"processingTime": "100 milliseconds"})
    with pytest.raises(Exception, match="this batch is not committed"):
        q.awaitTermination(120)
    sizes = [len(b) for b in batches]
    assert sizes[:2] == [5000, 5000] and sum(sizes) == len(published), sizes
    assert sorted(body for b in batches for body, _ in b) == sorted(published)
    last = sorted(body for body, _ in batches[-1])
    # given back (REQ, deferred by a second), long before the 60 s msgTimeout would
    # requeue them
    wait_until(
        lambda: channel_stats(node, "chan", "spark")["in_flight_count"] == 0, 20, "give-back"
    )
    wait_until(
        lambda: channel_stats(node, "chan", "spark")["depth"] == len(last), 20, "deferred ones due"
    )
    batches.clear()
    q = query({"availableNow": True})
    assert q.awaitTermination(120)
    assert q.exception() is None
    again = [row for b in batches for row in b]
    assert sorted(body for body, _ in again) == last  # delivered again, nothing lost
    # delivered again (a message given back may reach another of the query's connections
    # before nsqd took that one's CLS: it is given back once more, attempts 3)
    assert min(attempts for _, attempts in again) >= 2


def channel_reader(node: Node, topic: str, **options: str) -> Any:
    """The mode=channel reader on its own, as Spark's source process runs it."""
    from nsqx.spark.channel_mode import NsqChannelStreamReader
    from nsqx.spark.options import NsqOptions

    return NsqChannelStreamReader(
        NsqOptions.parse(
            {
                "topic": topic,
                "channel": "spark",
                "mode": "channel",
                "nsqdTcpAddresses": f"127.0.0.1:{node.tcp_port}",
                **options,
            }
        )
    )


def test_held_messages_are_touched_not_timed_out(tmp_path: Path) -> None:
    """The reader (on its own, as Spark's source process runs it) holds a taken batch
    and the messages waiting for the next one for longer than msgTimeout: it TOUCHes
    them, so nsqd times none out; commit FINs the batch, stop gives back the rest."""
    ours = start_nsqd(tmp_path / "n", "--http-address=127.0.0.1:0")
    node = Node(ours.proc, ours.tcp_port, ours.http_port)
    try:
        publish(node, "held", [b"h-%d" % i for i in range(300)])  # type: ignore[arg-type]
        # msgTimeout 1.5 s: TOUCH every 0.5 s
        reader = channel_reader(node, "held", maxOffsetsPerTrigger="200", msgTimeout="1500")
        batches, end = reader.read({"taken": 0})
        assert end == {"taken": 200} and sum(b.num_rows for b in batches) == 200
        wait_until(
            lambda: channel_stats(node, "held", "spark")["in_flight_count"] == 300, 20, "300 held"
        )
        # three times msgTimeout: each message would have timed out twice by now
        wait_until(lambda: reader.touch_rounds >= 9, 30, "4.5 s of touching")
        stats = channel_stats(node, "held", "spark")
        assert stats["timeout_count"] == 0 and stats["in_flight_count"] == 300, stats
        reader.commit(end)
        wait_until(
            lambda: channel_stats(node, "held", "spark")["in_flight_count"] == 100, 20, "FINs"
        )
        reader.stop()
        wait_until(lambda: channel_stats(node, "held", "spark")["depth"] == 100, 20, "give-back")
        stats = channel_stats(node, "held", "spark")
        assert stats["in_flight_count"] == 0 and stats["timeout_count"] == 0, stats
    finally:
        ours.stop(signal.SIGKILL)


def test_stop_finishes_what_spark_committed_and_gives_back_the_rest(tmp_path: Path) -> None:
    """A read FINs the batch before it only when Spark takes the new batch in; a query
    stopped between the two (the read's data never taken) still FINs the committed
    batch (Spark asked for what follows it) and gives back only the last one."""
    ours = start_nsqd(tmp_path / "n", "--http-address=127.0.0.1:0")
    node = Node(ours.proc, ours.tcp_port, ours.http_port)
    try:
        publish(node, "stopping", [b"s-%d" % i for i in range(300)])  # type: ignore[arg-type]
        reader = channel_reader(node, "stopping", maxOffsetsPerTrigger="200")
        first, end = reader.read({"taken": 0})
        assert sum(b.num_rows for b in first) == 200
        _second, end2 = reader.read(end)  # batch 1 committed; batch 2 never taken in
        assert end2 == {"taken": 300}
        assert channel_stats(node, "stopping", "spark")["in_flight_count"] == 300
        reader.stop()
        wait_until(
            lambda: channel_stats(node, "stopping", "spark")["depth"] == 100, 20, "give-back"
        )
        stats = channel_stats(node, "stopping", "spark")
        assert stats["in_flight_count"] == 0 and stats["requeue_count"] == 100, stats
    finally:
        ours.stop(signal.SIGKILL)
