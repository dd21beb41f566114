"""Youzan's extensions through the client, against real in-process nsqd (TCP and HTTP)
and a lookupd that answers Youzan's /lookup shape: keyed publishing on go-nsq's
partitions, ordered consumption across partitions, trace answers read back, ext
headers, replay from a time, an offset or a count, and retries when a partition moves."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import random
import socket
import struct
import threading
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nsqx.client import (
    BlockingConsumer,
    BlockingProducer,
    Consumer,
    Message,
    OrderError,
    PartitionProducer,
    Producer,
    PublishError,
    TraceResult,
    partition_for_key,
    set_channel_offset,
    start_at_count,
    start_at_end,
    start_at_offset,
    start_at_time,
)
from nsqx.nsqd.nsqd import NSQD

from rawnsq import run, start_nsqd, wait_for

# -- helpers: a lookupd in Youzan's shape, partitions made through nsqd's HTTP API ------


async def start_http_nsqd(**opts: Any) -> NSQD:
    """An in-process nsqd with its HTTP API, both on free loopback ports."""
    return await start_nsqd(http_address="127.0.0.1:0", **opts)


def tcp(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    return f"{nsqd.tcp_address[0]}:{nsqd.tcp_address[1]}"


def http(nsqd: NSQD) -> str:
    assert nsqd.http_address is not None
    return f"{nsqd.http_address[0]}:{nsqd.http_address[1]}"


async def post(nsqd: NSQD, path: str, data: bytes = b"") -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(f"http://{http(nsqd)}{path}", data=data) as r:
        return r.status, await r.read()


async def create(
    nsqd: NSQD, topic: str, partition_num: int, partitions: list[int] | None = None, **params: str
) -> None:
    """Partitions of ``topic`` on ``nsqd`` (all of them unless ``partitions``)."""
    extra = "".join(f"&{k}={v}" for k, v in params.items())
    for p in range(partition_num) if partitions is None else partitions:
        url = f"/topic/create?topic={topic}&partition={p}&partition_num={partition_num}{extra}"
        assert await post(nsqd, url) == (200, b"")


def peer(nsqd: NSQD) -> dict[str, Any]:
    """A PeerInfo as Youzan's nsqlookupd writes it."""
    assert nsqd.tcp_address is not None and nsqd.http_address is not None
    host, port = nsqd.tcp_address
    return {
        "id": f"{host}:{port}",
        "remote_address": f"{host}:{port + 10000}",
        "hostname": "test",
        "broadcast_address": host,
        "tcp_port": port,
        "http_port": nsqd.http_address[1],
        "version": "1.3.0-nsqx",
        "distributed_id": f"{host}:{port}",
    }


class YouzanLookupd:
    """An HTTP server answering /lookup in Youzan's shape: ``{channels, meta, producers,
    partitions}``, with what the test set (and may change) for each topic."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Any]] = {}
        self.queries: list[dict[str, str]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(
        self,
        topic: str,
        partitions: dict[int, NSQD],
        *,
        partition_num: int | None = None,
        producers: list[NSQD] | None = None,
        **meta: Any,
    ) -> None:
        nodes = (
            producers
            if producers is not None
            else list({id(n): n for n in partitions.values()}.values())
        )
        self.answers[topic] = {
            "channels": [],
            "meta": {
                "partition_num": partition_num if partition_num is not None else len(partitions),
                "replica": 1,
                "extend_support": False,
                "ordered": False,
                "multi_part": False,
                "disable_channel_auto_create": False,
                **meta,
            },
            "partitions": {str(p): peer(n) for p, n in sorted(partitions.items())},
            "producers": [peer(n) for n in nodes],
        }

    async def start(self) -> YouzanLookupd:
        app = web.Application()
        app.router.add_get("/lookup", self._lookup)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def _lookup(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        topic = request.query.get("topic", "")
        answer = self.answers.get(topic)
        if answer is None:
            answer = {
                "channels": [],
                "meta": {"partition_num": 0},
                "partitions": {},
                "producers": [],
            }
        if request.headers.get("Accept") != "application/vnd.nsq; version=1.0":
            answer = {"status_code": 200, "status_txt": "OK", "data": answer}
        return web.json_response(answer)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# -- tests ----------------------------------------------------------------------------


async def drain(consumer: Consumer, n: int, timeout: float = 10) -> list[Message]:
    """The next ``n`` messages of a consumer without a handler, each finished."""
    got: list[Message] = []

    async def take() -> None:
        async for msg in consumer:
            msg.finish()
            got.append(msg)
            if len(got) == n:
                return

    await asyncio.wait_for(take(), timeout)
    return got


def test_keyed_publishing_lands_on_go_nsqs_partition() -> None:
    async def body() -> None:
        nsqd = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        await create(nsqd, "k", 3)
        lookupd.set("k", {0: nsqd, 1: nsqd, 2: nsqd})
        # worked out from murmur3 vectors (test_client_sharding): hash % 3
        expected = {
            "hello": 1,
            "hello, world": 0,
            "The quick brown fox jumps over the lazy dog.": 2,
        }
        async with PartitionProducer(lookupd.address) as producer:
            for key, partition in expected.items():
                assert partition_for_key(key, 3) == partition
                for i in range(3):
                    r = await producer.publish_trace("k", b"%s/%d" % (key.encode(), i), 5, key=key)
                    assert r.partition == partition and r.trace_id == 5
                await producer.publish("k", b"plain", key=key.encode())
            # an explicit partition, and turns without either
            r = await producer.publish_trace("k", b"p2", 1, partition=2)
            assert r.partition == 2
            for _ in range(3):
                await producer.publish("k", b"any")
            with pytest.raises(ValueError):
                await producer.publish("k", b"x", partition=3)
        assert {q["access"] for q in lookupd.queries} == {"w"}
        assert all(q["metainfo"] == "true" for q in lookupd.queries)
        # read every partition back: keys on their partition, in publish order
        async with Consumer(
            "k",
            "check",
            lookupd_http_addresses=[lookupd.address],
            max_in_flight=10,
            start=start_at_count(0),
        ) as consumer:
            msgs = await drain(consumer, 3 * 4 + 1 + 3)
        by_part: dict[int, list[bytes]] = collections.defaultdict(list)
        for m in msgs:
            assert m.partition is not None and m.internal_id >> 50 == m.partition
            by_part[m.partition].append(m.body)
        for key, partition in expected.items():
            mine = [b for b in by_part[partition] if b.startswith(key.encode())]
            assert mine == [b"%s/%d" % (key.encode(), i) for i in range(3)]
        assert by_part[2].count(b"any") == by_part[0].count(b"any") == by_part[1].count(b"any") == 1
        await lookupd.close()
        await nsqd.close()

    run(body())


def test_ordered_consumer_keeps_per_key_order_under_req_and_restart() -> None:
    """4 partitions, 3 producers each publishing its keys in sequence, an ordered
    consumer whose coroutine handler requeues (REQ 0) some first deliveries, stopped
    half-way and started again: every key's messages are handled in publish order,
    one handler call at a time per partition."""

    async def body() -> None:
        nsqd = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        await create(nsqd, "o", 4, orderedmulti="true")
        lookupd.set("o", dict.fromkeys(range(4), nsqd), ordered=True)
        keys = [f"user-{i}" for i in range(12)]
        per_key = 15
        total = len(keys) * per_key

        async def produce(mine: list[str]) -> None:
            async with PartitionProducer(lookupd.address) as p:
                for i in range(per_key):
                    for key in mine:
                        await p.publish("o", f"{key}:{i}".encode(), key=key)

        async with PartitionProducer(lookupd.address) as p:
            with pytest.raises(ValueError, match="ordered"):
                await p.publish("o", b"no key")  # which partition? nsqd would refuse it too
        producing = asyncio.gather(*(produce(keys[j::3]) for j in range(3)))
        handled: dict[str, list[int]] = collections.defaultdict(list)
        active: collections.Counter[int] = collections.Counter()
        overlap: list[int] = []
        rng = random.Random(7)
        done = asyncio.Event()

        async def handle(msg: Message) -> Any:
            assert msg.partition is not None and msg.offset >= 0
            active[msg.partition] += 1
            if active[msg.partition] > 1:
                overlap.append(msg.partition)
            try:
                await asyncio.sleep(0)
                if msg.attempts == 1 and rng.random() < 0.2:
                    msg.requeue(0, backoff=False)  # REQ 0: the same message comes back
                    return None
                key, _, seq = msg.body.decode().partition(":")
                assert partition_for_key(key, 4) == msg.partition
                handled[key].append(int(seq))
                if sum(map(len, handled.values())) >= total:
                    done.set()
                return None
            finally:
                active[msg.partition] -= 1

        def consumer() -> Consumer:
            return Consumer(
                "o",
                "ch",
                handle,
                lookupd_http_addresses=[lookupd.address],
                enable_ordered=True,
                ordered_check="raise",
                max_in_flight=8,
                lookupd_poll_interval=0.05,
            )

        first = consumer()
        await first.start()
        assert sorted(first.connections) == [f"{tcp(nsqd)}/{p}" for p in range(4)]
        await wait_for(lambda: sum(map(len, handled.values())) >= total // 3, what="first third")
        await first.close()  # a consumer restart
        await first.wait_closed()
        second = consumer()
        await second.start()
        await producing
        await asyncio.wait_for(done.wait(), 30)
        await second.close()
        await second.wait_closed()  # raises OrderError if offsets went backwards
        assert not overlap
        for key in keys:
            seqs = handled[key]
            # in order; a message handled again after the restart may repeat
            assert sorted(set(seqs)) == list(range(per_key)), (key, seqs)
            assert all(b >= a for a, b in itertools.pairwise(seqs)), (key, seqs)
        await lookupd.close()
        await nsqd.close()

    run(body(), timeout=90)


def test_ordered_consumer_times_out_and_checks_offsets(caplog: pytest.LogCaptureFixture) -> None:
    """A message left unanswered comes back after msg_timeout (the same offset: not an
    order violation); a channel moved back makes offsets go backwards: logged, or the
    consumer stops with OrderError."""

    async def body() -> None:
        nsqd = await start_http_nsqd(msg_timeout=1.0)
        await create(nsqd, "ot", 2, orderedmulti="true")
        async with Producer(tcp(nsqd)) as p:
            for i in range(4):
                await p.publish("ot", b"m%d" % i, partition=1)
        seen: list[tuple[bytes, int]] = []

        def hold_first(msg: Message) -> None:
            seen.append((msg.body, msg.attempts))
            if msg.attempts == 1 and msg.body == b"m0":
                msg.enable_async()  # never answered: nsqd times it out

        consumer = Consumer(
            "ot",
            "ch",
            hold_first,
            nsqd_tcp_addresses=[tcp(nsqd)],
            partitions=[0, 1],
            enable_ordered=True,
            msg_timeout=1.0,
            max_in_flight=2,
        )
        await consumer.start()
        await wait_for(lambda: len(seen) == 5, timeout=15, what="redelivery")
        # the first m0 stays unanswered as far as the consumer knows: do not wait for it
        await consumer.close(timeout=0.1)
        assert seen == [(b"m0", 1), (b"m0", 2), (b"m1", 1), (b"m2", 1), (b"m3", 1)]

        # the channel moved back to its first message: logged, then consumed again
        again: list[bytes] = []
        consumer = Consumer(
            "ot",
            "ch",
            lambda m: again.append(m.body),
            nsqd_tcp_addresses=[tcp(nsqd)],
            partitions=1,
            enable_ordered=True,
            max_in_flight=1,
        )
        async with consumer:
            async with Producer(tcp(nsqd)) as p:
                await p.publish("ot", b"m4", partition=1)
            await wait_for(lambda: again == [b"m4"], what="m4")
            with caplog.at_level(logging.ERROR, "nsqx.client"):
                await set_channel_offset(http(nsqd), "ot", "ch", 1, start_at_count(0))
                await wait_for(lambda: len(again) == 6, what="replay")
        assert again == [b"m4", b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert any("out of order" in r.getMessage() for r in caplog.records)

        # ordered_check="raise": the consumer stops with OrderError
        strict = Consumer(
            "ot",
            "ch",
            lambda m: None,
            nsqd_tcp_addresses=[tcp(nsqd)],
            partitions=1,
            enable_ordered=True,
            ordered_check="raise",
        )
        await strict.start()
        async with Producer(tcp(nsqd)) as p:
            await p.publish("ot", b"m5", partition=1)
        ch = nsqd.topics["ot"].partitions[1].channels["ch"]
        await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0, what="m5 done")
        await set_channel_offset(http(nsqd), "ot", "ch", 1, start_at_count(2))
        with pytest.raises(OrderError, match="partition 1"):
            await asyncio.wait_for(strict.wait_closed(), 10)
        await nsqd.close()

    run(body())


def test_trace_answers_match_what_is_read_back() -> None:
    async def body() -> None:
        nsqd = await start_http_nsqd()
        await create(nsqd, "tr", 2)
        async with Producer(tcp(nsqd)) as p:
            one = await p.publish_trace("tr", b"hello", 777, partition=1)
            batch = await p.multi_publish_trace("tr", [b"a", b"bb"], [5, 6], partition=1)
            plain = await p.publish("tr", b"plain", partition=1)
            assert plain is None
        assert isinstance(one, TraceResult) and one.partition == 1 and one.trace_id == 777
        assert batch.trace_id == 0 and batch.id == one.id + 1 and batch.offset > one.offset
        async with Consumer(
            "tr",
            "ch",
            nsqd_tcp_addresses=[tcp(nsqd)],
            partitions=[1],
            start=start_at_count(0),
            max_in_flight=5,
        ) as consumer:
            got = await drain(consumer, 4)
        assert [(m.internal_id, m.trace_id, m.offset, m.raw_size) for m in got[:1]] == [
            (one.id, 777, one.offset, one.raw_size)
        ]
        assert [(m.internal_id, m.trace_id) for m in got[1:3]] == [(batch.id, 5), (batch.id + 1, 6)]
        assert got[1].offset == batch.offset
        assert got[1].raw_size + got[2].raw_size == batch.raw_size
        assert got[2].offset == got[1].offset + got[1].raw_size
        assert got[3].body == b"plain" and got[3].trace_id == 0
        assert all(m.partition == 1 for m in got)
        await nsqd.close()

    run(body())


def test_ext_headers_round_trip() -> None:
    async def body() -> None:
        nsqd = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        await create(nsqd, "e", 1, extend="true")
        lookupd.set("e", {0: nsqd}, extend_support=True)
        for ch in ("all", "red", "direct"):
            assert await post(nsqd, f"/channel/create?topic=e&channel={ch}") == (200, b"")
        async with PartitionProducer(lookupd.address) as p:
            r = await p.publish_ext("e", b"m0", {"k": "a", "n": 1}, tag="red", trace_id=42)
            assert isinstance(r, TraceResult) and r.trace_id == 42
            assert await p.publish_ext("e", b"m1", {"k": "b"}) is None
            await p.multi_publish_ext("e", [b"m2", b"m3"], [{"k": "c"}, None])
            with pytest.raises(ValueError):
                await p.publish_ext("e", b"x", {"##mine": 1})
        async with Producer(tcp(nsqd)) as direct:
            # nsqd's own answer to a bad header: the connection stays usable
            with pytest.raises(PublishError, match="E_EXT_NOT_SUPPORT"):
                await direct.publish_ext("plain-topic", b"x", {"k": "v"})
            await direct.publish("plain-topic", b"fine")
        # the lookup's meta turns extend_support on (as go-nsq)
        async with Consumer(
            "e", "all", lookupd_http_addresses=[lookupd.address], max_in_flight=4
        ) as c:
            got = await drain(c, 4)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
        assert got[0].ext_header == {
            "k": "a",
            "n": 1,
            "##client_dispatch_tag": "red",
            "##trace_id": "42",
        }
        assert got[0].tag == "red" and got[0].trace_id == 42 and got[0].ext_ver == 4
        assert got[1].ext_header == {"k": "b"} and got[1].tag == ""
        assert got[3].ext_header == {}
        # desired_tag: the tagged message goes to the consumer that asks for it
        async with Consumer(
            "e", "red", nsqd_tcp_addresses=[tcp(nsqd)], desired_tag="red", max_in_flight=4
        ) as c:
            (tagged,) = await drain(c, 1)
        assert tagged.body == b"m0"
        # by address: nsqd's E_SUB_EXTEND_NEED tells the consumer to IDENTIFY with it;
        # an ext filter keeps one message. (The filter matches the first message: nsqd
        # stalls a channel whose client has RDY 1 when its next message is filtered
        # out; reported.)
        channel = nsqd.topics["e"].partitions[0].channels["direct"]
        async with Consumer(
            "e",
            "direct",
            nsqd_tcp_addresses=[tcp(nsqd)],
            max_in_flight=4,
            ext_filter={"type": 1, "filter_ext_key": "k", "filter_data": "a"},
        ) as c:
            (filtered,) = await drain(c, 1)
            await wait_for(lambda: channel.filtered_count == 3, what="the others filtered")
        assert filtered.body == b"m0" and filtered.ext_header["k"] == "a"
        await lookupd.close()
        await nsqd.close()

    run(body())


def test_replay_from_a_time_an_offset_a_count_and_the_end() -> None:
    async def body() -> None:
        nsqd = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        await create(nsqd, "r", 2)
        lookupd.set("r", {0: nsqd, 1: nsqd})
        answers: list[TraceResult] = []
        async with PartitionProducer(lookupd.address) as p:
            for i in range(3):
                answers.append(await p.publish_trace("r", b"m%d" % i, i + 1, partition=0))
            # the next messages in a later second (nsqd's positions by time are seconds)
            t0 = int(time.time())
            await wait_for(lambda: int(time.time()) > t0, timeout=3, what="the next second")
            split = int(time.time())
            for i in range(3, 6):
                answers.append(await p.publish_trace("r", b"m%d" % i, i + 1, partition=0))

            async def first(channel: str, start: Any) -> Message:
                async with Consumer(
                    "r",
                    channel,
                    lookupd_http_addresses=[lookupd.address],
                    partitions=[0],
                    start=start,
                ) as c:
                    (m,) = await drain(c, 1)
                return m

            assert (await first("by-time", start_at_time(split))).body == b"m3"
            m = await first("by-offset", start_at_offset(answers[4].offset))
            assert (m.body, m.offset, m.internal_id) == (b"m4", answers[4].offset, answers[4].id)
            # counted from 1, as Youzan's nsqd counts: the second message
            assert (await first("by-count", start_at_count(2))).body == b"m1"
            # per partition: partition 1 from its end, partition 0 from its third message
            async with Consumer(
                "r",
                "mixed",
                lookupd_http_addresses=[lookupd.address],
                start={0: start_at_count(3), 1: start_at_end()},
                max_in_flight=4,
            ) as c:
                await wait_for(lambda: len(c.connections) == 2, what="both partitions")
                await p.publish("r", b"new", partition=1)
                got = await drain(c, 5)
            assert sorted(m.body for m in got) == [b"m2", b"m3", b"m4", b"m5", b"new"]
        await lookupd.close()
        await nsqd.close()

    run(body())


def test_a_moved_partition_is_looked_up_again() -> None:
    """Partition 1 moves from nsqd a to nsqd b: a answers E_TOPIC_NOT_EXIST, the
    producer looks the topic up again (the lookupd's answer changed) and publishes to
    b; the consumer's connection to a ends and it subscribes to b."""

    async def body() -> None:
        a = await start_http_nsqd()
        b = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        await create(a, "mv", 2)
        lookupd.set("mv", {0: a, 1: a})
        key = "hello"  # murmur3 % 2 == 1
        assert partition_for_key(key, 2) == 1
        received: list[Message] = []
        consumer = Consumer(
            "mv",
            "ch",
            received.append,
            lookupd_http_addresses=[lookupd.address],
            lookupd_poll_interval=60,  # only the loss of a connection polls again
            max_in_flight=4,
        )
        await consumer.start()
        async with PartitionProducer(lookupd.address, pub_retry_delay=0.01) as p:
            first = await p.publish_trace("mv", b"before", 1, key=key)
            assert first.partition == 1
            await wait_for(lambda: len(received) == 1, what="before")
            # the move: partition 1 now lives on b
            assert await post(a, "/topic/delete?topic=mv&partition=1") == (200, b"")
            await create(b, "mv", 2, partitions=[1])
            lookupd.set("mv", {0: a, 1: b})
            moved = await p.publish_trace("mv", b"after", 2, key=key)
            assert moved.partition == 1
            assert b.topics["mv"].partitions[1] is not None
            await wait_for(
                lambda: f"{tcp(b)}/1" in consumer.connections, timeout=10, what="resubscribed"
            )
            await wait_for(lambda: len(received) == 2, what="after")
        assert [m.body for m in received] == [b"before", b"after"]
        assert received[1].partition == 1
        await consumer.close()
        await lookupd.close()
        await a.close()
        await b.close()

    run(body())


class NotLeader:
    """An nsqd-shaped server that refuses every publish with E_FAILED_ON_NOT_LEADER
    (a partition whose leadership moved), answering in order as Youzan's nsqd does."""

    def __init__(self) -> None:
        self.publishes = 0
        self.closed = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> NotLeader:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        def frame(ftype: int, data: bytes) -> bytes:
            return struct.pack(">ii", len(data) + 4, ftype) + data

        try:
            assert await r.readexactly(4) == b"  V2"
            while True:
                line = await r.readline()
                if not line:
                    break
                verb = line.split()[0]
                if verb in (b"IDENTIFY", b"PUB", b"PUB_TRACE", b"MPUB"):
                    (size,) = struct.unpack(">i", await r.readexactly(4))
                    await r.readexactly(size)
                if verb == b"IDENTIFY":
                    w.write(frame(0, b"OK"))
                elif verb.startswith((b"PUB", b"MPUB")):
                    self.publishes += 1
                    w.write(frame(1, b"E_FAILED_ON_NOT_LEADER not leader"))
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            w.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


def test_not_leader_retires_the_connection_and_retries_elsewhere() -> None:
    async def body() -> None:
        nsqd = await start_http_nsqd()
        stale = await NotLeader().start()
        await create(nsqd, "nl", 1)
        lookupd = await YouzanLookupd().start()
        lookupd.set("nl", {0: nsqd})
        # the first answer points at the old leader
        real = lookupd.answers["nl"]
        old = {**real, "partitions": {"0": {**real["partitions"]["0"], "tcp_port": stale.port}}}
        lookupd.answers["nl"] = old

        async def fix_lookupd_after_first_query() -> None:
            await wait_for(lambda: len(lookupd.queries) >= 1, what="first lookup")
            lookupd.answers["nl"] = real

        fixing = asyncio.ensure_future(fix_lookupd_after_first_query())
        async with PartitionProducer(lookupd.address, pub_retry_delay=0.01) as p:
            results = await asyncio.gather(
                *(p.publish_trace("nl", b"m%d" % i, i + 1) for i in range(5))
            )
        await fixing
        assert sorted(r.trace_id for r in results) == [1, 2, 3, 4, 5]
        assert stale.publishes == 5  # each answered once, none twice
        await asyncio.wait_for(stale.closed.wait(), 5)  # retired, then closed
        # without retries the error comes through as nsqd's
        lookupd.answers["nl"] = old
        async with PartitionProducer(lookupd.address, pub_max_retry=0) as p:
            with pytest.raises(PublishError, match="E_FAILED_ON_NOT_LEADER"):
                await p.publish("nl", b"x")
        await stale.close()
        await lookupd.close()
        await nsqd.close()

    run(body())


def test_plain_topics_stay_nsq_13() -> None:
    """A one-partition topic in Youzan's lookup shape is consumed with NSQ 1.3's SUB
    (hex ids), and published without a partition if the lookupd lists none."""

    async def body() -> None:
        nsqd = await start_http_nsqd()
        lookupd = await YouzanLookupd().start()
        async with Producer(tcp(nsqd)) as p:
            await p.publish("plain", b"one")
        lookupd.set("plain", {0: nsqd})
        async with Consumer("plain", "ch", lookupd_http_addresses=[lookupd.address]) as c:
            (m,) = await drain(c, 1)
            assert c.connections == [tcp(nsqd)]
        assert m.id == m.hex_id == b"%016x" % m.internal_id and m.partition is None
        # an answer without partitions (NSQ 1.3's lookupd): nsqd in turn, no partition
        lookupd.answers["plain"] = {
            "channels": [],
            "producers": lookupd.answers["plain"]["producers"],
        }
        async with PartitionProducer(lookupd.address) as p:
            await p.publish("plain", b"two", key="any")
        async with Consumer("plain", "ch", lookupd_http_addresses=[lookupd.address]) as c:
            (m,) = await drain(c, 1)
        assert m.body == b"two"
        await lookupd.close()
        await nsqd.close()

    run(body())


def test_blocking_facade_with_partitions() -> None:
    async def setup() -> NSQD:
        nsqd = await start_http_nsqd()
        await create(nsqd, "bf", 2)
        return nsqd

    loop = asyncio.new_event_loop()
    nsqd = loop.run_until_complete(setup())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with BlockingProducer(tcp(nsqd)) as producer:
            r = producer.publish_trace("bf", b"traced", 9, partition=1)
            assert r.partition == 1 and r.trace_id == 9
            producer.publish("bf", b"plain", partition=1)
        with BlockingConsumer(
            "bf",
            "ch",
            nsqd_tcp_addresses=[tcp(nsqd)],
            partitions=[1],
            start=start_at_count(0),
            max_in_flight=2,
        ) as consumer:
            msgs = []
            for m in consumer.messages(timeout=10):
                msgs.append(m)
                m.finish()
                if len(msgs) == 2:
                    break
        assert [(m.body, m.trace_id, m.partition) for m in msgs] == [
            (b"traced", 9, 1),
            (b"plain", 0, 1),
        ]
        assert msgs[0].offset == r.offset and msgs[0].internal_id == r.id
    finally:
        asyncio.run_coroutine_threadsafe(nsqd.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
