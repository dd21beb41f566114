"""The Spark source on a replicated topic: each message is read once (from the leader,
up to the commit point), the offsets' keys name no nsqd so a stream goes on after a
failover without a gap or a repeat, and a task planned on a dead leader reads the same
sequences from another replica. Driver and executor code run here without a JVM."""

from __future__ import annotations

import signal
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    Publisher,
    create_replicated,
    leader_port,
    partition_state,
    start_cluster,
    until,
)

from nsqdproc import NsqdProcess

pytest.importorskip("pyspark")

from nsqx.spark import rangeclient
from nsqx.spark.options import NsqOptions
from nsqx.spark.source import NsqStreamReader, RangePartition, read_range


def _bodies(opts: NsqOptions, parts: list[RangePartition]) -> list[bytes]:
    out: list[bytes] = []
    for part in parts:
        for batch in read_range(opts, part):
            out += batch.column("body").to_pylist()
    return out


def test_stream_reads_each_message_once_across_a_failover(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path)
    create_replicated(lookupd, "sp", 3)
    pub = Publisher(lookupd, "sp")
    pub.publish(300)

    opts = NsqOptions.parse({"topic": "sp", "lookupdHttpAddresses": lookupd.http_address})
    reader = NsqStreamReader(opts)
    start = reader.initialOffset()
    assert start == {"*/0": 0}  # one partition, whichever replica leads it
    end = until(
        lambda: (
            (e := reader.latestOffset(start, reader.getDefaultReadLimit())) == {"*/0": 300} and e
        ),
        what="the commit point at 300",
    )
    parts = list(reader.partitions(start, end))
    assert len(parts) == 1 and len(parts[0].alternates) == 2  # the two followers
    leader = next(n for n in nodes if n.tcp_port == leader_port(lookupd, "sp"))
    assert parts[0].address == f"127.0.0.1:{leader.http_port}"
    assert _bodies(opts, parts) == [b"m%d" % i for i in range(300)]

    leader.stop(signal.SIGKILL)
    until(
        lambda: leader_port(lookupd, "sp") not in (None, leader.tcp_port),
        what="a new leader in /lookup",
    )
    pub.publish(100)  # (the publisher follows the new leader)
    start, end = (
        end,
        until(
            lambda: (
                (e := reader.latestOffset(end, reader.getDefaultReadLimit()))["*/0"] == 400 and e
            ),
            what="the new leader's commit point at 400",
        ),
    )
    parts = list(reader.partitions(start, end))
    assert [(p.start, p.end) for p in parts] == [(300, 400)]
    assert parts[0].address != f"127.0.0.1:{leader.http_port}"
    assert _bodies(opts, parts) == [b"m%d" % i for i in range(300, 400)]

    # a task planned before the failover, on the dead leader, reads from a replica
    alive = [f"127.0.0.1:{n.http_port}" for n in nodes if n is not leader]
    stale = RangePartition("*/0", f"127.0.0.1:{leader.http_port}", 0, 0, 400, tuple(alive))
    assert _bodies(opts, [stale]) == [b"m%d" % i for i in range(400)]


def test_range_reads_stop_at_the_commit_point(lookupd_factory: Any, tmp_path: Path) -> None:
    """While a follower is stopped, the leader stores a publish that the ISR does not
    hold yet: /range does not show it (a failover could still cut it)."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, count=2, lag_timeout="60s")
    port = create_replicated(lookupd, "sc", 2)
    leader = next(n for n in nodes if n.tcp_port == port)
    follower: NsqdProcess = next(n for n in nodes if n is not leader)
    Publisher(lookupd, "sc").publish(10)

    addr = f"127.0.0.1:{leader.http_port}"
    until(lambda: rangeclient.bounds(addr, "sc", 0) == (0, 10), what="10 committed")
    follower.proc.send_signal(signal.SIGSTOP)
    try:
        req = urllib.request.Request(f"{leader.http_url}/pub?topic=sc", data=b"late")
        # the HTTP publish waits for the ISR: let it wait in a thread of its own
        threading.Thread(target=lambda: _quietly(req), daemon=True).start()
        until(
            lambda: (partition_state(leader, "sc") or {}).get("end") == 11,
            what="the late message stored on the leader",
        )
        res = rangeclient.fetch_range(addr, "sc", 0, 0)
        assert res.end_sequence == 10 and res.size == 10
    finally:
        follower.proc.send_signal(signal.SIGCONT)
    until(lambda: rangeclient.bounds(addr, "sc", 0) == (0, 11), what="11 committed")


def _quietly(req: urllib.request.Request) -> None:
    try:
        urllib.request.urlopen(req, timeout=30).read()
    except OSError:
        pass
