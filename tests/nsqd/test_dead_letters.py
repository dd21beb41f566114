"""Channel policies through a real nsqd (nsqx.nsqd.channel_policy, dead_letters):
dead letters after max_attempts (JSON and ext formats), their replay, message TTLs,
delivery rate limits, /channel/config's bad input, and the policy across a restart.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from nsqx.nsqd.channel_policy import NO_POLICY, ChannelPolicy, PolicyError
from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

Call = Callable[..., Awaitable[tuple[int, Any]]]


@asynccontextmanager
async def served(data_path: str | None = None) -> AsyncIterator[tuple[NSQD, Call]]:
    """An nsqd with its HTTP API, and a call of it: (method, path) -> (status, JSON)."""
    opts: dict[str, Any] = {"http_address": "127.0.0.1:0"}
    if data_path is not None:
        opts["data_path"] = data_path
    nsqd = await start_nsqd(**opts)
    assert nsqd.http_address is not None
    base = f"http://127.0.0.1:{nsqd.http_address[1]}"
    try:
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
                async with http.request(method, base + path, data=body) as r:
                    body = await r.read()
                    return r.status, json.loads(body) if body else None

            yield nsqd, call
    finally:
        await nsqd.close()


async def fail_twice(consumer: Raw) -> bytes:
    """Take the next message twice, REQ it both times; its id."""
    consumer.send(c.rdy(1))
    first = await consumer.message()
    assert first.attempts == 1
    consumer.send(c.req(first.id, 0))
    again = await consumer.message()
    assert (again.id, again.attempts) == (first.id, 2)
    consumer.send(c.rdy(0) + c.req(again.id, 0))
    return bytes(first.id)


def test_a_message_delivered_max_attempts_times_goes_to_the_dead_letter_topic() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("orders", "billing")
            status, doc = await call(
                "POST", "/channel/config?topic=orders&channel=billing&max_attempts=2"
            )
            assert status == 200, doc
            assert doc["max_attempts"] == 2 and doc["dead_letters_to"] == "orders.dead"
            pub = await Raw.connect(nsqd)
            before = time.time_ns()
            await pub.publish("orders", b"poison", b"fine")
            mid = await fail_twice(consumer)
            ch = nsqd.topics["orders"].default_partition.channels["billing"]
            # the next one goes out; the poison one does not come a third time
            consumer.send(c.rdy(5))
            nxt = await consumer.message()
            assert nxt.body == b"fine" and nxt.attempts == 1
            consumer.send(c.fin(nxt.id))
            await wait_for(lambda: ch.dead_letter_count == 1, what="the dead letter")
            await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0)
            assert await consumer.nothing_for(0.2)

            # an NSQ 1.3 consumer of the dead-letter topic reads a JSON envelope
            reader = await Raw.connect(nsqd)
            await reader.subscribe("orders.dead", "ops", rdy=1)
            letter = await reader.message()
            env = json.loads(letter.body)
            assert (env["topic"], env["channel"], env["partition"]) == ("orders", "billing", 0)
            assert (env["id"], env["attempts"], env["body"]) == (mid.decode(), 2, "poison")
            assert before <= env["timestamp"] <= env["first_delivery"]
            assert env["first_delivery"] <= env["last_delivery"] <= env["dead_at"]

            status, stats = await call("GET", "/stats?format=json&topic=orders")
            (chs,) = stats["topics"][0]["channels"]
            assert chs["dead_letter_count"] == 1 and chs["expired_count"] == 0

            # replay gives it back to this channel alone, as a first attempt, once
            other = await Raw.connect(nsqd)
            await other.subscribe("orders", "audit")  # (made after: its own cursor)
            status, doc = await call(
                "POST", "/channel/deadletter/replay?topic=orders&channel=billing"
            )
            assert (status, doc) == (200, {"replayed": 1, "missing": 0, "scanned": 1})
            back = await consumer.message()
            assert (back.id, back.body, back.attempts) == (mid, b"poison", 1)
            consumer.send(c.fin(back.id))
            status, doc = await call(
                "POST", "/channel/deadletter/replay?topic=orders&channel=billing"
            )
            assert doc["replayed"] == 0
            other.send(c.rdy(1))
            assert await other.nothing_for(0.2)
            for conn in (consumer, pub, reader, other):
                await conn.close()

    run(go())


def test_dead_letters_in_the_ext_format_keep_the_body_and_carry_the_facts_in_headers() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("jobs", "w")
            # an ext dead-letter topic must exist first
            q = "topic=jobs&channel=w&max_attempts=2&dead_letter_topic=jobs_dl"
            status, doc = await call("POST", f"/channel/config?{q}&dead_letter_format=ext")
            assert (status, doc["message"]) == (
                400,
                "DEAD_LETTER_TOPIC_NOT_EXT: create it first with "
                "POST /topic/create?topic=jobs_dl&extend=true",
            )
            status, _ = await call("POST", "/topic/create?topic=jobs_dl&extend=true")
            assert status == 200
            status, _ = await call("POST", f"/channel/config?{q}&dead_letter_format=ext")
            assert status == 200
            pub = await Raw.connect(nsqd)
            await pub.publish("jobs", b"\xff\x00 binary")
            mid = await fail_twice(consumer)
            ch = nsqd.topics["jobs"].default_partition.channels["w"]
            await wait_for(lambda: ch.dead_letter_count == 1, what="the dead letter")
            status, doc = await call("GET", "/topic/peek?topic=jobs_dl")
            (m,) = doc["messages"]
            assert base64.b64decode(m["body_base64"]) == b"\xff\x00 binary"
            header = json.loads(m["ext"])
            assert header["dead_letter_id"] == mid.decode()
            assert header["dead_letter_channel"] == "w"
            assert header["dead_letter_attempts"] == "2"
            # and replay reads that format too
            status, doc = await call("POST", "/channel/deadletter/replay?topic=jobs&channel=w")
            assert doc["replayed"] == 1
            consumer.send(c.rdy(1))
            assert (await consumer.message()).id == mid
            await consumer.close()
            await pub.close()

    run(go())


def test_a_last_attempt_requeued_with_a_delay_and_one_whose_client_left_die_at_once() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            first = await Raw.connect(nsqd)
            await first.subscribe("t", "c")
            await call("POST", "/channel/config?topic=t&channel=c&max_attempts=1")
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a", b"b")
            first.send(c.rdy(2))
            a, _b = await first.messages(2)
            ch = nsqd.topics["t"].default_partition.channels["c"]
            first.send(c.req(a.id, 3_600_000))  # an hour: not waited for
            await wait_for(lambda: ch.dead_letter_count == 1)
            await first.close()  # b was in flight: it dies too
            await wait_for(lambda: ch.dead_letter_count == 2)
            assert nsqd.topics["t.dead"].default_partition.log.end == 2
            await pub.close()

    run(go())


def test_a_refused_dead_letter_waits_and_is_tried_again_never_lost() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            # the dead-letter topic refuses publishes while its channel holds one
            dlq = await Raw.connect(nsqd)
            await dlq.subscribe("src.dead", "x")
            q = "topic=src.dead&channel=x&max_depth=1"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("src", "c")
            await call("POST", "/channel/config?topic=src&channel=c&max_attempts=1")
            pub = await Raw.connect(nsqd)
            await pub.publish("src", b"a", b"b")
            consumer.send(c.rdy(2))
            first, second = await consumer.messages(2)
            consumer.send(c.rdy(0) + c.req(first.id, 0))
            ch = nsqd.topics["src"].default_partition.channels["c"]
            await wait_for(lambda: ch.dead_letter_count == 1)
            consumer.send(c.req(second.id, 0))
            # the second is refused (the topic is full): pending, not delivered, not lost
            await wait_for(lambda: ch.deferred_count == 1 or bool(ch._dying))
            assert ch.low_water() == 1
            dlq.send(c.rdy(1))
            m = await dlq.message()
            dlq.send(c.fin(m.id))
            await wait_for(lambda: ch.dead_letter_count == 2, what="the retried dead letter")
            assert json.loads((await dlq.message()).body)["body"] == "b"
            consumer.send(c.rdy(5))
            assert await consumer.nothing_for(0.1)
            for conn in (dlq, consumer, pub):
                await conn.close()

    run(go())


def test_expired_messages_are_skipped_and_counted_never_delivered() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            pub = await Raw.connect(nsqd)
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("ttl", "c")
            await pub.publish("ttl", b"old1", b"old2", b"old3")
            ch = nsqd.topics["ttl"].default_partition.channels["c"]
            status, _ = await call("POST", "/channel/config?topic=ttl&channel=c&message_ttl_ms=1")
            assert status == 200
            # no consumer is ready: the timer scan skips them (depth shows live ones)
            await wait_for(lambda: ch.expired_count == 3, what="expiry")
            assert ch.depth == 0
            status, _ = await call(
                "POST", "/channel/config?topic=ttl&channel=c&message_ttl_ms=600000"
            )
            await pub.publish("ttl", b"fresh")
            consumer.send(c.rdy(10))
            m = await consumer.message()
            assert m.body == b"fresh"
            assert await consumer.nothing_for(0.1)
            status, stats = await call("GET", "/stats?format=json&topic=ttl")
            assert stats["topics"][0]["channels"][0]["expired_count"] == 3
            await pub.close()
            await consumer.close()

    run(go())


def test_a_rate_limited_channel_delivers_no_faster_than_its_limit() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            pub = await Raw.connect(nsqd)
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("rl", "c")
            q = "topic=rl&channel=c&max_msgs_per_sec=20"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            await pub.publish("rl", *[b"x%d" % i for i in range(10)])
            ch = nsqd.topics["rl"].default_partition.channels["c"]
            start = time.monotonic()
            consumer.send(c.rdy(100))
            got = await consumer.messages(4)
            elapsed = time.monotonic() - start
            # at most a tenth of a second's worth at a time, then 20 a second: a slow
            # machine only delivers fewer
            assert ch.message_count <= 2 + elapsed * 20 + 2
            for m in got:
                consumer.send(c.fin(m.id))
            # a byte limit paces too; lifting the limits lets the rest go at once
            q = "topic=rl&channel=c&max_msgs_per_sec=&max_bytes_per_sec=100"
            _status, doc = await call("POST", f"/channel/config?{q}")
            assert (doc["max_msgs_per_sec"], doc["max_bytes_per_sec"]) == (0, 100)
            paced = await consumer.messages(1)
            await call("POST", "/channel/config?topic=rl&channel=c&max_bytes_per_sec=")
            rest = await consumer.messages(10 - 5)
            assert sorted(m.body for m in [*got, *paced, *rest]) == sorted(
                b"x%d" % i for i in range(10)
            )
            await pub.close()
            await consumer.close()

    run(go())


def test_a_full_channel_refuses_publishes_until_it_has_room() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("full", "c")
            status, _ = await call("POST", "/channel/config?topic=full&channel=c&max_depth=3")
            assert status == 200
            pub = await Raw.connect(nsqd)
            await pub.publish("full", b"1", b"2", b"3")
            pub.send(c.pub("full", b"4"))
            err = await pub.error()
            assert err.startswith(b"E_TOPIC_FULL topic full is full: channel c has 3 messages")
            status, doc = await call("POST", "/pub?topic=full", b"4")
            assert (status, doc["message"]) == (503, "TOPIC_FULL")
            # the connection stays open; one consumed makes room for one
            consumer.send(c.rdy(1))
            m = await consumer.message()
            consumer.send(c.rdy(0) + c.fin(m.id))
            ch = nsqd.topics["full"].default_partition.channels["c"]
            await wait_for(lambda: ch.depth == 2 and ch.in_flight_count == 0)
            await pub.publish("full", b"4")
            pub.send(c.pub("full", b"5"))
            assert (await pub.error()).startswith(b"E_TOPIC_FULL")
            # a limit in bytes likewise; lifting the limits takes publishes again
            q = "topic=full&channel=c&max_depth=&max_depth_bytes=1"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            pub.send(c.pub("full", b"5"))
            assert b"bytes waiting" in await pub.error()
            await call("POST", "/channel/config?topic=full&channel=c&max_depth_bytes=")
            await pub.publish("full", b"5")
            await pub.close()
            await consumer.close()

    run(go())


def test_a_full_channel_with_drop_oldest_drops_its_oldest_messages_counted() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("drop", "c")
            q = "topic=drop&channel=c&max_depth=2&overflow=drop_oldest"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            pub = await Raw.connect(nsqd)
            await pub.publish("drop", *[b"m%d" % i for i in range(5)])
            ch = nsqd.topics["drop"].default_partition.channels["c"]
            await wait_for(lambda: ch.dropped_count == 3, what="the drop")
            consumer.send(c.rdy(10))
            assert [m.body for m in await consumer.messages(2)] == [b"m3", b"m4"]
            _, stats = await call("GET", "/stats?format=json&topic=drop")
            assert stats["topics"][0]["channels"][0]["dropped_count"] == 3
            await pub.close()
            await consumer.close()

    run(go())


def test_a_maximum_depth_counts_waiting_messages_as_stats_does_deferred_ones_kept() -> None:
    """A DPUB not yet due is deferred, not waiting (as /stats and /channel/peek count):
    it neither fills a channel nor is dropped as one of its oldest waiting messages."""

    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("dd", "c")
            assert (await call("POST", "/channel/config?topic=dd&channel=c&max_depth=2"))[0] == 200
            pub = await Raw.connect(nsqd)
            pub.send(c.dpub("dd", 3_600_000, b"later"))
            assert await pub.response() == b"OK"
            await pub.publish("dd", b"m1")
            await pub.publish("dd", b"m2")  # (depth 2: full now, the DPUB aside)
            pub.send(c.pub("dd", b"m3"))
            assert (await pub.error()).startswith(b"E_TOPIC_FULL")
            q = "topic=dd&channel=c&overflow=drop_oldest&max_depth=1"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            ch = nsqd.topics["dd"].default_partition.channels["c"]
            await wait_for(lambda: ch.dropped_count == 1, what="the drop")
            _, stats = await call("GET", "/stats?format=json&topic=dd&channel=c")
            (chs,) = stats["topics"][0]["channels"]
            assert (chs["depth"], chs["deferred_count"], chs["dropped_count"]) == (1, 1, 1)
            consumer.send(c.rdy(10))
            assert [m.body for m in await consumer.messages(1)] == [b"m2"]
            assert await consumer.nothing_for(0.1)  # (the DPUB: in an hour)
            await pub.close()
            await consumer.close()

    run(go())


def test_channel_config_refuses_bad_settings_clearly_and_nothing_else_is_harmed() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("bad", "c")
            base = "/channel/config?topic=bad&channel=c"
            cases = [
                (f"{base}&max_attempts=abc", 400, "INVALID_MAX_ATTEMPTS"),
                (f"{base}&max_attempts=-1", 400, "INVALID_MAX_ATTEMPTS"),
                (f"{base}&max_attempts=70000", 400, "INVALID_MAX_ATTEMPTS"),
                (f"{base}&max_attempts=%C2%B2", 400, "INVALID_MAX_ATTEMPTS"),
                (f"{base}&bogus=1", 400, "UNKNOWN_ARG_BOGUS"),
                (
                    f"{base}&max_attempts=3&dead_letter_topic=no%20way",
                    400,
                    "INVALID_DEAD_LETTER_TOPIC",
                ),
                (
                    f"{base}&max_attempts=3&dead_letter_topic=bad",
                    400,
                    "INVALID_DEAD_LETTER_TOPIC: the channel's own topic",
                ),
                (f"{base}&dead_letter_format=xml", 400, "INVALID_DEAD_LETTER_FORMAT"),
                (f"{base}&message_ttl_ms=1.5", 400, "INVALID_MESSAGE_TTL_MS"),
                (f"{base}&max_depth=10&overflow=oldest", 400, "INVALID_OVERFLOW"),
                ("/channel/config?topic=bad&channel=nope&max_attempts=3", 404, "CHANNEL_NOT_FOUND"),
                ("/channel/config?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
                (f"{base}&partition=5&max_attempts=3", 404, "PARTITION_NOT_FOUND"),
                (
                    "/channel/deadletter/replay?topic=bad&channel=c&partition=5",
                    404,
                    "PARTITION_NOT_FOUND",
                ),
                ("/channel/deadletter/replay?topic=bad&channel=c&n=0", 400, "INVALID_N"),
            ]
            for path, status, message in cases:
                got, doc = await call("POST", path)
                text = doc["message"]
                if message.startswith("UNKNOWN_ARG_"):  # (then what it takes)
                    text = text.split(": ")[0]
                assert (got, text) == (status, message), path
            long_topic = "t" * 60
            await consumer.close()
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe(long_topic, "c")
            got, doc = await call(
                "POST", f"/channel/config?topic={long_topic}&channel=c&max_attempts=2"
            )
            assert (got, doc["message"]) == (
                400,
                "INVALID_DEAD_LETTER_TOPIC: name one with dead_letter_topic",
            )
            # nothing changed, and the channel still delivers
            got, doc = await call("GET", f"{base}")
            assert doc["max_attempts"] == 0
            other = await Raw.connect(nsqd)
            await other.subscribe("bad", "c", rdy=1)
            pub = await Raw.connect(nsqd)
            await pub.publish("bad", b"ok")
            assert (await other.message()).body == b"ok"
            for conn in (consumer, other, pub):
                await conn.close()

    run(go())


def test_the_policy_and_pending_dead_letters_survive_a_restart() -> None:
    async def go() -> None:
        data = tempfile.mkdtemp(prefix="nsqx-test-")
        async with served(data) as (nsqd, call):
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("keep", "c")
            q = "topic=keep&channel=c&max_attempts=2&message_ttl_ms=600000&max_msgs_per_sec=500"
            assert (await call("POST", f"/channel/config?{q}"))[0] == 200
            pub = await Raw.connect(nsqd)
            await pub.publish("keep", b"m")
            await fail_twice(consumer)
            ch = nsqd.topics["keep"].default_partition.channels["c"]
            await wait_for(lambda: ch.dead_letter_count == 1)
            await pub.publish("keep", b"n")
            consumer.send(c.rdy(1))
            n = await consumer.message()
            consumer.send(c.rdy(0) + c.req(n.id, 0))
            await wait_for(lambda: len(ch.flight.requeued) == 1)
            await consumer.close()
            await pub.close()
        async with served(data) as (nsqd, call):
            _status, doc = await call("GET", "/channel/config?topic=keep&channel=c")
            assert (doc["max_attempts"], doc["message_ttl_ms"], doc["max_msgs_per_sec"]) == (
                2,
                600000,
                500,
            )
            # the dead one stays dead; the requeued one comes back on its 2nd attempt
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("keep", "c", rdy=5)
            m = await consumer.message()
            assert (m.body, m.attempts) == (b"n", 2)
            assert await consumer.nothing_for(0.1)
            assert nsqd.topics["keep.dead"].default_partition.log.end == 1
            await consumer.close()

    run(go())


def test_policy_settings_parse_and_check() -> None:
    p = NO_POLICY.updated({"max_attempts": "5", "dead_letter_format": "ext"})
    assert p.max_attempts == 5 and p.active and not p.rate_limited
    assert p.changed_json() == {"max_attempts": 5, "dead_letter_format": "ext"}
    assert ChannelPolicy.from_json(p.changed_json()) == p
    assert ChannelPolicy.from_json({"max_attempts": 5, "from_the_future": 1}).max_attempts == 5
    assert p.updated({"max_attempts": "", "dead_letter_format": ""}) == NO_POLICY
    assert p.dead_letter_topic_for("a") == "a.dead"
    for bad in ({"max_attempts": "x"}, {"nope": "1"}, {"max_bytes_per_sec": "1e3"}):
        with pytest.raises(PolicyError):
            NO_POLICY.updated(bad)
    with pytest.raises(PolicyError):
        p.check_for("eph#ephemeral", "c")
    p.updated({"dead_letter_topic": "dl"}).check_for("eph#ephemeral", "c")
