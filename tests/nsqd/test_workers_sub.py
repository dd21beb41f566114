"""``nsqx nsqd --workers=N``: a consumer gets every message of its channel whichever
worker its connection landed on (nsqx.nsqd.workers.proxy).

Real processes on free loopback ports. Which worker took a connection is read from
/proc (the worker process that holds the accepted socket), so that each test runs its
consumer through a proxy (a worker that does not own the partition) for certain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_ERROR, FRAME_RESPONSE
from workernode import raw_on, start_workers, topics_spread, wait_for, worker_of, worker_pids

from nsqdproc import NsqdProcess
from rawnsq import Raw, run

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers need Linux (and /proc here)"
)


def other(topic: str, workers: int = 2) -> int:
    """A worker that does not own ``topic``'s partition 0."""
    return (owner_of(topic, 0, workers) + 1) % workers


@pytest.fixture(params=["moved", "proxied"])
def node(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    # moved: a plain connection moves to its topic's owner (workers/handoff.py); a
    # compressed one, and every one when handoff is off, is served through a proxy
    handoff = "true" if request.param == "moved" else "false"
    n = start_workers(tmp_path, f"--worker-handoff={handoff}")
    try:
        yield n
    finally:
        n.stop(signal.SIGKILL)


async def publish(node: NsqdProcess, topic: str, bodies: list[bytes], conns: int = 2) -> None:
    producers = [Producer(f"127.0.0.1:{node.tcp_port}") for _ in range(conns)]
    for p in producers:
        await p.connect()
    for i, body in enumerate(bodies):
        await producers[i % conns].publish(topic, body)
    for p in producers:
        await p.close()


def test_every_message_reaches_consumers_on_both_workers_once(node: NsqdProcess) -> None:
    topics = topics_spread(10, 2, "st")
    n = 40

    async def go() -> dict[str, list[bytes]]:
        got: dict[str, list[bytes]] = {t: [] for t in topics}
        done = asyncio.Event()
        total = n * len(topics)
        count = 0

        def handler(topic: str):  # type: ignore[no-untyped-def]
            def on_message(msg) -> None:  # type: ignore[no-untyped-def]
                nonlocal count
                got[topic].append(msg.body)
                count += 1
                if count >= total:
                    done.set()

            return on_message

        consumers = [
            Consumer(t, "c", handler(t), nsqd_tcp_addresses=[f"127.0.0.1:{node.tcp_port}"])
            for t in topics
            for _ in range(4)  # several connections per channel: local and proxied
        ]
        for cons in consumers:
            await cons.start()
        # published through connections on any worker
        await asyncio.gather(
            *(publish(node, t, [f"{t}-{i}".encode() for i in range(n)], 3) for t in topics)
        )
        await asyncio.wait_for(done.wait(), 30)
        # the channels are on both workers (proxied: their connections landed anywhere;
        # moved: each is at its topic's owner)
        ports = [
            link.transport.get_extra_info("sockname")[1]
            for cons in consumers
            for link in cons._conns.values()
            if link.transport is not None
        ]
        landed = {await asyncio.to_thread(worker_of, node, p) for p in ports}
        assert landed == {0, 1}
        for cons in consumers:
            await cons.close()
        return got

    got = run(go())
    for t in topics:
        assert sorted(got[t]) == sorted(f"{t}-{i}".encode() for i in range(n)), t


def test_req_timeout_touch_and_fin_through_a_proxy(node: NsqdProcess) -> None:
    topic = "proxied"

    async def go() -> None:
        await publish(node, topic, [b"a", b"b", b"c"])
        sub = await raw_on(node, other(topic))
        await sub.identify(msg_timeout=1000)
        sub.send(c.sub(topic, "ch") + c.rdy(3))
        assert await sub.response() == b"OK"
        msgs = {m.body: m for m in await sub.messages(3)}
        assert set(msgs) == {b"a", b"b", b"c"} and all(m.attempts == 1 for m in msgs.values())
        # REQ 0: back at once; TOUCH keeps "c" in flight; "b" times out (1 s)
        sub.send(c.req(msgs[b"a"].id, 0) + c.touch(msgs[b"c"].id))
        again = await sub.message()
        assert (again.body, again.attempts) == (b"a", 2)
        sub.send(c.fin(again.id) + c.fin(msgs[b"c"].id))
        late = await sub.message(timeout=10)
        assert (late.body, late.attempts) == (b"b", 2)
        sub.send(c.fin(late.id))
        # failures come back as error frames; the connection stays open
        sub.send(c.fin(b"0" * 16))
        err = await sub.error()
        assert err.startswith(b"E_FIN_FAILED"), err
        sub.send(c.req(b"1" * 16, 0))
        assert (await sub.error()).startswith(b"E_REQ_FAILED")
        sub.send(c.touch(b"2" * 16))
        assert (await sub.error()).startswith(b"E_TOUCH_FAILED")
        await publish(node, topic, [b"d"])
        m = await sub.message()
        assert m.body == b"d"
        sub.send(c.fin(m.id) + c.nop())
        assert await sub.nothing_for(0.3)
        await sub.close()

    run(go())


def test_a_refused_sub_is_answered_by_the_owner(node: NsqdProcess) -> None:
    topic = "refused"

    async def go() -> None:
        await publish(node, topic, [b"x"])
        raw = await raw_on(node, other(topic))
        # an extend_support client on a topic that is not ext: the owner refuses, fatally
        await raw.identify(extend_support=True)
        raw.send(c.sub(topic, "ch"))
        ftype, data = await raw.frame()
        assert ftype == FRAME_ERROR and data.startswith(b"E_SUB_EXTEND_FORBIDDON"), data
        assert await raw.closed()

    run(go())


def test_a_disconnected_proxied_consumer_s_messages_go_to_another(node: NsqdProcess) -> None:
    topic = "leaver"

    async def go() -> None:
        bodies = [b"m%d" % i for i in range(5)]
        await publish(node, topic, bodies)
        first = await raw_on(node, other(topic))
        await first.subscribe(topic, "ch", rdy=5)
        got = await first.messages(5)
        assert sorted(m.body for m in got) == bodies
        await first.close()  # nothing finished
        for worker in (other(topic), owner_of(topic, 0, 2)):
            second = await raw_on(node, worker)
            await second.subscribe(topic, "ch", rdy=5)
            again = await second.messages(5)
            assert sorted(m.body for m in again) == bodies
            assert all(m.attempts >= 2 for m in again)
            await second.close()

    run(go())


def test_an_ordered_channel_keeps_its_order_through_a_proxy(node: NsqdProcess) -> None:
    topic = "ordered"

    async def go() -> None:
        bodies = [b"o%02d" % i for i in range(20)]
        await publish(node, topic, bodies, conns=1)
        sub = await raw_on(node, other(topic))
        sub.send(c.sub_ordered(topic, "ch", 0) + c.rdy(5))
        assert await sub.response() == b"OK"
        got = []
        for _ in bodies:
            m = await sub.yz_message(detail=True)
            got.append(m.body)
            # one message in flight for the channel: nothing else until this FIN
            assert await sub.nothing_for(0.02)
            sub.send(c.fin(m.id))
        assert got == bodies
        await sub.close()

    run(go())


def test_youzan_positions_and_layout_through_a_proxy(node: NsqdProcess) -> None:
    topic = "positions"

    async def advanced(worker: int, channel: str, start: str, n: int) -> list[tuple]:  # type: ignore[type-arg]
        sub = await raw_on(node, worker)
        await sub.identify(desired_tag="")
        sub.send(f"SUB_ADVANCED {topic} {channel} 0 {start}\n".encode() + c.rdy(10))
        assert await sub.response() == b"OK"
        got = [await sub.yz_message(detail=True) for _ in range(n)]
        sub.send(b"".join(c.fin(m.id) for m in got) + c.nop())
        assert await sub.nothing_for(0.2)  # FIN of binary ids: no error
        await sub.close()
        return [(m.body, m.id, m.offset, m.raw_size) for m in got]

    async def go() -> None:
        await publish(node, topic, [b"p%d" % i for i in range(5)], conns=1)
        owner = owner_of(topic, 0, 2)
        # as the owner's own connections see them, and as a proxied one does
        local = await advanced(owner, "a", "msgcount:1", 5)
        assert [m[0] for m in local] == [b"p%d" % i for i in range(5)]
        proxied = await advanced(other(topic), "b", "msgcount:3", 3)
        assert proxied == local[2:]
        offset = local[3][2]
        assert await advanced(other(topic), "c", f"virtual_queue:{offset}", 2) == local[3:]

    run(go())


def test_max_channel_consumers_counts_local_and_proxied_consumers(tmp_path: Path) -> None:
    node = start_workers(tmp_path, "--max-channel-consumers=1")
    topic = "crowded"
    try:

        async def subscribed(worker: int) -> Raw:
            # a consumer that just left frees its place once its worker (and the
            # owner, for a proxied one) saw it go: until then a new one is refused
            deadline = time.monotonic() + 10
            while True:
                raw = await raw_on(node, worker)
                raw.send(c.sub(topic, "ch"))
                ftype, data = await raw.frame()
                if (ftype, data) == (FRAME_RESPONSE, b"OK"):
                    return raw
                await raw.close()
                assert time.monotonic() < deadline, data
                await asyncio.sleep(0.05)

        async def go() -> None:
            await publish(node, topic, [b"x"])
            owner = owner_of(topic, 0, 2)
            for first, second in ((owner, other(topic)), (other(topic), owner)):
                one = await subscribed(first)
                two = await raw_on(node, second)
                two.send(c.sub(topic, "ch"))
                err = await two.error()
                assert err.startswith(b"E_TOO_MANY_CHANNEL_CONSUMERS"), err
                assert await two.closed()
                await one.close()
                await (await subscribed(second)).close()

        run(go())
    finally:
        node.stop(signal.SIGKILL)


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_a_compressed_consumer_through_a_proxy(node: NsqdProcess, codec: str) -> None:
    topic = f"packed{codec}"

    async def go() -> None:
        bodies = [b"z%d" % i * 50 for i in range(30)]
        await publish(node, topic, [b"first"])  # the topic exists on its owner
        want = other(topic)
        for _ in range(100):
            got: list[Message] = []
            cons = Consumer(
                topic,
                f"ch{codec}",
                got.append,
                nsqd_tcp_addresses=[f"127.0.0.1:{node.tcp_port}"],
                max_in_flight=7,
                **{codec: True},
            )
            await cons.start()
            await asyncio.to_thread(
                wait_for,
                lambda links=cons._conns: any(k.transport for k in links.values()),
                10,
                "connected",
            )
            link = next(iter(cons._conns.values()))
            port = link.transport.get_extra_info("sockname")[1]
            if await asyncio.to_thread(worker_of, node, port) != want:
                await cons.close()
                continue
            # (a new channel starts at the end of the topic: these are the ones it gets)
            await publish(node, topic, bodies)
            deadline = time.monotonic() + 20
            while len(got) < len(bodies) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await cons.close()
            assert sorted(m.body for m in got if m.body != b"first") == sorted(bodies)
            return
        raise AssertionError("no consumer landed on the worker without the topic")

    run(go())


def test_a_killed_owner_closes_its_proxied_consumers_who_get_the_messages_again(
    node: NsqdProcess,
) -> None:
    topic = next(t for t in (f"k{i}" for i in range(50)) if owner_of(t, 0, 2) == 1)

    async def go() -> None:
        bodies = [b"k%d" % i for i in range(20)]
        # (both channels exist before the publishes: a later channel starts at the end)
        sub = await raw_on(node, 0)
        await sub.subscribe(topic, "ch", rdy=20)
        # an nsqx consumer on its own channel, wherever it landed, connects again
        seen_by_client: list[bytes] = []
        client = Consumer(
            topic,
            "cc",
            lambda m: seen_by_client.append(m.body),
            nsqd_tcp_addresses=[f"127.0.0.1:{node.tcp_port}"],
            reconnect_delay=0.1,
        )
        await client.start()
        await publish(node, topic, bodies)
        got = await sub.messages(20)
        sub.send(b"".join(c.fin(m.id) for m in got[:10]))
        sub.send(c.nop())
        assert await sub.nothing_for(0.2)
        unfinished = {m.body for m in got[10:]}
        before = worker_pids(node)
        os.kill(before[1], signal.SIGKILL)
        assert await sub.closed(10), "the proxied consumer was not closed"
        await asyncio.to_thread(
            wait_for,
            lambda: worker_pids(node).get(1, before[1]) != before[1],
            20,
            "worker 1 restarted",
        )
        # subscribed again through worker 0 once worker 1 is back: the unfinished come
        # again (finished ones may too: at least once)
        deadline = time.monotonic() + 20
        while True:
            again = await raw_on(node, 0)
            again.send(c.sub(topic, "ch") + c.rdy(20))
            try:
                ftype, data = await again.frame()
            except ConnectionError as err:  # the link to worker 1 broke again
                ftype, data = 0, str(err).encode()
            if ftype == FRAME_RESPONSE and data == b"OK":
                break
            await again.close()
            assert time.monotonic() < deadline, data
            await asyncio.sleep(0.1)
        seen: set[bytes] = set()
        while not unfinished <= seen:
            m = await again.message()
            seen.add(m.body)
            again.send(c.fin(m.id))
        await again.close()
        # the nsqx consumer is back too: it gets what is published now
        await publish(node, topic, [b"after"])
        while b"after" not in seen_by_client:
            assert time.monotonic() < deadline + 20, "the nsqx consumer did not come back"
            await asyncio.sleep(0.05)
        await client.close()

    run(go(), timeout=90)
