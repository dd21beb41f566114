"""A consumer over several real nsqd that come and go: RDY invariants, rotation of
scarce RDY, reconnection with exponential backoff, and discovery through a
lookupd-shaped HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import tempfile
from pathlib import Path

import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions

from clienthelp import FakeLookupd, RdyWatcher
from nsqdproc import start_nsqd as start_nsqd_process
from rawnsq import run, start_nsqd, wait_for


def addr(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


async def restart(port: int) -> NSQD:
    """A new nsqd on the port an earlier one had (as a restarted daemon would be)."""
    options = NsqdOptions(
        tcp_address=f"127.0.0.1:{port}",
        http_address="",
        data_path=tempfile.mkdtemp(prefix="nsqx-test-"),
    )
    nsqd = NSQD(options)
    await nsqd.start()
    return nsqd


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(address) as p:
        await p.multi_publish(topic, bodies)


class Feeder:
    """Publishes a message to every live nsqd every few milliseconds."""

    def __init__(self, nodes: dict[str, NSQD | None], topic: str) -> None:
        self.nodes = nodes
        self.topic = topic
        self.sent = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        producers: dict[str, Producer] = {}
        try:
            while True:
                for key, nsqd in self.nodes.items():
                    if nsqd is None:
                        continue
                    # A bounded handshake: a connection that CPython's asyncio accepts
                    # just as the nsqd's server closes is never attached to a protocol
                    # (Server._attach asserts) and never closed; unbounded, the
                    # producer would wait on its IDENTIFY for the default read_timeout (60 s).
                    p = producers.setdefault(
                        key,
                        Producer(
                            key, reconnect_delay=0.01, read_timeout=2.0, heartbeat_interval=1.0
                        ),
                    )
                    with contextlib.suppress(Exception):
                        await p.publish(self.topic, b"x%d" % self.sent)
                        self.sent += 1
                await asyncio.sleep(0.002)
        finally:
            for p in producers.values():
                await p.close()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.mark.parametrize("max_in_flight", [2, 9])
def test_rdy_invariants_while_nsqd_come_and_go(
    monkeypatch: pytest.MonkeyPatch, max_in_flight: int
) -> None:
    """Three nsqd, two of them restarted (one twice): every RDY sent keeps the sum of
    the live connections' counts <= max_in_flight, and consumption goes on."""

    async def body() -> None:
        nodes = [await start_nsqd() for _ in range(3)]
        keys = [addr(n) for n in nodes]
        live: dict[str, NSQD | None] = dict(zip(keys, nodes, strict=True))
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=keys,
            max_in_flight=max_in_flight,
            reconnect_delay=0.02,
            max_reconnect_delay=0.1,
            low_rdy_idle_timeout=0.05,
            low_rdy_timeout=0.1,
            rdy_redistribute_interval=0.02,
        )
        watcher = RdyWatcher(c).install(monkeypatch)
        feeder = Feeder(live, "t")
        async with c:
            await wait_for(lambda: len(c.connections) == 3, what="3 connections")

            async def bounce(*which: int) -> None:
                for i in which:
                    old = live[keys[i]]
                    assert old is not None
                    live[keys[i]] = None
                    await old.close()
                await wait_for(lambda: len(c.connections) == 3 - len(which), what="drop")
                for i in which:
                    live[keys[i]] = await restart(int(keys[i].rsplit(":", 1)[1]))
                await wait_for(lambda: len(c.connections) == 3, what="reconnect")
                mark = len(got)
                await wait_for(lambda: len(got) > mark + 20, what="consumption goes on")

            await bounce(1)
            await bounce(0, 2)
            await bounce(1)
        await feeder.stop()
        for n in live.values():
            if n is not None:
                await n.close()
        assert watcher.errors == []
        assert watcher.sent > 10
        assert watcher.max_sum <= max_in_flight

    run(body(), timeout=90)


def test_scarce_rdy_rotates_to_every_nsqd(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_in_flight 1 over 3 nsqd: RDY moves around until every nsqd's messages are read."""

    async def body() -> None:
        nodes = [await start_nsqd() for _ in range(3)]
        for i, n in enumerate(nodes):
            await publish(addr(n), "t", [b"%d-%d" % (i, j) for j in range(5)])
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=[addr(n) for n in nodes],
            max_in_flight=1,
            low_rdy_idle_timeout=0.05,
            low_rdy_timeout=0.1,
            rdy_redistribute_interval=0.02,
        )
        watcher = RdyWatcher(c).install(monkeypatch)
        async with c:
            await wait_for(lambda: len(got) == 15, what="every nsqd's messages")
        assert {b.split(b"-")[0] for b in got} == {b"0", b"1", b"2"}
        assert watcher.errors == [] and watcher.max_sum == 1
        for n in nodes:
            await n.close()

    run(body())


def test_reconnects_with_exponential_backoff(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nsqx.client")

    async def body() -> None:
        nsqd = await start_nsqd()
        key = addr(nsqd)
        port = int(key.rsplit(":", 1)[1])
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=[key],
            reconnect_delay=0.01,
            max_reconnect_delay=0.08,
        )
        async with c:
            await wait_for(lambda: len(c.connections) == 1, what="connected")
            await nsqd.close()

            def delays() -> list[float]:
                return [
                    float(m.group(1))
                    for r in caplog.records
                    if (m := re.search(r"reconnecting in ([\d.e-]+)s", r.getMessage()))
                ]

            await wait_for(lambda: len(delays()) >= 6, what="6 failed attempts")
            assert delays()[:6] == [0.01, 0.02, 0.04, 0.08, 0.08, 0.08]
            nsqd = await restart(port)
            await wait_for(lambda: len(c.connections) == 1, what="reconnected")
            await publish(key, "t", [b"after"])
            await wait_for(lambda: got == [b"after"], what="a message after the restart")
        await nsqd.close()

    run(body())


def test_survives_a_killed_nsqd_process(tmp_path: Path) -> None:
    """A real `nsqx nsqd` process SIGKILLed and started again on its port."""
    first = start_nsqd_process(tmp_path / "a")
    port = first.tcp_port
    procs = [first]

    async def body() -> None:
        key = f"127.0.0.1:{port}"
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=[key],
            max_in_flight=10,
            reconnect_delay=0.02,
            max_reconnect_delay=0.1,
        )
        async with c:
            await publish(key, "t", [b"before"])
            await wait_for(lambda: got == [b"before"], what="first message")
            first.stop(signal.SIGKILL)
            await wait_for(lambda: not c.connections, what="connection lost")
            second = await asyncio.to_thread(
                start_nsqd_process, tmp_path / "b", f"--tcp-address=127.0.0.1:{port}"
            )
            procs.append(second)
            await wait_for(lambda: len(c.connections) == 1, what="reconnected")
            await publish(key, "t", [b"after"])
            await wait_for(lambda: got == [b"before", b"after"], what="after the restart")

    try:
        run(body())
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)


def test_discovers_new_nsqd_and_forgets_vanished_ones() -> None:
    async def body() -> None:
        a, b = await start_nsqd(), await start_nsqd()
        lookupd = await FakeLookupd().start()
        lookupd.set("t", a.tcp_address)  # type: ignore[arg-type]
        await publish(addr(a), "t", [b"from-a"])
        await publish(addr(b), "t", [b"from-b"])
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            lookupd_http_addresses=[lookupd.address],
            lookupd_poll_interval=0.02,
            max_in_flight=10,
        )
        async with c:
            # the first poll happens in start()
            assert c.connections == [addr(a)]
            await wait_for(lambda: got == [b"from-a"], what="a's message")
            lookupd.set("t", a.tcp_address, b.tcp_address)  # type: ignore[arg-type]
            await wait_for(lambda: len(c.connections) == 2, what="b discovered")
            await wait_for(lambda: sorted(got) == [b"from-a", b"from-b"], what="b's message")
            # a leaves lookupd and goes away; a new nsqd on its port is not reconnected
            lookupd.set("t", b.tcp_address)  # type: ignore[arg-type]
            port_a = a.tcp_address[1]  # type: ignore[index]
            await wait_for(lambda: lookupd.requests > 3, what="polls")
            await a.close()
            await wait_for(lambda: c.connections == [addr(b)], what="a dropped")
            a = await restart(port_a)
            seen = lookupd.requests
            await wait_for(lambda: lookupd.requests >= seen + 5, what="more polls")
            assert c.connections == [addr(b)]
            # listed again: connected again at the next poll
            lookupd.set("t", a.tcp_address, b.tcp_address)  # type: ignore[arg-type]
            await wait_for(lambda: len(c.connections) == 2, what="a rediscovered")
        await lookupd.close()
        await a.close()
        await b.close()

    run(body())


def test_unions_every_lookupd_and_survives_their_failures() -> None:
    async def body() -> None:
        a, b = await start_nsqd(), await start_nsqd()
        l1, l2 = await FakeLookupd().start(), await FakeLookupd().start()
        l1.set("t", a.tcp_address)  # type: ignore[arg-type]
        l2.set("t", b.tcp_address)  # type: ignore[arg-type]
        l2.envelope = True  # pre-1.0 lookupd answers {"status_code":..,"data":{...}}
        c = Consumer(
            "t",
            "c",
            lambda m: None,
            lookupd_http_addresses=[l1.address, f"http://{l2.address}/lookup"],
            lookupd_poll_interval=0.02,
        )
        async with c:
            assert sorted(c.connections) == sorted([addr(a), addr(b)])
            # both lookupds fail: nothing is forgotten, nothing breaks
            l1.status = l2.status = 500
            seen = l1.requests
            await wait_for(lambda: l1.requests >= seen + 3, what="failed polls")
            assert len(c.connections) == 2
        for x in (l1, l2):
            await x.close()
        await a.close()
        await b.close()

    run(body())


def test_topic_unknown_to_lookupd_then_created() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        lookupd = await FakeLookupd().start()
        got: list[Message] = []
        c = Consumer(
            "t",
            "c",
            got.append,
            lookupd_http_addresses=lookupd.address,
            lookupd_poll_interval=0.02,
        )
        async with c:
            assert c.connections == []  # 404 TOPIC_NOT_FOUND: nothing to connect to
            lookupd.set("t", nsqd.tcp_address)  # type: ignore[arg-type]
            await wait_for(lambda: len(c.connections) == 1, what="discovered")
        await lookupd.close()
        await nsqd.close()

    run(body())
