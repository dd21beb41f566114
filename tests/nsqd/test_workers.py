"""``nsqx nsqd --workers=N``: one node of several processes (nsqx.nsqd.supervisor).

Real processes on free loopback ports: publishes through any worker land in the
partition's owner and are acknowledged only once there; the node's nsqd.dat lists
every worker's topics; a worker killed with SIGKILL is restarted and loses nothing it
acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.nsqd.metadata import ChannelMetadata, TopicMetadata, merge_metadata
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_ERROR, FRAME_RESPONSE
from workernode import start_workers, topics_spread, wait_for, worker_pids

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers need fork/exec")


async def drain(port: int, topic: str, want: int, timeout: float = 10.0) -> list[bytes]:
    """Every message of ``topic`` (channel "c") from a node, until ``want`` arrived."""
    got: list[bytes] = []
    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[f"127.0.0.1:{port}"], max_in_flight=1000)
    await consumer.start()
    try:
        async with asyncio.timeout(timeout):
            async for msg in consumer:
                msg.finish()
                got.append(msg.body)
                if len(got) >= want:
                    break
    except TimeoutError:
        pass
    finally:
        await consumer.close()
    return got


# -- nsqd.dat: one file, each worker its own partitions --------------------------------


def _owns(index: int, workers: int):  # type: ignore[no-untyped-def]
    return lambda topic, pid: owner_of(topic, pid, workers) == index


def test_merge_keeps_the_other_workers_topics_and_replaces_its_own() -> None:
    a = [t for t in topics_spread(8, 2) if owner_of(t, 0, 2) == 0][:2]
    b = [t for t in topics_spread(8, 2) if owner_of(t, 0, 2) == 1][:2]
    existing = [TopicMetadata(t, False, [ChannelMetadata("old")]) for t in a + b]
    mine = [TopicMetadata(a[0], True, [ChannelMetadata("new")])]  # a[1] was deleted
    merged = {t.name: t for t in merge_metadata(existing, mine, _owns(0, 2))}
    assert set(merged) == {a[0], *b}
    assert merged[a[0]].paused and merged[a[0]].channels[0].name == "new"
    assert all(merged[t].channels[0].name == "old" for t in b)


def test_merge_gathers_a_partitioned_topics_partitions_from_every_worker() -> None:
    owns0, owns1 = _owns(0, 2), _owns(1, 2)
    settings = {"partition_num": 4}
    chans = {pid: [ChannelMetadata(f"c{pid}")] for pid in range(4)}
    w0 = {pid: c for pid, c in chans.items() if owns0("p", pid)}
    w1 = {pid: c for pid, c in chans.items() if owns1("p", pid)}
    assert w0 and w1
    first = merge_metadata([], [TopicMetadata("p", False, [], settings, w0)], owns0)
    both = merge_metadata(first, [TopicMetadata("p", False, [], settings, w1)], owns1)
    assert len(both) == 1 and both[0].partitions == chans
    assert both[0].channels == chans[0]  # the top level is partition 0's, as NSQ reads it
    # worker 1 dropping its partitions leaves worker 0's
    after = merge_metadata(both, [], owns1)
    assert after[0].partitions == w0


def test_ownership_is_stable_and_spreads_partitions() -> None:
    assert owner_of("t", 0, 1) == 0
    assert owner_of("t", -1, 4) == owner_of("t", 0, 4)
    assert sorted(owner_of("t", pid, 4) for pid in range(4)) == [0, 1, 2, 3]
    owners = [owner_of(f"topic{i}", 0, 4) for i in range(400)]
    assert min(owners.count(w) for w in range(4)) > 60


# -- a node of two workers -------------------------------------------------------------


def test_publishes_through_any_worker_land_once_in_their_owner(tmp_path: Path) -> None:
    node = start_nsqd(tmp_path, "--workers=2")
    topics = topics_spread(10, 2)
    try:

        async def publish() -> None:
            producers = [Producer(f"127.0.0.1:{node.tcp_port}") for _ in range(6)]
            for p in producers:
                await p.connect()
            for i in range(60):
                for k, topic in enumerate(topics):
                    await producers[(i + k) % 6].publish(topic, f"{topic}-{i}".encode())
            for k, topic in enumerate(topics):
                await producers[k % 6].multi_publish(topic, [b"m1", b"m2"])
            for p in producers:
                await p.close()

        run(publish())
        assert node.stop() == 0
    finally:
        node.stop(signal.SIGKILL)
    doc = json.loads((tmp_path / "nsqd.dat").read_text())
    assert sorted(t["name"] for t in doc["topics"]) == sorted(topics)
    # one process reads the node's directory: every message, once
    single = start_nsqd(tmp_path)
    try:
        for topic in topics:
            got = run(drain(single.tcp_port, topic, 62))
            assert sorted(got) == sorted(
                [f"{topic}-{i}".encode() for i in range(60)] + [b"m1", b"m2"]
            )
    finally:
        single.stop()


def test_a_forwarded_publish_gets_its_owners_refusal(tmp_path: Path) -> None:
    node = start_nsqd(tmp_path, "--workers=2")
    try:

        async def go() -> list[tuple[int, bytes]]:
            answers = []
            # each connection lands on some worker; a publish with an ext header that
            # is not JSON is refused (not fatally) by the topic's owner, wherever it
            # arrived, and the publish pipelined behind it is answered after it; a
            # publish to partition 3 of a topic that does not exist is refused and
            # closes the connection, as on a single nsqd
            for _ in range(6):
                raw = await Raw.connect(node.tcp_address)
                raw.send(c.pub_ext("fine", None, b"{not json", b"x") + c.pub("fine", b"y"))
                answers.append(await raw.frame())
                answers.append(await raw.frame())
                raw.send(c.pub("nosuch", b"z", 3) + c.pub("fine", b"w"))
                answers.append(await raw.frame())
                with pytest.raises(ConnectionError):
                    await raw.frame()
                raw.writer.close()
            return answers

        answers = run(go())
    finally:
        node.stop()
    for k in range(6):
        ext, ok, missing = answers[3 * k : 3 * k + 3]
        assert ext[0] == FRAME_ERROR and ext[1].startswith(b"E_"), ext
        assert ok == (FRAME_RESPONSE, b"OK")
        assert missing[0] == FRAME_ERROR and missing[1].startswith(b"E_TOPIC_NOT_EXIST")


def test_a_killed_worker_restarts_and_keeps_what_it_acknowledged(tmp_path: Path) -> None:
    node = start_workers(tmp_path)
    topics = topics_spread(6, 2)
    try:

        async def publish(n: int, tag: str) -> None:
            producers = [Producer(f"127.0.0.1:{node.tcp_port}") for _ in range(4)]
            for p in producers:
                await p.connect()
            for i in range(n):
                for k, topic in enumerate(topics):
                    await producers[(i + k) % 4].publish(topic, f"{tag}{i}".encode())
            for p in producers:
                await p.close()

        run(publish(30, "a"))
        before = worker_pids(node)
        os.kill(before[1], signal.SIGKILL)
        wait_for(
            lambda: worker_pids(node).get(1, before[1]) != before[1], what="worker 1 restarted"
        )
        # the node takes publishes again once worker 1 is back (a client retries)
        deadline = time.monotonic() + 20
        while True:
            try:
                run(publish(30, "b"), timeout=20)
                break
            except (ConnectionError, OSError, TimeoutError, Exception):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert node.stop() == 0
    finally:
        node.stop(signal.SIGKILL)
    single = start_nsqd(tmp_path)
    try:
        for topic in topics:
            got = set(run(drain(single.tcp_port, topic, 60)))
            want = {f"a{i}".encode() for i in range(30)} | {f"b{i}".encode() for i in range(30)}
            assert want <= got, (topic, sorted(want - got)[:5])
    finally:
        single.stop()


def test_a_hundred_topics_with_their_own_publishers_and_consumers(tmp_path: Path) -> None:
    """Issue 30's "many topics": 100 topics, each with a publisher and a consumer of its
    own, on a node of two workers; every consumer gets its topic's messages, once."""
    node = start_nsqd(tmp_path, "--workers=2")
    topics = [f"many{i}" for i in range(100)]
    per_topic = 20
    address = f"127.0.0.1:{node.tcp_port}"

    async def one(topic: str) -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        def handle(msg: Message) -> None:
            got.append(msg.body)
            if len(got) >= per_topic:
                done.set()

        consumer = Consumer(topic, "c", handle, nsqd_tcp_addresses=[address], max_in_flight=50)
        await consumer.start()
        producer = Producer(address)
        await producer.connect()
        for i in range(per_topic):
            await producer.publish(topic, f"{topic}/{i}".encode())
        await producer.close()
        try:
            async with asyncio.timeout(30):
                await done.wait()
        finally:
            await consumer.close()
        return got

    async def all_topics() -> list[list[bytes]]:
        return await asyncio.gather(*(one(t) for t in topics))

    try:
        results = run(all_topics(), timeout=120)
    finally:
        node.stop()
    for topic, got in zip(topics, results, strict=True):
        assert sorted(got) == sorted(f"{topic}/{i}".encode() for i in range(per_topic)), topic


def test_a_worker_that_cannot_start_stops_the_node(tmp_path: Path) -> None:
    """A bad certificate stops a node of workers as it stops a single nsqd: exit 1
    with the reason, nothing left running, the directory free."""
    cmd = [
        sys.executable,
        "-m",
        "nsqx",
        "nsqd",
        "--workers=2",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--https-address=",
        f"--data-path={tmp_path}",
        f"--tls-cert={tmp_path / 'missing.pem'}",
        f"--tls-key={tmp_path / 'missing.key'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "could not start" in proc.stderr
    assert "w0: " in proc.stderr and "No such file" in proc.stderr  # the worker says why
    node = start_nsqd(tmp_path)  # the directory is free again
    node.stop()


def test_stats_list_every_consumer_of_a_channel_once(tmp_path: Path) -> None:
    """A consumer subscribed through another worker is listed in its channel's /stats
    as a local one (with its RDY and the messages it got), and counted once."""
    node = start_nsqd(tmp_path, "--workers=2", "--http-address=127.0.0.1:0")
    try:

        async def go() -> dict[str, Any]:
            raws = []
            for k in range(6):
                raw = await Raw.connect(node.tcp_address)
                await raw.subscribe("listed", "c", rdy=10 + k, client_id=f"consumer{k}")
                raws.append(raw)
            pub = await Raw.connect(node.tcp_address)
            await pub.publish("listed", *[b"m%d" % i for i in range(12)])
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                doc = await asyncio.to_thread(http_stats, node)
                ch = doc["topics"][0]["channels"][0]
                if sum(cl["message_count"] for cl in ch["clients"]) == 12:
                    break
                assert asyncio.get_running_loop().time() < deadline, ch
                await asyncio.sleep(0.05)
            for raw in [*raws, pub]:
                raw.writer.close()
            return ch

        ch = run(go())
    finally:
        node.stop()
    assert ch["client_count"] == 6
    assert sorted(cl["client_id"] for cl in ch["clients"]) == [f"consumer{k}" for k in range(6)]
    assert sorted(cl["ready_count"] for cl in ch["clients"]) == list(range(10, 16))
    assert len({cl["remote_address"] for cl in ch["clients"]}) == 6


def http_stats(node: NsqdProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{node.http_url}/stats?format=json&topic=listed") as resp:
        doc: dict[str, Any] = json.load(resp)
    return doc
