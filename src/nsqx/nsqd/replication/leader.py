"""LeaderReplication: a partition leader's side of replication.

Each follower keeps one stream open to the leader (nsqx.wire.replication). The leader
sends it every stored batch it lacks, in order (first from the files when it is behind,
then each new batch as it is appended, several at once under load), and the follower
answers with the end of its log, and, as its background fsyncs finish, with its
*durable end*. The *commit point* is the lowest end among the ISR (the leader's own
included): every record below it is held by the whole ISR (what an election relies on);
with durable acknowledgement (the default: nsqd's ``--replication-ack``, a topic's
``replication_ack``) it is also at most the durable end that a write quorum of the
replicas has reached (more than half of them, the leader counted): every record below
it is fsynced on a majority, so a power cut of every node at once loses none of it
(see nsqx.lookupd.replicas for the election that finds it again). A publish is answered
once the commit point passes it, and consumers see only records below it, so a message
a consumer has seen can never vanish in a failover.

The leader's own fsync starts as a batch is appended (nsqd.syncer.LogSyncer, in a
thread, group-committed) while the batch is on its way to the followers, which append,
acknowledge and fsync at once: an acknowledgement waits for about one fsync, not two.

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

from nsqx.nsqd.waiters import Waiter
from nsqx.wire import replication as rp

if TYPE_CHECKING:
    from aiohttp import web

    from nsqx.nsqd.replication.replica import PartitionReplica

log = logging.getLogger("nsqx.replication")

#: Told once the records it waits for are committed (None) or will not be (the error).
CommitWaiter = Waiter

#: Bytes of stored batches per stream message.
SEND_BYTES = 1 << 20
#: BATCHES messages a follower may have unacknowledged: what is appended meanwhile waits
#: for an acknowledgement and goes in one message (under load, fewer and bigger
#: messages, writes and acknowledgements, each side; Kafka's followers get the same from
#: fetching); two, so that one is on its way while the other is being applied
MAX_UNACKED = 2
#: Marks a stream keeps (see FollowerStream.mark): about a second of commits under load
MAX_MARKS = 1024
#: A replica outside the ISR joins it again once it has acknowledged everything the
#: leader had at a moment at most this long ago (s): it keeps pace with the writes
REJOIN_WITHIN = 0.5


class CommitFailed(Exception):
    """A write that will not be committed by this leader (it lost the leadership)."""


class FrameWriter:
    """Writes a stream's BATCHES messages to the WebSocket's transport itself: the
    frame's head and the message's pieces (the stored frames among them, not copied)
    with one ``writev``. aiohttp writes a large frame's head and its payload with a
    system call each, and the follower wakes for each: under load that was a fifth of
    a leader's CPU with two followers. Other messages (WELCOME, CURSORS, the close)
    still go through aiohttp, each frame whole, so frames never interleave."""

    def __init__(self, ws: web.WebSocketResponse, request: web.BaseRequest) -> None:
        self.ws = ws
        self.transport = request.transport
        self.protocol = request.protocol

    def write(self, parts: list[bytes]) -> bool:
        """Write one binary message made of ``parts`` at once; True if the transport's
        buffer is now above its high-water mark (a slow follower: :meth:`drain`)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.ws.closed:
            raise ConnectionResetError("the follower's stream is closed")
        transport.writelines([rp.ws_binary_head(sum(map(len, parts))), *parts])
        return bool(self.protocol.writing_paused)

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark, as
        aiohttp's writer does."""
        protocol = self.protocol
        transport = self.transport
        if protocol.writing_paused:
            drain = getattr(protocol, "_drain_helper", None)  # aiohttp's, as its writer
            if drain is not None:
                await drain()
                return
            while protocol.writing_paused and transport is not None and not transport.is_closing():
                await asyncio.sleep(0.005)


class FollowerStream:
    """One follower's open stream: what was sent to it and what it acknowledged."""

    def __init__(
        self, node: str, ws: web.WebSocketResponse, next_seq: int, writer: FrameWriter
    ) -> None:
        self.node = node
        self.ws = ws
        self.writer = writer
        #: the next sequence to send
        self.next_seq = next_seq
        #: the follower's log end as it last acknowledged it
        self.acked = next_seq
        #: wakes the send task: what to send next waits for it (see LeaderReplication.pump)
        self.wake = asyncio.Event()
        self.wake.set()
        #: the transport's buffer is full: only the send task sends, once it drained
        self.draining = False
        self.sent_commit = -1
        self.connected_at = time.monotonic()
        #: (the leader's log end, when) noted as records were sent, oldest first: an
        #: acknowledgement that reaches a mark's end shows the follower had caught up
        #: with the leader as of that moment
        self.marks: deque[tuple[int, float]] = deque(maxlen=MAX_MARKS)
        #: the log end after each BATCHES message sent and not yet acknowledged
        self.unacked: deque[int] = deque()
        #: the follower reports its durable end (a follower of the previous release
        #: does not: its written end counts as durable, as that release promised)
        self.reports_durable = False

    def mark(self, end: int) -> None:
        """Note the leader's log end now (records up to it are on their way)."""
        marks = self.marks
        if not marks or marks[-1][0] < end:
            marks.append((end, time.monotonic()))

    def covered(self, acked: int) -> float | None:
        """When the leader last had no record beyond ``acked``, as far as the marks
        tell (the newest mark it reaches, which is dropped with the older ones)."""
        marks = self.marks
        at = None
        while marks and marks[0][0] <= acked:
            at = marks.popleft()[1]
        return at


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
        #: replicas reported caught up (node -> the epoch of the report), counted in
        #: the commit point until a newer role says whether they joined: the
        #: coordinator's ISR is then never larger than the one commits wait for (Kafka's
        #: "maximal ISR"), so whoever it elects holds every acknowledged write
        self.joining: dict[str, int] = {}
        #: each replica's durable end as it last reported it (kept across its
        #: reconnects: a power cut does not undo an fsync; a truncation lowers it)
        self.durable: dict[str, int] = {}
        #: replicas whose stream does not report durable ends (the previous release)
        self.legacy: set[str] = set()
        #: this leader's own durable end (its log's fsyncs)
        self.own_durable = 0
        #: the commit point waits for a write quorum's fsyncs (replica.durable_ack)
        self.durable_ack = replica.durable_ack
        self._waiters: deque[tuple[int, CommitWaiter, float]] = deque()
        self.closed = False
        now = time.monotonic()
        for node in replica.role.isr if replica.role else ():
            self.caught_up_at[node] = now

    # -- commit -----------------------------------------------------------------------

    def when_committed(self, seq: int, waiter: CommitWaiter) -> None:
        """Call ``waiter(None)`` once every record below ``seq`` is committed (in the
        call that moves the commit point: a future would answer the publisher one loop
        iteration later), ``waiter(CommitFailed)`` if it will not be."""
        if self.commit >= seq and self.replica.may_acknowledge():
            waiter(None)
        elif self.closed:
            waiter(CommitFailed("not the leader any more"))
        else:
            self._waiters.append((seq, waiter, time.monotonic()))

    def _tell(self, waiter: CommitWaiter, err: BaseException | None) -> None:
        try:
            waiter(err)
        except Exception:  # (one waiter's bug must not keep the others waiting)
            log.exception("REPL: %s: a commit waiter failed", self.part)

    def role_changed(self, epoch: int) -> None:
        """A newer role arrived while leading: it decided the joins reported before."""
        for node in [n for n, e in self.joining.items() if e < epoch]:
            del self.joining[node]

    def recompute(self) -> None:
        """Move the commit point to the lowest end among the ISR (and the replicas
        reported caught up), if the ISR is big enough to write and the leadership may
        acknowledge now (the lease); answer the writes it passes; show the records to
        channels."""
        role = self.replica.role
        if role is None or self.closed:
            return
        if not self.replica.may_acknowledge():
            # fenced: nothing is acknowledged until the lease is held and confirmed
            self.replica.manager.blocked.add(self.replica)
            return
        me = self.replica.node_id
        end = self.part.log.end
        if not role.quorum_ok:
            return
        commit = end
        acked = self.acked
        for node in role.isr:
            if node != me:
                commit = min(commit, acked.get(node, 0))
        for node in self.joining:
            if node != me:
                commit = min(commit, acked.get(node, 0))
        if self.durable_ack and commit > self.commit:
            commit = min(commit, self.quorum_durable())
        if commit > self.commit:
            self.commit = commit
            self.part.committed(commit)  # (visible to channels before the answers go out)
        waiters = self._waiters
        commit = self.commit
        while waiters and waiters[0][0] <= commit:
            self._tell(waiters.popleft()[1], None)
        # followers learn the commit point with the next batches, or from heartbeat()
        # when idle: not one message more per acknowledgement

    def quorum_durable(self) -> int:
        """The durable end a write quorum of the replicas (more than half of the
        topic's replicator, this leader counted) has reached: every record below it is
        fsynced on that many nodes."""
        role = self.replica.role
        if role is None:
            return 0
        me = self.replica.node_id
        durable = self.durable
        acked = self.acked
        legacy = self.legacy
        ends = [self.own_durable]
        for node in role.replicas:
            if node != me:
                ends.append(acked.get(node, 0) if node in legacy else durable.get(node, 0))
        quorum = role.replica // 2 + 1
        if len(ends) < quorum:
            return 0
        ends.sort(reverse=True)
        return ends[quorum - 1]

    def durable_advanced(self, end: int) -> None:
        """This node's fsync made every record below ``end`` durable."""
        if end > self.own_durable:
            self.own_durable = end
            if self.durable_ack:
                self.recompute()

    def follower_durable(self, node: str, end: int) -> None:
        """A follower's DURABLE: every record below ``end`` is fsynced there."""
        if end > self.durable.get(node, 0):
            self.durable[node] = end
            if self.durable_ack:
                self.recompute()

    def set_durable_ack(self, durable_ack: bool) -> None:
        """The acknowledgement rule changed (the topic's replication_ack, or a role):
        streams open again, so that followers hear in the WELCOME whether to fsync and
        report as they append."""
        if durable_ack == self.durable_ack:
            return
        log.info(
            "REPL: %s: acknowledgement rule now %s",
            self.part,
            "durable" if durable_ack else "written",
        )
        self.durable_ack = durable_ack
        for stream in list(self.streams.values()):
            self.replica.manager.spawn(_close_quietly(stream.ws))
        self.recompute()

    def appended(self) -> None:
        """A publish appended records: send them to every follower, and (durable
        acknowledgement) have this log fsynced meanwhile."""
        for stream in self.streams.values():
            self.pump(stream)
        if self.durable_ack:
            self.replica.sync_soon()

    def pump(self, stream: FollowerStream) -> None:
        """Send ``stream`` what it may have now, in this call (not a loop iteration
        later, from its task: each iteration between a publish and its answer costs
        the publisher a loop's turn on two processes); the task takes over while the
        transport drains, or if the send fails."""
        if stream.draining:
            return
        try:
            stream.draining = self._send_now(stream)
        except (OSError, RuntimeError, ValueError):
            stream.draining = True  # (the task meets the error and closes the stream)
        if stream.draining:
            stream.wake.set()

    def _send_now(self, stream: FollowerStream) -> bool:
        """Send what the follower may have (records, or the commit point alone); True
        if the transport must drain first."""
        log_ = self.part.log
        write = stream.writer.write
        stream.mark(log_.end)
        while stream.next_seq < log_.end and len(stream.unacked) < MAX_UNACKED and not self.closed:
            batches = log_.read_batches(stream.next_seq, SEND_BYTES)
            if not batches:
                break
            paused = write(rp.batches_parts(self.commit, batches))
            last = batches[-1]
            stream.next_seq = last.first + last.messages
            stream.unacked.append(stream.next_seq)
            stream.sent_commit = self.commit
            if paused:
                return True
        # (with messages unacknowledged, the next one carries the commit point)
        if stream.sent_commit != self.commit and not stream.unacked and not self.closed:
            stream.sent_commit = self.commit
            return write(rp.batches_parts(self.commit, []))
        return False

    def expire(self, timeout: float) -> None:
        """Fail the writes that waited ``timeout`` seconds for the ISR (their
        connections close unanswered: the publishers retry)."""
        waiters = self._waiters
        limit = time.monotonic() - timeout
        while waiters and waiters[0][2] < limit:
            self._tell(
                waiters.popleft()[1], CommitFailed(f"not held by the ISR after {timeout:g} s")
            )

    def close(self) -> None:
        """Leadership lost: fail the waiting writes, close every stream."""
        self.closed = True
        while self._waiters:
            self._tell(self._waiters.popleft()[1], CommitFailed("not the leader any more"))
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
        over = hello.start > cut
        if over:
            # its log starts past the cut (a torn segment set aside whole, the
            # sequences it may have held skipped): it cannot cut back there, so it
            # starts over as a new replica does
            fresh = True
            log.warning(
                "REPL: %s: %s's log starts at %d, past %d where it must cut: it starts over",
                self.part,
                hello.node,
                hello.start,
                cut,
            )
        floor = self.copy_floor() if fresh else log_.start
        holder = log_.batch_start(cut) if floor <= cut < log_.end else cut
        if holder is None:
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
        elif holder != cut:
            # the follower's log ends inside one of this log's batches (a torn tail, or
            # a gap an older release skipped): it cuts back to where that batch starts,
            # the last record both logs agree on, and copies from there
            log.warning(
                "REPL: %s: %s ends at %d, inside the batch at %d: it cuts back to it",
                self.part,
                hello.node,
                cut,
                holder,
            )
            cut = holder
        durable = hello.durable and self.durable_ack
        if cut < floor or over:
            # reclaimed since it left, or a spare: it starts over at the floor (a spare
            # need not copy what every channel is done with; with replicator 2 writes
            # wait for its copy)
            first = log_.read_batches(floor, 1)
            offset = first[0].offset if first else log_.next_offset
            return rp.Welcome(role.epoch, history, floor, (floor, offset), durable)  # type: ignore[arg-type]
        return rp.Welcome(role.epoch, history, cut, None, durable)  # type: ignore[arg-type]

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

    async def serve(
        self,
        node: str,
        ws: web.WebSocketResponse,
        start: int,
        request: web.BaseRequest,
        reports_durable: bool = False,
    ) -> None:
        """Run one follower's stream (the WebSocket of ``request``) until it closes or
        the leadership ends. ``reports_durable``: the WELCOME asked it for DURABLE
        messages (else its written end counts as durable: the previous release)."""
        old = self.streams.get(node)
        if old is not None:
            await old.ws.close()
        stream = FollowerStream(node, ws, start, FrameWriter(ws, request))
        stream.reports_durable = reports_durable
        self.streams[node] = stream
        self.acked[node] = start  # its log end once truncated as told
        # what it made durable before stays durable, up to where it was told to cut
        self.durable[node] = min(self.durable.get(node, 0), start)
        if reports_durable:
            self.legacy.discard(node)
        else:
            self.legacy.add(node)
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
                if isinstance(ack, rp.Durable) and reports_durable:
                    self.follower_durable(node, ack.end)
                    continue
                if not isinstance(ack, rp.Ack):
                    log.error("REPL: %s: unexpected %s from %s", self.part, ack, node)
                    break
                stream.acked = ack.end
                self.acked[node] = ack.end
                # caught up as of the newest moment whose log end it now holds (at
                # once if that is the current end): under a steady stream of writes
                # a follower that keeps pace is always a little behind the end
                at = time.monotonic() if ack.end >= self.part.log.end else stream.covered(ack.end)
                if at is not None and at > self.caught_up_at.get(node, 0.0):
                    self.caught_up_at[node] = at
                unacked = stream.unacked
                if unacked and unacked[0] <= ack.end:
                    while unacked and unacked[0] <= ack.end:
                        unacked.popleft()
                    if stream.next_seq < self.part.log.end:
                        self.pump(stream)  # what waited for room
                self.recompute()
                self.replica.follower_progress(node, ack.end)
        finally:
            sender.cancel()
            if self.streams.get(node) is stream:
                del self.streams[node]
            log.info("REPL: %s: follower %s stream closed", self.part, node)

    async def _send_loop(self, stream: FollowerStream) -> None:
        # sends when the stream opens, after a drain, and for heartbeat(); pump() sends
        # the rest as it happens
        ws = stream.ws
        try:
            while not self.closed and not ws.closed:
                await stream.wake.wait()
                stream.wake.clear()
                stream.draining = True
                while self._send_now(stream):
                    await stream.writer.drain()
                stream.draining = False
        except (OSError, RuntimeError, ValueError) as err:
            # (a read of this log that failed too: the follower's next HELLO decides)
            log.warning("REPL: %s: sending to %s failed: %s", self.part, stream.node, err)
            await ws.close()

    def heartbeat(self) -> None:
        """Send the commit point to followers that have not had it (an idle leader)."""
        for stream in self.streams.values():
            if stream.sent_commit != self.commit:
                self.pump(stream)

    def send_cursors(self, message: bytes) -> None:
        for stream in self.streams.values():
            if not stream.ws.closed:
                self.replica.manager.spawn(_send_quietly(stream.ws, message))

    # -- health -----------------------------------------------------------------------

    def lagging(self, timeout: float) -> list[str]:
        """ISR members that have not, for ``timeout`` seconds, acknowledged everything
        the leader had at some moment of that time (Kafka's replica.lag.time.max.ms:
        not "reached the end", which a follower keeping pace with a steady stream of
        writes never quite does)."""
        role = self.replica.role
        if role is None:
            return []
        now = time.monotonic()
        end = self.part.log.end
        out = []
        for node in (*role.isr, *(n for n in self.joining if n not in role.isr)):
            if node == self.replica.node_id:
                continue
            if self.acked.get(node, 0) >= end:
                self.caught_up_at[node] = now
                continue
            if now - self.caught_up_at.get(node, now) >= timeout:
                out.append(node)
        return out

    def caught_up(self) -> list[str]:
        """Replicas outside the ISR whose stream has reached the leader's end, or has
        acknowledged everything the leader had at most REJOIN_WITHIN seconds ago, and
        holds every committed record (so that every member of the coordinator's ISR
        holds them all: an election among live members needs no more)."""
        role = self.replica.role
        if role is None:
            return []
        end = self.part.log.end
        commit = self.commit
        recent = time.monotonic() - REJOIN_WITHIN
        return [
            node
            for node, stream in self.streams.items()
            if node not in role.isr
            and not stream.ws.closed
            and stream.acked >= commit
            and (stream.acked >= end or self.caught_up_at.get(node, 0.0) >= recent)
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
