"""The client with our own nsqlookupd and nsqd HTTP API (real asyncio servers in the
test's event loop, on free loopback ports)."""

from __future__ import annotations

import pytest

from nsqx.client import Consumer, HttpProducer, Producer, PublishError
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions
from nsqx.nsqd.nsqd import NSQD

from rawnsq import run, start_nsqd, wait_for


async def start_lookupd() -> NSQLookupd:
    lk = NSQLookupd(
        LookupdOptions(
            tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"
        )
    )
    await lk.start()
    return lk


async def registered_nsqd(lk: NSQLookupd) -> NSQD:
    return await start_nsqd(
        broadcast_address="127.0.0.1", nsqlookupd_tcp_addresses=[f"127.0.0.1:{lk.tcp_port}"]
    )


def addr(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


def test_discovery_through_our_nsqlookupd() -> None:
    """nsqd registers its topics with nsqlookupd; the consumer finds each nsqd that has
    the topic, and stops reconnecting to one that went away."""

    async def body() -> None:
        lk = await start_lookupd()
        a, b = await registered_nsqd(lk), await registered_nsqd(lk)
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            lookupd_http_addresses=[f"127.0.0.1:{lk.http_port}"],
            lookupd_poll_interval=0.05,
            max_in_flight=10,
        )
        async with Producer(addr(a)) as pa, Producer(addr(b)) as pb, c:
            await pa.publish("t", b"from-a")
            await wait_for(lambda: c.connections == [addr(a)], what="a discovered")
            await wait_for(lambda: got == [b"from-a"], what="a's message")
            await pb.publish("t", b"from-b")
            await wait_for(lambda: len(c.connections) == 2, what="b discovered")
            await wait_for(lambda: sorted(got) == [b"from-a", b"from-b"], what="b's message")
            await a.close()
            await wait_for(lambda: c.connections == [addr(b)], what="a gone")
            port_a = a.tcp_address[1]  # type: ignore[index]

            def a_unregistered() -> bool:
                # lookupd drops what an nsqd registered once its connection closes
                return all(
                    p.peer.info.tcp_port != port_a for p in lk.db.find_producers("topic", "t", "")
                )

            await wait_for(a_unregistered, what="a unregistered")
            assert c.connections == [addr(b)]
        await b.close()
        await lk.close()

    run(body())


def test_http_producer_with_our_nsqd() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0", max_msg_size=1000)
        assert nsqd.http_address is not None
        async with HttpProducer(f"127.0.0.1:{nsqd.http_address[1]}") as p:
            await p.publish("t", b"one")
            await p.multi_publish("t", [b"two", b"three\nwith a newline"])
            await p.deferred_publish("t", b"later", 0.05)
            with pytest.raises(PublishError) as info:
                await p.publish("t", b"x" * 2000)
            assert info.value.code == "MSG_TOO_BIG"
        got: list[bytes] = []
        async with Consumer(
            "t", "c", lambda m: got.append(m.body), nsqd_tcp_addresses=addr(nsqd), max_in_flight=10
        ):
            await wait_for(lambda: len(got) == 4, what="4 messages")
        assert sorted(got) == [b"later", b"one", b"three\nwith a newline", b"two"]
        await nsqd.close()

    run(body())
