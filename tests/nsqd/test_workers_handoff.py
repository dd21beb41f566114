"""A plain connection moves to the worker that owns its topic (nsqx.nsqd.workers.handoff).

A node of two workers; each test opens connections until one lands (SO_REUSEPORT) on
the worker that does not own its topic, then shows that after its first publish, or
with its SUB, the connection is held by the owner's process (from /proc), and that
what it negotiated before the move (IDENTIFY's settings, AUTH's answer, its counts)
holds there: heartbeats at its interval, its message timeout, no second auth query. A
compressed connection stays where it landed, and a moved one forwards what it publishes
to a third worker's topic: it moves once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nsqx.client import Producer
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT
from workernode import (
    raw_on,
    socket_holder,
    start_workers,
    topics_spread,
    wait_for,
    worker_of,
    worker_pids,
)

from lookupdproc import http_request
from nsqdproc import NsqdProcess
from rawnsq import Raw, run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers need fork/exec")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NsqdProcess]:
    n = start_workers(tmp_path, "--http-address=127.0.0.1:0")
    try:
        yield n
    finally:
        n.stop(signal.SIGKILL)


def owned_by(worker: int) -> str:
    return next(t for t in topics_spread(10, 2, "ho") if owner_of(t, 0, 2) == worker)


def holder(node: NsqdProcess, raw: Raw) -> int | None:
    return socket_holder(worker_pids(node), node.tcp_port, raw.writer.get_extra_info("sockname")[1])


async def landed_on(node: NsqdProcess, worker: int, **identify: Any) -> Raw:
    """A connection that the kernel gave ``worker``, IDENTIFY answered."""
    raw = await raw_on(node, worker)
    await raw.identify(**identify)
    return raw


async def until_held_by(node: NsqdProcess, raw: Raw, worker: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while holder(node, raw) != worker:
        assert loop.time() < deadline, f"the connection did not move to worker {worker}"
        await asyncio.sleep(0.02)


def test_a_publisher_moves_to_its_topics_owner_with_its_settings(node: NsqdProcess) -> None:
    topic = owned_by(1)

    async def go() -> dict[str, Any]:
        raw = await landed_on(node, 0, client_id="mover", heartbeat_interval=1000)
        await raw.publish(topic, b"a")  # forwarded; then the connection moves
        await until_held_by(node, raw, 1)
        await raw.publish(topic, b"b", b"c")  # pipelined, at the owner
        # the interval it negotiated (1 s, not nsqd's 30 s) holds at the owner
        raw.answer_heartbeats = False
        assert await raw.frame(timeout=5) == (FRAME_RESPONSE, HEARTBEAT)
        raw.send(c.nop())
        await raw.publish(topic, b"d")
        loop = asyncio.get_running_loop()
        status, _, body = await loop.run_in_executor(
            None, http_request, f"http://127.0.0.1:{node.http_port}/stats?format=json"
        )
        assert status == 200
        await raw.close()
        return dict(json.loads(body))

    doc = run(go())
    [prod] = [p for p in doc["producers"] if p["client_id"] == "mover"]
    assert prod["pub_counts"] == [{"topic": topic, "count": 4}]
    [t] = [t for t in doc["topics"] if t["topic_name"] == topic]
    assert t["message_count"] == 4


def test_a_subscriber_moves_with_its_sub_and_the_rdy_behind_it(node: NsqdProcess) -> None:
    topic = owned_by(1)

    async def go() -> None:
        raw = await landed_on(node, 0, msg_timeout=1000)
        raw.send(c.sub(topic, "ch") + c.rdy(5))  # one write: both move together
        assert await raw.frame() == (FRAME_RESPONSE, b"OK")
        await until_held_by(node, raw, 1)
        producer = Producer(f"127.0.0.1:{node.tcp_port}")
        await producer.connect()
        await producer.publish(topic, b"one")
        await producer.publish(topic, b"two")
        first, second = await raw.messages(2)
        assert {first.body, second.body} == {b"one", b"two"}
        raw.send(c.fin(first.id))
        # not finished: back after its 1 s timeout (nsqd's default would be 60 s)
        again = await raw.message(timeout=10)
        assert (again.id, again.attempts) == (second.id, 2)
        raw.send(c.fin(again.id))
        assert await raw.nothing_for(0.5)
        await producer.close()
        await raw.close()

    run(go())


def test_a_sub_waits_for_its_owners_restarted_worker_and_moves_there(node: NsqdProcess) -> None:
    """Worker 1 dies; a SUB to its topic on worker 0 meanwhile is held until the new
    worker 1 is up, then moves there (proxied, it would stay so for good)."""
    topic = owned_by(1)

    async def go() -> None:
        raw = await landed_on(node, 0)
        old = worker_pids(node)[1]
        os.kill(old, signal.SIGKILL)
        exited = f"worker 1 (pid {old}) exited"
        await asyncio.to_thread(
            wait_for, lambda: any(exited in line for line in list(node.log)), 20.0, exited
        )
        raw.send(c.sub(topic, "ch") + c.rdy(5))
        assert await raw.frame(timeout=30) == (FRAME_RESPONSE, b"OK")
        assert worker_pids(node)[1] != old
        await until_held_by(node, raw, 1)
        assert any("SUB waits for worker 1" in line for line in list(node.log))
        producer = Producer(f"127.0.0.1:{node.tcp_port}")
        await producer.connect()
        await producer.publish(topic, b"after")
        m = await raw.message()
        assert m.body == b"after"
        raw.send(c.fin(m.id) + c.nop())
        assert await raw.nothing_for(0.3)
        await producer.close()
        await raw.close()

    run(go())


@asynccontextmanager
async def auth_server(topic: str) -> AsyncIterator[tuple[str, list[str]]]:
    """Grants secret "pub" publishing to ``topic`` only."""
    queries: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        queries.append(request.query.get("secret", ""))
        grants = [{"topic": f"^{topic}$", "channels": [".*"], "permissions": ["publish"]}]
        body = {"ttl": 3600, "identity": "pub", "identity_url": "", "authorizations": grants}
        return web.json_response(body)

    runner = web.AppRunner(web.Application())
    runner.app.router.add_get("/auth", handle)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", queries
    finally:
        await runner.cleanup()


def test_an_authorized_publisher_moves_with_its_authorization(tmp_path: Path) -> None:
    topic, other = owned_by(1), owned_by(0)

    async def go() -> None:
        async with auth_server(topic) as (address, queries):
            loop = asyncio.get_running_loop()
            node = await loop.run_in_executor(
                None, start_workers, tmp_path, f"--auth-http-address={address}"
            )
            try:
                raw = await landed_on(node, 0)
                raw.send(c.auth(b"pub"))
                assert json.loads(await raw.response())["identity"] == "pub"
                await raw.publish(topic, b"a")
                await until_held_by(node, raw, 1)
                await raw.publish(topic, b"b")
                # its authorization came with it: refused elsewhere, never asked again
                raw.send(c.pub(other, b"x"))
                ftype, data = await raw.frame()
                assert ftype == FRAME_ERROR and data.startswith(b"E_UNAUTHORIZED")
                assert await raw.closed()
                assert queries == ["pub"]
            finally:
                node.stop(signal.SIGKILL)

    run(go())


def test_a_compressed_publisher_stays_where_it_landed(node: NsqdProcess) -> None:
    """Its compressor's state lives in the worker that negotiated it: forwarded, never
    moved."""
    topic = owned_by(1)

    async def go() -> None:
        for _ in range(60):
            producer = Producer(f"127.0.0.1:{node.tcp_port}", snappy=True)
            await producer.connect()
            assert producer._conn is not None and producer._conn.transport is not None
            port = producer._conn.transport.get_extra_info("sockname")[1]
            if await asyncio.to_thread(worker_of, node, port) == 0:
                break
            await producer.close()
        else:
            raise AssertionError("no connection landed on worker 0")
        for i in range(3):
            await producer.publish(topic, b"m%d" % i)
        # a connection that moves is at its owner a few milliseconds after its answer
        for _ in range(10):
            assert socket_holder(worker_pids(node), node.tcp_port, port) == 0
            await asyncio.sleep(0.05)
        await producer.close()

    run(go())


def test_a_moved_publisher_forwards_to_a_third_topic_owner(node: NsqdProcess) -> None:
    """A connection moves once: after moving to one topic's owner, its publishes to a
    topic of another worker are forwarded from there, answered in order."""
    first, second = owned_by(1), owned_by(0)

    async def go() -> None:
        raw = await landed_on(node, 0)
        await raw.publish(first, b"a")
        await until_held_by(node, raw, 1)
        # pipelined across both topics: every answer, in order
        await raw.publish(second, b"b", b"c")
        await raw.publish(first, b"d")
        await raw.publish(second, b"e")
        for _ in range(10):
            assert holder(node, raw) == 1
            await asyncio.sleep(0.05)
        await raw.close()

    run(go())
    counts = {
        t["topic_name"]: t["message_count"]
        for t in json.loads(
            http_request(f"http://127.0.0.1:{node.http_port}/stats?format=json")[2]
        )["topics"]
    }
    assert counts[first] == 2 and counts[second] == 3
