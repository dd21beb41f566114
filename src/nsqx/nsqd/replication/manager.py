"""ReplicationManager: nsqd's replicated partitions, their health checks and reports.

Twice a second it looks at every partition this node leads: an ISR member that has been
behind for ``--replication-lag-timeout`` is reported to the coordinator (nsqlookupd:
``POST /partition/isr/leave``), a replica that caught up is reported too
(``/partition/isr/join``), and the channels' positions go to the followers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from nsqx.nsqd.replication.replica import PartitionReplica
from nsqx.wire import replication as rp

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition

log = logging.getLogger("nsqx.replication")

TICK = 0.5
#: at most one report of a kind per partition and node this often (seconds)
REPORT_EVERY = 1.0


class ReplicationManager:
    """Every replicated partition of one nsqd."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.lag_timeout = nsqd.options.replication_lag_timeout
        #: a write not held by the ISR after this long is not acknowledged
        self.commit_timeout = max(3 * self.lag_timeout, 5.0)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._reported: dict[tuple[str, int, str, str], float] = {}
        self._cursors_sent: dict[tuple[str, int], bytes] = {}
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task that is kept until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def http_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=2.0, sock_read=None)
            )
        return self._session

    def attach(self, part: Partition) -> PartitionReplica:
        """A replicated partition was opened or created here."""
        replica = PartitionReplica(self, part)
        self.replicas[part.key] = replica
        if self._started:
            replica.start()
        return replica

    def detach(self, part: Partition) -> None:
        replica = self.replicas.pop(part.key, None)
        if replica is not None:
            self.spawn(replica.close())

    def start(self) -> None:
        """nsqd is listening and knows its node id: follow, and start checking."""
        self._started = True
        for replica in self.replicas.values():
            replica.start()
        self._task = asyncio.create_task(self._tick_loop(), name="replication-tick")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas.values()))
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- checks -----------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.tick()
            except Exception:
                log.exception("REPL: check failed")

    def tick(self) -> None:
        for key, replica in list(self.replicas.items()):
            leader = replica.leader
            role = replica.role
            if leader is None or role is None or not replica.confirmed:
                continue
            leader.expire(self.commit_timeout)
            leader.heartbeat()
            for node in leader.lagging(self.lag_timeout):
                self._report(replica, "leave", node)
            for node in leader.caught_up():
                self._report(replica, "join", node)
            part = replica.part
            channels = {
                name: (ch.low_water(), ch.ordered_flag)
                for name, ch in part.channels.items()
                if not ch.ephemeral
            }
            message = rp.encode_cursors(rp.Cursors(channels, part.hold_from))
            if self._cursors_sent.get(key) != message or leader.streams:
                self._cursors_sent[key] = message
                leader.send_cursors(message)

    def _report(self, replica: PartitionReplica, action: str, node: str) -> None:
        part = replica.part
        key = (part.name, part.id, action, node)
        now = time.monotonic()
        if now - self._reported.get(key, 0.0) < REPORT_EVERY:
            return
        self._reported[key] = now
        assert replica.role is not None
        epoch = replica.role.epoch
        log.warning("REPL: %s: asking the coordinator: %s %s (epoch %d)", part, action, node, epoch)
        self.spawn(self._post_report(part.name, part.id, action, node, epoch))

    async def _post_report(self, topic: str, pid: int, action: str, node: str, epoch: int) -> None:
        params = {"topic": topic, "partition": str(pid), "node": node, "epoch": str(epoch)}
        session = self.http_session()
        for address in self.nsqd.lookup.lookupd_http_addresses():
            url = f"http://{address}/partition/isr/{action}"
            try:
                async with session.post(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=3.0)
                ) as resp:
                    if resp.status == 200:
                        return
                    text = (await resp.read())[:200]
                    log.info("REPL: %s answered %d %s", url, resp.status, text)
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                log.info("REPL: %s: %s", url, err)
