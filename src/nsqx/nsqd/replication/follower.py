"""FollowerReplication: a follower's side of replication.

The follower opens a stream to its leader (nsqx.wire.replication), says where its log
ends and what its epoch history is, cuts its log where the leader says it diverges
(records a failed leader wrote that the new leader never had), then appends every batch
the leader sends, exactly as sent, and acknowledges the new end after each message.
It reconnects, with a growing delay, until the coordinator gives it another role.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import aiohttp

from nsqx.wire import replication as rp

if TYPE_CHECKING:
    from nsqx.nsqd.replication.replica import PartitionReplica

log = logging.getLogger("nsqx.replication")

RETRY_MIN = 0.1
RETRY_MAX = 2.0


class ReplicationError(Exception):
    """The stream cannot go on (the follower reconnects)."""


class FollowerReplication:
    """The stream of one follower partition to its leader, in a task."""

    def __init__(self, replica: PartitionReplica, leader_http: str) -> None:
        self.replica = replica
        self.part = replica.part
        self.leader_http = leader_http
        self.connected = False
        #: the leader's commit point as last received
        self.commit = 0
        self._task = asyncio.create_task(self._run(), name=f"follow {self.part}")

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        delay = RETRY_MIN
        session = self.replica.manager.http_session()
        part = self.part
        # who and what in the URL too: for the leader's logs, and for proxies
        url = (
            f"http://{self.leader_http}/replication/stream?node={self.replica.node_id}"
            f"&topic={part.name}&partition={part.id}"
        )
        while True:
            try:
                before = part.log.end
                async with session.ws_connect(url, heartbeat=5.0, max_msg_size=0) as ws:
                    await self._follow(ws)
                    if part.log.end != before:
                        delay = RETRY_MIN  # the leader closed a working stream: at once
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, TimeoutError, ReplicationError) as err:
                log.info("REPL: %s: following %s: %s", self.part, self.leader_http, err)
            except Exception:
                log.exception("REPL: %s: following %s failed", self.part, self.leader_http)
            finally:
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    async def _follow(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        replica = self.replica
        role = replica.role
        part = self.part
        log_ = part.log
        assert role is not None
        await ws.send_bytes(
            rp.encode_hello(
                rp.Hello(
                    part.name,
                    part.id,
                    replica.node_id,
                    role.epoch,
                    log_.end,
                    log_.end_offset,
                    list(role.history),
                )
            )
        )
        first = await ws.receive()
        if first.type != aiohttp.WSMsgType.BINARY:
            raise ReplicationError(f"no WELCOME ({first.type.name})")
        welcome = rp.decode(first.data)
        if isinstance(welcome, rp.Refused):
            raise ReplicationError(f"refused: {welcome.error} {welcome.message}")
        if not isinstance(welcome, rp.Welcome):
            raise ReplicationError(f"unexpected {type(welcome).__name__}")
        if welcome.epoch < role.epoch:
            raise ReplicationError(f"the leader's epoch {welcome.epoch} < {role.epoch}")
        if welcome.reset is not None:
            seq, offset = welcome.reset
            log.warning(
                "REPL: %s: the leader starts this replica over at %d (this log ends at %d)",
                part,
                seq,
                log_.end,
            )
            part.reset(seq, offset)
        elif welcome.truncate_to < log_.end:
            log.warning(
                "REPL: %s: cutting records %d-%d the leader does not have",
                part,
                welcome.truncate_to,
                log_.end - 1,
            )
            part.truncate(welcome.truncate_to)
        replica.adopt_history(tuple(welcome.history))
        self.connected = True
        acked = log_.end
        await ws.send_bytes(rp.encode_ack(acked))
        log.info("REPL: %s: following %s from %d", part, self.leader_http, log_.end)
        # acknowledgements go from a task of their own: the messages that arrive in one
        # loop iteration are all appended before one ACK says where the log ends
        wake = asyncio.Event()
        acker = asyncio.create_task(self._ack_loop(ws, wake, acked))
        try:
            await self._apply_stream(ws, wake)
        finally:
            acker.cancel()

    async def _ack_loop(
        self, ws: aiohttp.ClientWebSocketResponse, wake: asyncio.Event, sent: int
    ) -> None:
        """Send the log's end whenever it moved past the last end sent (``sent``)."""
        log_ = self.part.log
        while True:
            await wake.wait()
            wake.clear()
            end = log_.end
            if end != sent:
                await ws.send_bytes(rp.encode_ack(end))
                sent = end

    async def _apply_stream(self, ws: aiohttp.ClientWebSocketResponse, wake: asyncio.Event) -> None:
        part = self.part
        log_ = part.log
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                raise ReplicationError(f"stream ended ({msg.type.name})")
            ev = rp.decode(msg.data)
            if isinstance(ev, rp.Batches):
                if ev.batches:
                    try:
                        part.append_replicated(ev.batches)
                    except ValueError as err:
                        raise ReplicationError(str(err)) from None
                self.commit = ev.commit
                part.committed(min(ev.commit, log_.end))
                if ev.batches:
                    wake.set()
            elif isinstance(ev, rp.Cursors):
                part.apply_cursors(ev.channels, ev.hold_from)
            else:
                raise ReplicationError(f"unexpected {type(ev).__name__}")
