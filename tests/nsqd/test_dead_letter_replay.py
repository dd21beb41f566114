"""/channel/deadletter/replay gives each dead letter back once (docs/dead-letters.md),
whatever the sequence of dead-letter topics, restarts and upgrades: how far a channel's
replays have looked is kept per dead-letter topic and partition, durably, and a mark
written before that (one number per channel: tests/fixtures/replay_mark, made by
tests/fixtures/make_replay_mark.py) keeps its meaning."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.replication.manager import ReplicationManager
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

Call = Callable[..., Awaitable[tuple[int, Any]]]

FIXTURE = Path(__file__).parent.parent / "fixtures" / "replay_mark"
REPLAY = "/channel/deadletter/replay?topic=rp&channel=c"


@asynccontextmanager
async def served(data_path: str) -> AsyncIterator[tuple[NSQD, Call]]:
    """An nsqd on ``data_path`` with its HTTP API, and a call of it."""
    nsqd = await start_nsqd(data_path=data_path, http_address="127.0.0.1:0")
    assert nsqd.http_address is not None
    base = f"http://127.0.0.1:{nsqd.http_address[1]}"
    try:
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str) -> tuple[int, Any]:
                async with http.request(method, base + path) as r:
                    body = await r.read()
                    return r.status, json.loads(body) if body else None

            yield nsqd, call
    finally:
        await nsqd.close()


async def config(call: Call, settings: str) -> None:
    status, doc = await call("POST", f"/channel/config?topic=rp&channel=c&{settings}")
    assert status == 200, doc


async def kill(nsqd: NSQD, consumer: Raw, pub: Raw, *bodies: bytes) -> None:
    """Publish ``bodies`` to rp and give each back once: with max_attempts=1 each
    becomes a dead letter (in the topic the policy names now)."""
    ch = nsqd.topics["rp"].default_partition.channels["c"]
    before = ch.dead_letter_count
    await pub.publish("rp", *bodies)
    consumer.send(c.rdy(len(bodies)))
    got = await consumer.messages(len(bodies))
    consumer.send(c.rdy(0) + b"".join(c.req(m.id, 0) for m in got))
    await wait_for(lambda: ch.dead_letter_count == before + len(bodies), what="dead letters")


async def replayed(call: Call, consumer: Raw, n: int = 1000) -> list[bytes]:
    """Replay, take what comes back (finished), and say what it was."""
    status, doc = await call("POST", f"{REPLAY}&n={n}")
    assert status == 200, doc
    assert doc["missing"] == 0, doc
    if not doc["replayed"]:
        return []
    consumer.send(c.rdy(doc["replayed"]))
    got = await consumer.messages(doc["replayed"])
    consumer.send(c.rdy(0) + b"".join(c.fin(m.id) for m in got))
    assert all(m.attempts == 1 for m in got)
    return sorted(bytes(m.body) for m in got)


def test_each_dead_letter_is_replayed_once_whatever_its_dead_letter_topic() -> None:
    """The issue's sequence: 3 letters in rp.dead replayed, then one in rp.dx, then back
    to rp.dead: nothing comes twice; and letters left in one topic while another was
    replayed are not skipped."""

    async def go() -> None:
        async with served(tempfile.mkdtemp(prefix="nsqx-test-")) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            pub = await Raw.connect(nsqd)
            await config(call, "max_attempts=1")
            await kill(nsqd, consumer, pub, b"d1", b"d2", b"d3")
            assert await replayed(call, consumer) == [b"d1", b"d2", b"d3"]

            await config(call, "dead_letter_topic=rp.dx")
            await kill(nsqd, consumer, pub, b"x1")
            assert await replayed(call, consumer) == [b"x1"]

            await config(call, "dead_letter_topic=")  # back to rp.dead
            assert await replayed(call, consumer) == []
            # the other way round: new letters in rp.dead while rp.dx is replayed
            await kill(nsqd, consumer, pub, b"d4", b"d5")
            await config(call, "dead_letter_topic=rp.dx")
            await kill(nsqd, consumer, pub, b"x2")
            assert await replayed(call, consumer) == [b"x2"]
            await config(call, "dead_letter_topic=")
            assert await replayed(call, consumer, n=1) == [b"d4"]
            assert await replayed(call, consumer) == [b"d5"]
            assert await replayed(call, consumer) == []
            assert await consumer.nothing_for(0.1)
            await consumer.close()
            await pub.close()

    run(go())


def test_replay_marks_survive_restarts_and_policy_changes_between_them() -> None:
    async def go() -> None:
        data = tempfile.mkdtemp(prefix="nsqx-test-")
        async with served(data) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            pub = await Raw.connect(nsqd)
            await config(call, "max_attempts=1")
            await kill(nsqd, consumer, pub, b"d1", b"d2")
            assert await replayed(call, consumer, n=1) == [b"d1"]
            await config(call, "dead_letter_topic=rp.dx")
            await kill(nsqd, consumer, pub, b"x1", b"x2")
            assert await replayed(call, consumer, n=1) == [b"x1"]
            await consumer.close()
            await pub.close()
        async with served(data) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            assert await replayed(call, consumer) == [b"x2"]
            await config(call, "dead_letter_topic=")
            await consumer.close()
        async with served(data) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            assert await replayed(call, consumer) == [b"d2"]
            assert await replayed(call, consumer) == []
            await config(call, "dead_letter_topic=rp.dx")
            assert await replayed(call, consumer) == []
            await consumer.close()

    run(go())


def test_a_dead_letter_topic_deleted_and_made_again_is_replayed_from_its_start() -> None:
    """The mark of a topic that was deleted does not skip the letters of the topic of
    the same name made afterwards."""

    async def go() -> None:
        async with served(tempfile.mkdtemp(prefix="nsqx-test-")) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            pub = await Raw.connect(nsqd)
            await config(call, "max_attempts=1")
            await kill(nsqd, consumer, pub, b"d1", b"d2")
            assert await replayed(call, consumer) == [b"d1", b"d2"]
            status, _ = await call("POST", "/topic/delete?topic=rp.dead")
            assert status == 200
            await kill(nsqd, consumer, pub, b"d3", b"d4", b"d5")
            assert await replayed(call, consumer) == [b"d3", b"d4", b"d5"]
            await consumer.close()
            await pub.close()

    run(go())


def test_a_replay_mark_written_before_marks_per_topic_is_kept() -> None:
    """tests/fixtures/replay_mark: channel c of rp had 3 dead letters in rp.dead, 2 of
    them replayed (and finished) by the release before this change. Today's nsqd
    replays the third, once, and nothing else."""
    manifest = json.loads((FIXTURE / "manifest.json").read_text())

    async def go() -> None:
        data = Path(tempfile.mkdtemp(prefix="nsqx-test-")) / "data"
        shutil.copytree(FIXTURE / "data", data)
        async with served(str(data)) as (nsqd, call):
            ch = nsqd.topics["rp"].default_partition.channels["c"]
            assert ch.policy.max_attempts == 1
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            assert await replayed(call, consumer) == [b.encode() for b in manifest["left"]]
            assert await replayed(call, consumer) == []
            await consumer.close()
        async with served(str(data)) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rp", "c")
            assert await replayed(call, consumer) == []
            await consumer.close()

    run(go())


def test_a_leader_sends_its_followers_the_marks_of_replicated_dead_letter_topics() -> None:
    """Marks in a replicated dead-letter topic (the same log on every replica) go with
    the channel's state to the followers (CURSORS); those in a topic of this node alone
    do not: each node has its own log, and its own marks, there."""
    manager: Any = ReplicationManager.__new__(ReplicationManager)
    replicated = SimpleNamespace(replica=object())
    alone = SimpleNamespace(replica=None)
    manager.nsqd = SimpleNamespace(
        topics={"t.dead": SimpleNamespace(partitions={0: replicated, 1: alone})}
    )
    marks = {"t.dead:0": (3, 1), "t.dead:1": (4, 2), "t.dead:2": (1, 1), "gone:0": (1, 1)}
    assert manager._shared_marks(marks) == {"t.dead:0": (3, 1)}
