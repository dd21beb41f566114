"""FollowerReplication: a follower's side of replication.

The follower opens a stream to its leader (nsqx.wire.replication), says where its log
ends and what its epoch history is, cuts its log where the leader says it diverges
(records a failed leader wrote that the new leader never had), then appends every batch
the leader sends, exactly as sent, and acknowledges the new end after each read. With
durable acknowledgement it also has each read's appends fsynced in the background
(nsqd.syncer, group-committed) and reports its durable end as the fsyncs finish.
It reconnects, with a growing delay, until the coordinator gives it another role; at
once when its log did not end where the leader said to cut (a torn or damaged tail cut
further back): its next HELLO says where it really ends.

The stream is a WebSocket on the leader's HTTP port. This side of it is a plain asyncio
protocol over nsqx.wire.websocket rather than aiohttp's client: a read's messages are
appended where they arrive, in ``data_received``, and acknowledged with one frame, with
no message objects, queue or task switch per message (under load the follower's work per
message fell by a third; see docs/replication.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, cast

from nsqx.wire import replication as rp
from nsqx.wire import websocket as ws

if TYPE_CHECKING:
    from nsqx.nsqd.replication.replica import PartitionReplica

log = logging.getLogger("nsqx.replication")

RETRY_MIN = 0.1
RETRY_MAX = 2.0
#: seconds to connect, and to wait for the handshake's and the HELLO's answers
CONNECT_TIMEOUT = 2.0
ANSWER_TIMEOUT = 10.0
#: the largest stream message taken (a leader sends about SEND_BYTES, or one stored
#: batch if bigger): a bogus length is refused, not allocated
MAX_MESSAGE = 1 << 30
#: bytes read at a time (but a big message is received straight into its own buffer)
READ_SIZE = 16 * 1024
#: a ping every HEARTBEAT seconds at most; a stream that received nothing for twice the
#: node timeout is taken for dead and opened again (a live leader sends the channels'
#: positions twice a second)
HEARTBEAT = 1.0


class ReplicationError(Exception):
    """The stream cannot go on (the follower reconnects)."""


class _Stream(asyncio.BufferedProtocol):
    """One connection to the leader: the WebSocket handshake, then its messages. Until
    :meth:`stream_to` they are queued for the follower's coroutine (the WELCOME, and the
    batches that may follow it in the same read); after it, applied as they arrive. A
    big message is received straight into a buffer of its own (ws.FrameReader)."""

    def __init__(self) -> None:
        # (kept: asyncio.get_running_loop() is a getpid system call each time in 3.11)
        self._loop = loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # (a message's payload is applied, its batches copied out, before the next read:
        # the reader may receive every big one into the same buffer)
        self.reader = ws.FrameReader(max_size=MAX_MESSAGE, reuse=True)
        self._buffer = memoryview(bytearray(READ_SIZE))
        self._direct = False
        self._ack_soon = False
        self._head = b""
        self._key = b""
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.received_at = time.monotonic()
        self._queued: deque[bytes] = deque()
        self._arrived: asyncio.Future[None] | None = None
        self._follower: FollowerReplication | None = None

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses: no isinstance)
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ReplicationError(f"the leader closed the stream ({exc or 'EOF'})"))

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self.reader.direct_buffer() if self.accepted.done() else None
        self._direct = direct is not None
        return direct if direct is not None else self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.received_at = time.monotonic()
        try:
            if self._direct:
                messages = self.reader.direct_filled(nbytes)
            else:
                data = bytes(self._buffer[:nbytes])
                if not self.accepted.done():
                    data = self._handshake(data)
                    if not data:
                        return
                messages = self.reader.feed(data)
            follower = self._follower
            for opcode, payload in messages:
                if opcode == ws.OP_BINARY:
                    if follower is not None:
                        follower.apply(payload)
                    else:
                        self._queued.append(bytes(payload))  # (kept: a copy)
                        if self._arrived is not None and not self._arrived.done():
                            self._arrived.set_result(None)
                elif opcode == ws.OP_PING:
                    self.send(ws.OP_PONG, bytes(payload))
                elif opcode == ws.OP_CLOSE:
                    self.send(ws.OP_CLOSE, bytes(payload[:2]))
                    raise ReplicationError("the leader closed the stream (CLOSE)")
                elif opcode == ws.OP_TEXT:
                    raise ReplicationError("a text message on the stream")
            if follower is not None and messages and not self._ack_soon:
                # at the end of this loop iteration: the reads it makes of this stream
                # (several, under load) are all appended first, then one ACK
                self._ack_soon = True
                self._loop.call_soon(self._acknowledge)
        except Exception as err:  # (a bad frame, a write to the log that failed): reconnect
            self._fail(err)

    def _acknowledge(self) -> None:
        self._ack_soon = False
        if self._follower is not None:
            self._follower.acknowledge(self)

    # -- the follower's side ----------------------------------------------------------

    def open(self, host: str, target: str, headers: dict[str, str] | None = None) -> None:
        assert self.transport is not None
        request, self._key = ws.client_handshake(host, target, headers)
        self.transport.write(request)

    def send(self, opcode: int, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(ws.client_frame(opcode, payload))

    async def next_message(self) -> bytes:
        """The next binary message received before streaming began."""
        while not self._queued:
            if self.done.done():
                self.done.result()  # raises why it ended
            self._arrived = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._arrived, self.done], return_when=asyncio.FIRST_COMPLETED)
        return self._queued.popleft()

    def stream_to(self, follower: FollowerReplication) -> None:
        """From now on apply each message as it arrives (those queued first)."""
        try:
            while self._queued:
                follower.apply(self._queued.popleft())
            follower.acknowledge(self)
        except Exception as err:
            self._fail(err)
            return
        self._follower = follower

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _handshake(self, data: bytes) -> bytes:
        head = self._head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > ws.MAX_HEAD:
                raise ws.WebSocketError("an endless handshake answer")
            self._head = head
            return b""
        self._head = b""
        ws.check_handshake(head[:end], self._key)
        self.accepted.set_result(None)
        return head[end + 4 :]

    def _fail(self, err: Exception) -> None:
        if isinstance(err, ReplicationError):
            self._end(err)
        elif isinstance(err, ws.WebSocketError):
            self._end(ReplicationError(str(err)))
        else:
            self._end(ReplicationError(f"{type(err).__name__}: {err}"))

    def _end(self, err: ReplicationError) -> None:
        if not self.accepted.done():
            self.accepted.set_exception(err)
            self.accepted.exception()  # (retrieved: its waiter may be gone)
        if not self.done.done():
            self.done.set_exception(err)
            self.done.exception()
        self._follower = None
        self.close()


class FollowerReplication:
    """The stream of one follower partition to its leader, in a task."""

    def __init__(self, replica: PartitionReplica, leader_http: str) -> None:
        self.replica = replica
        self.part = replica.part
        self.leader_http = leader_http
        self.connected = False
        #: the leader's commit point as last received
        self.commit = 0
        #: the log end last acknowledged on this stream
        self._acked = -1
        #: the leader wants this follower's durable end (WELCOME's durable)
        self.reports_durable = False
        #: the first commit point this stream brought: once the log reaches it, it
        #: holds every committed record (the leader counts it in the ISR from the
        #: stream's start, so no later commit point passes it): replica.intact
        self._intact_at = -1
        #: when the leader was last heard (time.monotonic), on any stream
        self.heard_at = time.monotonic()
        self._stream: _Stream | None = None
        self._task = asyncio.create_task(self._run(), name=f"follow {self.part}")

    def silent_for(self, now: float) -> float:
        """Seconds since anything came from the leader (connected or not)."""
        stream = self._stream
        heard = self.heard_at
        if stream is not None and stream.accepted.done() and stream.received_at > heard:
            heard = stream.received_at
        return now - heard

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        delay = RETRY_MIN
        part = self.part
        host, _, port = self.leader_http.rpartition(":")
        # who and what in the URL too: for the leader's logs, and for proxies
        target = (
            f"/replication/stream?node={self.replica.node_id}&topic={part.name}&partition={part.id}"
        )
        loop = asyncio.get_running_loop()
        while True:
            stream: _Stream | None = None
            try:
                before = part.log.end
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that races with its answer, and close() then waits for
                # this loop for ever
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    _, opened = await loop.create_connection(_Stream, host.strip("[]"), int(port))
                stream = opened
                self._stream = opened
                opened.open(self.leader_http, target, self.replica.member_headers())
                await self._follow(opened)
            except asyncio.CancelledError:
                raise
            except (OSError, TimeoutError, ValueError, ReplicationError) as err:
                log.info("REPL: %s: following %s: %s", self.part, self.leader_http, err)
            except Exception:
                log.exception("REPL: %s: following %s failed", self.part, self.leader_http)
            finally:
                self.connected = False
                if stream is not None:
                    if stream.accepted.done() and stream.received_at > self.heard_at:
                        self.heard_at = stream.received_at
                    stream.close()
                self._stream = None
            if part.log.end != before:
                delay = RETRY_MIN  # the leader closed a working stream: at once
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    async def _follow(self, stream: _Stream) -> None:
        replica = self.replica
        role = replica.role
        part = self.part
        log_ = part.log
        assert role is not None
        async with asyncio.timeout(ANSWER_TIMEOUT):
            await asyncio.shield(stream.accepted)
        stream.send(
            ws.OP_BINARY,
            rp.encode_hello(
                rp.Hello(
                    part.name,
                    part.id,
                    replica.node_id,
                    role.epoch,
                    log_.end,
                    log_.end_offset,
                    list(role.history),
                    True,
                    log_.start,
                )
            ),
        )
        async with asyncio.timeout(ANSWER_TIMEOUT):
            welcome = rp.decode(await stream.next_message())
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
            replica.log_cut(log_.end)
        elif welcome.truncate_to < log_.end:
            log.warning(
                "REPL: %s: cutting records %d-%d the leader does not have",
                part,
                welcome.truncate_to,
                log_.end - 1,
            )
            part.truncate(welcome.truncate_to)
            replica.log_cut(log_.end)
        if welcome.reset is None and log_.end != welcome.truncate_to:
            # the cut went further back (it fell inside a batch of this log, or a torn
            # or damaged tail was set aside), or this log ends before that point: the
            # leader's batches would not follow this end. Say where it ends now
            raise ReplicationError(
                f"this log ends at {log_.end}, not at {welcome.truncate_to} as the leader said"
            )
        replica.adopt_history(tuple(welcome.history))
        self.connected = True
        self._acked = -1
        self._intact_at = -1
        self.reports_durable = welcome.durable
        log.info("REPL: %s: following %s from %d", part, self.leader_http, log_.end)
        # (acknowledges the log's end at once: the leader's commit point may wait on it)
        stream.stream_to(self)
        if self.reports_durable:
            # what is fsynced already counts at once; the rest once fsynced (the first
            # ACK asked for that fsync)
            stream.send(ws.OP_BINARY, rp.encode_durable(min(replica.durable_end, log_.end)))
        dead_after = 2 * replica.node_timeout()
        every = min(HEARTBEAT, dead_after / 4)
        while not stream.done.done():
            await asyncio.wait([stream.done], timeout=every)
            if stream.done.done():
                break
            if time.monotonic() - stream.received_at > dead_after:
                raise ReplicationError(f"nothing from the leader for {dead_after:g} s")
            stream.send(ws.OP_PING, b"")
        stream.done.result()

    def apply(self, data: ws.Payload) -> None:
        """One message of the stream (on the event loop, as it arrives)."""
        part = self.part
        try:
            ev = rp.decode(data)
        except rp.ReplicationProtocolError as err:
            raise ReplicationError(f"a bad message: {err}") from None
        if isinstance(ev, rp.Batches):
            if ev.batches:
                try:
                    part.append_replicated(ev.batches)
                except ValueError as err:
                    raise ReplicationError(str(err)) from None
            self.commit = ev.commit
            part.committed(min(ev.commit, part.log.end))
            if not self.replica.intact:
                if self._intact_at < 0:
                    self._intact_at = ev.commit
                if part.log.end >= self._intact_at:
                    self.replica.intact = True
        elif isinstance(ev, rp.Cursors):
            part.apply_cursors(ev.channels, ev.hold_from, ev.deferred, ev.now_ms)
            if ev.replay_marks:
                part.apply_replay_marks(ev.replay_marks)
        else:
            raise ReplicationError(f"unexpected {type(ev).__name__}")

    def acknowledge(self, stream: _Stream) -> None:
        """Send the log's end if it moved since the last ACK (once per read: the
        messages that arrived together are all appended first), and have what was
        appended fsynced if the leader waits for this follower's durable end."""
        end = self.part.log.end
        if end != self._acked:
            self._acked = end
            stream.send(ws.OP_BINARY, rp.encode_ack(end))
            if self.reports_durable:
                self.replica.sync_soon()

    def durable_advanced(self, end: int) -> None:
        """An fsync made every record below ``end`` durable: tell the leader."""
        stream = self._stream
        if self.reports_durable and self.connected and stream is not None:
            stream.send(ws.OP_BINARY, rp.encode_durable(end))
