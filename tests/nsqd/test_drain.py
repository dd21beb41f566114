"""nsqd's drain (docs/drain.md): SIGTERM or POST /drain stops deliveries, tells each
subscribed client with CLOSE_WAIT, waits for what is in flight (up to --drain-timeout),
then closes; publishing goes on meanwhile."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, Message
from nsqx.wire import commands as c

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run, wait_for
from rawnsq import start_nsqd as start_inproc

BOGUS_ID = b"ffffffffffffffff"


async def barrier(r: Raw) -> list[tuple[int, bytes]]:
    """The frames nsqd sent before it answered a FIN of an unknown id (a round trip:
    a delivery due by then came before it)."""
    r.send(c.fin(BOGUS_ID))
    seen = []
    while True:
        ftype, data = await r.frame()
        if ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED"):
            return seen
        seen.append((ftype, data))


async def held_messages(nsqd: NSQD | tuple[str, int], n: int) -> tuple[Raw, Raw, list[Message]]:
    """A publisher and a consumer that holds ``n`` messages unanswered."""
    pub = await Raw.connect(nsqd)
    sub = await Raw.connect(nsqd)
    await sub.subscribe("t", "ch", rdy=n)
    await pub.publish("t", *[b"held-%d" % i for i in range(n)])
    return pub, sub, await sub.messages(n)


def test_drain_tells_subscribers_and_stops_deliveries() -> None:
    """CLOSE_WAIT comes after what was sent; then no message is delivered whatever the
    RDY, publishing goes on, FIN still works, and drain() ends when nothing is in
    flight. A CLS crossing the notice is answered CLOSE_WAIT again, not an error."""

    async def body() -> None:
        nsqd = await start_inproc()
        pub, sub, held = await held_messages(nsqd, 5)
        idle = await Raw.connect(nsqd)  # a publisher-only connection: told nothing
        await idle.publish("t", b"from-idle")
        nsqd.start_drain()
        assert nsqd.draining
        assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        await pub.publish("t", b"after-drain")  # accepted: it waits in the log
        sub.send(c.rdy(100))
        assert await barrier(sub) == []  # nothing delivered, the RDY ignored
        assert nsqd.in_flight_count() == 5
        waiter = asyncio.ensure_future(nsqd.drain(30))
        sub.send(b"".join(c.fin(m.id) for m in held[:4]) + c.req(held[4].id, 0))
        assert await waiter is True
        assert nsqd.in_flight_count() == 0
        sub.send(c.cls())
        assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        assert await barrier(sub) == []  # still connected; the REQ'd one not resent
        await idle.publish("t", b"idle-again")  # its answer is the next frame: no notice
        channel = nsqd.topics["t"].default_partition.channels["ch"]
        assert channel.depth == 4  # the requeued one and the three published since
        await nsqd.close()

    run(body())


def test_sub_while_draining_is_answered_then_told() -> None:
    """A client subscribing to a draining nsqd gets its OK, then CLOSE_WAIT, and no
    message; a second drain changes nothing."""

    async def body() -> None:
        nsqd = await start_inproc()
        pub = await Raw.connect(nsqd)
        await pub.publish("t", b"waiting")
        nsqd.start_drain()
        nsqd.start_drain()
        late = await Raw.connect(nsqd)
        late.send(c.sub("t", "ch") + c.rdy(10))
        assert await late.frame() == (FRAME_RESPONSE, b"OK")
        assert await late.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        assert await barrier(late) == []
        assert await nsqd.drain(30) is True
        await nsqd.close()

    run(body())


def test_drain_deadline_leaves_the_rest_for_the_restart(tmp_path: Path) -> None:
    """A consumer that never answers: drain() gives up at its deadline; the messages it
    held come back after the restart (attempts 2), nothing is lost."""

    async def body() -> None:
        nsqd = await start_inproc(data_path=str(tmp_path))
        pub, sub, held = await held_messages(nsqd, 3)
        assert await nsqd.drain(0.2) is False
        await nsqd.close()
        await sub.close()
        await pub.close()
        again = await start_inproc(data_path=str(tmp_path))
        s = await Raw.connect(again)
        await s.subscribe("t", "ch", rdy=10)
        back = await s.messages(3)
        assert sorted(m.body for m in back) == sorted(m.body for m in held)
        assert {m.attempts for m in back} == {2}
        await again.close()

    run(body())


# -- the daemon: SIGTERM, the flag, POST /drain ---------------------------------------


def logged(nsqd: NsqdProcess, text: str) -> bool:
    return any(text in line for line in nsqd.log)


async def exited(nsqd: NsqdProcess) -> int:
    await wait_for(lambda: nsqd.proc.poll() is not None, timeout=20, what="nsqd to exit")
    return nsqd.proc.wait()


def test_sigterm_drains_then_exits_and_nothing_comes_twice(tmp_path: Path) -> None:
    """SIGTERM: the consumer is told, answers what it holds, nsqd exits 0 once nothing
    is in flight; after the restart the rest is delivered, each message once."""

    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--drain-timeout=60s")
        pub, sub, held = await held_messages(nsqd.tcp_address, 4)
        await pub.publish("t", *[b"queued-%d" % i for i in range(3)])
        nsqd.proc.send_signal(signal.SIGTERM)
        assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        await pub.publish("t", b"during-drain")
        assert nsqd.alive()  # (it waits for the consumer)
        sub.send(b"".join(c.fin(m.id) for m in held))
        assert await exited(nsqd) == 0
        assert logged(nsqd, "NSQ: drained: nothing in flight")
        assert await sub.closed()
        nsqd = start_nsqd(tmp_path)
        s = await Raw.connect(nsqd.tcp_address)
        await s.subscribe("t", "ch", rdy=10)
        rest = await s.messages(4)
        assert sorted(m.body for m in rest) == [
            b"during-drain",
            b"queued-0",
            b"queued-1",
            b"queued-2",
        ]
        assert {m.attempts for m in rest} == {1}
        s.send(b"".join(c.fin(m.id) for m in rest) + c.fin(BOGUS_ID))
        assert (await s.error()).startswith(b"E_FIN_FAILED")  # and nothing else came
        assert nsqd.stop() == 0

    run(body())


def test_sigterm_drain_timeout_is_honoured(tmp_path: Path) -> None:
    """A consumer that never answers: nsqd exits 0 after --drain-timeout; what it held
    is delivered again after the restart."""

    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--drain-timeout=300ms")
        _pub, sub, held = await held_messages(nsqd.tcp_address, 2)
        nsqd.proc.send_signal(signal.SIGTERM)
        assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        assert await exited(nsqd) == 0
        assert logged(nsqd, "drain timeout (0.3s): 2 messages still in flight")
        nsqd = start_nsqd(tmp_path)
        s = await Raw.connect(nsqd.tcp_address)
        await s.subscribe("t", "ch", rdy=10)
        back = await s.messages(2)
        assert sorted(m.body for m in back) == sorted(m.body for m in held)
        assert {m.attempts for m in back} == {2}
        await s.close()
        assert nsqd.stop() == 0

    run(body())


def test_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--drain-timeout=1h")
        _pub, sub, _held = await held_messages(nsqd.tcp_address, 1)
        nsqd.proc.send_signal(signal.SIGTERM)
        assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
        nsqd.proc.send_signal(signal.SIGINT)
        assert await exited(nsqd) == 0
        assert logged(nsqd, "signalled again: closing without draining")

    run(body())


def test_drain_timeout_zero_closes_at_once(tmp_path: Path) -> None:
    """--drain-timeout=0: NSQ 1.3's shutdown, no notice."""

    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--drain-timeout=0")
        _pub, sub, _held = await held_messages(nsqd.tcp_address, 1)
        nsqd.proc.send_signal(signal.SIGTERM)
        assert await sub.closed()
        assert (FRAME_RESPONSE, b"CLOSE_WAIT") not in sub.frames
        assert await exited(nsqd) == 0
        assert not logged(nsqd, "draining")

    run(body())


def test_bad_drain_timeout_is_refused(tmp_path: Path) -> None:
    for value, says in (("-1s", "must not be negative"), ("soon", "drain-timeout")):
        proc = subprocess.run(
            [sys.executable, "-m", "nsqx", "nsqd", f"--drain-timeout={value}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr


def test_http_drain(tmp_path: Path) -> None:
    """POST /drain begins the drain and answers what is in flight; asking again is the
    same; nsqd stays up (SIGTERM then closes at once). Parameters are refused, and a
    refused request drains nothing; GET is not allowed."""

    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--http-address=127.0.0.1:0", "--drain-timeout=1h")
        pub, sub, held = await held_messages(nsqd.tcp_address, 2)
        async with aiohttp.ClientSession() as http:
            url = f"{nsqd.http_url}/drain"
            async with http.post(url + "?timeout=5") as resp:
                assert resp.status == 400
                doc = json.loads(await resp.read())
                assert doc["message"].startswith("UNKNOWN_ARG_TIMEOUT: /drain takes no timeout")
            async with http.get(url) as resp:
                assert resp.status == 405
            assert await barrier(sub) == []  # not told: no drain began
            async with http.post(url) as resp:
                assert resp.status == 200
                assert json.loads(await resp.read()) == {"draining": True, "in_flight": 2}
            assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
            sub.send(c.fin(held[0].id))
            assert await barrier(sub) == []
            async with http.post(url) as resp:
                assert json.loads(await resp.read()) == {"draining": True, "in_flight": 1}
            sub.send(c.fin(held[1].id))
            assert await barrier(sub) == []
            async with http.post(url) as resp:
                assert json.loads(await resp.read()) == {"draining": True, "in_flight": 0}
            async with http.get(f"{nsqd.http_url}/ping") as resp:
                assert resp.status == 200  # still up, still publishing
            await pub.publish("t", b"still")
        nsqd.proc.send_signal(signal.SIGTERM)
        assert await exited(nsqd) == 0
        assert logged(nsqd, "NSQ: drained: nothing in flight")

    run(body())


def test_http_drain_is_an_admin_action(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--http-address=127.0.0.1:0", "--http-admin-allow=10.99.0.0/16")
        _pub, sub, _held = await held_messages(nsqd.tcp_address, 1)
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{nsqd.http_url}/drain") as resp,
        ):
            assert resp.status == 403
        assert await barrier(sub) == []
        await sub.close()
        assert nsqd.stop() == 0

    run(body())


def test_message_frames_before_the_notice_are_all_in_flight() -> None:
    """Everything sent before CLOSE_WAIT was a delivery the drain waits for; after it
    only answers to the client's own commands come."""

    async def body() -> None:
        nsqd = await start_inproc()
        pub = await Raw.connect(nsqd)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=50)
        await pub.publish("t", *[b"%d" % i for i in range(200)])
        got = 0
        await wait_for(lambda: nsqd.in_flight_count() == 50, what="50 in flight")
        nsqd.start_drain()
        while True:
            ftype, data = await sub.frame()
            if ftype == FRAME_RESPONSE:
                assert data == b"CLOSE_WAIT"
                break
            assert ftype == FRAME_MESSAGE
            got += 1
        assert got == 50 == nsqd.in_flight_count()
        await nsqd.close()

    run(body())


def test_http_drain_reaches_every_worker(tmp_path: Path) -> None:
    """--workers: POST /drain is sent to every worker, so the subscribers of topics
    each worker owns are all told; SIGTERM then stops the node at once."""

    async def body() -> None:
        node = start_nsqd(tmp_path, "--workers=2", "--http-address=127.0.0.1:0")
        names = [f"t{i}" for i in range(20)]
        topics = [next(t for t in names if owner_of(t, 0, 2) == w) for w in (0, 1)]
        subs = []
        for topic in topics:
            pub = await Raw.connect(node.tcp_address)
            await pub.publish(topic, b"m")
            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe(topic, "ch", rdy=1)
            subs.append((sub, await sub.message()))
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{node.http_url}/drain") as resp,
        ):
            assert resp.status == 200
            assert json.loads(await resp.read())["draining"] is True
        for sub, msg in subs:
            assert await sub.frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")
            sub.send(c.fin(msg.id))
            assert await barrier(sub) == []
        assert node.stop() == 0
        assert logged(node, "NSQ: drained: nothing in flight")

    run(body())
