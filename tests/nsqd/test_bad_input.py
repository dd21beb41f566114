"""Bad input gets NSQ's error and a clean close; the server and other clients carry on."""

from __future__ import annotations

import asyncio
import os
import random
import struct

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import FRAME_ERROR
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for


async def error_then_close(r: Raw) -> bytes:
    """Skip responses up to the error frame; the server must then close."""
    while True:
        ftype, payload = await r.frame()
        if ftype == FRAME_ERROR:
            break
    assert await r.closed(), "server kept the connection open after a fatal error"
    return payload


async def healthy(nsqd: NSQD) -> None:
    """A fresh client can still publish and consume."""
    r = await Raw.connect(nsqd)
    await r.subscribe("health", "ch", rdy=1)
    await r.publish("health", b"ok")
    m = await r.message()
    r.send(c.fin(m.id))
    await r.close()


def test_wrong_magic() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd, magic=False)
        r.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await error_then_close(r) == b"E_BAD_PROTOCOL"
        await healthy(nsqd)
        await nsqd.close()

    run(body())


def test_random_bytes() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        rng = random.Random(7)
        for _ in range(30):
            r = await Raw.connect(nsqd)
            r.send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))) + b"\n")
            err = await error_then_close(r)
            assert err.startswith(b"E_"), err
        await healthy(nsqd)
        await nsqd.close()

    run(body())


def test_oversized_body_refused_before_it_is_sent() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(max_msg_size=1000, max_body_size=5000)
        for data, err in [
            (
                b"PUB t\n" + struct.pack(">i", 1001),
                b"E_BAD_MESSAGE PUB message too big 1001 > 1000",
            ),
            (b"MPUB t\n" + struct.pack(">i", 5001), b"E_BAD_BODY MPUB body too big 5001 > 5000"),
            (
                b"IDENTIFY\n" + struct.pack(">i", 2**31 - 1),
                b"E_BAD_BODY IDENTIFY body too big 2147483647 > 5000",
            ),
            (b"PUB t\n" + struct.pack(">i", -5), b"E_BAD_MESSAGE PUB invalid message body size -5"),
        ]:
            r = await Raw.connect(nsqd)
            r.send(data)  # the body itself never comes: the size prefix is enough
            assert await error_then_close(r) == err
        # an MPUB message over max-msg-size inside an acceptable body
        r = await Raw.connect(nsqd)
        r.send(c.mpub("t", [b"x" * 1001]))
        assert await error_then_close(r) == b"E_BAD_MESSAGE MPUB message too big 1001 > 1000"
        assert "t" not in nsqd.topics or nsqd.topics["t"].message_count == 0
        await healthy(nsqd)
        await nsqd.close()

    run(body())


def test_truncated_and_lying_size_prefixes() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        # says 100 bytes, sends 10, hangs up: nothing published, nothing breaks
        r = await Raw.connect(nsqd)
        r.send(b"PUB t\n" + struct.pack(">i", 100) + b"0123456789")
        await r.close()
        # says 3 bytes, sends 10: the rest is read as the next command
        r = await Raw.connect(nsqd)
        r.send(b"PUB t\n" + struct.pack(">i", 3) + b"abcdefghij\n")
        assert await r.response() == b"OK"
        assert await error_then_close(r) == b"E_INVALID invalid command defghij"
        # an MPUB whose inner sizes run past its body
        r = await Raw.connect(nsqd)
        inner = struct.pack(">ii", 2, 500) + b"x" * 10
        r.send(b"MPUB t\n" + struct.pack(">i", len(inner)) + inner)
        assert await error_then_close(r) == b"E_BAD_MESSAGE MPUB failed to read message body"
        # a truncated command line, then the connection closes
        r = await Raw.connect(nsqd)
        r.send(b"SUB t")
        await r.close()
        await wait_for(lambda: nsqd.topics["t"].message_count == 1)
        await healthy(nsqd)
        await nsqd.close()

    run(body())


def test_unknown_command_and_line_too_long() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        r = await Raw.connect(nsqd)
        r.send(b"EXPLODE now\n")
        assert await error_then_close(r) == b"E_INVALID invalid command EXPLODE"
        r = await Raw.connect(nsqd)
        r.send(b"X" * 100_000)
        assert (await error_then_close(r)).startswith(b"E_INVALID command line too long")
        await healthy(nsqd)
        await nsqd.close()

    run(body())


def test_bad_clients_do_not_harm_a_consumer() -> None:
    """While garbage, floods and bad bodies hit the server, a consumer receives every
    message of a well-behaved publisher, in time."""

    async def body() -> None:
        nsqd = await start_nsqd()
        consumer = await Raw.connect(nsqd)
        await consumer.subscribe("good", "ch", rdy=100)
        publisher = await Raw.connect(nsqd)
        n = 2000
        stop = asyncio.Event()

        async def vandal(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                r = await Raw.connect(nsqd)
                kind = rng.randrange(3)
                if kind == 0:
                    r.send(os.urandom(rng.randrange(1, 5000)))
                elif kind == 1:
                    r.send(b"PUB good\n" + struct.pack(">i", 50 * 1024 * 1024))
                else:
                    r.send(c.fin(b"0123456789abcdef"))
                await r.closed(timeout=2)
                await r.close()

        async def flooder() -> None:
            # never reads: NOPs and PUBs to another topic, as fast as it can write
            r = await Raw.connect(nsqd)
            chunk = (c.nop() * 500) + c.pub("flood", b"x") * 500
            while not stop.is_set():
                r.writer.write(chunk)
                try:
                    await asyncio.wait_for(r.writer.drain(), 1)
                except TimeoutError:
                    await asyncio.sleep(0.01)  # the server pushes back; that is the point
            await r.close()

        tasks = [asyncio.create_task(vandal(i)) for i in range(4)]
        tasks.append(asyncio.create_task(flooder()))
        for i in range(0, n, 100):
            publisher.send(c.mpub("good", [b"%d" % j for j in range(i, i + 100)]))
            assert await publisher.response() == b"OK"
        got = set()
        while len(got) < n:
            m = await consumer.message(timeout=10)
            got.add(m.body)
            consumer.send(c.fin(m.id))
        stop.set()
        await asyncio.gather(*tasks)
        assert got == {b"%d" % i for i in range(n)}
        await healthy(nsqd)
        await nsqd.close()

    run(body(), timeout=120)


def test_disconnect_requeues_in_flight_to_others() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        a = await Raw.connect(nsqd)
        await a.subscribe("t", "ch", rdy=10)
        await a.publish("t", b"1", b"2")
        await a.messages(2)
        b = await Raw.connect(nsqd)
        await b.subscribe("t", "ch", rdy=10)
        await a.close()  # without FIN: both go to b at once, attempts 2
        got = await b.messages(2)
        assert sorted(m.body for m in got) == [b"1", b"2"]
        assert {m.attempts for m in got} == {2}
        await nsqd.close()

    run(body())
