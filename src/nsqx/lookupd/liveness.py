"""Liveness: partition-aware nsqd are judged alive by time, not by an open socket.

A stopped process, a paused VM or a cut network keeps its TCP connection open: nothing
closes, so a node judged only by its registration connection would keep its
leaderships for as long as the fault lasts. So every partition-aware nsqd PINGs each
nsqlookupd every :attr:`Timing.heartbeat_interval` (announced in the IDENTIFY reply,
with the lease and the node timeout), and a connection that stays silent for
:attr:`Timing.node_timeout` is closed here and its node judged as after a crash.

The fencing rule (docs/replication.md, "Timing"): an answered PING lets the node's
partition leaders acknowledge writes until :attr:`Timing.lease` seconds after the PING
was *sent* (the node's clock). The coordinator judges a node lost no earlier than
``lease + margin`` after the last moment it heard from it (:meth:`Timing.lost_after`),
and a silent node no earlier than ``node_timeout`` after it; both are later than any
lease the node could hold, because a PING is sent before it is heard. So a leader that
may be replaced has stopped acknowledging before anyone else is elected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from nsqx.lookupd.registration_db import Peer

log = logging.getLogger("nsqx.lookupd")


@dataclass(frozen=True)
class Timing:
    """The liveness times, all derived from ``--node-timeout`` (seconds)."""

    node_timeout: float

    @property
    def heartbeat_interval(self) -> float:
        """How often a partition-aware nsqd PINGs: ten to a timeout, so that a few
        late or lost PINGs neither lapse a lease nor lose a node."""
        return self.node_timeout / 10

    @property
    def lease(self) -> float:
        """How long after sending an answered PING a leader may acknowledge writes."""
        return self.node_timeout / 4

    @property
    def margin(self) -> float:
        """Between the end of any lease a node could hold and its judgement: the time
        an acknowledgement decided just before the lease ended needs to leave."""
        return self.node_timeout / 8

    def lost_after(self, last_heard: float) -> float:
        """The earliest loop time at which a node last heard at ``last_heard`` may be
        judged lost (its connection closed: a crash, a reset)."""
        return last_heard + self.lease + self.margin

    def identify_fields(self) -> dict[str, int]:
        """What a partition-aware nsqd is told in the IDENTIFY reply (milliseconds)."""
        return {
            "heartbeat_interval": round(self.heartbeat_interval * 1000),
            "lease": round(self.lease * 1000),
            "node_timeout": round(self.node_timeout * 1000),
        }


class Connection(Protocol):
    """What the monitor needs of a registration connection."""

    peer: Peer | None

    def time_out(self, silent_for: float) -> None: ...


class LivenessMonitor:
    """Closes partition-aware connections that stay silent for the node timeout.

    If this nsqlookupd itself was stalled (stopped, paused, starved: its own ticks came
    late), the silence it measured is its own, not the nodes': every connection then
    gets a full timeout again instead of all being judged lost at once.
    """

    def __init__(self, timing: Timing, connections: Callable[[], Iterable[Connection]]) -> None:
        self.timing = timing
        self._connections = connections
        self._task: asyncio.Task[None] | None = None
        #: Times this nsqlookupd found itself stalled (for tests and /debug).
        self.stalls = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lookupd-liveness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = self.timing.heartbeat_interval / 2
        last = loop.time()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            try:
                self.check(now, now - last - tick)
            except Exception:
                log.exception("LIVENESS: check failed")
            last = now

    def check(self, now: float, late: float = 0.0) -> None:
        """Close the connections silent for the node timeout as of ``now``; ``late``:
        how much later than planned this check runs (this process's own stall)."""
        timing = self.timing
        conns = [c for c in self._connections() if c.peer is not None]
        if late > timing.node_timeout / 4:
            self.stalls += 1
            log.warning(
                "LIVENESS: this nsqlookupd was stalled for %.2fs: every node gets a full "
                "timeout again",
                late,
            )
            for conn in conns:
                assert conn.peer is not None
                conn.peer.last_heard = max(conn.peer.last_heard, now)
            return
        for conn in conns:
            peer = conn.peer
            assert peer is not None
            if peer.info.liveness != "heartbeat" or peer.lost:
                continue  # (an nsqd that PINGs every 15 s is judged by its connection)
            silent = now - peer.last_heard
            if silent >= timing.node_timeout:
                conn.time_out(silent)
