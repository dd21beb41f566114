"""Syncer: fsyncs and checkpoints off the event loop, grouped."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqx.store.cursor import CursorState, write_cursor
from nsqx.store.log import MessageLog

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.nsqd import NSQD

log = logging.getLogger("nsqx.nsqd")

#: unfinished messages above which a channel's checkpoint is taken less often
LARGE_CHECKPOINT = 50_000
#: Seconds of channel snapshots a checkpoint round takes in one loop turn, at most
#: (plus one channel's: a snapshot is not cut)
CHECKPOINT_SLICE = 0.001


class LogSyncer:
    """Runs one DiskLog's fsyncs in a thread, one at a time (fsync releases the GIL).

    Whoever asks while an fsync runs is served by the next one, which covers every
    write made before it started: a group commit. ``request()`` returns a future that
    completes once the log's writes up to now are on the device; ``kick()`` asks the
    same without a future, for a caller that listens to ``on_durable`` instead (a
    replicated partition: its durable end moves the commit point in the call that
    learns of it, not a loop iteration later).
    """

    def __init__(self, disklog: MessageLog) -> None:
        self.log = disklog
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._wanted = False
        #: every record below this sequence is on the device, as far as this process
        #: knows (what it found at start is not known to be: a killed process leaves
        #: unsynced pages; the first fsync tells)
        self.durable_end = disklog.start
        #: called on the loop with the new durable end after each fsync that moved it
        self.on_durable: Callable[[int], None] | None = None
        # the lowest end the log was cut to while an fsync ran (None: no cut): that
        # fsync covers nothing past it (what follows the cut was written after)
        self._cut_during: int | None = None

    def request(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        return fut

    def kick(self) -> None:
        """Have an fsync cover every write made so far (no future: see on_durable)."""
        self._wanted = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def truncated(self, end: int) -> None:
        """The log was cut (or reset) to ``end``: records from there are not durable
        until a later fsync says so."""
        if self.durable_end > end:
            self.durable_end = end
        if self._task is not None and not self._task.done():
            cut = self._cut_during
            self._cut_during = end if cut is None else min(cut, end)

    async def _run(self) -> None:
        while self._waiters or self._wanted:
            waiters, self._waiters = self._waiters, []
            self._wanted = False
            covered = self.log.unsynced
            end = self.log.end
            self._cut_during = None
            try:
                await asyncio.to_thread(self.log.sync)
            except Exception as err:  # pragma: no cover - disk failure
                log.error("STORE: fsync of %s failed: %s", self.log, err)
                for w in waiters:
                    if not w.done():
                        w.set_exception(err)
                continue
            self.log.unsynced = max(0, self.log.unsynced - covered)
            self.log.sync_lag = self.log.unsynced  # (written while it ran)
            self.log.last_sync = time.monotonic()
            if self._cut_during is not None:
                end = min(end, self._cut_during)
                self._cut_during = None
            if end > self.durable_end:
                self.durable_end = end
                if self.on_durable is not None:
                    try:
                        self.on_durable(end)
                    except Exception:  # (its bug must not stop the fsyncs)
                        log.exception("STORE: %s: durable-end listener failed", self.log)
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def due(self, sync_every: int, sync_timeout: float, now: float) -> bool:
        """Whether --sync-every / --sync-timeout call for an fsync now, or a roll left
        a sealed segment to fsync and close (even with nothing unsynced after it)."""
        unsynced = self.log.unsynced
        if self.log.sync_error is not None:
            return False  # it would fail again: health says so; acks that wait still fail
        if self.log.sync_pending:
            return True
        return unsynced > 0 and (unsynced >= sync_every or now - self.log.last_sync >= sync_timeout)


class Checkpointer:
    """Writes dirty channels' cursor files in a thread, one round at a time."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self._task: asyncio.Task[None] | None = None

    async def drain(self) -> None:
        """Wait for the round being written (before a final, synchronous checkpoint, so
        that an older snapshot cannot land after it)."""
        if self._task is not None:
            try:
                await asyncio.shield(self._task)
            except Exception:  # reported where it failed; the final checkpoint follows
                log.exception("checkpoint round failed")

    def run_round(self) -> None:
        """Checkpoint the dirty channels: their snapshots taken on the loop, in slices
        of CHECKPOINT_SLICE seconds, then written in a thread (one hand-off per round)."""
        if self._task is not None and not self._task.done():
            return  # the previous round is still writing
        channels = [
            ch
            for topic in self.nsqd.topics.values()
            for p in topic.partitions.values()
            for ch in p.channels.values()
            if ch.dirty and ch.cursor_path is not None and not ch.deleted
        ]
        if channels:
            self._task = asyncio.get_running_loop().create_task(self._round(channels))

    async def _round(self, channels: list[Channel]) -> None:
        work = []
        now = time.monotonic()
        slow_every = self.nsqd.options.sync_timeout
        started = time.perf_counter()
        for ch in channels:
            # A snapshot costs O(unfinished messages), 0.3 us each compiled: 2500 in
            # flight on each of ten channels made one 7.5 ms turn of every round. So
            # the loop turns between channels once a slice is spent.
            if time.perf_counter() - started >= CHECKPOINT_SLICE:
                await asyncio.sleep(0)
                started = time.perf_counter()
            if not ch.dirty or ch.cursor_path is None or ch.deleted:
                continue
            # A channel holding very many unfinished messages (say a million deferred)
            # is checkpointed every --sync-timeout only.
            if ch.checkpoint_size > LARGE_CHECKPOINT and now - ch.checkpoint_at < slow_every:
                continue
            ch.dirty = False
            # the snapshot is taken here, on the loop; only the write is threaded
            state = ch.cursor_state()
            ch.checkpoint_size = len(state.pending) // 3
            ch.checkpoint_at = now
            work.append((ch, state))
        if work:
            # each file is fsynced (a rename without it can leave an empty cursor after a
            # power loss); a slow disk makes rounds rarer, never the loop slower
            await self._write(work)

    async def _write(self, work: list[tuple[Channel, CursorState]]) -> None:
        def write_all() -> None:
            for ch, state in work:
                path = ch.cursor_path
                assert path is not None
                try:
                    write_cursor(path, state)
                    if ch.deleted:  # deleted while we wrote: do not leave it behind
                        os.remove(path)
                except FileNotFoundError:
                    pass  # the channel or topic was deleted meanwhile
                except OSError as err:  # e.g. a full disk: keep the channel dirty, retry
                    log.error("CHANNEL(%s): checkpoint failed: %s", ch.name, err)
                    ch.dirty = True

        await asyncio.to_thread(write_all)
