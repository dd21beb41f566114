"""One nsqd whose data directory is on faultfs (tests/faultfs, a FUSE filesystem that
forgets what was not fsynced): power cuts (SIGKILL, then every unsynced write lost,
whole or torn) and a flipped bit, then a restart on what was durable. What was
acknowledged under --sync-before-ack is all delivered, no message id is given to two
bodies, and without it only the newest messages are lost.

A new topic's directories are made durable with its files (they were not: a power cut
took the whole log, fsynced records included). Needs FUSE (skips cleanly without it)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.wire import FRAME_MESSAGE, decode_message
from nsqx.wire import commands as c

from faultfs import FaultFS, unavailable
from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run


class Disk(FaultFS):
    """A faultfs mount for nsqd's data, and the nsqd processes started on it (stopped
    before it is unmounted, whatever the test did)."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path / "disk", tmp_path / "data")
        self.nodes: list[NsqdProcess] = []

    def nsqd(self, *args: str) -> NsqdProcess:
        node = start_nsqd(self.mountpoint, *args)
        self.nodes.append(node)
        return node


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    why = unavailable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    fs = Disk(tmp_path)
    fs.mount()
    try:
        yield fs
    finally:
        for node in fs.nodes:
            node.stop(signal.SIGKILL)
        fs.close()


async def publish(address: tuple[str, int], topic: str, bodies: list[bytes]) -> list[bytes]:
    """PUB each body (a hundred in flight at a time); the acknowledged ones, in order."""
    r = await Raw.connect(address)
    acked: list[bytes] = []
    for i in range(0, len(bodies), 100):
        chunk = bodies[i : i + 100]
        for b in chunk:
            r.send(c.pub(topic, b))
        for b in chunk:
            assert await r.response() == b"OK"
            acked.append(b)
    await r.close()
    return acked


async def consume(
    address: tuple[str, int], topic: str, quiet: float = 1.5
) -> list[tuple[bytes, bytes]]:
    """(id, body) of everything delivered on channel "c", FINed, until quiet."""
    r = await Raw.connect(address)
    await r.subscribe(topic, "c", rdy=500)
    got: list[tuple[bytes, bytes]] = []
    while not await r.nothing_for(quiet):
        while r.frames:
            ftype, data = r.frames.pop(0)
            assert ftype == FRAME_MESSAGE, (ftype, data)
            m = decode_message(data)
            got.append((m.id, m.body))
            r.send(c.fin(m.id))
    await r.close()
    return got


def cut(nsqd: NsqdProcess, fs: FaultFS, mode: str = "all", seed: int = 0) -> None:
    nsqd.stop(signal.SIGKILL)
    fs.cut(mode, seed=seed)
    fs.mount()


def made_durable(nsqd: NsqdProcess, fs: FaultFS) -> None:
    """A clean stop and unmount: everything on the disk (the topic's directories too)."""
    assert nsqd.stop(signal.SIGTERM) == 0
    fs.unmount()
    fs.mount()


def no_id_reused(*deliveries: list[tuple[bytes, bytes]]) -> None:
    seen: dict[bytes, bytes] = {}
    for got in deliveries:
        for mid, body in got:
            assert seen.setdefault(mid, body) == body, f"id {mid!r}: {seen[mid]!r} and {body!r}"


BODIES = [b"m-%06d" % i for i in range(3000)]
SMALL_SEGMENTS = "--max-bytes-per-file=20000"


def test_sync_before_ack_keeps_everything_of_a_new_topic(disk: Disk) -> None:
    async def body() -> None:
        nsqd = disk.nsqd("--sync-before-ack", SMALL_SEGMENTS)
        acked = await publish(nsqd.tcp_address, "t", BODIES[:1000])
        cut(nsqd, disk)
        nsqd = disk.nsqd("--sync-before-ack", SMALL_SEGMENTS)
        got = await consume(nsqd.tcp_address, "t")
        nsqd.stop()
        assert {b for _, b in got} >= set(acked)

    run(body(), timeout=240)


@pytest.mark.parametrize("mode,seed", [("all", 0), ("torn", 1), ("torn", 2), ("reorder", 3)])
def test_sync_before_ack_loses_nothing_acknowledged(disk: Disk, mode: str, seed: int) -> None:
    async def body() -> None:
        nsqd = disk.nsqd("--sync-before-ack", SMALL_SEGMENTS)
        acked = await publish(nsqd.tcp_address, "t", BODIES[:10])
        first = await consume(nsqd.tcp_address, "t")
        made_durable(nsqd, disk)
        nsqd = disk.nsqd("--sync-before-ack", SMALL_SEGMENTS)
        acked += await publish(nsqd.tcp_address, "t", BODIES[10:2000])
        cut(nsqd, disk, mode, seed)
        nsqd = disk.nsqd("--sync-before-ack", SMALL_SEGMENTS)
        got = await consume(nsqd.tcp_address, "t")
        acked += await publish(nsqd.tcp_address, "t", BODIES[2000:2100])
        more = await consume(nsqd.tcp_address, "t")
        nsqd.stop()
        delivered = {b for _, b in first + got + more}
        assert not [b for b in acked if b not in delivered]
        no_id_reused(first, got, more)

    run(body(), timeout=240)


def test_defaults_lose_only_the_newest_messages(disk: Disk) -> None:
    async def body() -> None:
        nsqd = disk.nsqd(SMALL_SEGMENTS)
        await publish(nsqd.tcp_address, "t", BODIES[:10])
        first = await consume(nsqd.tcp_address, "t")
        made_durable(nsqd, disk)
        nsqd = disk.nsqd(SMALL_SEGMENTS)
        synced = await publish(nsqd.tcp_address, "t", BODIES[10:600])
        # nsqd fsyncs by itself within --sync-timeout (2 s): until then faultfs holds
        # writes not yet durable
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while disk.stats()["pending_file_ops"]:
            assert loop.time() < deadline, f"never fsynced: {disk.stats()}"
            await asyncio.sleep(0.05)
        acked = synced + await publish(nsqd.tcp_address, "t", BODIES[600:2000])
        cut(nsqd, disk)
        nsqd = disk.nsqd(SMALL_SEGMENTS)
        got = await consume(nsqd.tcp_address, "t")
        await publish(nsqd.tcp_address, "t", BODIES[:100])  # again: new ids for them
        more = await consume(nsqd.tcp_address, "t")
        nsqd.stop()
        kept = [b for _, b in got]
        # what survived is the oldest, in order, and at least what was fsynced
        assert kept == acked[: len(kept)]
        assert len(kept) >= len(synced)
        no_id_reused(first, got, more)

    run(body(), timeout=240)


def test_a_flipped_bit_costs_only_the_batch_it_hit(disk: Disk) -> None:
    async def body() -> None:
        nsqd = disk.nsqd("--sync-before-ack")
        await publish(nsqd.tcp_address, "t", BODIES[:10])
        made_durable(nsqd, disk)
        nsqd = disk.nsqd("--sync-before-ack")
        r = await Raw.connect(nsqd.tcp_address)
        batches = [BODIES[i : i + 10] for i in range(10, 2000, 10)]
        for batch in batches:  # one record each
            r.send(c.mpub("t", batch))
            assert await r.response() == b"OK"
        await r.close()
        nsqd.stop(signal.SIGKILL)
        (segment,) = [p for p in (disk.backing / "t.topic").rglob("*.seg")]
        size = segment.stat().st_size
        disk.flip_bit(str(segment.relative_to(disk.backing)), offset=size // 2, bit=5)
        nsqd = disk.nsqd("--sync-before-ack")
        got = await consume(nsqd.tcp_address, "t")
        nsqd.stop()
        published = set(BODIES[:2000])
        bodies = [b for _, b in got]
        assert set(bodies) <= published, "a garbled body was delivered"
        assert len(published) - len(set(bodies)) <= 10

    run(body(), timeout=240)
