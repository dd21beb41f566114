"""LogSyncer's durable end: what an fsync covered (the log's end when it started), told
to its listener on the loop in the call after the fsync; a cut of the log while an
fsync runs keeps that fsync from vouching for what was written after the cut; kicks
that arrive during an fsync are served together by the next one (a group commit)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from nsqx.nsqd.syncer import LogSyncer


class SlowLog:
    """A log whose sync waits until the test lets it go."""

    def __init__(self) -> None:
        self.start = 0
        self.end = 0
        self.unsynced = 0
        self.last_sync = 0.0
        self.syncs = 0
        self.entered = threading.Event()
        self.go = threading.Event()

    def sync(self) -> None:
        self.syncs += 1
        self.entered.set()
        self.go.wait(5)
        self.go.clear()


async def _in_sync(log: SlowLog) -> None:
    await asyncio.to_thread(log.entered.wait, 5)
    log.entered.clear()


def test_durable_end_is_the_end_when_the_fsync_started() -> None:
    async def main() -> None:
        log = SlowLog()
        syncer = LogSyncer(log)  # type: ignore[arg-type]
        told: list[int] = []
        syncer.on_durable = told.append
        log.end = 10
        syncer.kick()
        await _in_sync(log)
        log.end = 15  # written while the fsync runs: not covered by it
        syncer.kick()
        syncer.kick()
        log.go.set()
        await _in_sync(log)
        assert told == [10] and syncer.durable_end == 10
        log.go.set()
        await asyncio.wait_for(syncer._task, 5)  # type: ignore[arg-type]
        assert told == [10, 15] and log.syncs == 2  # the two kicks: one fsync

    asyncio.run(main())


def test_a_cut_during_an_fsync_caps_what_it_covers() -> None:
    async def main() -> None:
        log = SlowLog()
        syncer = LogSyncer(log)  # type: ignore[arg-type]
        told: list[Any] = []
        syncer.on_durable = told.append
        log.end = 20
        syncer.kick()
        await _in_sync(log)
        syncer.truncated(12)  # cut while the fsync runs, then written again
        log.end = 18
        log.go.set()
        await asyncio.wait_for(syncer._task, 5)  # type: ignore[arg-type]
        assert syncer.durable_end == 12 and told == [12]
        syncer.truncated(5)
        assert syncer.durable_end == 5
        syncer.kick()
        await _in_sync(log)
        log.go.set()
        await asyncio.wait_for(syncer._task, 5)  # type: ignore[arg-type]
        assert syncer.durable_end == 18 and told == [12, 18]

    asyncio.run(main())
