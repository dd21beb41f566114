"""GET /channel/peek and /topic/peek (nsqx.nsqd.peek): messages seen, nothing changed.

A real nsqd on free loopback ports: what the channel peek shows is exactly what its
consumer then gets, in that order (requeued first, in-flight and deferred messages left
out), and bad input gets a clear 4xx.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

Get = Callable[[str], Awaitable[tuple[int, Any]]]


@asynccontextmanager
async def served() -> AsyncIterator[tuple[NSQD, Get]]:
    """An nsqd with its HTTP API, and a GET of it: (status, JSON)."""
    nsqd = await start_nsqd(http_address="127.0.0.1:0")
    assert nsqd.http_address is not None
    base = f"http://127.0.0.1:{nsqd.http_address[1]}"
    try:
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> tuple[int, Any]:
                async with http.get(base + path) as r:
                    return r.status, await r.json()

            yield nsqd, get
    finally:
        await nsqd.close()


async def refused(get: Get, cases: list[tuple[str, tuple[int, str]]]) -> None:
    for path, want in cases:
        status, doc = await get(path)
        assert (status, doc["message"]) == want, path


def test_channel_peek_shows_what_the_consumer_gets_next_and_changes_nothing() -> None:
    async def go() -> None:
        async with served() as (nsqd, get):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("pk", "c")
            pub = await Raw.connect(nsqd)
            await pub.publish("pk", b"m0", b"m1", b"m2")
            pub.send(c.dpub("pk", 60_000, b"later"))  # not due: not next
            assert await pub.response() == b"OK"
            await pub.publish("pk", b"\xff\x00binary", b"m4")
            consumer.send(c.rdy(2))
            first, second = await consumer.messages(2)
            # back to the channel, not redelivered yet (RDY 0 first)
            consumer.send(c.rdy(0) + c.req(first.id, 0))
            ch = nsqd.topics["pk"].default_partition.channels["c"]
            await wait_for(lambda: bool(ch.flight.requeued))

            status, doc = await get("/channel/peek?topic=pk&channel=c&n=10")
            assert status == 200
            assert (doc["topic_name"], doc["channel_name"], doc["partition"]) == (
                "pk",
                "c",
                0,
            )
            assert doc["in_flight_count"] == 1 and doc["paused"] is False
            peeked = [(m["body_base64"], m["attempts"]) for m in doc["messages"]]
            b64 = [base64.b64encode(b).decode() for b in (b"m0", b"m2", b"\xff\x00binary", b"m4")]
            assert peeked == [(b64[0], 2), (b64[1], 1), (b64[2], 1), (b64[3], 1)]
            assert doc["messages"][0]["id"] == first.id.decode()
            assert doc["messages"][0]["body"] == "m0"
            assert doc["messages"][2]["body"].endswith("binary")  # as text, replaced
            assert [m["sequence"] for m in doc["messages"]] == [0, 2, 4, 5]
            status, two = await get("/channel/peek?topic=pk&channel=c&n=2")
            assert [m["id"] for m in two["messages"]] == [m["id"] for m in doc["messages"][:2]]

            # nothing changed: the consumer now gets exactly those, in that order
            consumer.send(c.fin(second.id) + c.rdy(10))
            got = await consumer.messages(4)
            assert [(m.body, m.attempts) for m in got] == [
                (b"m0", 2),
                (b"m2", 1),
                (b"\xff\x00binary", 1),
                (b"m4", 1),
            ]
            assert [m.id.decode() for m in got] == [m["id"] for m in doc["messages"]]
            for m in got:
                consumer.send(c.fin(m.id))
            await wait_for(lambda: ch.in_flight_count == 0)
            status, empty = await get("/channel/peek?topic=pk&channel=c")
            assert status == 200 and empty["messages"] == []

            # bad input: a clear 4xx, nothing else harmed
            await refused(
                get,
                [
                    ("/channel/peek?topic=pk&channel=c&n=0", (400, "INVALID_N")),
                    ("/channel/peek?topic=pk&channel=c&n=1001", (400, "INVALID_N")),
                    ("/channel/peek?topic=pk&channel=c&n=x", (400, "INVALID_N")),
                    ("/channel/peek?topic=pk", (400, "MISSING_ARG_CHANNEL")),
                    ("/channel/peek?topic=pk&channel=nosuch", (404, "CHANNEL_NOT_FOUND")),
                    ("/channel/peek?topic=nosuch&channel=c", (404, "TOPIC_NOT_FOUND")),
                    ("/channel/peek?topic=pk&channel=c&partition=3", (404, "PARTITION_NOT_FOUND")),
                ],
            )
            await consumer.close()
            await pub.close()

    run(go())


def test_channel_peek_counts_depth_and_deferred_as_stats_does() -> None:
    """A DPUB not yet due that the channel's cursor has not reached is deferred, not
    waiting, in /channel/peek as in /stats (NSQ defers it when it is published); so is
    one the cursor passed, and a REQ with a delay."""

    async def go() -> None:
        async with served() as (nsqd, get):

            async def both() -> list[tuple[int, int]]:
                _, peek = await get("/channel/peek?topic=dp&channel=c")
                _, stats = await get("/stats?format=json&topic=dp&channel=c")
                (ch,) = stats["topics"][0]["channels"]
                return [
                    (peek["depth"], peek["deferred_count"]),
                    (ch["depth"], ch["deferred_count"]),
                ]

            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("dp", "c")
            pub = await Raw.connect(nsqd)
            await pub.publish("dp", b"m0", b"m1")
            pub.send(c.dpub("dp", 3_600_000, b"later"))
            assert await pub.response() == b"OK"
            await pub.publish("dp", b"m3", b"m4")
            assert await both() == [(4, 1), (4, 1)]
            # the cursor passes the DPUB: it is in the deferred heap now
            consumer.send(c.rdy(3))
            got = await consumer.messages(3)
            consumer.send(c.rdy(0) + c.fin(got[1].id) + c.fin(got[2].id) + c.req(got[0].id, 60_000))
            ch = nsqd.topics["dp"].default_partition.channels["c"]
            await wait_for(lambda: ch.in_flight_count == 0)
            assert await both() == [(1, 2), (1, 2)]
            await consumer.close()
            await pub.close()

    run(go())


def test_topic_peek_reads_the_log_from_a_position() -> None:
    async def go() -> None:
        async with served() as (nsqd, get):
            pub = await Raw.connect(nsqd)
            await pub.publish("tp", *[b"t%d" % i for i in range(6)])
            status, doc = await get("/topic/peek?topic=tp&n=3")
            assert status == 200 and (doc["start"], doc["end"]) == (0, 6)
            assert [m["body"] for m in doc["messages"]] == ["t0", "t1", "t2"]
            assert all(m["attempts"] == 1 for m in doc["messages"])
            status, doc = await get("/topic/peek?topic=tp&sequence=4")
            assert [m["body"] for m in doc["messages"]] == ["t4", "t5"]
            offset = doc["messages"][1]["offset"]
            status, doc = await get(f"/topic/peek?topic=tp&offset={offset}")
            assert [m["body"] for m in doc["messages"]] == ["t5"]
            status, doc = await get("/topic/peek?topic=tp&timestamp=0&n=1")
            assert [m["body"] for m in doc["messages"]] == ["t0"]
            status, doc = await get("/topic/peek?topic=tp&timestamp=99999999999")
            assert status == 200 and doc["messages"] == []
            await refused(
                get,
                [
                    ("/topic/peek?topic=tp&sequence=-1", (400, "INVALID_SEQUENCE")),
                    ("/topic/peek?topic=tp&sequence=x", (400, "INVALID_SEQUENCE")),
                    ("/topic/peek?topic=tp&offset=-5", (400, "INVALID_OFFSET")),
                    ("/topic/peek?topic=tp&n=0", (400, "INVALID_N")),
                    ("/topic/peek?topic=nosuch", (404, "TOPIC_NOT_FOUND")),
                    ("/topic/peek", (400, "MISSING_ARG_TOPIC")),
                ],
            )
            await pub.close()

    run(go())
