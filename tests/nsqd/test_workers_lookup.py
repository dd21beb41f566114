"""A node of several workers is ONE node to nsqlookupd (nsqx.nsqd.workers.topology).

Real processes: an nsqlookupd (nsqx's, and Go's 1.3 where its binary is at hand) and a
node of two workers. Only the lead worker registers, and it registers every worker's
topics and channels under the node's one address; a killed worker keeps its
registrations and a restarted lead registers everyone's again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqx.client import Consumer, Producer
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.nsqd.workers.spec import SPEC_ENV, WorkerSpec
from workernode import Lookupd, go_lookupd, start_workers, topics_spread, worker_pids

from lookupdproc import http_request, wait_until
from nsqdproc import NsqdProcess
from rawnsq import run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers need fork/exec")


@pytest.fixture(params=["nsqx", "go"])
def lookupd(request: pytest.FixtureRequest, lookupd_factory: Any) -> Iterator[Lookupd]:
    if request.param == "nsqx":
        proc = lookupd_factory()
        yield Lookupd(proc.tcp_address, proc.http_address, lambda: None)
        return
    with go_lookupd() as go:
        yield go


def internal_http(node: NsqdProcess) -> list[str]:
    """Each worker's private HTTP address (where its own partitions are answered), read
    from the spec its supervisor gave it."""
    pid = worker_pids(node)[0]
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    raw = next(e for e in env if e.startswith(SPEC_ENV.encode() + b"="))
    spec = WorkerSpec.from_json(raw.split(b"=", 1)[1].decode())
    return [f"127.0.0.1:{p}" for p in spec.internal_http_ports]


def create_channel(node: NsqdProcess, topic: str, channel: str) -> None:
    """Create a channel (and its topic) in the worker that owns the topic."""
    address = internal_http(node)[owner_of(topic, 0, 2)]
    status, _, body = http_request(f"http://{address}/topic/create?topic={topic}", method="POST")
    assert status == 200, body
    query = urllib.parse.urlencode({"topic": topic, "channel": channel})
    status, _, body = http_request(f"http://{address}/channel/create?{query}", method="POST")
    assert status == 200, body


def publish_on_fresh_connections(node: NsqdProcess, topics: list[str]) -> None:
    async def go() -> None:
        # a connection lands on any worker: publishes are forwarded to the owner
        for round_ in range(3):
            for topic in topics:
                producer = Producer(f"127.0.0.1:{node.tcp_port}")
                await producer.connect()
                await producer.publish(topic, f"{topic}-{round_}".encode())
                await producer.close()

    run(go())


def producers_of(lookupd: Lookupd, topic: str) -> list[tuple[str, int, int]] | None:
    doc = lookupd.json(f"/lookup?topic={topic}")
    if not doc:
        return None
    return [(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in doc["producers"]]


def channels_of(lookupd: Lookupd, topic: str) -> list[str]:
    doc = lookupd.json(f"/channels?topic={topic}")
    return list(doc["channels"]) if doc else []


def all_registered(lookupd: Lookupd, node: NsqdProcess, topics: list[str]) -> bool:
    listed = lookupd.json("/topics")
    if not listed or not set(topics) <= set(listed["topics"]):
        return False
    one = [("127.0.0.1", node.tcp_port, node.http_port)]
    for topic in topics:
        if producers_of(lookupd, topic) != one:
            return False
        channels = lookupd.json(f"/channels?topic={topic}")
        if not channels or f"ch-{topic}" not in channels["channels"]:
            return False
    return True


def start_node(tmp_path: Path, lookupd: Lookupd) -> NsqdProcess:
    return start_workers(
        tmp_path,
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    )


def register_everywhere(node: NsqdProcess, lookupd: Lookupd, topics: list[str]) -> None:
    """Each topic published to (through connections landing on either worker) and given
    a channel, then seen registered under the node's one address."""
    publish_on_fresh_connections(node, topics)
    for topic in topics:
        create_channel(node, topic, f"ch-{topic}")
    wait_until(
        lambda: all_registered(lookupd, node, topics),
        timeout=20,
        what="every topic and channel registered under the node's one address",
    )


def test_every_workers_topics_register_as_one_producer(tmp_path: Path, lookupd: Lookupd) -> None:
    node = start_node(tmp_path, lookupd)
    topics = topics_spread(10, 2)
    try:
        register_everywhere(node, lookupd, topics)
        nodes = lookupd.json("/nodes")["producers"]
        assert [(n["tcp_port"], n["http_port"]) for n in nodes] == [(node.tcp_port, node.http_port)]
        assert set(topics) <= set(nodes[0]["topics"])

        # a topic deleted in its worker (not the lead) no longer has the node as producer
        gone = next(t for t in topics if owner_of(t, 0, 2) == 1)
        address = internal_http(node)[1]
        status, _, _ = http_request(f"http://{address}/topic/delete?topic={gone}", method="POST")
        assert status == 200
        wait_until(lambda: not producers_of(lookupd, gone), what="the deleted topic unregistered")
        assert all_registered(lookupd, node, [t for t in topics if t != gone])
    finally:
        node.stop()


def test_killed_workers_keep_or_regain_the_nodes_registrations(
    tmp_path: Path, lookupd_factory: Any
) -> None:
    proc = lookupd_factory()
    lookupd = Lookupd(proc.tcp_address, proc.http_address, lambda: None)
    node = start_node(tmp_path, lookupd)
    topics = topics_spread(10, 2)
    try:
        register_everywhere(node, lookupd, topics)

        # an ephemeral channel of worker 1's: it dies with the worker
        eph = next(t for t in topics if owner_of(t, 0, 2) == 1)
        create_channel(node, eph, "e#ephemeral")
        wait_until(lambda: "e#ephemeral" in channels_of(lookupd, eph), what="ephemeral channel")

        # worker 1 killed: the lead keeps its registrations; restarted, it syncs again,
        # and what it no longer has (the ephemeral channel) is unregistered
        before = worker_pids(node)
        os.kill(before[1], signal.SIGKILL)
        wait_until(lambda: worker_pids(node).get(1) != before[1], timeout=20, what="restart 1")
        wait_until(
            lambda: "e#ephemeral" not in channels_of(lookupd, eph),
            timeout=20,
            what="the ephemeral channel unregistered after the restart",
        )
        assert all_registered(lookupd, node, topics)

        # the lead killed: nsqlookupd drops the node with its connection; the restarted
        # lead registers its own topics and worker 1's, which it sends again
        before = worker_pids(node)
        os.kill(before[0], signal.SIGKILL)
        wait_until(lambda: worker_pids(node).get(0) != before[0], timeout=20, what="restart 0")
        wait_until(
            lambda: all_registered(lookupd, node, topics),
            timeout=30,
            what="every worker's topics registered again by the new lead",
        )
        # and worker 1's later topics still reach it
        more = [t for t in (f"late{i}" for i in range(20)) if owner_of(t, 0, 2) == 1][:2]
        publish_on_fresh_connections(node, more)
        for topic in more:
            create_channel(node, topic, f"ch-{topic}")
        wait_until(lambda: all_registered(lookupd, node, more), timeout=20, what="later topics")
    finally:
        node.stop()


@pytest.mark.skipif(
    importlib.util.find_spec("nsqx.nsqd.workers.proxy") is None,
    reason="needs a SUB on any worker served by the partition's owner (the subproxy work)",
)
def test_a_consumer_by_lookupd_finds_every_workers_topics(tmp_path: Path, lookupd: Lookupd) -> None:
    node = start_node(tmp_path, lookupd)
    topics = topics_spread(10, 2)
    try:
        for topic in topics:
            create_channel(node, topic, "c")
        publish_on_fresh_connections(node, topics)

        async def consume(topic: str) -> set[bytes]:
            got: set[bytes] = set()
            consumer = Consumer(
                topic, "c", lookupd_http_addresses=[lookupd.http_address], max_in_flight=10
            )
            await consumer.start()
            try:
                async with asyncio.timeout(20):
                    async for msg in consumer:
                        msg.finish()
                        got.add(msg.body)
                        if len(got) == 3:
                            break
            finally:
                await consumer.close()
            return got

        for topic in topics:
            assert run(consume(topic)) == {f"{topic}-{r}".encode() for r in range(3)}
    finally:
        node.stop()
