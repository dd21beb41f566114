"""LoopTurn: what nsqd does once per event-loop iteration, and after each client read.

Every read of a client connection passes here (its read budget, busy polling) and every
publish to a durable partition asks for the iteration's group commit: per-read work,
so the module is compiled with the rest of the hot path (nsqx.compiled).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from nsqx.nsqd.client_v2 import ClientV2
    from nsqx.nsqd.partition import Partition

#: Bytes read from all clients in one event-loop iteration before busy readers yield,
#: so that channel pumps (which run once per iteration) keep pace with publishers.
#: Measured (bench/server_bench.py, both phase): 64 KiB keeps consumers level with a
#: flooding publisher (513k in / 511k out); 256 KiB let ingest win (619k in / 320k out).
READ_BUDGET_PER_ITERATION: Final = 64 * 1024
#: Seconds one client connection must have been the only one reading before the loop
#: busy-polls after its reads (see LoopTurn.note_read).
BUSY_POLL_ALONE: Final = 0.01
# (compiled: a C static, where ``time.monotonic`` is a module lookup on every read)
_monotonic: Final = time.monotonic
#: Buckets of the turn histogram (nsqx.nsqd.loop_monitor): bucket i counts turns that
#: lasted less than 2**i us (and at least 2**(i-1)); the last, every longer one (> 4 s).
TURN_BUCKETS: Final = 24


class LoopTurn:
    """One nsqd's per-iteration state: bytes read so far in this iteration, the
    partitions whose publishes the iteration's end writes (one write each for every
    publish of the iteration, from every connection), and busy polling."""

    def __init__(self, busy_poll: float) -> None:
        #: seconds the loop keeps polling after a lone publisher's read (0: never)
        self.busy_poll = busy_poll
        #: seconds a connection must have read alone before polling starts
        self.alone = BUSY_POLL_ALONE
        self.read_this_turn = 0
        #: the iteration's end is scheduled (a ready handle)
        self.end_scheduled = False
        #: partitions with publishes staged in this loop iteration
        self.to_commit: list[Partition] = []
        self.last_reader: ClientV2 | None = None
        self.last_read_at = 0.0
        self.last_publish_at = 0.0
        self.shared_until = 0.0
        #: the loop is busy-polling now
        self.polling = False
        #: nsqd is closing: no more polling
        self.exiting = False
        self.loop: asyncio.AbstractEventLoop | None = None
        #: nsqd's health: the last storage write error, None once a write succeeds
        #: (NSQD.health_error; here because every commit reads it)
        self.health_error: str | None = None
        #: turns that read from clients, by duration: first read to the group commit's
        #: end (see TURN_BUCKETS); their longest since LoopMonitor last took it, and the
        #: seconds of them all
        self.turn_counts: list[int] = [0] * TURN_BUCKETS
        self.turn_max = 0.0
        self.turn_seconds = 0.0
        #: when this turn's first read (or publish) came
        self.turn_started = 0.0
        # the bound method, made once (one call_soon per loop iteration)
        self._end_cb: Callable[[], None] = self._end
        self._poll_cb: Callable[[], None] = self._poll_on

    def spend_read_budget(
        self, nbytes: int, reader: ClientV2 | None = None, published: bool = False
    ) -> bool:
        """Count bytes ``reader`` (a client connection) read in this loop iteration
        (``published``: the read carried publishes to be answered); True once over the
        budget."""
        if not self.end_scheduled:
            self._schedule_end()
        if self.busy_poll:
            self.note_read(reader, published)
        self.read_this_turn += nbytes
        return self.read_this_turn >= READ_BUDGET_PER_ITERATION

    def commit_soon(self, part: Partition) -> None:
        """Have ``part`` commit what it staged once this loop iteration's reads are done
        (one write for every publish of the iteration, from every connection)."""
        self.to_commit.append(part)
        if not self.end_scheduled:
            self._schedule_end()

    def _schedule_end(self) -> None:
        # One handle per loop iteration, run after the iteration's I/O callbacks: ready
        # handles run in the next iteration's first phase, before it polls again.
        self.end_scheduled = True
        self.turn_started = _monotonic()
        self._running_loop().call_soon(self._end_cb)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        # (kept: asyncio.get_running_loop() is a getpid system call each time in 3.11)
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop

    def _end(self) -> None:
        self.end_scheduled = False
        self.read_this_turn = 0
        if self.to_commit:
            parts = self.to_commit
            self.to_commit = []
            for part in parts:
                part.commit()
        # The turn's length (reads, their answers, the timers between, the commit): a
        # clock read and a few additions per turn, not per message.
        took = _monotonic() - self.turn_started
        self.turn_seconds += took
        if took > self.turn_max:
            self.turn_max = took
        us = int(took * 1e6)
        self.turn_counts[min(us.bit_length(), TURN_BUCKETS - 1)] += 1

    # -- busy polling ---------------------------------------------------------------
    #
    # A lone client that sends a command and waits for the answer (a web handler
    # publishing one message at a time) pays, per round trip, for the event loop going
    # to sleep in epoll_wait and the kernel waking it when the next command comes: on
    # the 2-core test machine that was a third of the round trip (a minimal uvloop
    # server answering OK made 16-17k round trips/s, Go's nsqd 20-21k; the same server
    # polling on for 200 us after each read made 27-29k). So after a read that
    # published, while a single connection is active, the loop keeps polling (a ready
    # callback makes it poll without blocking) for ``busy_poll`` seconds. Other reads
    # (a lone consumer's FINs and RDYs) do not start it: nothing waits on an answer to
    # them, and a consumer at 1k msgs/s would keep a fifth of a core busy. With several
    # active connections their reads overlap and the loop rarely sleeps, and polling
    # would only take CPU from the clients: it stays off until one connection has been
    # alone for BUSY_POLL_ALONE seconds. Nor does it poll while that connection's
    # answers wait for nsqd's own work (replication, --sync-before-ack).

    def note_read(self, reader: ClientV2 | None, published: bool) -> None:
        # One clock read per loop iteration: later reads in it take the first one's time
        # (microseconds apart; a second connection's read makes them shared anyway).
        # (the turn's first read: _schedule_end just read the clock for the turn)
        now = self.last_read_at if self.read_this_turn else self.turn_started
        if reader is not self.last_reader:
            if now - self.last_read_at < self.alone:
                self.shared_until = now + self.alone
            self.last_reader = reader
        self.last_read_at = now
        if not published:
            return
        self.last_publish_at = now
        if not self.polling and now >= self.shared_until:
            self.polling = True
            self._running_loop().call_soon(self._poll_cb)

    def _poll_on(self) -> None:
        reader = self.last_reader
        if (
            _monotonic() - self.last_publish_at < self.busy_poll
            and not self.exiting
            # answers waiting for an fsync or the ISR: nsqd has the next move, and
            # polling would take the CPU its followers and fsyncs need (answers that
            # wait for this iteration's group commit, due next, do not count)
            and (reader is None or self.end_scheduled or not reader.answers_held)
        ):
            loop = self.loop
            assert loop is not None
            loop.call_soon(self._poll_cb)
        else:
            self.polling = False
