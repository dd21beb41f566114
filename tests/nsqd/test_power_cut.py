"""A single nsqd loses its power: what the files keep is what it fsynced (tests/powercut.py
records that in this process), and a restart on them must keep its promises
(docs/storage.md): with --sync-before-ack nothing acknowledged is lost; by default at
most --sync-every acknowledged messages are; in both, a torn write costs only what was
not whole, no message id seen before the cut is given to another message, and nothing
is served that was not published."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.partition import SYNC_PACE_WINDOWS
from nsqx.store.log import records
from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_DATA_AT, FRAME_MESSAGE, ID_AT, ID_END, decode_message
from powercut import PowerCut

from rawnsq import Raw, run, start_nsqd, wait_for

SYNC_EVERY = 200


async def load(
    nsqd: NSQD, cut: PowerCut, acked: set[bytes], seen: dict[bytes, bytes], until: int
) -> None:
    """Four publishers (MPUBs of 20, each waiting for its OK) and one consumer (FINs
    every message) until the consumer has seen ``until`` messages and every one written,
    some of them not fsynced yet: the power goes then."""
    part = nsqd.topics["t"].default_partition
    stop = asyncio.Event()

    async def publisher(k: int) -> None:
        pub = await Raw.connect(nsqd)
        n = 0
        while not stop.is_set():
            bodies = [b"p%d-%d" % (k, n + i) for i in range(20)]
            n += 20
            pub.send(c.mpub("t", bodies))
            assert await pub.response() == b"OK"
            if not stop.is_set():  # (an answer after the cut never reached anyone)
                acked.update(bodies)

    async def consumer() -> None:
        sub = await Raw.connect(nsqd)
        await sub.subscribe("t", "c", rdy=500)
        while not stop.is_set():
            try:
                ftype, payload = await sub.frame(timeout=0.2)
            except AssertionError:
                continue
            assert ftype == FRAME_MESSAGE
            m = decode_message(payload)
            seen[m.id] = m.body
            sub.send(c.fin(m.id))
            # the power goes once the consumer has seen every record written (c came
            # after "first"), some of them not covered by any fsync yet
            caught_up = len(seen) >= max(until, part.visible_end - 1)
            if caught_up and cut.undurable(part.log.segments[-1].path):
                cut.cut()
                stop.set()

    await asyncio.gather(consumer(), *(publisher(k) for k in range(4)))


def survivors(nsqd: NSQD) -> dict[bytes, bytes]:
    """id -> body of every record of topic t's log after the restart."""
    log = nsqd.topics["t"].default_partition.log
    out = {}
    for _seq, frame in records(log, log.start, log.end):
        out[frame[ID_AT:ID_END]] = decode_message(frame[FRAME_DATA_AT:]).body
    return out


@pytest.mark.parametrize(
    ("sync_before_ack", "torn"),
    [(True, False), (True, True), (False, False), (False, True)],
    ids=["sync-before-ack", "sync-before-ack-torn", "defaults", "defaults-torn"],
)
def test_a_power_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_before_ack: bool, torn: bool
) -> None:
    async def body() -> None:
        root = tmp_path / "data"
        opts = {"sync_before_ack": sync_before_ack, "sync_every": SYNC_EVERY}
        nsqd = await start_nsqd(data_path=str(root), max_bytes_per_file=64 * 1024, **opts)
        first = await Raw.connect(nsqd)
        await first.publish("t", b"first")
        await first.subscribe("t", "audit")  # (holds the log: never consumes)
        await wait_for(lambda: b"audit" in (root / "nsqd.dat").read_bytes())
        # from here the disk is slow (the window fills) and every fsync is recorded
        cut = PowerCut(root, monkeypatch, fsync_delay=0.05)
        acked: set[bytes] = {b"first"}
        seen: dict[bytes, bytes] = {}
        await load(nsqd, cut, acked, seen, until=1000)
        cut.cut()
        assert cut.fsyncs  # (the load saw fsyncs: segments rolled, windows filled)
        await nsqd.close()
        after = tmp_path / "after"
        cut.leave(after, random.Random(len(acked)) if torn else None)
        monkeypatch.undo()
        again = await start_nsqd(data_path=str(after), **opts)
        kept = survivors(again)
        bodies = set(kept.values())
        assert bodies <= acked | {b"p%d-%d" % (k, n) for k in range(4) for n in range(10**5)}
        lost = acked - bodies
        if sync_before_ack:
            assert not lost, sorted(lost)[:10]
        else:
            # acknowledged and unsynced at once: at most SYNC_PACE_WINDOWS times
            # --sync-every (and the consumer may have finished some of them before
            # the cut)
            assert len(lost) <= SYNC_EVERY * SYNC_PACE_WINDOWS, len(lost)
        for mid, b in kept.items():
            assert seen.get(mid, b) == b, "an id seen before the cut holds another body"
        pub = await Raw.connect(again)
        await pub.publish("t", *(b"new-%d" % i for i in range(5)))
        new = {mid for mid, b in survivors(again).items() if b.startswith(b"new-")}
        assert len(new) == 5 and not new & set(seen), "an id given twice"
        await again.close()

    run(body(), timeout=120)
