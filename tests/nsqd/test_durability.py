"""The durable log under nsqd: restarts, deferred messages, space, crashes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import pytest

from nsqx.wire import FRAME_MESSAGE, FRAME_RESPONSE, decode_message
from nsqx.wire import commands as c

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run, wait_for
from rawnsq import start_nsqd as start_inproc


async def drain(
    address: tuple[str, int], topic: str, channel: str, quiet: float = 1.0
) -> list[bytes]:
    """Consume and FIN until nothing arrives for ``quiet`` seconds."""
    r = await Raw.connect(address)
    await r.subscribe(topic, channel, rdy=500)
    got: list[bytes] = []
    while not await r.nothing_for(quiet):
        while r.frames:
            ftype, data = r.frames.pop(0)
            assert ftype == FRAME_MESSAGE, (ftype, data)
            m = decode_message(data)
            got.append(m.body)
            r.send(c.fin(m.id))
    await r.close()
    return got


def test_clean_restart_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--max-bytes-per-file=20000", "--mem-queue-size=50")
        pub = await Raw.connect(nsqd.tcp_address)
        bodies = [b"msg-%05d" % i for i in range(2000)]
        for i in range(0, 2000, 100):
            pub.send(c.mpub("t", bodies[i : i + 100]))
            assert await pub.response() == b"OK"
        sub = await Raw.connect(nsqd.tcp_address)
        await sub.subscribe("t", "ch", rdy=100)
        first = []
        for _ in range(700):
            m = await sub.message()
            first.append(m)
            sub.send(c.fin(m.id))
        # a round trip on the same connection: every FIN before it was processed
        sub.send(c.fin(b"ffffffffffffffff"))
        while (await sub.frame())[0] == FRAME_MESSAGE:
            pass  # in flight, unfinished: these must come back after the restart
        await pub.publish("t", b"sentinel")
        assert nsqd.stop(signal.SIGTERM) == 0
        nsqd = start_nsqd(tmp_path)
        rest = await drain(nsqd.tcp_address, "t", "ch")
        # the 700 were FINed; everything else, each once (in flight ones come back)
        assert sorted([m.body for m in first] + rest) == sorted([*bodies, b"sentinel"])
        nsqd.stop()

    run(body())


def test_deferred_and_requeued_keep_their_due_time(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path)
        r = await Raw.connect(nsqd.tcp_address)
        await r.subscribe("t", "ch", rdy=10)
        r.send(c.dpub("t", 1500, b"dpub"))
        assert await r.response() == b"OK"
        await r.publish("t", b"req")
        m = await r.message()
        r.send(c.req(m.id, 1500))
        await r.publish("t", b"sync")
        sync = await r.message()
        assert sync.body == b"sync"
        r.send(c.fin(sync.id) + c.fin(b"ffffffffffffffff"))
        assert (await r.error()).startswith(b"E_FIN_FAILED")  # the FIN before was applied
        assert nsqd.stop(signal.SIGTERM) == 0
        nsqd = start_nsqd(tmp_path)
        s = await Raw.connect(nsqd.tcp_address)
        await s.subscribe("t", "ch", rdy=10)
        got = await s.messages(2, timeout=10)
        assert sorted(x.body for x in got) == [b"dpub", b"req"]
        assert {x.body: x.attempts for x in got} == {b"dpub": 1, b"req": 2}
        nsqd.stop()

    run(body())


def test_topic_without_channel_keeps_messages_across_restart(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path)
        pub = await Raw.connect(nsqd.tcp_address)
        await pub.publish("t", b"a", b"b")
        nsqd.stop(signal.SIGKILL)
        nsqd = start_nsqd(tmp_path)
        assert await drain(nsqd.tcp_address, "t", "first") == [b"a", b"b"]
        nsqd.stop()

    run(body())


def segment_files(data: Path, topic: str) -> list[str]:
    return sorted(p.name for p in (data / f"{topic}.topic" / "p0").glob("*.seg"))


def test_space_comes_back(tmp_path: Path) -> None:
    """Consumed segments are deleted; emptying or deleting a channel, or deleting the
    topic, gives the space back."""

    async def publish_200(pub: Raw, fill: bytes) -> None:
        for _ in range(20):
            pub.send(c.mpub("t", [fill * 100] * 10))
            assert await pub.response() == b"OK"

    async def body() -> None:
        nsqd = await start_inproc(
            data_path=str(tmp_path), max_bytes_per_file=4000, mem_queue_size=10
        )
        pub = await Raw.connect(nsqd)
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "ch", rdy=100)
        await publish_200(pub, b"x")
        assert len(segment_files(tmp_path, "t")) > 5
        for _ in range(200):
            m = await sub.message()
            sub.send(c.fin(m.id))
        await wait_for(
            lambda: len(segment_files(tmp_path, "t")) <= 2, what="consumed segments gone"
        )
        await sub.close()
        topic = nsqd.topics["t"]
        # a backlog on ch; emptying the channel lets it go
        await publish_200(pub, b"y")
        assert len(segment_files(tmp_path, "t")) > 5
        topic.channels["ch"].empty()
        await wait_for(lambda: len(segment_files(tmp_path, "t")) <= 2, what="emptied channel")
        # a second channel's backlog; deleting the channel lets it go
        topic.get_channel("other")
        await publish_200(pub, b"z")
        assert len(segment_files(tmp_path, "t")) > 5
        topic.channels["ch"].empty()
        topic.delete_channel("other")
        await wait_for(lambda: len(segment_files(tmp_path, "t")) <= 2, what="deleted channel")
        # deleting the topic removes its directory
        nsqd.delete_topic("t")
        assert not (tmp_path / "t.topic").exists()
        await nsqd.close()

    run(body())


def test_sync_before_ack(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = start_nsqd(tmp_path, "--sync-before-ack")
        pub = await Raw.connect(nsqd.tcp_address)
        for i in range(0, 500, 50):
            pub.send(c.mpub("t", [b"%d" % j for j in range(i, i + 50)]))
        for _ in range(10):
            assert await pub.response() == b"OK"
        await pub.publish("t", b"single")
        nsqd.stop(signal.SIGKILL)
        nsqd = start_nsqd(tmp_path)
        assert len(await drain(nsqd.tcp_address, "t", "ch")) == 501
        nsqd.stop()

    run(body())


def _start_after_crash(tmp_path: Path, *flags: str) -> NsqdProcess:
    """Start nsqd on a crashed node's directory: a node of workers frees it once its
    last worker died (they die with their supervisor, a moment after it)."""
    for _ in range(100):
        try:
            return start_nsqd(tmp_path, *flags)
        except RuntimeError as err:
            if "in use" not in str(err):
                raise
    raise AssertionError("the data directory stayed locked")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_crash_loses_nothing_acknowledged(tmp_path: Path, workers: int) -> None:
    """Publishers (PUB, MPUB, DPUB over TCP; HTTP /pub) and a consumer run while nsqd is
    SIGKILLed at random moments and restarted on the same data; then a consumer drains.
    Every acknowledged message arrives; duplicates (finished before a crash, after the
    last checkpoint) are counted and printed. With --workers=2 the whole node (its
    supervisor) is killed: its workers die with it."""

    rng = random.Random(int(os.environ.get("NSQX_CRASH_SEED", "1")))
    acked: set[bytes] = set()
    received: list[bytes] = []
    state: dict[str, NsqdProcess] = {}

    async def publisher(kind: str, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            try:
                r = await Raw.connect(state["nsqd"].tcp_address)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            try:
                while not stop.is_set():
                    if kind == "pub":
                        batch = [b"pub-%d" % n]
                        r.send(c.pub("crash", batch[0]))
                    elif kind == "mpub":
                        batch = [b"mpub-%d-%d" % (n, k) for k in range(50)]
                        r.send(c.mpub("crash", batch))
                    else:
                        batch = [b"dpub-%d" % n]
                        r.send(c.dpub("crash", rng.randrange(0, 300), batch[0]))
                    n += 1
                    ftype, data = await r.frame(timeout=5)
                    if ftype == FRAME_RESPONSE and data == b"OK":
                        acked.update(batch)
            except (ConnectionError, AssertionError, OSError):
                pass  # killed: unacknowledged batches may or may not be there
            finally:
                await r.close()

    async def http_publisher(stop: asyncio.Event) -> None:
        import aiohttp

        n = 0
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                body = b"http-%d" % n
                n += 1
                try:
                    url = f"{state['nsqd'].http_url}/pub?topic=crash"
                    async with session.post(url, data=body) as resp:
                        if resp.status == 200 and await resp.read() == b"OK":
                            acked.add(body)
                except (aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.02)  # killed: retry against the restarted one

    async def consumer(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                r = await Raw.connect(state["nsqd"].tcp_address)
                await r.subscribe("crash", "ch", rdy=200)
                while not stop.is_set():
                    m = await r.message(timeout=5)
                    received.append(m.body)
                    r.send(c.fin(m.id))
            except (ConnectionError, AssertionError, OSError):
                await asyncio.sleep(0.05)

    async def body() -> None:
        flags = (
            "--max-bytes-per-file=200000",
            "--http-address=127.0.0.1:0",
            f"--workers={workers}",
        )
        state["nsqd"] = start_nsqd(tmp_path, *flags)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(publisher(k, stop)) for k in ("pub", "mpub", "dpub")]
        tasks.append(asyncio.create_task(http_publisher(stop)))
        tasks.append(asyncio.create_task(consumer(stop)))
        for _ in range(4):
            before = len(acked)
            await wait_for(
                lambda before=before: len(acked) > before + 2000, timeout=30, what="publishing"
            )
            await asyncio.sleep(rng.uniform(0, 0.3))  # a random moment
            state["nsqd"].stop(signal.SIGKILL)
            state["nsqd"] = _start_after_crash(tmp_path, *flags)
        stop.set()
        await asyncio.gather(*tasks)
        received.extend(await drain(state["nsqd"].tcp_address, "crash", "ch", quiet=1.5))
        state["nsqd"].stop(signal.SIGTERM)

    run(body(), timeout=240)
    lost = acked - set(received)
    duplicates = len(received) - len(set(received))
    print(
        f"\ncrash test: {len(acked)} acknowledged, {len(set(received))} received, "
        f"{len(lost)} lost, {duplicates} duplicates"
    )
    if os.environ.get("NSQX_CRASH_DEBUG"):
        from collections import Counter

        dup = Counter(received)
        print("acknowledged by kind", dict(Counter(b.split(b"-")[0] for b in acked)))
        kinds = Counter(b.split(b"-")[0] for b, n in dup.items() if n > 1)
        print("duplicated by kind", dict(kinds), "max copies", max(dup.values()))
    assert not lost, sorted(lost)[:10]


def test_sync_before_ack_answers_then_reports_a_fatal_error(tmp_path: Path) -> None:
    """With --sync-before-ack, a PUB followed by garbage in one read gets its OK (after
    the fsync) and then the error frame, then the close."""

    async def body() -> None:
        nsqd = await start_inproc(data_path=str(tmp_path), sync_before_ack=True)
        r = await Raw.connect(nsqd)
        r.send(c.pub("t", b"kept") + b"GARBAGE\n")
        assert await r.response() == b"OK"
        assert (await r.error()).startswith(b"E_INVALID invalid command GARBAGE")
        assert await r.closed()
        assert nsqd.topics["t"].message_count == 1
        await nsqd.close()

    run(body())
