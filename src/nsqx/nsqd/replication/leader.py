"""LeaderReplication: a partition leader's side of replication.

Each follower keeps one stream open to the leader (nsqx.wire.replication). The leader
sends it every stored batch it lacks, in order (first from the files when it is behind,
then each new batch as it is appended, several at once under load), and the follower
answers with the end of its log. The *commit point* is the lowest end among the ISR
(the leader's own included): every record below it is held by the whole ISR. A publish
is answered once the commit point passes it, and consumers see only records below it,
so a message a consumer has seen can never vanish in a failover.

The write rule is Youzan's: writes need an ISR of more than half of the replicas. An
ISR member that stays behind for ``lag_timeout`` seconds (dead, cut off or too slow) is
reported to the coordinator, which takes it out of the ISR; a replica that is not in
the ISR and has caught up with the leader's end is reported so that it joins again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from nsqx.wire import replication as rp

if TYPE_CHECKING:
    from aiohttp import web

    from nsqx.nsqd.replication.replica import PartitionReplica

log = logging.getLogger("nsqx.replication")

#: Bytes of stored batches per stream message.
SEND_BYTES = 1 << 20


class CommitFailed(Exception):
    """A write that will not be committed by this leader (it lost the leadership)."""


class FollowerStream:
    """One follower's open stream: what was sent to it and what it acknowledged."""

    def __init__(self, node: str, ws: web.WebSocketResponse, next_seq: int) -> None:
        self.node = node
        self.ws = ws
        #: the next sequence to send
        self.next_seq = next_seq
        #: the follower's log end as it last acknowledged it
        self.acked = next_seq
        self.wake = asyncio.Event()
        self.wake.set()
        self.sent_commit = -1
        self.connected_at = time.monotonic()


class LeaderReplication:
    """The streams of one leader partition, its commit point and its waiting writes."""

    def __init__(self, replica: PartitionReplica, commit: int) -> None:
        self.replica = replica
        self.part = replica.part
        self.streams: dict[str, FollowerStream] = {}
        #: every ISR member's acknowledged end, kept across its reconnects
        self.acked: dict[str, int] = {}
        #: when each ISR member was last seen at the leader's end (monotonic)
        self.caught_up_at: dict[str, float] = {}
        self.commit = min(commit, self.part.log.end)
        self._waiters: deque[tuple[int, asyncio.Future[None], float]] = deque()
        self.closed = False
        now = time.monotonic()
        for node in replica.role.isr if replica.role else ():
            self.caught_up_at[node] = now

    # -- commit -----------------------------------------------------------------------

    def wait(self, seq: int) -> asyncio.Future[None]:
        """A future done once every record below ``seq`` is committed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.commit >= seq:
            fut.set_result(None)
        elif self.closed:
            fut.set_exception(CommitFailed("not the leader any more"))
        else:
            self._waiters.append((seq, fut, time.monotonic()))
        return fut

    def recompute(self) -> None:
        """Move the commit point to the lowest end among the ISR, if the ISR is big
        enough to write; answer the writes it passes; show the records to channels."""
        role = self.replica.role
        if role is None or self.closed:
            return
        me = self.replica.node_id
        end = self.part.log.end
        if not role.quorum_ok:
            return
        commit = end
        for node in role.isr:
            if node != me:
                commit = min(commit, self.acked.get(node, 0))
        if commit <= self.commit:
            return
        self.commit = commit
        waiters = self._waiters
        while waiters and waiters[0][0] <= commit:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_result(None)
        self.part.committed(commit)
        # followers learn the commit point with the next batches, or from heartbeat()
        # when idle: not one message more per acknowledgement

    def appended(self) -> None:
        """A publish appended records: send them to every follower."""
        for stream in self.streams.values():
            stream.wake.set()

    def expire(self, timeout: float) -> None:
        """Fail the writes that waited ``timeout`` seconds for the ISR (their
        connections close unanswered: the publishers retry)."""
        waiters = self._waiters
        limit = time.monotonic() - timeout
        while waiters and waiters[0][2] < limit:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(CommitFailed(f"not held by the ISR after {timeout:g} s"))

    def close(self) -> None:
        """Leadership lost: fail the waiting writes, close every stream."""
        self.closed = True
        while self._waiters:
            fut = self._waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(CommitFailed("not the leader any more"))
        for stream in list(self.streams.values()):
            stream.wake.set()
            self.replica.manager.spawn(_close_quietly(stream.ws))

    # -- streams ----------------------------------------------------------------------

    def accept(self, hello: rp.Hello) -> rp.Welcome | rp.Refused:
        """Answer a follower's HELLO: the point it must truncate to, or a refusal."""
        role = self.replica.role
        assert role is not None
        if hello.node not in role.replicas or hello.node == self.replica.node_id:
            return rp.Refused("E_NOT_REPLICA", f"{hello.node} holds no replica of {self.part}")
        if hello.epoch > role.epoch:
            return rp.Refused("E_STALE_LEADER", f"epoch {role.epoch} < {hello.epoch}")
        log_ = self.part.log
        cut = rp.divergence(role.history, log_.end, hello.history, hello.end)
        cut = min(cut, hello.end)
        history = [tuple(h) for h in role.history]
        # a new replica (a spare: nothing stored) starts where readers need it; one
        # that holds records keeps them (replays on it reach as far back) and copies
        # from its end, unless this log no longer has what follows it
        fresh = hello.end == 0 and not hello.history
        floor = self.copy_floor() if fresh else log_.start
        if floor <= cut < log_.end and log_.batch_start(cut) is None:
            # this log lost records there (a damaged segment set aside, see the store's
            # corruption policy): the follower cannot copy them, so it starts over after
            # the gap (its copy of older records goes; this log keeps its own)
            floor = log_.resume_at(cut)
            log.warning(
                "REPL: %s: %s needs sequences from %d that this log lost; it starts over at %d",
                self.part,
                hello.node,
                cut,
                floor,
            )
        if cut < floor:
            # reclaimed since it left, or a spare: it starts over at the floor (a spare
            # need not copy what every channel is done with; with replicator 2 writes
            # wait for its copy)
            first = log_.read_batches(floor, 1)
            offset = first[0].offset if first else log_.next_offset
            return rp.Welcome(role.epoch, history, floor, (floor, offset))  # type: ignore[arg-type]
        return rp.Welcome(role.epoch, history, cut)  # type: ignore[arg-type]

    def copy_floor(self) -> int:
        """Where a replica that lacks records starts: the stored batch that holds the
        partition's low water (the oldest position a channel, an in-flight message or a
        topic without channels still needs), or the log's start."""
        log_ = self.part.log
        low = min(self.part.low_water(), log_.end)
        if low <= log_.start:
            return log_.start
        if low >= log_.end:
            return log_.end
        first = log_.batch_start(low)
        return log_.start if first is None else first

    async def serve(self, node: str, ws: web.WebSocketResponse, start: int) -> None:
        """Run one follower's stream until it closes or the leadership ends."""
        old = self.streams.get(node)
        if old is not None:
            await old.ws.close()
        stream = FollowerStream(node, ws, start)
        self.streams[node] = stream
        self.acked[node] = start  # its log end once truncated as told
        log.info("REPL: %s: follower %s streaming from %d", self.part, node, start)
        sender = asyncio.create_task(self._send_loop(stream))
        try:
            async for msg in ws:
                if msg.type.name != "BINARY":
                    break
                try:
                    ack = rp.decode(msg.data)
                except rp.ReplicationProtocolError as err:
                    log.error("REPL: %s: bad message from %s: %s", self.part, node, err)
                    break
                if not isinstance(ack, rp.Ack):
                    log.error("REPL: %s: unexpected %s from %s", self.part, ack, node)
                    break
                stream.acked = ack.end
                self.acked[node] = ack.end
                if ack.end >= self.part.log.end:
                    self.caught_up_at[node] = time.monotonic()
                self.recompute()
                self.replica.follower_progress(node, ack.end)
        finally:
            sender.cancel()
            if self.streams.get(node) is stream:
                del self.streams[node]
            log.info("REPL: %s: follower %s stream closed", self.part, node)

    async def _send_loop(self, stream: FollowerStream) -> None:
        ws = stream.ws
        log_ = self.part.log
        try:
            while not self.closed and not ws.closed:
                await stream.wake.wait()
                stream.wake.clear()
                while stream.next_seq < log_.end and not self.closed:
                    batches = log_.read_batches(stream.next_seq, SEND_BYTES)
                    if not batches:
                        break
                    await ws.send_bytes(rp.encode_batches(self.commit, batches))
                    last = batches[-1]
                    stream.next_seq = last.first + last.messages
                    stream.sent_commit = self.commit
                if stream.sent_commit != self.commit and not self.closed:
                    stream.sent_commit = self.commit
                    await ws.send_bytes(rp.encode_batches(self.commit, []))
        except (OSError, RuntimeError, ValueError) as err:
            # (a read of this log that failed too: the follower's next HELLO decides)
            log.warning("REPL: %s: sending to %s failed: %s", self.part, stream.node, err)
            await ws.close()

    def heartbeat(self) -> None:
        """Send the commit point to followers that have not had it (an idle leader)."""
        for stream in self.streams.values():
            if stream.sent_commit != self.commit:
                stream.wake.set()

    def send_cursors(self, message: bytes) -> None:
        for stream in self.streams.values():
            if not stream.ws.closed:
                self.replica.manager.spawn(_send_quietly(stream.ws, message))

    # -- health -----------------------------------------------------------------------

    def lagging(self, timeout: float) -> list[str]:
        """ISR members that have been behind the leader's end for ``timeout`` seconds."""
        role = self.replica.role
        if role is None:
            return []
        now = time.monotonic()
        end = self.part.log.end
        out = []
        for node in role.isr:
            if node == self.replica.node_id:
                continue
            if self.acked.get(node, 0) >= end:
                self.caught_up_at[node] = now
                continue
            if now - self.caught_up_at.get(node, now) >= timeout:
                out.append(node)
        return out

    def caught_up(self) -> list[str]:
        """Replicas outside the ISR whose stream has reached the leader's end."""
        role = self.replica.role
        if role is None:
            return []
        end = self.part.log.end
        return [
            node
            for node, stream in self.streams.items()
            if node not in role.isr and stream.acked >= end and not stream.ws.closed
        ]


async def _send_quietly(ws: web.WebSocketResponse, message: bytes) -> None:
    try:
        await ws.send_bytes(message)
    except (ConnectionError, RuntimeError):
        pass


async def _close_quietly(ws: web.WebSocketResponse) -> None:
    try:
        await ws.close()
    except (ConnectionError, RuntimeError):
        pass
