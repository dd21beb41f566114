"""Busy polling (--busy-poll): after a read of a lone client connection the event loop
keeps polling instead of sleeping, for at most the --busy-poll window; with several
connections reading it does not poll. Real connections to an in-process nsqd."""

from __future__ import annotations

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for


async def publish(raw: Raw, body: bytes) -> None:
    raw.send(c.pub("busy", body))
    assert await raw.response() == b"OK"


async def stop_polling(nsqd: NSQD, window: float) -> None:
    nsqd.turn.busy_poll = 0.0
    await wait_for(lambda: not nsqd.turn.polling, what="polling to stop")
    nsqd.turn.busy_poll = window


def test_a_lone_publisher_keeps_the_loop_polling_until_the_window_ends() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(busy_poll=0.01)
        try:
            # a window the test cannot miss: the poll is still on when the OK is read
            nsqd.turn.busy_poll = 30.0
            raw = await Raw.connect(nsqd)
            for i in range(5):
                # polling goes on across the publishes (a read that comes while it
                # polls has its answer held until the iteration's commit, due next)
                await publish(raw, b"%d" % i)
                assert nsqd.turn.polling, i
            # and it ends by itself once the window since the last read is over
            nsqd.turn.busy_poll = 0.001
            await wait_for(lambda: not nsqd.turn.polling, what="the poll window to end")
            await raw.close()
        finally:
            await nsqd.close()

    run(body())


def test_several_reading_connections_turn_polling_off() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(busy_poll=0.01)
        try:
            nsqd.turn.alone = 30.0
            nsqd.turn.busy_poll = 30.0
            a = await Raw.connect(nsqd)
            await publish(a, b"1")
            assert nsqd.turn.polling  # alone so far
            await stop_polling(nsqd, 30.0)
            b = await Raw.connect(nsqd)
            await publish(b, b"2")  # a second connection reads: shared from now on
            assert not nsqd.turn.polling
            await publish(a, b"3")
            assert not nsqd.turn.polling
            await a.close()
            await b.close()
        finally:
            await nsqd.close()

    run(body())


def test_off_never_polls() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(busy_poll=0.0)
        try:
            raw = await Raw.connect(nsqd)
            for i in range(3):
                await publish(raw, b"%d" % i)
                assert not nsqd.turn.polling
            await raw.close()
        finally:
            await nsqd.close()

    run(body())


def test_a_lone_consumer_does_not_start_polling() -> None:
    """Reads without publishes (a consumer's SUB, RDY, FIN) have no answer anyone waits
    for: a lone consumer never makes the loop poll."""

    async def body() -> None:
        nsqd = await start_nsqd(busy_poll=0.01)
        try:
            nsqd.turn.busy_poll = 30.0
            pub = await Raw.connect(nsqd)
            for i in range(3):
                await publish(pub, b"%d" % i)
            await pub.close()
            await stop_polling(nsqd, 30.0)
            con = await Raw.connect(nsqd)
            con.send(c.sub("busy", "ch"))
            assert await con.response() == b"OK"
            con.send(c.rdy(3))
            for _ in range(3):
                msg = await con.message()
                con.send(c.fin(msg.id))
            channel = nsqd.topics["busy"].partitions[0].channels["ch"]
            await wait_for(lambda: channel.in_flight_count == 0, what="the FINs read")
            assert not nsqd.turn.polling
            await con.close()
        finally:
            await nsqd.close()

    run(body())
