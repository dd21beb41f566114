"""nsqx.client and a draining nsqd (docs/drain.md): on the CLOSE_WAIT it did not ask
for, a consumer takes the connection out of its RDY rotation, answers what it holds on
it, closes it, and comes back when the nsqd does. Real nsqd (and nsqlookupd)
processes: one is drained under load, nothing is lost and nothing delivered twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.client.consumer import _Link
from nsqx.client.rdy import RdyController

from lookupdproc import start_lookupd
from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import run, wait_for


def address(nsqd: NsqdProcess) -> str:
    return f"127.0.0.1:{nsqd.tcp_port}"


def logged(nsqd: NsqdProcess, text: str) -> bool:
    return any(text in line for line in nsqd.log)


class Feeder:
    """Publishes to every live nsqd in turn, as fast as they answer; remembers what
    was acknowledged (a publish refused or cut off may or may not be stored)."""

    def __init__(self, nodes: dict[str, NsqdProcess | None], topic: str) -> None:
        self.nodes = nodes
        self.topic = topic
        self.acked: set[bytes] = set()
        self.count = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        producers: dict[str, Producer] = {}
        try:
            while True:
                for key, node in list(self.nodes.items()):
                    if node is None:
                        continue
                    p = producers.get(key)
                    if p is None:
                        p = producers[key] = Producer(
                            key, reconnect_delay=0.01, read_timeout=2.0, heartbeat_interval=1.0
                        )
                    self.count += 1
                    body = b"f-%d" % self.count
                    with contextlib.suppress(Exception):
                        await p.multi_publish(self.topic, [body + b"-%d" % i for i in range(5)])
                        self.acked.update(body + b"-%d" % i for i in range(5))
                await asyncio.sleep(0)
        finally:
            for p in producers.values():
                with contextlib.suppress(Exception):
                    await p.close()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Ledger:
    """Every delivery (body -> attempts of each), and the check that the consumer never
    holds more than max_in_flight messages unanswered while the drain runs."""

    def __init__(self) -> None:
        self.deliveries: dict[bytes, list[int]] = defaultdict(list)
        self.over: list[int] = []

    def record(self, msg: Message) -> None:
        self.deliveries[msg.body].append(msg.attempts)

    def watch_in_flight(self, consumer: Consumer, monkeypatch: pytest.MonkeyPatch) -> None:
        """After each read: the messages held over all connections, draining ones
        included, within max_in_flight (RDY only grows while a node drains here, so
        nsqd never has more out than the consumer allowed)."""
        original = Consumer._on_frames
        ledger = self

        def on_frames(c: Consumer, conn: object, frames: list[tuple[int, bytes]]) -> None:
            original(c, conn, frames)  # type: ignore[arg-type]
            if c is consumer and ledger.checking:
                held = sum(x.state.in_flight for x in c._conns.values() if x.state)
                if held > c.max_in_flight:
                    ledger.over.append(held)

        self.checking = False
        monkeypatch.setattr(Consumer, "_on_frames", on_frames)

    def twice(self) -> dict[bytes, list[int]]:
        return {b: a for b, a in self.deliveries.items() if a != [1]}


def link(consumer: Consumer, key: str) -> _Link | None:
    return consumer._conns.get(key)


def test_sigterm_under_load_moves_the_consumer_without_redelivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nsqd, a consumer on all three holding messages of the first when it is sent
    SIGTERM: told, the consumer answers those, its other connections take the RDY, nsqd
    exits 0 with nothing in flight, and after the restart on the same port the consumer
    reconnects. Every acknowledged message arrives, each once, attempts 1."""

    async def body() -> None:
        nodes = [start_nsqd(tmp_path / f"n{i}", "--drain-timeout=60s") for i in range(3)]
        keys = [address(n) for n in nodes]
        first = keys[0]
        live: dict[str, NsqdProcess | None] = dict(zip(keys, nodes, strict=True))
        ledger = Ledger()
        gate = asyncio.Event()
        holding: list[Message] = []

        async def handler(msg: Message) -> None:
            ledger.record(msg)
            link_ = msg._link
            if link_ is not None and link_.key == first and not gate.is_set():
                holding.append(msg)
                await gate.wait()  # held until nsqd has said it drains
            await asyncio.sleep(random.random() * 0.002)

        c = Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=keys,
            max_in_flight=30,
            reconnect_delay=0.05,
            max_reconnect_delay=0.2,
        )
        ledger.watch_in_flight(c, monkeypatch)
        feeder = Feeder(live, "t")
        async with c:
            await wait_for(lambda: len(c.connections) == 3, what="3 connections")
            ledger.checking = True
            await wait_for(lambda: len(holding) >= 5, what="messages held from the first")
            nodes[0].proc.send_signal(signal.SIGTERM)
            conn = link(c, first)
            assert conn is not None
            await wait_for(lambda: conn.draining, what="the drain notice")
            assert c.rdy.held == conn.state.in_flight > 0  # type: ignore[union-attr]
            assert first not in c.rdy.conns
            gate.set()
            await wait_for(lambda: conn.closed, what="the drained connection to close")
            assert c.rdy.held == 0
            live[first] = None
            assert nodes[0].proc.wait(30) == 0
            assert logged(nodes[0], "NSQ: drained: nothing in flight")
            ledger.checking = False
            # the others go on; then the node comes back where it was
            await wait_for(lambda: len(ledger.deliveries) > len(holding) + 200, what="load")
            nodes[0] = start_nsqd(tmp_path / "n0", f"--tcp-address={first}")
            live[first] = nodes[0]
            await wait_for(lambda: first in c.connections, timeout=20, what="reconnected")
            await wait_for(lambda: len(ledger.deliveries) > len(holding) + 400, what="load")
            await feeder.stop()
            await wait_for(
                lambda: feeder.acked <= set(ledger.deliveries),
                timeout=30,
                what="every acknowledged message",
            )
        assert ledger.twice() == {}
        assert ledger.over == []
        for n in nodes:
            assert n.stop() == 0

    run(body(), timeout=120)


def test_lookupd_consumer_and_http_drain(tmp_path: Path) -> None:
    """POST /drain: nsqlookupd stops listing the node, the consumer (discovering through
    nsqlookupd) answers what it holds there and closes that connection; once the node
    is stopped and started again it registers, is found, and its messages published
    meanwhile arrive. Nothing twice."""

    async def body() -> None:
        lookupd = start_lookupd()
        flags = (
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
            "--http-address=127.0.0.1:0",
        )
        a = start_nsqd(tmp_path / "a", *flags)
        b = start_nsqd(tmp_path / "b", *flags)
        key_a = address(a)
        async with Producer(key_a) as pa, Producer(address(b)) as pb:
            await pa.multi_publish("t", [b"a-%d" % i for i in range(20)])
            await pb.multi_publish("t", [b"b-%d" % i for i in range(20)])
            ledger = Ledger()
            gate = asyncio.Event()
            holding: list[Message] = []

            async def handler(msg: Message) -> None:
                ledger.record(msg)
                if msg.body.startswith(b"a-") and not gate.is_set():
                    holding.append(msg)
                    await gate.wait()

            c = Consumer(
                "t",
                "c",
                handler,
                lookupd_http_addresses=[lookupd.http_address],
                max_in_flight=8,
                lookupd_poll_interval=0.05,
            )
            async with c, aiohttp.ClientSession() as http:
                await wait_for(lambda: len(holding) >= 2, what="messages held from a")
                async with http.post(f"{a.http_url}/drain") as resp:
                    assert resp.status == 200
                    answer = json.loads(await resp.read())
                assert answer["draining"] is True and answer["in_flight"] >= 2
                await wait_for(
                    lambda: len(lookupd.json("/lookup?topic=t")["producers"]) == 1,
                    what="nsqlookupd to forget the draining node",
                )
                conn = link(c, key_a)
                assert conn is not None
                await wait_for(lambda: conn.draining, what="the drain notice")
                await pa.multi_publish("t", [b"a-late-%d" % i for i in range(5)])
                gate.set()
                await wait_for(lambda: conn.closed, what="the drained connection to close")
                await wait_for(
                    lambda: sum(k.startswith(b"b-") for k in ledger.deliveries) == 20,
                    what="b's messages",
                )
                assert key_a not in c.connections
                assert a.stop() == 0  # nothing in flight: no wait
                a = start_nsqd(tmp_path / "a", *flags, f"--tcp-address={key_a}")
                expected = {b"a-%d" % i for i in range(20)} | {b"a-late-%d" % i for i in range(5)}
                expected |= {b"b-%d" % i for i in range(20)}
                await wait_for(
                    lambda: set(ledger.deliveries) == expected,
                    timeout=20,
                    what="a's messages after its restart",
                )
        assert ledger.twice() == {}
        assert a.stop() == 0
        assert b.stop() == 0
        lookupd.stop()

    run(body(), timeout=120)


def test_drain_timeout_with_a_consumer_that_never_answers(tmp_path: Path) -> None:
    """The handler never returns: nsqd closes at its --drain-timeout; the consumer lets
    go of what it held (its budget comes back to the other connection) and the
    messages are delivered again after the restart (attempts 2: the timeout's cost)."""

    async def body() -> None:
        a = start_nsqd(tmp_path / "a", "--drain-timeout=300ms")
        b = start_nsqd(tmp_path / "b")
        key_a = address(a)
        stuck = asyncio.Event()
        seen: list[Message] = []

        async def handler(msg: Message) -> None:
            seen.append(msg)
            if msg.body.startswith(b"a-"):
                await stuck.wait()

        async with Producer(key_a) as pa:
            await pa.multi_publish("t", [b"a-%d" % i for i in range(3)])
        c = Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=[key_a, address(b)],
            max_in_flight=6,
            reconnect_delay=0.05,
            max_reconnect_delay=0.2,
        )
        async with c:
            await wait_for(lambda: sum(m.body.startswith(b"a-") for m in seen) == 3, what="a's 3")
            conn = link(c, key_a)
            assert conn is not None
            a.proc.send_signal(signal.SIGTERM)
            await wait_for(lambda: conn.draining, what="the drain notice")
            assert c.rdy.held == 3
            assert a.proc.wait(30) == 0
            assert logged(a, "drain timeout (0.3s): 3 messages still in flight")
            await wait_for(lambda: conn.closed, what="nsqd to close the connection")
            assert c.rdy.held == 0
            assert c.rdy.total <= c.max_in_flight
            a = start_nsqd(tmp_path / "a", f"--tcp-address={key_a}")
            stuck.set()
            await wait_for(lambda: len(seen) == 6, timeout=20, what="a's 3 again")
        assert sorted(m.attempts for m in seen) == [1, 1, 1, 2, 2, 2]
        assert a.stop() == 0
        assert b.stop() == 0

    run(body(), timeout=120)


# -- the RDY bookkeeping -----------------------------------------------------------------


def test_rdy_held_budget_of_a_draining_connection() -> None:
    """A connection leaving with messages in flight keeps their part of max_in_flight
    until they are answered; the others may grow only into what is free."""
    rdy: RdyController[str] = RdyController(10)
    for key in ("a", "b"):
        rdy.add(key, 2500, 0.0)
    for key in ("a", "b"):
        rdy.received(key, 1, 0.0)
        rdy.maybe_update(key, 0.0)
    assert rdy.conns["a"].rdy == rdy.conns["b"].rdy == 5
    # a drains holding 5: b's share would be 10, but 5 are still out on a
    assert rdy.remove("a", 1.0, hold=5) == []
    assert rdy.held == 5
    assert rdy.maybe_update("b", 1.0) is None
    rdy.check()
    assert rdy.release(2, 1.0) == []  # partly answered: b grows with its next messages
    assert rdy.maybe_update("b", 1.0) == 7  # 10 less the 3 still held
    rdy.check()
    assert rdy.release(3, 1.0) == [("b", 10)]  # all answered: b gets the whole budget
    assert rdy.held == 0
    assert rdy.release(1, 1.0) == []  # (nothing held: nothing to give back)
    rdy.check()
