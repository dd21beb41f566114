"""The "nsq" data source in a real local SparkSession against real nsqd processes."""

from __future__ import annotations

import json
import signal
import struct
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nsqdproc import NsqdProcess, start_nsqd

pytestmark = pytest.mark.spark


def publish(nsqd: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    data = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    req = urllib.request.Request(f"{nsqd.http_url}/mpub?topic={topic}&binary=true", data=data)
    with urllib.request.urlopen(req) as resp:
        assert resp.read() == b"OK"


def stats(nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?format=json&topic={topic}") as resp:
        data: dict[str, Any] = json.load(resp)
    return data


@pytest.fixture
def two_nsqd(tmp_path: Path) -> Any:
    started = [start_nsqd(tmp_path / f"n{i}", "--http-address=127.0.0.1:0") for i in range(2)]
    yield started
    for n in started:
        n.stop(signal.SIGKILL)


def addresses(nodes: list[NsqdProcess]) -> str:
    return ",".join(f"127.0.0.1:{n.http_port}" for n in nodes)


def test_batch_round_trip(spark: Any, two_nsqd: list[NsqdProcess]) -> None:
    a, b = two_nsqd
    publish(a, "events", [b"a-%d" % i for i in range(300)])
    publish(b, "events", [b"b-%d" % i for i in range(200)])
    df = (
        spark.read.format("nsq")
        .option("topic", "events")
        .option("nsqdHttpAddresses", addresses(two_nsqd))
        .load()
    )
    assert df.rdd.getNumPartitions() == 2  # one per (nsqd, topic partition)
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(
        [b"a-%d" % i for i in range(300)] + [b"b-%d" % i for i in range(200)]
    )
    r = rows[0]
    assert r.topic == "events" and r.partition == 0 and r.attempts == 1 and len(r.id) == 16
    assert r.timestamp is not None and r.trace_id == 0
    # write the rows back to another topic with MPUB batches, then read them again
    (
        df.selectExpr("body")
        .write.format("nsq")
        .option("topic", "copy")
        .option("nsqdTcpAddresses", f"127.0.0.1:{a.tcp_port}")
        .mode("append")
        .save()
    )
    copied = (
        spark.read.format("nsq")
        .option("topic", "copy")
        .option("nsqdHttpAddresses", f"127.0.0.1:{a.http_port}")
        .option("startingOffsets", json.dumps({f"127.0.0.1:{a.http_port}/0": 100}))
        .load()
    )
    assert copied.count() == 400


def test_streaming_restart_from_checkpoint_exactly_once(
    spark: Any, two_nsqd: list[NsqdProcess], tmp_path: Path
) -> None:
    a, b = two_nsqd
    out = tmp_path / "out"
    ckpt = tmp_path / "ckpt"

    def run_once() -> None:
        q = (
            spark.readStream.format("nsq")
            .option("topic", "stream")
            .option("nsqdHttpAddresses", addresses(two_nsqd))
            .option("maxOffsetsPerTrigger", "150")
            .option("channel", "spark")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    publish(a, "stream", [b"a1-%d" % i for i in range(250)])
    publish(b, "stream", [b"b1-%d" % i for i in range(100)])
    run_once()
    # more arrives; the query is restarted from its checkpoint
    publish(a, "stream", [b"a2-%d" % i for i in range(120)])
    publish(b, "stream", [b"b2-%d" % i for i in range(80)])
    run_once()
    bodies = [r.body for r in spark.read.parquet(str(out)).select("body").collect()]
    expected = (
        [b"a1-%d" % i for i in range(250)]
        + [b"b1-%d" % i for i in range(100)]
        + [b"a2-%d" % i for i in range(120)]
        + [b"b2-%d" % i for i in range(80)]
    )
    assert sorted(bodies) == sorted(expected)  # every message exactly once
    # commit advanced the named channel: its lag shows in /stats (commits run a batch late)
    ch = stats(a, "stream")["topics"][0]["channels"]
    assert [c["channel_name"] for c in ch] == ["spark"]
    # 370 were published to a; all but (at most) the last batch's share were committed
    assert ch[0]["depth"] < 150, ch[0]


def test_bad_option_names_the_option(spark: Any, two_nsqd: list[NsqdProcess]) -> None:
    with pytest.raises(Exception, match="startingOffsets"):
        (
            spark.read.format("nsq")
            .option("topic", "events")
            .option("nsqdHttpAddresses", addresses(two_nsqd))
            .option("startingOffsets", "whenever")
            .load()
            .collect()
        )
