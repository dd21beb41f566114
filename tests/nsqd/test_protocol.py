"""nsqd's protocol V2 behaviour, against a real asyncio nsqd on a free loopback port."""

from __future__ import annotations

import asyncio
import struct

from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for


def test_pub_sub_fin() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"one", b"two")
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        msgs = await sub.messages(2)
        assert [m.body for m in msgs] == [b"one", b"two"]
        assert all(m.attempts == 1 for m in msgs)
        assert len({m.id for m in msgs}) == 2
        sub.send(c.fin_many([m.id for m in msgs]))
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.in_flight_count == 0, what="FINs applied")
        assert ch.depth == 0
        await nsqd.close()

    run(body())


def test_mpub_is_atomic_and_dpub_defers() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=100)
        pub = await Raw.connect(nsqd)
        pub.send(c.dpub("t", 300, b"later"))
        assert await pub.response() == b"OK"
        pub.send(c.mpub("t", [b"a", b"b", b"c"]))
        assert await pub.response() == b"OK"
        got = await sub.messages(4)
        assert [m.body for m in got] == [b"a", b"b", b"c", b"later"]
        # the deferred one carries its publish time; it came at least 300 ms after
        assert got[3].timestamp < got[0].timestamp
        # a bad MPUB publishes none of its messages
        bad = struct.pack(">ii", 2, 1) + b"x" + struct.pack(">i", 0)
        pub.send(b"MPUB t\n" + struct.pack(">i", len(bad)) + bad)
        assert (await pub.error()).startswith(b"E_BAD_MESSAGE")
        assert nsqd.topics["t"].message_count == 4
        await nsqd.close()

    run(body())


def test_req_and_timeout_redeliver_with_attempts() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=5, msg_timeout=1000)
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"m")
        m1 = await sub.message()
        sub.send(c.req(m1.id, 0))
        m2 = await sub.message()
        assert (m2.id, m2.attempts) == (m1.id, 2)
        sub.send(c.req(m2.id, 200))
        m3 = await sub.message()
        assert (m3.id, m3.attempts) == (m1.id, 3)
        # no FIN: the 1 s msg_timeout redelivers it
        m4 = await sub.message(timeout=5)
        assert (m4.id, m4.attempts) == (m1.id, 4)
        ch = nsqd.topics["t"].channels["ch"]
        assert ch.timeout_count == 1 and ch.requeue_count == 2
        sub.send(c.fin(m4.id))
        await wait_for(lambda: ch.in_flight_count == 0)
        await nsqd.close()

    run(body())


def test_late_fin_keeps_the_attempts_of_a_message_in_flight_elsewhere() -> None:
    """A consumer whose message timed out and went to another consumer FINs it late: it
    gets E_FIN_FAILED, and the message, in flight elsewhere, keeps its attempt count (a
    reset would let a poison message escape max_attempts for ever)."""

    async def body() -> None:
        nsqd = await start_nsqd()
        slow = await Raw.connect(nsqd)
        await slow.subscribe("t", "ch", rdy=1, msg_timeout=1000)
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"poison")
        m1 = await slow.message()
        slow.send(c.rdy(0))  # the redelivery must go to the other consumer
        other = await Raw.connect(nsqd)
        await other.subscribe("t", "ch", rdy=1)
        m2 = await other.message(timeout=5)  # after slow's 1 s timeout
        assert (m2.id, m2.attempts) == (m1.id, 2)
        slow.send(c.fin(m1.id))  # late
        assert await slow.error() == b"E_FIN_FAILED FIN %s failed client does not own message" % (
            m1.id
        )
        other.send(c.req(m2.id, 0))
        m3 = await other.message()
        assert (m3.id, m3.attempts) == (m1.id, 3)
        # and a FIN of an id that was never delivered changes nothing either
        slow.send(c.fin(b"f" * 16))
        assert (await slow.error()).startswith(b"E_FIN_FAILED")
        other.send(c.req(m3.id, 0))
        m4 = await other.message()
        assert (m4.id, m4.attempts) == (m1.id, 4)
        other.send(c.fin(m4.id))
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.in_flight_count == 0)
        assert not ch.flight.attempts  # a FIN of a message in flight does forget its attempts
        await nsqd.close()

    run(body())


def test_touch_extends_timeout() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=1, msg_timeout=1000)
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"m")
        m = await sub.message()
        # touch every 400 ms for 2 s: never redelivered
        for _ in range(5):
            await asyncio.sleep(0.4)
            sub.send(c.touch(m.id))
        assert await sub.nothing_for(0.2)
        sub.send(c.fin(m.id))
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.in_flight_count == 0)
        assert ch.timeout_count == 0
        await nsqd.close()

    run(body())


def test_touch_is_bounded_by_max_msg_timeout() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(max_msg_timeout=1.5)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=1, msg_timeout=1000)
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"m")
        m = await sub.message()
        redelivered: list[int] = []

        async def keep_touching() -> None:
            while not redelivered:
                sub.send(c.touch(m.id))
                await asyncio.sleep(0.2)

        toucher = asyncio.create_task(keep_touching())
        again = await sub.message(timeout=5)
        redelivered.append(again.attempts)
        await toucher
        assert (again.id, again.attempts) == (m.id, 2)
        await nsqd.close()

    run(body())


def test_non_fatal_errors_keep_the_connection() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=1)
        unknown = b"0123456789abcdef"
        sub.send(c.fin(unknown) + c.req(unknown, 0) + c.touch(unknown))
        assert await sub.error() == b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
        assert await sub.error() == b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"
        assert await sub.error() == b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"
        await sub.publish("t", b"still here")
        assert (await sub.message()).body == b"still here"
        await nsqd.close()

    run(body())


def test_fin_of_another_clients_message() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        a = await Raw.connect(nsqd)
        await a.subscribe("t", "ch", rdy=1)
        b = await Raw.connect(nsqd)
        await b.subscribe("t", "ch")
        await b.publish("t", b"x")
        m = await a.message()
        b.send(c.fin(m.id))
        assert await b.error() == b"E_FIN_FAILED FIN %s failed client does not own message" % m.id
        await nsqd.close()

    run(body())


def test_rdy_bounds_and_in_flight_limit() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(max_rdy_count=50)
        pub = await Raw.connect(nsqd)
        pub.send(c.mpub("t", [b"%d" % i for i in range(20)]))
        assert await pub.response() == b"OK"
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=3)
        got = await sub.messages(3)
        assert await sub.nothing_for(0.3)  # RDY 3: no fourth until a FIN
        sub.send(c.fin(got[0].id))
        await sub.message()
        sub.send(c.rdy(51))
        assert await sub.error() == b"E_INVALID RDY count 51 out of range 0-50"
        assert await sub.closed()
        await nsqd.close()

    run(body())


def test_cls_stops_delivery() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=10)
        await sub.publish("t", b"a")
        m = await sub.message()
        sub.send(c.cls())
        assert await sub.response() == b"CLOSE_WAIT"
        sub.send(c.rdy(10))  # ignored after CLS
        await sub.publish("t", b"b")
        assert await sub.nothing_for(0.5)
        sub.send(c.fin(m.id))  # FIN still allowed while closing
        ch = nsqd.topics["t"].channels["ch"]
        await wait_for(lambda: ch.in_flight_count == 0)
        await sub.close()
        other = await Raw.connect(nsqd)
        await other.subscribe("t", "ch", rdy=10)
        assert (await other.message()).body == b"b"
        await nsqd.close()

    run(body())


def test_nop_has_no_response_and_wrong_state_is_fatal() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        r.send(c.nop() + c.fin(b"0123456789abcdef"))
        assert await r.error() == b"E_INVALID cannot FIN in current state"
        assert await r.closed()
        for data, err in [
            (c.rdy(1), b"E_INVALID cannot RDY in current state"),
            (c.cls(), b"E_INVALID cannot CLS in current state"),
            (c.req(b"0123456789abcdef", 0), b"E_INVALID cannot REQ in current state"),
            (c.touch(b"0123456789abcdef"), b"E_INVALID cannot TOUCH in current state"),
            (c.sub("t", "a") + c.sub("t", "b"), b"E_INVALID cannot SUB in current state"),
            (c.sub("t", "a") + c.identify({}), b"E_INVALID cannot IDENTIFY in current state"),
            (c.auth("s"), b"E_AUTH_DISABLED AUTH Disabled"),
        ]:
            r = await Raw.connect(nsqd)
            r.send(data)
            while True:
                ftype, payload = await r.frame()
                if ftype == 1:
                    break
            assert payload == err
            assert await r.closed()
        await nsqd.close()

    run(body())


def test_heartbeats_and_close_after_two_missed() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        await r.identify(heartbeat_interval=1000)
        r.answer_heartbeats = False
        assert await r.response() == b"_heartbeat_"
        # unanswered: closed once 2 intervals pass without a command
        assert await r.closed(timeout=5)
        ok = await Raw.connect(nsqd)
        await ok.subscribe("t", "ch", heartbeat_interval=1000)
        # answered heartbeats keep it open across 2+ intervals
        assert await ok.nothing_for(2.5)
        await ok.publish("t", b"alive")
        await nsqd.close()

    run(body())


def test_sub_refused_without_heartbeats() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        await r.identify(heartbeat_interval=-1)
        r.send(c.sub("t", "c"))
        assert await r.error() == b"E_INVALID cannot SUB with heartbeats disabled"
        await nsqd.close()

    run(body())


def test_topic_holds_messages_for_first_channel_and_channels_fan_out() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"early")
        a = await Raw.connect(nsqd)
        await a.subscribe("t", "a", rdy=10)
        assert (await a.message()).body == b"early"
        b = await Raw.connect(nsqd)
        await b.subscribe("t", "b", rdy=10)  # a later channel starts at the end
        await pub.publish("t", b"late")
        assert (await a.message()).body == b"late"
        assert (await b.message()).body == b"late"
        assert await b.nothing_for(0.2)
        await nsqd.close()

    run(body())


def test_consumers_on_one_channel_share() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        subs = [await Raw.connect(nsqd) for _ in range(3)]
        for s in subs:
            await s.subscribe("t", "ch", rdy=100)
        pub = await Raw.connect(nsqd)
        n = 600
        for i in range(0, n, 100):
            pub.send(c.mpub("t", [b"%d" % j for j in range(i, i + 100)]))
            assert await pub.response() == b"OK"
        seen: dict[bytes, int] = {}
        counts = []

        async def drain(s: Raw) -> None:
            k = 0
            while len(seen) < n:
                try:
                    m = await s.message(timeout=1)
                except AssertionError:
                    continue
                seen[m.body] = seen.get(m.body, 0) + 1
                s.send(c.fin(m.id))
                k += 1
            counts.append(k)

        await asyncio.gather(*(drain(s) for s in subs))
        assert len(seen) == n and set(seen.values()) == {1}
        assert all(k > 0 for k in counts), counts
        await nsqd.close()

    run(body())


def test_ephemeral_channel_and_topic_vanish() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        s = await Raw.connect(nsqd)
        await s.subscribe("t#ephemeral", "c#ephemeral", rdy=1)
        s2 = await Raw.connect(nsqd)
        await s2.subscribe("t", "c#ephemeral")
        assert "c#ephemeral" in nsqd.topics["t#ephemeral"].channels
        await s.close()
        await s2.close()
        await wait_for(lambda: "t#ephemeral" not in nsqd.topics, what="ephemeral topic gone")
        await wait_for(lambda: "c#ephemeral" not in nsqd.topics["t"].channels)
        await nsqd.close()

    run(body())


def test_ephemeral_overflow_is_dropped() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(mem_queue_size=10)
        s = await Raw.connect(nsqd)
        await s.subscribe("t", "c#ephemeral")
        pub = await Raw.connect(nsqd)
        pub.send(c.mpub("t", [b"%d" % i for i in range(50)]))
        assert await pub.response() == b"OK"
        s.send(c.rdy(100))
        got = await s.messages(10)
        assert [m.body for m in got] == [b"%d" % i for i in range(40, 50)]
        assert await s.nothing_for(0.2)
        await nsqd.close()

    run(body())


def test_sample_rate() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        s = await Raw.connect(nsqd)
        resp = await s.identify(sample_rate=30)
        assert resp["sample_rate"] == 30
        await s.subscribe("t", "c", rdy=2500)
        pub = await Raw.connect(nsqd)
        pub.send(c.mpub("t", [b"x"] * 1000))
        assert await pub.response() == b"OK"
        n = 0
        while not await s.nothing_for(0.3):
            while s.frames:
                s.frames.pop()
                n += 1
        assert 150 < n < 500, n
        await nsqd.close()

    run(body())


def test_output_buffering_options() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        for obs, obt in [(-1, -1), (64, 25), (65536, 1000)]:
            s = await Raw.connect(nsqd)
            resp = await s.identify(output_buffer_size=obs, output_buffer_timeout=obt)
            assert resp["output_buffer_size"] == (1 if obs == -1 else obs)
            await s.subscribe("t", f"c{obs}", rdy=10)
            await s.publish("t", b"m")
            # with RDY to spare the frame waits for the buffer timeout, then arrives
            assert (await s.message(timeout=5)).body == b"m"
            await s.close()
        await nsqd.close()

    run(body())
