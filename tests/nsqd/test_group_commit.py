"""Group commit: the publishes of one loop iteration, from every connection, are written
by one system call, and answered after it (never before, never for a failed write)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

import nsqx.store.disklog as disklog
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for


def count_writevs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.writev

    def writev(fd: int, buffers: list[bytes]) -> int:
        calls.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(disklog.os, "writev", writev)
    return calls


def test_publishes_of_one_iteration_share_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight connections whose PUBs arrive together (loopback delivers a send at once,
    so the server's next poll sees all eight) cost one writev, and every one is OK."""

    async def body() -> None:
        nsqd = await start_nsqd()
        conns = [await Raw.connect(nsqd) for _ in range(8)]
        conns[0].send(c.pub("t", b"first"))  # makes the topic
        assert await conns[0].response() == b"OK"
        writevs = count_writevs(monkeypatch)
        for i, r in enumerate(conns):
            r.send(c.pub("t", b"m%d" % i))
        for r in conns:
            assert await r.response() == b"OK"
        assert len(writevs) == 1
        part = nsqd.topics["t"].default_partition
        assert part.log.end == 9 and part.message_count == 9
        await nsqd.close()

    run(body())


def test_answers_wait_for_the_write_and_channels_see_it_after() -> None:
    """Partition.publish stages; the records become visible and the waiters hear of
    them only when the iteration's commit wrote them."""

    async def body() -> None:
        nsqd = await start_nsqd()
        part = nsqd.get_topic("t").default_partition
        ch = part.get_channel("ch")
        heard: list[Any] = []
        part.publish([b"a"])
        part.publish([b"b", b"c"])
        part.when_acknowledged(heard.append)
        assert heard == [] and part.log.end == 0 and part.visible_end == 0
        assert ch.depth == 0
        await asyncio.sleep(0)  # one loop iteration: the commit runs
        assert heard == [None]
        assert part.log.end == 3 and part.visible_end == 3 and ch.depth == 3
        # nothing staged: an acknowledgement is at once
        part.when_acknowledged(heard.append)
        assert heard == [None, None]
        await nsqd.close()

    run(body())


def test_a_failed_write_fails_every_publisher_of_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group's write fails: each connection with a publish in it gets E_PUB_FAILED or
    E_MPUB_FAILED and is closed, none gets an OK, /ping's health says so, nothing of it
    is stored or counted; once the disk works again publishing goes on."""

    async def body() -> None:
        nsqd = await start_nsqd()
        ok = await Raw.connect(nsqd)
        await ok.publish("t", b"kept")
        real = os.writev

        def disk_full(fd: int, buffers: list[bytes]) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(disklog.os, "writev", disk_full)
        pub, mpub = await Raw.connect(nsqd), await Raw.connect(nsqd)
        pub.send(c.pub("t", b"lost") * 2)
        mpub.send(c.mpub("t", [b"lost1", b"lost2"]))
        assert (await pub.error()).startswith(b"E_PUB_FAILED PUB failed")
        assert (await mpub.error()).startswith(b"E_MPUB_FAILED MPUB failed")
        assert await pub.closed() and await mpub.closed()
        assert not pub.frames and not mpub.frames
        assert nsqd.health().startswith("NOK - failed to write to topic t")
        part = nsqd.topics["t"].default_partition
        assert part.log.end == 1 and part.message_count == 1
        monkeypatch.setattr(disklog.os, "writev", real)
        await ok.publish("t", b"after")
        assert nsqd.health() == "OK"
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        assert [m.body for m in await sub.messages(2)] == [b"kept", b"after"]
        await nsqd.close()

    run(body())


def test_pubs_in_a_row_are_each_answered_and_stored() -> None:
    """Pipelined PUBs (parsed as one run) get one OK each, and are stored in order."""

    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        bodies = [b"m%d" % i for i in range(50)]
        r.send(b"".join(c.pub("t", b) for b in bodies) + c.nop() + c.pub("t", b"last"))
        for _ in range(51):
            assert await r.response() == b"OK"
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=100)
        got = [m.body for m in await sub.messages(51)]
        assert got == [*bodies, b"last"]
        assert len({m for m in got}) == 51
        await nsqd.close()

    run(body())


def test_answers_then_a_fatal_error_in_one_read() -> None:
    """A PUB followed by garbage in one read: the OK (after the write), then the error,
    then the close."""

    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        r.send(c.pub("t", b"kept") + b"GARBAGE\n")
        assert await r.response() == b"OK"
        assert (await r.error()).startswith(b"E_INVALID invalid command GARBAGE")
        assert await r.closed()
        await wait_for(lambda: nsqd.topics["t"].default_partition.log.end == 1)
        await nsqd.close()

    run(body())


def test_http_publish_is_written_before_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """/pub and /mpub write at once (with whatever TCP publishes are staged), before
    answering: a request costs far more than its write."""

    async def body() -> None:
        import aiohttp

        nsqd = await start_nsqd(http_address="127.0.0.1:0")
        assert nsqd.http_address is not None
        base = "http://{}:{}".format(*nsqd.http_address)
        writevs = count_writevs(monkeypatch)
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/pub?topic=h", data=b"one") as resp:
                assert resp.status == 200
            async with s.post(f"{base}/mpub?topic=h", data=b"two\nthree") as resp:
                assert resp.status == 200
            async with s.get(f"{base}/stats?format=json&topic=h") as resp:
                stats = json.loads(await resp.read())
        assert stats["topics"][0]["message_count"] == 3
        assert len(writevs) == 2
        assert nsqd.topics["h"].default_partition.log.end == 3
        await nsqd.close()

    run(body())


def test_a_truncate_drops_what_is_staged() -> None:
    """A follower cut (replication) between a publish and its commit: the staged
    messages are never written, uncounted, and their publishers told so."""

    async def body() -> None:
        from nsqx.nsqd.partition import StagedDropped

        nsqd = await start_nsqd()
        part = nsqd.get_topic("t").default_partition
        part.publish([b"kept"])
        await asyncio.sleep(0)
        heard: list[Any] = []
        part.publish([b"dropped"])
        part.when_acknowledged(heard.append)
        part.truncate(1)
        assert len(heard) == 1 and isinstance(heard[0], StagedDropped)
        await asyncio.sleep(0)  # the iteration's commit finds nothing to write
        assert part.log.end == 1 and part.message_count == 1
        part.publish([b"next"])
        await asyncio.sleep(0)
        assert part.log.end == 2
        chunks, _ = part.log.read(1, 1)
        assert chunks[0].endswith(b"next")
        await nsqd.close()

    run(body())
