"""``nsqx nsqd --workers=N --worker-shards``: an NSQ 1.3 topic has one shard per worker.

A topic made implicitly by a client that names no partition gets shards 0..N-1 (shard p
owned by worker ``owner_of(topic, p, N)``, so each worker owns exactly one); a plain
publish is written to the shard of the worker whose connection took it, and a plain SUB
subscribes its one connection to every shard, its RDY a bound over all of them.

Real processes on free loopback ports. Which worker took a connection is read from /proc
(workernode.raw_on / worker_of), and which shard a message came from from its id (the
partition is in the id's high bits, nsqx.nsqd.guid).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nsqx.nsqd.fanin import IDLE_AFTER
from nsqx.nsqd.guid import PARTITION_SHIFT
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.spark import rangeclient
from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_RESPONSE
from workernode import raw_on, start_workers, worker_of, worker_pids

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers need Linux (and /proc here)"
)

HTTP = "--http-address=127.0.0.1:0"


# -- helpers ---------------------------------------------------------------------------


def dump(node: NsqdProcess) -> None:
    """The node's log's tail, for a failed test's captured output."""
    print("".join(node.log[-60:]))


@contextmanager
def logged(node: NsqdProcess, sig: int = signal.SIGTERM) -> Iterator[NsqdProcess]:
    """A test's body against ``node``: the node's log's tail printed if it fails, the
    node stopped (``sig``) either way."""
    try:
        yield node
    except BaseException:
        dump(node)
        raise
    finally:
        node.stop(sig)


def start_sharded(data_path: Path, *args: str) -> NsqdProcess:
    """A node of two workers with --worker-shards and an HTTP address."""
    return start_workers(data_path, "--worker-shards", HTTP, *args)


def shard_of(msg_id: bytes | str) -> int:
    """The partition (shard) a message id belongs to."""
    return int(msg_id, 16) >> PARTITION_SHIFT


def shard_on(topic: str, worker: int, workers: int = 2) -> int:
    """The shard of ``topic`` that ``worker`` owns."""
    (p,) = [p for p in range(workers) if owner_of(topic, p, workers) == worker]
    return p


def topic_entries(node: NsqdProcess, topic: str) -> list[dict[str, Any]]:
    """``topic``'s entries in the node's /stats (one per partition listed)."""
    url = f"{node.http_url}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc: dict[str, Any] = json.load(resp)
    return [t for t in doc.get("topics") or [] if t["topic_name"] == topic]


def http_post(url: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
        body: bytes = r.read()
    return body


def http_body(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body


def shard_stats(node: NsqdProcess, topic: str) -> dict[int, dict[str, Any]]:
    """``topic``'s /stats entries by partition: a sharded topic is one entry, its shards
    under ``shards``; a topic of one partition, that one."""
    entries = topic_entries(node, topic)
    for t in entries:
        if "shards" in t:
            return {int(sh["topic_partition"]): sh for sh in t["shards"]}
    return {int(t.get("topic_partition", 0)): t for t in entries}


def channel_stats(entry: dict[str, Any], channel: str) -> dict[str, Any] | None:
    return next((ch for ch in entry["channels"] if ch["channel_name"] == channel), None)


async def until(
    probe: Callable[[], Any], ok: Callable[[Any], bool], what: str, timeout: float = 15
) -> Any:
    """Poll ``probe`` (blocking, run in a thread) until ``ok`` of its result; that result."""
    deadline = time.monotonic() + timeout
    while True:
        last = await asyncio.to_thread(probe)
        if ok(last):
            return last
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {last}"
        await asyncio.sleep(0.05)


async def make_sharded(node: NsqdProcess, topic: str) -> bytes:
    """Create ``topic`` with one plain publish and wait until /stats lists both shards;
    the body published (it is in the topic)."""
    seed = f"seed-{topic}".encode()
    raw = await Raw.connect(node.tcp_address)
    await raw.publish(topic, seed)
    await raw.close()
    await until(
        lambda: shard_stats(node, topic),
        lambda s: set(s) == {0, 1},
        f"/stats to list {topic}'s shards 0 and 1",
    )
    return seed


async def pub_on(node: NsqdProcess, worker: int, topic: str, bodies: list[bytes]) -> None:
    """PUB ``bodies`` through a connection that landed on ``worker``."""
    raw = await raw_on(node, worker)
    await raw.publish(topic, *bodies)
    await raw.close()


async def subscribed(node: NsqdProcess, topic: str, channel: str, timeout: float = 20) -> Raw:
    """A plain SUB (no partition) answered OK, trying again while a worker comes back."""
    deadline = time.monotonic() + timeout
    while True:
        raw = await Raw.connect(node.tcp_address)
        raw.send(c.sub(topic, channel))
        try:
            ftype, data = await raw.frame()
        except (ConnectionError, AssertionError) as err:
            ftype, data = 0, str(err).encode()
        if (ftype, data) == (FRAME_RESPONSE, b"OK"):
            return raw
        await raw.close()
        assert time.monotonic() < deadline, data
        await asyncio.sleep(0.1)


async def receive_all(
    sub: Raw, want: set[bytes], timeout: float = 20
) -> tuple[list[bytes], set[int]]:
    """Messages (FINed as they come) until every body of ``want`` arrived; the bodies
    in order of arrival and the shards they came from."""
    got: list[bytes] = []
    shards: set[int] = set()
    deadline = time.monotonic() + timeout
    while not want <= set(got):
        left = deadline - time.monotonic()
        assert left > 0, f"missing {sorted(want - set(got))[:10]} of {len(want)}"
        m = await sub.message(timeout=left)
        got.append(m.body)
        shards.add(shard_of(m.id))
        sub.send(c.fin(m.id))
    return got, shards


def rdy_picture(node: NsqdProcess, topic: str, channel: str) -> str:
    """Each shard's channel depth, in flight and its consumers' RDY (for a failure)."""
    out = []
    for p, entry in sorted(shard_stats(node, topic).items()):
        ch = channel_stats(entry, channel)
        if ch is not None:
            clients = [(cl["ready_count"], cl["in_flight_count"]) for cl in ch["clients"] or []]
            out.append(
                f"shard {p}: depth {ch['depth']}, in flight {ch['in_flight_count']},"
                f" consumers (RDY, in flight) {clients}"
            )
    return "; ".join(out)


def dat_topic(data_path: Path, topic: str) -> dict[str, Any]:
    """``topic``'s entry in the node's nsqd.dat."""
    doc: dict[str, Any] = json.loads((data_path / "nsqd.dat").read_text())
    entries: list[dict[str, Any]] = [t for t in doc["topics"] if t["name"] == topic]
    assert len(entries) == 1, entries
    return entries[0]


# -- 1. publishes spread over the shards, consumed once --------------------------------


def test_publishers_of_a_new_topic_publish_where_they_are(tmp_path: Path) -> None:
    """The first publish of each connection races the topic's making (it goes to
    partition 0's owner, which makes it sharded): the connections stay where they are
    and their next publishes land in their own worker's shard, not moved to partition
    0's owner as a forwarded publisher of an unsharded topic is."""
    node = start_sharded(tmp_path)
    topic = "fresh"
    with logged(node):

        async def go() -> None:
            raws = [await raw_on(node, w) for w in (0, 1) for _ in range(4)]
            for i in range(5):  # one at a time: each answer read before the next
                for k, raw in enumerate(raws):
                    await raw.publish(topic, f"c{k}-{i}".encode())
            stats = await asyncio.to_thread(shard_stats, node, topic)
            assert set(stats) == {0, 1}, stats
            for w in (0, 1):
                # all but (at most) each connection's first publish
                assert stats[shard_on(topic, w)]["message_count"] >= 4 * 4, stats
            for raw in raws:
                await raw.close()

        run(go())


def test_publishes_spread_over_the_shards_and_each_is_consumed_once(tmp_path: Path) -> None:
    node = start_sharded(tmp_path)
    topic = "spread"
    per_conn = 8
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            raws = [await Raw.connect(node.tcp_address) for _ in range(16)]
            ports = [r.writer.get_extra_info("sockname")[1] for r in raws]
            landed = {await asyncio.to_thread(worker_of, node, p) for p in ports}
            assert landed == {0, 1}, "16 connections did not land on both workers"
            bodies = {f"c{k}-{i}".encode() for k in range(16) for i in range(per_conn)}
            for k, raw in enumerate(raws):  # all at once, pipelined
                raw.send(b"".join(c.pub(topic, f"c{k}-{i}".encode()) for i in range(per_conn)))
            for raw in raws:
                for _ in range(per_conn):
                    assert await raw.response() == b"OK"
            for raw in raws:
                await raw.close()
            stats = await asyncio.to_thread(shard_stats, node, topic)
            assert set(stats) == {0, 1}, stats
            counts = {p: stats[p]["message_count"] for p in (0, 1)}
            assert counts[0] > 0 and counts[1] > 0, counts
            assert counts[0] + counts[1] == len(bodies) + 1, counts

            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe(topic, "c", rdy=10)
            want = bodies | {seed}
            got, shards = await receive_all(sub, want)
            sub.send(c.nop())
            assert await sub.nothing_for(0.3), "a message came twice"
            assert sorted(got) == sorted(want)
            assert shards == {0, 1}

            def drained(s: dict[int, dict[str, Any]]) -> bool:
                chans = [channel_stats(s[p], "c") for p in (0, 1) if p in s]
                return len(chans) == 2 and all(
                    ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
                    for ch in chans
                )

            await until(lambda: shard_stats(node, topic), drained, "channel c drained")
            await sub.close()

        run(go())


# -- 2. RDY is a bound over every shard ------------------------------------------------


def test_rdy_bounds_the_messages_in_flight_over_all_shards(tmp_path: Path) -> None:
    node = start_sharded(tmp_path)
    topic = "bounded"
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            first = [b"a%d" % i for i in range(3)]
            second = [b"b%d" % i for i in range(3)]
            await pub_on(node, 0, topic, first)
            await pub_on(node, 1, topic, second)
            stats = await asyncio.to_thread(shard_stats, node, topic)
            assert all(stats[p]["message_count"] > 0 for p in (0, 1)), stats

            # RDY 1: one at a time, whichever shard holds the next
            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe(topic, "c", rdy=1)
            want = {seed, *first, *second}
            got: list[bytes] = []
            shards: set[int] = set()
            while len(got) < len(want):
                try:
                    m = await sub.message()
                except AssertionError:
                    raise AssertionError(
                        f"RDY 1, nothing unfinished, {len(want) - len(got)} not delivered:"
                        " none came in 10 s;"
                        f" {await asyncio.to_thread(rdy_picture, node, topic, 'c')}"
                    ) from None
                got.append(m.body)
                shards.add(shard_of(m.id))
                assert await sub.nothing_for(0.4), (
                    f"a second message while {m.body!r} is unfinished with RDY 1"
                )
                sub.send(c.fin(m.id))
            assert sorted(got) == sorted(want)
            assert shards == {0, 1}

            # RDY 3: never more than 3 unfinished
            more = [b"x%d" % i for i in range(6)]
            other = [b"y%d" % i for i in range(6)]
            await pub_on(node, 0, topic, more)
            await pub_on(node, 1, topic, other)
            sub.send(c.rdy(3))
            held: list[Any] = []
            seen: list[bytes] = []
            checks = 0
            while len(seen) < len(more) + len(other):
                if len(held) < 3:
                    try:
                        m = await sub.message()
                    except AssertionError:
                        raise AssertionError(
                            f"RDY 3, {len(held)} unfinished"
                            f" (shards {[shard_of(m.id) for m in held]}),"
                            f" {12 - len(seen)} not delivered: none came in 10 s;"
                            f" {await asyncio.to_thread(rdy_picture, node, topic, 'c')}"
                        ) from None
                    held.append(m)
                    seen.append(m.body)
                    continue
                if checks < 3:  # (each check costs its wait)
                    checks += 1
                    assert await sub.nothing_for(0.4), "a 4th message in flight with RDY 3"
                else:
                    assert not sub.frames, "a 4th message in flight with RDY 3"
                sub.send(c.fin(held.pop(0).id))
            assert sorted(seen) == sorted(more + other)
            assert len(seen) == len(set(seen))
            sub.send(b"".join(c.fin(m.id) for m in held) + c.nop())
            assert await sub.nothing_for(0.3)
            await sub.close()

        run(go())


async def seed_consumed_on_worker_0(node: NsqdProcess, topic: str) -> Raw:
    """``topic`` made sharded, and a consumer of its channel ``c`` on worker 0 that
    consumed the first message (RDY 1)."""
    seed = await make_sharded(node, topic)
    sub = await raw_on(node, 0)
    await sub.subscribe(topic, "c", rdy=1)
    m = await sub.message()
    assert m.body == seed
    sub.send(c.fin(m.id))
    return sub


def test_a_batching_consumer_gets_its_batch_when_rdy_moves_to_another_shard(
    tmp_path: Path,
) -> None:
    """A consumer that FINs only once RDY's worth arrived holds what the other worker's
    shard sent it. When that shard's RDY is taken for this worker's shard's messages,
    what it holds counts for what it is (its owner says so over the link), not for the
    RDY it had: the batch fills from this worker's shard. Before, the other shard's old
    RDY was kept until the messages held were finished, so the batch waited for them to
    time out (here 5 minutes)."""
    node = start_sharded(tmp_path, "--msg-timeout=300s")
    topic = "batches"
    here, there = shard_on(topic, 0), shard_on(topic, 1)
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            sub = await seed_consumed_on_worker_0(node, topic)

            # a batch of 3: 2 come from the other worker's shard and are held
            sub.send(c.rdy(3))
            await pub_on(node, 1, topic, [b"t0", b"t1"])
            held = await sub.messages(2)
            assert {shard_of(m.id) for m in held} == {there}
            # (that shard delivered nothing for a while: all of its RDY may be taken)
            await asyncio.sleep(IDLE_AFTER * 2)
            await pub_on(node, 0, topic, [b"h0", b"h1", b"h2"])
            try:
                third = await sub.message(timeout=10)
            except AssertionError:
                raise AssertionError(
                    "a batch of 3 with 2 held: no third message in 10 s;"
                    f" {await asyncio.to_thread(rdy_picture, node, topic, 'c')}"
                ) from None
            assert shard_of(third.id) == here
            assert await sub.nothing_for(0.3), "a 4th message in flight with RDY 3"
            held.append(third)
            sub.send(b"".join(c.fin(m.id) for m in held))
            rest = await sub.messages(2)
            got = {m.body for m in [*held, *rest]}
            assert got == {b"t0", b"t1", b"h0", b"h1", b"h2"}
            await sub.close()

        run(go())


def test_a_shard_that_ran_out_gives_up_its_ask_for_rdy(tmp_path: Path) -> None:
    """The other worker's shard asks for RDY (messages and no room), then sends what it
    had as the consumer finishes some: it says it has nothing left, so the RDY it holds
    can go to this worker's shard when that one has messages. Before, its old ask stood
    and kept its RDY from the shard that asked next: a consumer that finishes a batch
    of 2 got 1 and waited (found by a random search of consumers)."""
    node = start_sharded(tmp_path, "--msg-timeout=300s")
    topic = "asks"
    here, there = shard_on(topic, 0), shard_on(topic, 1)
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            sub = await seed_consumed_on_worker_0(node, topic)

            # the other shard gets all of RDY 2 and asks for more while 2 are held
            sub.send(c.rdy(2))
            await pub_on(node, 1, topic, [b"t0", b"t1", b"t2"])
            held = await sub.messages(2)
            assert {shard_of(m.id) for m in held} == {there}
            # one finished: its last message comes, and it has nothing left
            sub.send(c.fin(held.pop(0).id))
            held.append(await sub.message())
            assert shard_of(held[-1].id) == there
            sub.send(b"".join(c.fin(m.id) for m in held))

            # batches of 2 from this worker's shard
            await pub_on(node, 0, topic, [b"h0", b"h1", b"h2"])
            got: list[bytes] = []
            while len(got) < 2:
                try:
                    batch = [await sub.message(timeout=10)]
                    batch.append(await sub.message(timeout=10))
                except AssertionError:
                    raise AssertionError(
                        "a batch of 2: no second message in 10 s;"
                        f" {await asyncio.to_thread(rdy_picture, node, topic, 'c')}"
                    ) from None
                assert {shard_of(m.id) for m in batch} == {here}
                got += [m.body for m in batch]
                sub.send(b"".join(c.fin(m.id) for m in batch))
            assert set(got) <= {b"h0", b"h1", b"h2"}
            await sub.close()

        run(go())


# -- 3. REQ, TOUCH and FIN of the other worker's shard --------------------------------


def test_req_touch_and_fin_of_the_other_workers_shard(tmp_path: Path) -> None:
    node = start_sharded(tmp_path)
    topic = "remote"
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            await pub_on(node, 0, topic, [b"mine"])
            await pub_on(node, 1, topic, [b"theirs", b"held"])
            sub = await raw_on(node, 0)
            await sub.identify(msg_timeout=1000)
            await sub.subscribe(topic, "ch", rdy=10)
            first = await sub.messages(4)
            msgs = {m.body: m for m in first}
            assert set(msgs) == {seed, b"mine", b"theirs", b"held"}, [
                (m.body, m.attempts, shard_of(m.id)) for m in first
            ]
            assert shard_of(msgs[b"mine"].id) == shard_on(topic, 0)
            theirs = shard_on(topic, 1)
            assert shard_of(msgs[b"theirs"].id) == theirs
            assert shard_of(msgs[b"held"].id) == theirs
            assert all(m.attempts == 1 for m in msgs.values())
            sub.send(c.fin(msgs[seed].id) + c.fin(msgs[b"mine"].id))

            # REQ 0 of the other shard's message: back at once, attempts 2
            sub.send(c.req(msgs[b"theirs"].id, 0))
            again = await sub.message()
            assert (again.body, again.attempts) == (b"theirs", 2)
            assert shard_of(again.id) == theirs
            sub.send(c.fin(again.id))

            # TOUCH keeps "held" (1 s timeout) in flight for 1.5 s: no error, no redelivery
            for _ in range(3):
                sub.send(c.touch(msgs[b"held"].id))
                assert await sub.nothing_for(0.5), "TOUCH answered, or the message came again"
            sub.send(c.fin(msgs[b"held"].id) + c.nop())
            assert await sub.nothing_for(0.3), "FIN after TOUCHes failed"

            # unknown ids: error frames, the connection stays open
            unknown_there = b"%016x" % ((theirs << PARTITION_SHIFT) | 999_999)
            for bad in (b"0" * 16, unknown_there):
                sub.send(c.fin(bad))
                err = await sub.error()
                assert err.startswith(b"E_FIN_FAILED"), err
            sub.send(c.req(unknown_there, 0))
            assert (await sub.error()).startswith(b"E_REQ_FAILED")
            sub.send(c.touch(unknown_there))
            assert (await sub.error()).startswith(b"E_TOUCH_FAILED")
            await pub_on(node, 1, topic, [b"after"])
            m = await sub.message()
            assert m.body == b"after"
            sub.send(c.fin(m.id) + c.nop())
            assert await sub.nothing_for(0.2)

            # FINs of both shards and an unknown id in one read: each shard's finished,
            # one error for the unknown one, nothing back after the 1 s timeout
            await pub_on(node, 0, topic, [b"x0", b"y0"])
            await pub_on(node, 1, topic, [b"x1", b"y1"])
            batch = await sub.messages(4)
            assert {shard_of(m.id) for m in batch} == {0, 1}
            unknown_here = b"%016x" % ((shard_on(topic, 0) << PARTITION_SHIFT) | 999_998)
            ids = [m.id for m in batch]
            sub.send(b"".join(c.fin(i) for i in [*ids[:2], unknown_here, *ids[2:]]))
            err = await sub.error()
            assert err.startswith(b"E_FIN_FAILED") and unknown_here in err, err
            assert await sub.nothing_for(1.5), "a FIN of the batch was lost"
            await sub.close()

        run(go())


# -- 4. pynsq -------------------------------------------------------------------------


def test_a_pynsq_reader_with_max_in_flight_1_gets_every_shards_messages(
    tmp_path: Path,
) -> None:
    nsq = pytest.importorskip("nsq")
    node = start_sharded(tmp_path)
    topic = "pynsq"
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            mine = [b"p0-%d" % i for i in range(10)]
            theirs = [b"p1-%d" % i for i in range(10)]
            await pub_on(node, 0, topic, mine)
            await pub_on(node, 1, topic, theirs)
            want = {seed, *mine, *theirs}
            got: list[bytes] = []
            shards: set[int] = set()
            done = asyncio.Event()

            def handler(msg: Any) -> bool:
                got.append(bytes(msg.body))
                shards.add(shard_of(msg.id))
                if want <= set(got):
                    done.set()
                return True  # finished by the Reader

            reader = nsq.Reader(
                topic=topic,
                channel="py",
                message_handler=handler,
                nsqd_tcp_addresses=[f"127.0.0.1:{node.tcp_port}"],
                max_in_flight=1,
            )
            try:
                await asyncio.wait_for(done.wait(), 30)
            except TimeoutError:
                raise AssertionError(
                    f"pynsq got {len(set(got))} of {len(want)}, from shards {shards}"
                ) from None
            finally:
                reader.close()
            assert sorted(got) == sorted(want)
            assert shards == {0, 1}

        run(go())


# -- 5. a worker killed while publishers publish --------------------------------------


def test_a_killed_worker_keeps_every_acknowledged_message_of_its_shard(tmp_path: Path) -> None:
    # the owner of shard 0 (it made the topic sharded) is the one killed
    topic = next(t for t in (f"killed{i}" for i in range(50)) if owner_of(t, 0, 2) == 1)
    node = start_sharded(tmp_path)
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            acked: list[bytes] = [seed]
            stop = asyncio.Event()

            async def publisher(k: int) -> None:
                raw: Raw | None = None
                i = 0
                while not stop.is_set():
                    body = f"k{k}-{i}".encode()
                    i += 1
                    try:
                        if raw is None:
                            raw = await Raw.connect(node.tcp_address)
                        raw.send(c.pub(topic, body))
                        if await raw.frame(timeout=15) == (FRAME_RESPONSE, b"OK"):
                            acked.append(body)
                            await asyncio.sleep(0.01)  # (paced: a few thousand in all)
                            continue
                    except (ConnectionError, OSError, AssertionError):
                        pass
                    if raw is not None:  # refused, or the connection broke: a new one
                        await raw.close()
                        raw = None
                    await asyncio.sleep(0.05)
                if raw is not None:
                    await raw.close()

            tasks = [asyncio.create_task(publisher(k)) for k in range(8)]
            await until(lambda: len(acked), lambda n: n >= 100, "100 acknowledged publishes")
            before = worker_pids(node)
            os.kill(before[1], signal.SIGKILL)
            at_kill = len(acked)
            await until(
                lambda: worker_pids(node).get(1, before[1]),
                lambda pid: pid != before[1],
                "worker 1 restarted",
                timeout=30,
            )
            after_restart = len(acked)
            await until(
                lambda: len(acked),
                lambda n: n >= after_restart + 100,
                "100 acknowledged publishes after the restart",
                timeout=30,
            )
            stop.set()
            await asyncio.gather(*tasks)
            assert at_kill < len(acked)

            sub = await subscribed(node, topic, "c")
            sub.send(c.rdy(100))
            _, shards = await receive_all(sub, set(acked), timeout=30)
            assert shards == {0, 1}
            await sub.close()

        run(go(), timeout=100)


# -- 6. the directory restarted with one worker ---------------------------------------


def test_one_worker_on_a_sharded_directory_serves_every_shards_messages(
    tmp_path: Path,
) -> None:
    topic = "reopened"
    node = start_sharded(tmp_path)
    with logged(node, signal.SIGKILL):

        async def go() -> tuple[set[bytes], set[bytes]]:
            seed = await make_sharded(node, topic)
            mine = [b"r0-%d" % i for i in range(6)]
            theirs = [b"r1-%d" % i for i in range(6)]
            await pub_on(node, 0, topic, mine)
            await pub_on(node, 1, topic, theirs)
            # some consumed (one at a time, FINed) before the restart: with RDY 1 the
            # 5th arrives only once the 4th FIN is done; it is left unfinished
            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe(topic, "c", rdy=1)
            finished: set[bytes] = set()
            for _ in range(4):
                m = await sub.message()
                finished.add(m.body)
                sub.send(c.fin(m.id))
            assert (await sub.message()).body not in finished
            await sub.close()  # (its message in flight goes back)

            def settled(s: dict[int, dict[str, Any]]) -> bool:
                chans = [channel_stats(s[p], "c") for p in (0, 1) if p in s]
                return len(chans) == 2 and all(
                    ch is not None and ch["in_flight_count"] == 0 and ch["client_count"] == 0
                    for ch in chans
                )

            await until(lambda: shard_stats(node, topic), settled, "the consumer to be gone")
            return {seed, *mine, *theirs} - finished, finished

        left, finished = run(go())
        assert node.stop() == 0
    assert dat_topic(tmp_path, topic).get("worker_shards") is True

    single = start_nsqd(tmp_path, "--workers=1")
    with logged(single, signal.SIGKILL):

        async def again() -> None:
            sub = await Raw.connect(single.tcp_address)
            await sub.subscribe(topic, "c", rdy=20)
            got, shards = await receive_all(sub, left)
            assert shards == {0, 1}
            assert not set(got) & finished, f"finished before the restart: {set(got) & finished}"
            sub.send(c.nop())
            assert await sub.nothing_for(0.3)
            assert sorted(got) == sorted(left)
            # and it takes new publishes
            pub = await Raw.connect(single.tcp_address)
            await pub.publish(topic, b"new")
            await pub.close()
            m = await sub.message()
            assert m.body == b"new"
            sub.send(c.fin(m.id))
            await sub.close()

        run(again())


def test_a_topic_made_before_is_sharded_at_a_start_with_the_flag(tmp_path: Path) -> None:
    """A topic made without --worker-shards (one partition, a backlog, a paused channel)
    is sharded when the node starts with the flag: its partition 0, backlog and cursors
    are partition 0's owner's shard, the other shard is made empty with the topic's
    channels and their pause; every message, old and new, is consumed once."""
    topic = "older"
    plain = start_workers(tmp_path, HTTP)
    with logged(plain):

        async def before() -> None:
            await asyncio.to_thread(http_post, f"{plain.http_url}/topic/create?topic={topic}")
            for ch in ("c", "p"):
                url = f"{plain.http_url}/channel/create?topic={topic}&channel={ch}"
                await asyncio.to_thread(http_post, url)
            await asyncio.to_thread(
                http_post, f"{plain.http_url}/channel/pause?topic={topic}&channel=p"
            )
            await pub_on(plain, 0, topic, [b"old0", b"old1"])
            await pub_on(plain, 1, topic, [b"old2"])
            # and a paused topic: its new shard is paused too
            await pub_on(plain, 1, "older-paused", [b"held"])
            await asyncio.to_thread(http_post, f"{plain.http_url}/topic/pause?topic=older-paused")

        run(before())
    assert "worker_shards" not in dat_topic(tmp_path, topic)

    node = start_sharded(tmp_path)
    with logged(node):

        async def after() -> None:
            shards = await until(
                lambda: shard_stats(node, topic), lambda s: set(s) == {0, 1}, "two shards"
            )
            depths = {p: (channel_stats(sh, "c") or {}).get("depth") for p, sh in shards.items()}
            assert depths == {0: 3, 1: 0}, depths
            for p in (0, 1):
                paused = {ch["channel_name"]: ch["paused"] for ch in shards[p]["channels"]}
                assert paused == {"c": False, "p": True}, (p, shards[p])
            other = await until(
                lambda: shard_stats(node, "older-paused"), lambda s: set(s) == {0, 1}, "shards"
            )
            assert [other[p]["paused"] for p in (0, 1)] == [True, True], other
            new = [b"new0", b"new1"]
            await pub_on(node, 0, topic, new[:1])
            await pub_on(node, 1, topic, new[1:])
            # each written where its connection is; the old backlog stays in shard 0
            counts = {p: sh["message_count"] for p, sh in shard_stats(node, topic).items()}
            assert counts == {0: 1, 1: 1}, counts
            want = {b"old0", b"old1", b"old2", *new}
            sub = await subscribed(node, topic, "c")
            sub.send(c.rdy(10))
            got, from_shards = await receive_all(sub, want)
            assert sorted(got) == sorted(want) and from_shards == {0, 1}
            paused = await subscribed(node, topic, "p")
            paused.send(c.rdy(10))
            assert await paused.nothing_for(0.5), "a paused channel's shard delivered"
            await asyncio.to_thread(
                http_post, f"{node.http_url}/channel/unpause?topic={topic}&channel=p"
            )
            got, _ = await receive_all(paused, want)
            assert sorted(got) == sorted(want)
            for raw in (sub, paused):
                raw.send(c.nop())
                assert await raw.nothing_for(0.3)
                await raw.close()

        run(after())
        assert dat_topic(tmp_path, topic).get("worker_shards") is True


# -- 7. without --worker-shards: one partition ----------------------------------------


def test_stats_show_a_sharded_topic_as_one_topic(tmp_path: Path) -> None:
    """NSQ 1.3's /stats shape: one entry for the topic (no partition fields), its
    figures the sum of its shards', its channel once, and a connection subscribed to
    every shard listed once, with its RDY and all its messages in flight; two such
    connections, one on each worker, are two clients in /stats with or without the
    clients' lines and in /metrics."""
    node = start_sharded(tmp_path)
    topic = "stated"
    with logged(node):

        async def go() -> None:
            seed = await make_sharded(node, topic)
            await pub_on(node, 0, topic, [b"a0", b"a1"])
            await pub_on(node, 1, topic, [b"b0", b"b1", b"b2"])
            sub = await raw_on(node, 0)
            await sub.subscribe(topic, "c", rdy=4)
            idle = await raw_on(node, 1)
            await idle.subscribe(topic, "c")  # (RDY 0: takes nothing)
            got = [await sub.message() for _ in range(4)]
            assert len({m.body for m in got} - {seed}) >= 3

            def listed(entries: list[dict[str, Any]]) -> bool:
                return len(entries) == 1 and entries[0]["channels"][0]["in_flight_count"] == 4

            (entry,) = await until(lambda: topic_entries(node, topic), listed, "4 in flight")
            assert "topic_partition" not in entry and "worker_shards" not in entry
            assert entry["message_count"] == 6
            assert sorted(int(sh["topic_partition"]) for sh in entry["shards"]) == [0, 1]
            (ch,) = entry["channels"]
            assert ch["channel_name"] == "c"
            assert ch["depth"] == 2 and ch["in_flight_count"] == 4, ch
            [client] = [cl for cl in ch["clients"] if cl["ready_count"]]
            assert client["ready_count"] == 4 and client["in_flight_count"] == 4, client
            assert client["message_count"] == 4, client
            assert len(ch["clients"]) == ch["client_count"] == 2
            # each connection counted once, though each is subscribed to both shards
            url = f"{node.http_url}/stats?format=json&topic={topic}&include_clients=false"
            doc = json.loads(await asyncio.to_thread(http_body, url))
            [brief] = [t for t in doc["topics"] if t["topic_name"] == topic]
            assert brief["channels"][0]["client_count"] == 2, brief
            metrics = (await asyncio.to_thread(http_body, f"{node.http_url}/metrics")).decode()
            line = f'nsq_channel_clients{{channel="c",topic="{topic}"}} 2.0'
            assert line in metrics.splitlines(), [
                x for x in metrics.splitlines() if x.startswith("nsq_channel_clients")
            ]
            # the Spark source finds the shards as partitions (and reads each)
            address = node.http_url.removeprefix("http://")
            found = await asyncio.to_thread(rangeclient.local_partitions, address, topic)
            assert found == {0: None, 1: None}
            await sub.close()
            await idle.close()

        run(go())


def test_without_worker_shards_a_topic_keeps_one_partition(tmp_path: Path) -> None:
    node = start_workers(tmp_path, HTTP)
    topic = "unsharded"
    with logged(node, signal.SIGKILL):

        async def go() -> None:
            raws = [await Raw.connect(node.tcp_address) for _ in range(16)]
            ports = [r.writer.get_extra_info("sockname")[1] for r in raws]
            landed = {await asyncio.to_thread(worker_of, node, p) for p in ports}
            assert landed == {0, 1}, "16 connections did not land on both workers"
            bodies = [f"u{k}-{i}".encode() for k in range(16) for i in range(4)]
            for k, raw in enumerate(raws):
                raw.send(b"".join(c.pub(topic, f"u{k}-{i}".encode()) for i in range(4)))
            for raw in raws:
                for _ in range(4):
                    assert await raw.response() == b"OK"
            for raw in raws:
                await raw.close()
            entries = await asyncio.to_thread(topic_entries, node, topic)
            assert len(entries) == 1, entries
            assert int(entries[0].get("topic_partition", 0)) == 0
            assert entries[0]["message_count"] == len(bodies)
            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe(topic, "c", rdy=100)
            got, shards = await receive_all(sub, set(bodies))
            sub.send(c.nop())
            assert await sub.nothing_for(0.3)
            assert sorted(got) == sorted(bodies)
            assert shards == {0}
            await sub.close()

        run(go())
        assert node.stop() == 0
    assert not dat_topic(tmp_path, topic).get("worker_shards")
