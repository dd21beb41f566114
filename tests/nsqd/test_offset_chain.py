"""Offsets chain by raw size, as in Youzan's nsqd: a message's virtual offset plus its raw
size is the offset of the next message of its partition, in SUB_ADVANCED frames and in
PUB_TRACE / MPUB_TRACE answers, across single PUBs, PUBs written as one record, MPUBs, a
segment roll, a restart and a memory topic; and positions computed that way find the next
message (SUB_ADVANCED virtual_queue, /channel/setoffset, /message/get)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c
from nsqx.wire.frames import YouzanMessage

from rawnsq import Raw, run, start_nsqd

#: small segments: the messages below span several files
SEGMENT_BYTES = 1024


@asynccontextmanager
async def node(data: Path) -> AsyncIterator[tuple[NSQD, aiohttp.ClientSession, str]]:
    nsqd = await start_nsqd(
        data_path=str(data), http_address="127.0.0.1:0", max_bytes_per_file=SEGMENT_BYTES
    )
    assert nsqd.http_address is not None
    try:
        async with aiohttp.ClientSession() as s:
            yield nsqd, s, f"http://127.0.0.1:{nsqd.http_address[1]}"
    finally:
        await nsqd.close()


async def traced(raw: Raw, topic: str, line: bytes) -> tuple[int, int, int, int]:
    """Send a PUB_TRACE or MPUB_TRACE; its answer: (id, trace id, offset, raw size)."""
    raw.send(line)
    resp = await raw.response()
    assert len(resp) == 30 and resp[:2] == b"OK", resp
    got: tuple[int, int, int, int] = struct.unpack(">QQQI", resp[2:])
    return got


async def read_all(nsqd: NSQD, topic: str, channel: str, n: int) -> list[YouzanMessage]:
    """Every message of partition 0 from its first, as a Youzan tracing consumer reads
    them (SUB_ADVANCED: offsets and raw sizes in the frames)."""
    sub = await Raw.connect(nsqd)
    await sub.identify(desired_tag="")
    sub.send(c.sub_advanced(topic, channel, 0, c.ConsumeStart("msgcount", 0)))
    assert await sub.response() == b"OK"
    sub.send(c.rdy(n + 1))
    got = [await sub.yz_message(detail=True) for _ in range(n)]
    assert await sub.nothing_for(0.1)
    await sub.close()
    return got


def assert_chained(msgs: list[YouzanMessage]) -> None:
    for a, b in itertools.pairwise(msgs):
        assert a.offset + a.raw_size == b.offset, (a.body, a.offset, a.raw_size, b.body, b.offset)


async def first_from(nsqd: NSQD, topic: str, channel: str, offset: int) -> bytes:
    sub = await Raw.connect(nsqd)
    await sub.identify(desired_tag="")
    sub.send(c.sub_advanced(topic, channel, 0, c.ConsumeStart("virtual_queue", offset)))
    assert await sub.response() == b"OK"
    sub.send(c.rdy(1))
    m = await sub.yz_message(detail=True)
    await sub.close()
    assert m.offset == offset, (m.body, m.offset, offset)
    return m.body


def test_offsets_chain_by_raw_size_through_records_segments_and_a_restart(tmp_path: Path) -> None:
    async def body() -> None:
        answers: dict[bytes, tuple[int, int, int, int]] = {}
        async with node(tmp_path) as (nsqd, s, base):
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"single-1")
            await pub.publish("t", b"single-2")
            # three PUBs in one read: staged in one loop turn, one stored batch
            await pub.publish("t", b"turn-1", b"turn-2", b"turn-3")
            pub.send(c.mpub("t", [b"mpub-1", b"mpub-2", b"mpub-3"]))
            assert await pub.response() == b"OK"
            answers[b"trace-1"] = await traced(pub, "t", c.pub_trace("t", 0, 11, b"trace-1"))
            answers[b"trace-2"] = await traced(pub, "t", c.pub_trace("t", 0, 12, b"trace-2"))
            # a traced publish between two plain ones of the same loop turn
            pub.send(c.pub("t", b"around-1") + c.pub_trace("t", 0, 13, b"trace-3"))
            pub.send(c.pub("t", b"around-2"))
            assert await pub.response() == b"OK"
            answers[b"trace-3"] = struct.unpack(">QQQI", (await pub.response())[2:])
            assert await pub.response() == b"OK"
            bodies = [b"tm-1", b"tm-2", b"tm-3"]
            answers[b"tm-1"] = await traced(pub, "t", c.mpub_trace("t", 0, [21, 22, 23], bodies))
            # enough bytes to roll segments, with traced ones among them
            for i in range(8):
                await pub.publish("t", b"big-%d " % i + b"x" * 200)
                answers[b"tbig-%d" % i] = await traced(
                    pub, "t", c.pub_trace("t", 0, 100 + i, b"tbig-%d" % i)
                )
            await pub.close()
            segments = list((tmp_path / "t.topic" / "p0").glob("*.seg"))
            assert len(segments) >= 3, segments
            before = await read_all(nsqd, "t", "all", 32)
        assert [m.body for m in before[:5]] == [
            b"single-1",
            b"single-2",
            b"turn-1",
            b"turn-2",
            b"turn-3",
        ]
        assert_chained(before)
        by_body = {m.body: m for m in before}
        for key, (msg_id, _trace, offset, raw) in answers.items():
            m = by_body[key]
            assert (m.internal_id, m.offset) == (msg_id, offset), key
            if key != b"tm-1":
                assert m.raw_size == raw, key
        # MPUB_TRACE: the first message's offset plus the batch's raw size is the message
        # after the batch
        tm1 = answers[b"tm-1"]
        after_batch = before[[m.body for m in before].index(b"tm-3") + 1]
        assert tm1[2] + tm1[3] == after_batch.offset
        assert sum(by_body[b].raw_size for b in bodies) == tm1[3]

        # a restart: the next message follows the last one before it
        async with node(tmp_path) as (nsqd, s, base):
            pub = await Raw.connect(nsqd)
            answers[b"after"] = await traced(pub, "t", c.pub_trace("t", 0, 99, b"after"))
            await pub.publish("t", b"after-plain")
            await pub.close()
            last = before[-1]
            assert answers[b"after"][2] == last.offset + last.raw_size
            again = await read_all(nsqd, "t", "again", 34)
            assert [(m.offset, m.raw_size) for m in again[:32]] == [
                (m.offset, m.raw_size) for m in before
            ]
            assert_chained(again)
            # positions made by adding a raw size find the next message
            turn1 = by_body[b"turn-1"]
            nxt = turn1.offset + turn1.raw_size
            assert await first_from(nsqd, "t", "from-turn", nxt) == b"turn-2"
            end_of_record = by_body[b"turn-3"]
            nxt = end_of_record.offset + end_of_record.raw_size
            assert await first_from(nsqd, "t", "from-mpub", nxt) == b"mpub-1"
            url = f"{base}/message/get?topic=t&partition=0&search_mode=virtual_offset"
            async with s.get(f"{url}&search_pos={nxt}") as r:
                got: dict[str, Any] = await r.json()
            assert (r.status, got["body"], got["offset"]) == (200, "mpub-1", nxt)
            # /channel/setoffset to a chained position
            q = "topic=t&channel=seek&partition=0"
            async with s.post(f"{base}/channel/create?{q}") as r:
                assert r.status == 200
            async with s.post(f"{base}/channel/setoffset?{q}", data=f"virtual_queue:{nxt}") as r:
                assert r.status == 200
            sub = await Raw.connect(nsqd)
            await sub.identify(desired_tag="")
            sub.send(c.sub_advanced("t", "seek", 0))
            assert await sub.response() == b"OK"
            sub.send(c.rdy(1))
            assert (await sub.yz_message(detail=True)).body == b"mpub-1"
            await sub.close()

    run(body())


def test_offsets_chain_in_a_memory_topic(tmp_path: Path) -> None:
    """#ephemeral topics keep their records in memory, with no batch headers between
    them: a raw size there is the frame's size, and the chain holds the same way."""

    async def body() -> None:
        async with node(tmp_path) as (nsqd, s, base):
            topic = "m#ephemeral"
            async with s.post(f"{base}/topic/create?topic=m%23ephemeral") as r:
                assert r.status == 200
            sub = await Raw.connect(nsqd)
            await sub.identify(desired_tag="")
            sub.send(c.sub_advanced(topic, "c#ephemeral", 0))
            assert await sub.response() == b"OK"
            pub = await Raw.connect(nsqd)
            await pub.publish(topic, b"one", b"two")
            one = await traced(pub, topic, c.pub_trace(topic, 0, 7, b"three"))
            await pub.publish(topic, b"four")
            sub.send(c.rdy(10))
            got = [await sub.yz_message(detail=True) for _ in range(4)]
            assert [m.body for m in got] == [b"one", b"two", b"three", b"four"]
            assert_chained(got)
            assert (got[2].offset, got[2].raw_size) == (one[2], one[3])
            await pub.close()
            await sub.close()

    run(body())
