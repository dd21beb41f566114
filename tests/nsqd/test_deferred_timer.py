"""Deferred messages (DPUB, REQ with a delay, deferred ones restored at start) come due by
their channel's timer, not by the queue scan: with a scan interval of an hour they still
arrive, and never before their time."""

from __future__ import annotations

import time
from pathlib import Path

from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

HOUR = 3600.0


def test_dpub_and_req_come_due_without_the_scan() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(queue_scan_interval=HOUR)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        pub = await Raw.connect(nsqd)
        t0 = time.monotonic()
        pub.send(c.dpub("t", 150, b"later") + c.dpub("t", 50, b"sooner"))
        assert await pub.response() == b"OK"
        assert await pub.response() == b"OK"
        first = await sub.message()
        t1 = time.monotonic()
        second = await sub.message()
        t2 = time.monotonic()
        assert (first.body, second.body) == (b"sooner", b"later")
        assert t1 - t0 >= 0.05 and t2 - t0 >= 0.15  # never early
        # REQ with a delay: due by the timer too, its attempts counted
        t3 = time.monotonic()
        sub.send(c.req(second.id, 80))
        again = await sub.message()
        assert again.body == b"later" and again.attempts == 2
        assert time.monotonic() - t3 >= 0.08
        await nsqd.close()

    run(body())


def test_an_earlier_deferral_rearms_the_timer() -> None:
    """A message deferred for less than the one the timer waits for comes first."""

    async def body() -> None:
        nsqd = await start_nsqd(queue_scan_interval=HOUR)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        pub = await Raw.connect(nsqd)
        pub.send(c.dpub("t", 60_000, b"a minute"))
        assert await pub.response() == b"OK"
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.deferred_count == 1, what="the first deferral")
        pub.send(c.dpub("t", 30, b"soon"))
        assert await pub.response() == b"OK"
        assert (await sub.message()).body == b"soon"
        assert ch.deferred_count == 1
        await nsqd.close()

    run(body())


def test_deferred_messages_restored_at_start_come_due(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(data_path=str(tmp_path), queue_scan_interval=HOUR)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"m")
        msg = await sub.message()
        sub.send(c.req(msg.id, 300))
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.deferred_count == 1, what="the REQ")
        await sub.close()
        await pub.close()
        await nsqd.close()  # the deferral is in the cursor file
        nsqd = await start_nsqd(data_path=str(tmp_path), queue_scan_interval=HOUR)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        again = await sub.message()
        assert again.body == b"m" and again.attempts == 2
        await nsqd.close()

    run(body())
