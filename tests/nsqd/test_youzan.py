"""Youzan's extensions in nsqd: partitions, ordered consumption, replay, tracing, ext
headers and filters, against a real nsqd (TCP and HTTP) on free loopback ports."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from nsqx.nsqd.guid import PARTITION_SHIFT
from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c
from nsqx.wire.ext import JSON_HEADER_EXT_VER

from rawnsq import Raw, run, start_nsqd, wait_for


@asynccontextmanager
async def served(**opts: Any) -> AsyncIterator[tuple[NSQD, aiohttp.ClientSession, str]]:
    nsqd = await start_nsqd(http_address="127.0.0.1:0", **opts)
    assert nsqd.http_address is not None
    try:
        async with aiohttp.ClientSession() as session:
            yield nsqd, session, f"http://127.0.0.1:{nsqd.http_address[1]}"
    finally:
        await nsqd.close()


async def post(s: aiohttp.ClientSession, url: str, data: bytes = b"") -> tuple[int, bytes]:
    async with s.post(url, data=data) as resp:
        return resp.status, await resp.read()


async def get(s: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with s.get(url) as resp:
        return resp.status, json.loads(await resp.read() or b"null")


async def create(
    s: aiohttp.ClientSession, base: str, topic: str, partitions: int = 4, **params: str
) -> None:
    extra = "".join(f"&{k}={v}" for k, v in params.items())
    for p in range(partitions):
        url = f"{base}/topic/create?topic={topic}&partition={p}&partition_num={partitions}{extra}"
        assert await post(s, url) == (200, b"")


async def traced_pub(raw: Raw, topic: str, pid: int, trace: int, body: bytes) -> tuple[int, ...]:
    """PUB_TRACE; its answer: (id, trace id, offset, raw size)."""
    raw.send(c.pub_trace(topic, pid, trace, body))
    resp = await raw.response()
    assert len(resp) == 30 and resp[:2] == b"OK"
    return struct.unpack(">QQQI", resp[2:])


def test_partitions_have_their_own_logs_ids_and_cursors() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "t", 3)
            pub = await Raw.connect(nsqd)
            for p in range(3):
                for i in range(p + 1):
                    pub.send(c.pub("t", b"p%d-%d" % (p, i), p))
                    assert await pub.response() == b"OK"
            topic = nsqd.topics["t"]
            assert [topic.partitions[p].message_count for p in range(3)] == [1, 2, 3]
            # a consumer of partition 2 gets its messages only; the id says the partition
            sub = await Raw.connect(nsqd)
            await sub.identify(desired_tag="")
            sub.send(c.sub("t", "ch", 2))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(10))
            got = [await sub.yz_message() for _ in range(3)]
            assert [m.body for m in got] == [b"p2-0", b"p2-1", b"p2-2"]
            assert {m.internal_id >> PARTITION_SHIFT for m in got} == {2}
            assert await sub.nothing_for(0.2)
            sub.send(b"".join(c.fin(m.id) for m in got))  # binary ids back
            ch2 = topic.partitions[2].channels["ch"]
            await wait_for(lambda: ch2.in_flight_count == 0 and ch2.depth == 0)
            # a channel is per partition: partition 1 has none yet and holds its messages
            assert "ch" not in topic.partitions[1].channels
            assert topic.partitions[1].depth == 2
            # errors: an unknown partition, a bad one, the node's default partition
            bad = await Raw.connect(nsqd)
            bad.send(c.pub("t", b"x", 7))
            assert await bad.error() == b"E_TOPIC_NOT_EXIST "  # Youzan's trailing space
            assert await bad.closed()
            bad = await Raw.connect(nsqd)
            bad.send(b"SUB t ch seven\n")
            assert (await bad.error()).startswith(b"E_BAD_PARTITION topic partition is not valid")
            assert await bad.closed()
            pub.send(c.pub("t", b"default"))  # no partition: the lowest local one
            assert await pub.response() == b"OK"
            assert topic.partitions[0].message_count == 2
            # /stats: one entry per partition, with Youzan's fields
            status, stats = await get(s, f"{base}/stats?format=json&topic=t")
            assert status == 200
            rows = {t["topic_partition"]: t for t in stats["topics"]}
            assert set(rows) == {"0", "1", "2"}
            assert rows["2"]["message_count"] == 3 and rows["2"]["partition_num"] == 3
            assert rows["1"]["depth"] == 2 and rows["2"]["channels"][0]["channel_name"] == "ch"
            # an NSQ 1.3 topic looks as before: no partition fields
            await pub.publish("plain", b"x")
            status, stats = await get(s, f"{base}/stats?format=json&topic=plain")
            assert "topic_partition" not in stats["topics"][0]
            # a partition can be deleted alone
            assert await post(s, f"{base}/topic/delete?topic=t&partition=1") == (200, b"")
            assert sorted(topic.partitions) == [0, 2]
            status, text = await post(s, f"{base}/topic/create?topic=t&partition=5")
            assert (status, json.loads(text)) == (400, {"message": "INVALID_PARTITION"})

    run(body())


def test_partitioned_topics_survive_a_restart(tmp_path: Any) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0", data_path=str(tmp_path))
        base = f"http://127.0.0.1:{nsqd.http_address[1]}"  # type: ignore[index]
        async with aiohttp.ClientSession() as s:
            await create(s, base, "t", 2, extend="true", retention="2")
            await create(s, base, "o", 2, orderedmulti="true")
        pub = await Raw.connect(nsqd)
        pub.send(c.pub("t", b"one", 1))
        assert await pub.response() == b"OK"
        nsqd.topics["t"].partitions[1].get_channel("ch")
        sub = await Raw.connect(nsqd)
        await sub.identify(desired_tag="")
        sub.send(c.sub_ordered("plain", "ordered", 0))
        assert await sub.error() == b"E_TOPIC_NOT_EXIST "  # Youzan's trailing space
        await pub.publish("plain", b"x")
        sub = await Raw.connect(nsqd)
        await sub.identify(desired_tag="")
        sub.send(c.sub_ordered("plain", "ord", 0))
        assert await sub.response() == b"OK"
        await nsqd.close()
        again = await start_nsqd(data_path=str(tmp_path))
        t = again.topics["t"]
        assert sorted(t.partitions) == [0, 1]
        assert t.meta.ext and t.meta.partition_num == 2 and t.meta.retention_days == 2
        assert again.topics["o"].meta.ordered
        assert t.partitions[1].channels["ch"].depth == 1
        assert again.topics["plain"].channels["ord"].ordered  # SUB_ORDERED sticks
        await again.close()

    run(body())


def test_ordered_consumption_one_in_flight_across_connections() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "o", 2, orderedmulti="true")
            pub = await Raw.connect(nsqd)
            for i in range(6):
                pub.send(c.pub("o", b"%d" % i, 0))
                assert await pub.response() == b"OK"
            # a plain SUB and a PUB without a partition are refused on such a topic
            plain = await Raw.connect(nsqd)
            plain.send(c.sub("o", "ch", 0))
            assert await plain.error() == (
                b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"
            )
            pub.send(c.pub("o", b"x"))
            assert await pub.error() == (
                b"E_BAD_PARTITION topic partition is not valid for multi partition: -1"
            )
            subs = []
            for _ in range(2):
                sub = await Raw.connect(nsqd)
                await sub.identify(msg_timeout=1000, desired_tag="")
                sub.send(c.sub_ordered("o", "ch", 0))
                assert await sub.response() == b"OK"
                sub.send(c.rdy(10))
                subs.append(sub)

            async def next_message(avoid: Raw | None = None) -> tuple[Raw, Any]:
                """The one message in flight, from whichever connection got it."""
                tasks = {asyncio.ensure_future(x.yz_message(detail=True)): x for x in subs}
                done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                (first,) = done
                return tasks[first], first.result()

            who, m0 = await next_message()
            assert m0.body == b"0" and m0.offset >= 0 and m0.raw_size > 0
            other = subs[1] if who is subs[0] else subs[0]
            assert await other.nothing_for(0.2) and await who.nothing_for(0.01)
            # REQ with a delay is ignored: the same message comes back after its timeout
            who.send(c.req(m0.id, 60_000))
            who, again = await next_message()
            assert (again.body, again.attempts) == (b"0", 2)
            # REQ 0 sends it again at once
            who.send(c.req(again.id, 0))
            who, third = await next_message()
            assert (third.body, third.attempts) == (b"0", 3)
            # FIN: the next one, in order, with a growing offset
            seen = [third]
            who.send(c.fin(third.id))
            while len(seen) < 6:
                who, m = await next_message()
                assert m.offset > seen[-1].offset
                assert m.internal_id > seen[-1].internal_id
                seen.append(m)
                who.send(c.fin(m.id))
            assert [m.body for m in seen] == [b"%d" % i for i in range(6)]
            ch = nsqd.topics["o"].partitions[0].channels["ch"]
            await wait_for(lambda: ch.in_flight_count == 0 and ch.depth == 0)
            # an ordered SUB with a sample rate is refused
            sampled = await Raw.connect(nsqd)
            await sampled.identify(sample_rate=50)
            sampled.send(c.sub_ordered("o", "ch2", 1))
            assert (await sampled.error()).startswith(b"E_INVALID order consume")

    run(body())


def test_replay_by_time_offset_count_and_setoffset() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "r", 1)
            pub = await Raw.connect(nsqd)
            answers = []
            for i in range(6):
                answers.append(await traced_pub(pub, "r", 0, 0, b"m%d" % i))
                if i == 2:
                    await asyncio.sleep(1.1)  # a second later: a timestamp split
            split = int(time.time())  # seconds, as Youzan's positions

            async def first_body(start: str) -> bytes:
                sub = await Raw.connect(nsqd)
                await sub.identify(desired_tag="")
                sub.send(f"SUB_ADVANCED r replay{start.replace(':', '')} 0 {start}\n".encode())
                assert await sub.response() == b"OK", start
                sub.send(c.rdy(1))
                m = await sub.yz_message(detail=True)
                await sub.close()
                return m.body

            assert await first_body(f"timestamp:{split}") == b"m3"
            assert await first_body(f"virtual_queue:{answers[4][2]}") == b"m4"
            assert await first_body("msgcount:2") == b"m1"  # counted from 1, as Youzan
            assert await first_body("msgcount:0") == b"m0"
            # SUB_ADVANCED reads back what PUB_TRACE answered: id, offset, raw size
            sub = await Raw.connect(nsqd)
            await sub.identify(desired_tag="")
            sub.send(c.sub_advanced("r", "all", 0, c.ConsumeStart("msgcount", 0)))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(10))
            got = [await sub.yz_message(detail=True) for _ in range(6)]
            assert [(m.internal_id, 0, m.offset, m.raw_size) for m in got] == answers
            # special:-1 starts at the end
            tail = await Raw.connect(nsqd)
            await tail.identify(desired_tag="")
            tail.send(c.sub_advanced("r", "tail", 0, c.ConsumeStart("special", -1)))
            assert await tail.response() == b"OK"
            tail.send(c.rdy(1))
            assert await tail.nothing_for(0.2)
            # /channel/setoffset moves a channel back (replay) or forward (skip)
            ch = nsqd.topics["r"].partitions[0].channels["all"]
            sub.send(b"".join(c.fin(m.id) for m in got))
            await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0)
            url = f"{base}/channel/setoffset?topic=r&channel=all&partition=0"
            assert await post(s, url, b"msgcount:5") == (200, b"")
            m = await sub.yz_message(detail=True)
            assert m.body == b"m4"
            assert await post(s, url, f"virtual_queue:{answers[1][2]}".encode()) == (200, b"")
            assert await post(s, url, b"special:-1") == (200, b"")
            assert (await post(s, url, b"nonsense"))[0] == 400
            status, text = await post(s, url.replace("all", "nope"), b"msgcount:1")
            assert (status, json.loads(text)) == (404, {"message": "CHANNEL_NOT_FOUND"})
            # /message/get: one message by count, id or offset
            for mode, pos in (
                ("count", 3),  # counted from 1, as Youzan
                ("id", answers[2][0]),
                ("virtual_offset", answers[2][2]),
            ):
                status, msg = await get(
                    s, f"{base}/message/get?topic=r&partition=0&search_mode={mode}&search_pos={pos}"
                )
                assert status == 200 and msg["body"] == "m2" and msg["offset"] == answers[2][2]
                assert msg["id"] == answers[2][0] and msg["queue_cnt_index"] == 3
            status, _ = await get(s, f"{base}/message/get?topic=r&search_mode=count&search_pos=99")
            assert status == 404
            # a bad position on SUB_ADVANCED is a fatal E_INVALID
            bad = await Raw.connect(nsqd)
            bad.send(b"SUB_ADVANCED r x 0 weird:1\n")
            assert await bad.error() == b"E_INVALID invalid consume offset:weird:1"
            assert await bad.closed()

    run(body())


def test_trace_replies_and_history() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "tr", 2)
            pub = await Raw.connect(nsqd)
            one = await traced_pub(pub, "tr", 1, 777, b"hello")
            assert one[0] >> PARTITION_SHIFT == 1 and one[1] == 777
            pub.send(c.mpub_trace("tr", 1, [5, 6], [b"a", b"bb"]))
            resp = await pub.response()
            first_id, trace, offset, raw = struct.unpack(">QQQI", resp[2:])
            assert first_id == one[0] + 1 and trace == 0 and offset > one[2]
            sub = await Raw.connect(nsqd)
            await sub.identify(desired_tag="")
            sub.send(c.sub_advanced("tr", "ch", 1))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(3))
            msgs = [await sub.yz_message(detail=True) for _ in range(3)]
            assert [(m.internal_id, m.trace_id) for m in msgs] == [
                (one[0], 777),
                (first_id, 5),
                (first_id + 1, 6),
            ]
            assert (msgs[0].offset, msgs[0].raw_size) == (one[2], one[3])
            assert msgs[1].offset == offset and msgs[1].raw_size + msgs[2].raw_size == raw
            # a vanilla consumer of the same partition sees plain hex ids, no trace ids
            vanilla = await Raw.connect(nsqd)
            vanilla.send(c.sub("tr", "plain"))  # the default partition, 0: empty
            assert await vanilla.response() == b"OK"
            sub.send(c.fin(msgs[0].id))
            sub.send(c.req(msgs[1].id, 0))
            await wait_for(lambda: len(nsqd.tracer.find("tr", trace_id=5)) >= 3)
            status, found = await get(s, f"{base}/message/trace?topic=tr&trace_id=777")
            assert status == 200
            assert [e["event"] for e in found["events"]] == ["PUB", "START", "FIN"]
            assert found["events"][0]["msg_id"] == one[0]
            status, found = await get(s, f"{base}/message/trace?topic=tr&msg_id={first_id}")
            assert status == 200
            assert [e["event"] for e in found["events"]] == ["PUB", "START", "REQ", "START"]
            # /message/trace/enable traces untraced messages too
            assert await post(s, f"{base}/message/trace/enable?topic=tr") == (200, b"")
            pub.send(c.pub("tr", b"plain", 1))
            assert await pub.response() == b"OK"
            await wait_for(lambda: len(nsqd.tracer.find("tr", trace_id=0)) >= 1)
            assert await post(s, f"{base}/message/trace/disable?topic=tr") == (200, b"")

    run(body())


def test_vanilla_consumer_gets_vanilla_frames_of_traced_messages() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        pub = await Raw.connect(nsqd)
        nsqd.get_topic("v")  # made the NSQ 1.3 way: one partition
        await traced_pub(pub, "v", 0, 99, b"traced")
        await pub.publish("v", b"plain")
        sub = await Raw.connect(nsqd)
        await sub.subscribe("v", "ch", rdy=10)
        got = await sub.messages(2)
        assert [m.body for m in got] == [b"traced", b"plain"]
        assert got[0].id == b"%016x" % 1 and got[1].id == b"%016x" % 2  # (never 0)
        sub.send(c.fin_many([m.id for m in got]))
        ch = nsqd.topics["v"].channels["ch"]
        await wait_for(lambda: ch.in_flight_count == 0 and ch.depth == 0)
        await nsqd.close()

    run(body())


def test_ext_headers_tags_and_filters() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "e", 1, extend="true")
            for ch in ("all", "exact", "re", "glob", "multi", "tags", "ext"):
                assert await post(s, f"{base}/channel/create?topic=e&channel={ch}") == (200, b"")
            pub = await Raw.connect(nsqd)
            headers = [
                b'{"##client_dispatch_tag":"red","k":"a1"}',
                b'{"k":"b2"}',
                b'{"k":"a3","##trace_id":"12"}',
                b"{}",
            ]
            for i, h in enumerate(headers):
                pub.send(c.pub_ext("e", 0, h, b"m%d" % i))
                resp = await pub.response()
                assert (len(resp) == 30) == (b"trace_id" in h)
            # errors that leave the connection open
            pub.send(c.pub_ext("e", 0, b"{bad", b"x"))
            assert (await pub.error()).startswith(b"E_INVALID_JSON_HEADER")
            pub.send(c.pub_ext("e", 0, b'{"##trace_id":1}', b"x"))
            assert await pub.error() == b"INVALID_TRACE_ID passin trace id should be string"
            await pub.publish("noext", b"x")
            pub.send(c.pub_ext("noext", 0, b'{"k":"v"}', b"x"))
            assert (
                await pub.error() == b"E_EXT_NOT_SUPPORT ext content not supported in topic noext"
            )
            pub.send(c.pub_ext("noext", 0, b"", b"empty header is fine"))
            assert await pub.response() == b"OK"
            # extend_support is needed on an ext topic and refused elsewhere
            raw = await Raw.connect(nsqd)
            raw.send(c.sub("e", "x"))
            assert await raw.error() == (
                b"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support."
            )
            raw = await Raw.connect(nsqd)
            await raw.identify(extend_support=True)
            raw.send(c.sub("noext", "x"))
            assert (await raw.error()).startswith(b"E_SUB_EXTEND_FORBIDDON")

            async def bodies(channel: str, n: int, **identify: Any) -> list[bytes]:
                sub = await Raw.connect(nsqd)
                await sub.identify(extend_support=True, **identify)
                sub.send(c.sub("e", channel, 0))
                assert await sub.response() == b"OK"
                sub.send(c.rdy(10))
                got = [await sub.yz_message(with_ext=True) for _ in range(n)]
                assert await sub.nothing_for(0.1)
                sub.send(b"".join(c.fin(m.id) for m in got))
                return [m.body for m in got]

            assert await bodies("all", 4) == [b"m0", b"m1", b"m2", b"m3"]
            exact = {"type": 1, "filter_ext_key": "k", "filter_data": "b2"}
            assert await bodies("exact", 1, ext_filter=exact) == [b"m1"]
            regexp = {"type": 2, "filter_ext_key": "k", "filter_data": "^a"}
            assert await bodies("re", 2, ext_filter=regexp) == [b"m0", b"m2"]
            glob = {"type": 3, "filter_ext_key": "k", "filter_data": "?3", "inverse": True}
            assert await bodies("glob", 3, ext_filter=glob) == [b"m0", b"m1", b"m3"]
            multi = {
                "type": 4,
                "filter_ext_key": "any",
                "filter_data_list": [
                    {"filter_ext_key": "k", "filter_data": "b2"},
                    {"filter_ext_key": "##client_dispatch_tag", "filter_data": "red"},
                ],
            }
            assert await bodies("multi", 2, ext_filter=multi) == [b"m0", b"m1"]
            filtered = nsqd.topics["e"].partitions[0].channels["exact"]
            await wait_for(lambda: filtered.depth == 0 and filtered.in_flight_count == 0)
            assert filtered.filtered_count == 3
            # the frame carries the ext header to an extend_support client
            sub = await Raw.connect(nsqd)
            await sub.identify(extend_support=True)
            sub.send(c.sub_advanced("e", "ext", 0, c.ConsumeStart("msgcount", 0)))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(1))
            m = await sub.yz_message(with_ext=True, detail=True)
            assert (m.ext_ver, m.ext, m.body) == (JSON_HEADER_EXT_VER, headers[0], b"m0")
            # desired_tag: tagged messages go to the clients with that tag
            red = await Raw.connect(nsqd)
            await red.identify(extend_support=True, desired_tag="red")
            red.send(c.sub("e", "tags", 0))
            assert await red.response() == b"OK"
            other = await Raw.connect(nsqd)
            await other.identify(extend_support=True)
            other.send(c.sub("e", "tags", 0))
            assert await other.response() == b"OK"
            red.send(c.rdy(10))
            other.send(c.rdy(10))
            assert (await red.yz_message(with_ext=True)).body == b"m0"
            got = [(await other.yz_message(with_ext=True)).body for _ in range(3)]
            assert got == [b"m1", b"m2", b"m3"]
            assert await red.nothing_for(0.1)

    run(body())


def test_a_filtered_message_does_not_stall_a_client_with_rdy_1() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "f", 1, extend="true")
            assert await post(s, f"{base}/channel/create?topic=f&channel=ch") == (200, b"")
            pub = await Raw.connect(nsqd)
            for i, k in enumerate([b"b", b"b", b"c", b"b", b"c"]):
                pub.send(c.pub_ext("f", 0, b'{"k":"%s"}' % k, b"m%d" % i))
                assert await pub.response() == b"OK"
            sub = await Raw.connect(nsqd)
            await sub.identify(
                extend_support=True,
                ext_filter={"type": 1, "filter_ext_key": "k", "filter_data": "c"},
            )
            sub.send(c.sub("f", "ch", 0))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(1))
            first = await sub.yz_message(with_ext=True)
            assert first.body == b"m2"
            sub.send(c.fin(first.id))
            assert (await sub.yz_message(with_ext=True)).body == b"m4"

    run(body())


def test_channels_of_disable_channel_auto_create_topics_come_from_the_api() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            await create(s, base, "d", 1, disable_channel_auto_create="true")
            sub = await Raw.connect(nsqd)
            sub.send(c.sub("d", "new", 0))
            assert await sub.error() == (
                b"E_SUB_CHANNEL_NOT_REGISTERED channel is not registered under topic."
            )
            assert await post(s, f"{base}/channel/create?topic=d&channel=new") == (200, b"")
            sub = await Raw.connect(nsqd)
            sub.send(c.sub("d", "new", 0))
            assert await sub.response() == b"OK"
            # /channel/setorder
            url = f"{base}/channel/setorder?topic=d&channel=new"
            assert await post(s, url + "&order=true") == (200, b"")
            assert nsqd.topics["d"].channels["new"].ordered
            assert await post(s, url + "&order=false") == (200, b"")
            assert (await post(s, url + "&order=maybe"))[0] == 400

    run(body())
