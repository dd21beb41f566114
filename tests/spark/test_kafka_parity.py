"""The options and behaviours of Spark's Kafka source that the "nsq" source has too
(docs/spark.md, "Kafka-source parity"): offsets by timestamp, minOffsetsPerTrigger with
maxTriggerDelay, failOnDataLoss, includeHeaders, and the progress's offsets behind
latest. Planning is checked on the reader against real nsqd; the rest in Spark."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from test_partitions import create, fill, http, publish_tcp, reclaim_old_segments, small_segments

from nsqx.spark.options import NsqOptions
from nsqx.spark.source import (
    NsqBatchReader,
    NsqStreamReader,
    RangePartition,
    offsets_behind_latest,
    read_range,
)
from nsqx.wire import commands as cmd

from nsqdproc import NsqdProcess


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NsqdProcess]:
    n = small_segments(tmp_path)
    yield n
    n.stop(signal.SIGKILL)


def opts(node: NsqdProcess, topic: str, **more: str) -> NsqOptions:
    return NsqOptions.parse({"topic": topic, "nsqdHttpAddresses": http(node), **more})


def ranges(reader: NsqBatchReader) -> list[tuple[str, int, int]]:
    return [(p.key, p.start, p.end) for p in reader.partitions()]


def test_offsets_by_timestamp(node: NsqdProcess) -> None:
    """startingTimestamp / endingTimestamp (one time for every partition) and
    *OffsetsByTimestamp (a time per partition): the first message published at or
    after the time; a partition the JSON leaves out keeps the default."""
    create(node, "ts", 0, 2)
    create(node, "ts", 1, 2)
    fill(node, "ts", 0, 30, "early")
    fill(node, "ts", 1, 10, "early")
    cut = int(time.time() * 1000) + 1
    while time.time() * 1000 <= cut:  # the next publishes are stamped after ``cut``
        pass
    fill(node, "ts", 0, 20, "late")
    fill(node, "ts", 1, 5, "late")
    k0, k1 = f"{http(node)}/0", f"{http(node)}/1"
    assert ranges(NsqBatchReader(opts(node, "ts", startingTimestamp=str(cut)))) == [
        (k0, 30, 50),
        (k1, 10, 15),
    ]
    assert ranges(NsqBatchReader(opts(node, "ts", endingTimestamp=str(cut)))) == [
        (k0, 0, 30),
        (k1, 0, 10),
    ]
    by_time = json.dumps({k1: cut})
    assert ranges(NsqBatchReader(opts(node, "ts", startingOffsetsByTimestamp=by_time))) == [
        (k0, 0, 50),
        (k1, 10, 15),
    ]
    assert ranges(NsqBatchReader(opts(node, "ts", endingOffsetsByTimestamp=by_time))) == [
        (k0, 0, 50),
        (k1, 0, 10),
    ]
    # the same in a stream's first offsets
    stream = NsqStreamReader(opts(node, "ts", startingOffsetsByTimestamp=by_time))
    assert stream.initialOffset() == {k0: 0, k1: 10}


def test_min_offsets_per_trigger_waits_for_rows_or_max_trigger_delay(
    node: NsqdProcess,
) -> None:
    """No micro-batch while fewer than minOffsetsPerTrigger rows are there, until
    maxTriggerDelay has passed since the last one; availableNow reads what there is."""
    create(node, "few", 0, 1)
    fill(node, "few", 0, 5, "a")
    k = f"{http(node)}/0"
    now = [100.0]
    reader = NsqStreamReader(opts(node, "few", minOffsetsPerTrigger="10", maxTriggerDelay="30s"))
    reader.clock = lambda: now[0]
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 5 < 10: wait
    now[0] += 29
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    fill(node, "few", 0, 5, "b")
    assert reader.latestOffset(start, ReadMaxRows(8)) == {k: 8}  # 10 there: go (max 8)
    assert reader.latestOffset({k: 8}, ReadAllAvailable()) == {k: 8}  # 2 < 10
    now[0] += 30  # maxTriggerDelay since the last micro-batch: read the 2
    assert reader.latestOffset({k: 8}, ReadAllAvailable()) == {k: 10}
    pinned = NsqStreamReader(opts(node, "few", minOffsetsPerTrigger="1000"))
    pinned.prepareForTriggerAvailableNow()
    assert pinned.latestOffset(start, ReadAllAvailable()) == {k: 10}


def test_fail_on_data_loss(node: NsqdProcess) -> None:
    """Planned sequences that nsqd deleted before they were read: an error naming them
    (failOnDataLoss=true, the default), or the rows that are left (false)."""
    create(node, "lossy", 0, 1)
    bodies = fill(node, "lossy", 0, 120, "m")
    lo = reclaim_old_segments(node, "lossy", 0)
    bodies += fill(node, "lossy", 0, 10, "n")
    assert 0 < lo < 130
    part = RangePartition(f"{http(node)}/0", http(node), 0, 0, 130)
    with pytest.raises(RuntimeError, match=f"sequences 0..{lo - 1} were deleted"):
        list(read_range(opts(node, "lossy"), part))
    rows = [
        r
        for b in read_range(opts(node, "lossy", failOnDataLoss="false"), part)
        for r in b.to_pylist()
    ]
    assert [r["body"] for r in rows] == bodies[lo:]
    # a start below the first retained sequence, planned from JSON, is the same case
    start = json.dumps({f"{http(node)}/0": 0})
    assert ranges(NsqBatchReader(opts(node, "lossy", startingOffsets=start)))[0][1] == 0
    assert (
        ranges(NsqBatchReader(opts(node, "lossy", startingOffsets=start, failOnDataLoss="false")))[
            0
        ][1]
        == lo
    )


@pytest.mark.spark
def test_headers_and_offsets_behind_latest_in_spark(
    spark: Any, node: NsqdProcess, tmp_path: Path
) -> None:
    """includeHeaders=true adds Kafka's ``headers`` (the JSON ext header's pairs); each
    micro-batch's progress has the source's latestOffset, from which
    offsets_behind_latest gives Kafka's min/max/avgOffsetsBehindLatest."""
    create(node, "hdr", 0, 1, "&extend=true")
    commands = [
        cmd.pub_ext("hdr", 0, b'{"user":"u%d","n":%d}' % (i, i), b"body-%d" % i)
        if i % 2 == 0
        else cmd.pub("hdr", b"body-%d" % i, 0)
        for i in range(25)
    ]
    publish_tcp(node, commands)
    df = (
        spark.read.format("nsq")
        .option("topic", "hdr")
        .option("nsqdHttpAddresses", http(node))
        .option("includeHeaders", "true")
        .load()
    )
    assert df.columns[-1] == "headers"
    rows = df.orderBy("offset").select("headers", "ext").collect()
    for i, r in enumerate(rows):
        if i % 2:
            assert r.headers is None and r.ext is None
        else:
            assert [(h.key, bytes(h.value)) for h in r.headers] == [
                ("user", b"u%d" % i),
                ("n", b"%d" % i),
            ]
    q = (
        spark.readStream.format("nsq")
        .option("topic", "hdr")
        .option("nsqdHttpAddresses", http(node))
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    behind = [offsets_behind_latest(p["sources"][0]) for p in q.recentProgress]
    behind = [b for b in behind if b]
    assert [b["maxOffsetsBehindLatest"] for b in behind] == [15.0, 5.0, 0.0]
    assert behind[0]["avgOffsetsBehindLatest"] == 15.0
