"""ClientV2: one TCP connection speaking protocol V2, as an asyncio Protocol.

Bytes go to the sans-IO parser (nsqx.wire.commands); each event is judged by protocol
V2's rules (nsqx.nsqd.protocol_v2: which state accepts it, whether AUTH must allow it)
and executed in order; everything the connection must send during one read is written
once at the end of it, or once the publishes it answers are acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, cast, final

from nsqx.nsqd import clock
from nsqx.nsqd import protocol_v2 as pv2
from nsqx.nsqd.auth import AuthError, AuthState
from nsqx.nsqd.fanin import (
    HEX_ID_LEN,
    SHARD_PREFIX_LEN,
    FanIn,
    LocalShard,
    Source,
    fanin_wanted,
)
from nsqx.nsqd.protocol_v2 import STATE_CLOSING as STATE_CLOSING
from nsqx.nsqd.protocol_v2 import STATE_INIT as STATE_INIT
from nsqx.nsqd.protocol_v2 import STATE_SUBSCRIBED as STATE_SUBSCRIBED
from nsqx.nsqd.publishing import ext_fields, pub_partition, traced_answer
from nsqx.nsqd.upgrade import UpgradedStream
from nsqx.store.log import split_chunks
from nsqx.wire import commands as cmd
from nsqx.wire.compression import codec_pair
from nsqx.wire.errors import (
    E_AUTH_DISABLED,
    E_AUTH_FAILED,
    E_AUTH_FIRST,
    E_FAILED_ON_NOT_LEADER,
    E_FIN_FAILED,
    E_IDENTIFY_FAILED,
    E_INVALID,
    E_REQ_FAILED,
    E_SUB_CHANNEL_NOT_REGISTERED,
    E_SUB_EXTEND_FORBIDDON,
    E_SUB_EXTEND_NEED,
    E_SUB_ORDER_IS_MUST,
    E_TOPIC_NOT_EXIST,
    E_TOUCH_FAILED,
    E_UNAUTHORIZED,
    ProtocolError,
)
from nsqx.wire.frames import (
    CLOSE_WAIT,
    HEARTBEAT,
    OK,
    encode_error,
    encode_response,
    equal_frame_size,
    hex_id,
    is_extended,
    vanilla_frame,
    youzan_frame,
    youzan_ids,
)
from nsqx.wire.identify import ClientSettings, negotiate

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel, Consumer
    from nsqx.nsqd.loopturn import LoopTurn
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition, Published
    from nsqx.nsqd.topic import Topic
    from nsqx.nsqd.workers.forwarding import Ticket, WorkerSet
    from nsqx.nsqd.workers.handoff import Handoff
    from nsqx.nsqd.workers.proxy import RemoteSub

log = logging.getLogger("nsqx.nsqd")

#: reads of one connection whose answers may wait for their acknowledgement at once
#: (replication round trips, fsyncs) before it stops reading
MAX_ACK_GROUPS: Final = 32
#: a SUB whose connection could not move to its partition's worker (starting or
#: restarting) tries again this often (seconds), for at most OWNER_WAIT seconds, before
#: it is proxied (it would stay so, each delivery crossing a link)
OWNER_RETRY: Final = 0.05
OWNER_WAIT: Final = 30.0

_OK_FRAME: Final = encode_response(OK)
# (compiled: a Final alias is a C static; ``cmd.Mpub`` would be a module lookup per read)
_MPUB: Final = cmd.Mpub
_PUBS: Final = cmd.Pubs
_PUB: Final = cmd.Pub
_SUB: Final = cmd.Sub
_HEARTBEAT_FRAME: Final = encode_response(HEARTBEAT)
_CLOSE_WAIT_FRAME: Final = encode_response(CLOSE_WAIT)


@final
class AckGroup:
    """The answers of one read that published, held until every partition it published
    to acknowledged (the waiter of :meth:`Partition.when_acknowledged`, called once per
    partition). A class of its own rather than a partial over a list: compiled, both
    making and calling it are direct."""

    def __init__(self, client: ClientV2, due: int, end: int) -> None:
        self.client = client
        #: acknowledgements still due
        self.due = due
        #: the end of this group's answers in the client's output
        self.end = end

    def __call__(self, err: BaseException | None) -> None:
        self.client._acknowledged(self, err)


def _one_prefix(ids: list[bytes]) -> bool:
    """Whether every id of ``ids`` is a hex id with the first one's shard prefix (so
    from its shard: nsqx.nsqd.fanin.FanIn.source_of), compared column by column."""
    n = len(ids)
    joined = b"".join(ids)
    if len(joined) != HEX_ID_LEN * n:
        return False
    first = ids[0]
    return all(joined[k::HEX_ID_LEN] == first[k : k + 1] * n for k in range(SHARD_PREFIX_LEN))


class ClientV2(asyncio.Protocol):
    """A client connection: its negotiated settings, state, RDY and output.

    Subscribed, it is its channel's :class:`~nsqx.nsqd.channel.Consumer`: the channel
    keeps the messages in flight to it (nsqx.nsqd.inflight) and calls :meth:`ready`
    and :meth:`send`.
    """

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        # read on every command (NSQD is not a compiled class: each read of its
        # attributes is a dictionary lookup)
        self._turn: LoopTurn = nsqd.turn
        self._topics: dict[str, Topic] = nsqd.topics
        self.id = nsqd.next_client_id()
        # --tls-required: only IDENTIFY is accepted until the connection is encrypted
        parser_cls = cmd.TLSRequiredParser if nsqd.tls_required else cmd.CommandParser
        self.parser: cmd.CommandParser = parser_cls(nsqd.parser_limits)
        self.settings = ClientSettings.defaults(nsqd.server_limits)
        self.state = STATE_INIT
        #: told CLOSE_WAIT by nsqd's drain (not by its own CLS)
        self._drained = False
        self.channel: Channel | None = None
        #: subscribed to a partition another worker owns (nsqx.nsqd.workers.proxy); a
        #: separate attribute, so that ``channel`` stays typed for the local path
        self._remote: RemoteSub | None = None
        #: subscribed to every shard of a sharded topic (nsqx.nsqd.fanin)
        self._fanin: FanIn | None = None
        #: the SUB sent to another worker, while it is answered (it may come back as
        #: a sharded topic's: then it subscribes to every shard)
        self._sub_ev: cmd.Sub | None = None
        self.rdy = 0
        self.remote_address = ""
        self.connect_ts = int(time.time())
        self.message_count = 0
        self._pub_counts: dict[str, int] = {}
        # the topic published to last and its count not yet in _pub_counts: a publisher
        # keeps to one topic, and a dictionary get and set per publish cost more
        self._pub_topic = ""
        self._pub_pending = 0
        self.closed = False
        #: negotiated upgrades (for stats); tls is set once the handshake completed
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.remote_ip = ""
        #: the last AUTH answer (None before AUTH)
        self.auth_state: AuthState | None = None
        self._auth_secret = b""
        # _halt is the one flag the read loop tests per command: closed, or waiting for
        # the auth server (then the rest of the read waits in _held / _held_data)
        self._halt = False
        self._held: list[cmd.Event] | None = None
        self._held_data: list[bytes] = []
        self._stream: UpgradedStream | None = None
        #: --auth-http-address: SUB and publishes must be authorized (Rule.auth)
        self._auth = nsqd.auth is not None
        #: the node's other workers (--workers): publishes to partitions another worker
        #: owns are forwarded there (nsqx.nsqd.workers.forwarding)
        self._workers: WorkerSet | None = nsqd.workers
        #: the worker that owns the partition published to last (-1: none yet)
        self._route_topic = ""
        self._route_pid = 0
        self._route_owner = -1
        self._route_gen = 0
        #: publishes of this read forwarded to their owner, waiting for its answer
        self._forwarded: list[Ticket] = []
        #: moving plain connections to their topic's owner (None: not a worker, or off)
        self._handoff: Handoff | None = nsqd.workers.handoff if nsqd.workers else None
        #: the worker this connection moves to once nothing of it is in flight (-1: none)
        self._handoff_to = -1
        #: moved already (a connection moves once), or adopted from another worker
        self._handed = False
        #: the last move could go but the owner's worker did not take it (not started)
        self._move_failed = False
        #: a SUB waits for its owner's worker to take the connection until then (0: not)
        self._owner_wait_until = 0.0
        #: _held already holds the rest of the read (a SUB waiting for its owner took it)
        self._held_whole = False
        #: the current read's events and the place of the one executing (a SUB moves
        #: with what follows it)
        self._events: list[cmd.Event] = _NO_EVENTS
        self._event_i = 0
        #: once adopted: the SUB that moved the connection here, the events after it in
        #: its read, and the start of a command not complete yet
        self._adopted: tuple[cmd.Sub, list[cmd.Event], bytes] | None = None
        #: items written or dropped from the front of _out so far (a forwarded
        #: publish's answer is found by its place counted from the start)
        self._out_base = 0
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._write_paused = False
        #: durable partitions published to during this read: its answers (and all output
        #: after them) wait until each acknowledged (Partition.when_acknowledged)
        self._awaiting: list[Partition] = []
        #: acknowledgements still awaited, in all groups
        self._acks_due = 0
        #: one group per read that published. Output is written in order, a group's
        #: answers once all of its publishes (and every earlier group's) are acknowledged.
        #: (a list: at most MAX_ACK_GROUPS, and compiled, list operations are direct)
        self._groups: list[AckGroup] = []
        #: reading stopped: too many reads wait for their acknowledgements
        self._paused_for_ack = False
        self._close_after_ack = False
        self._ack_failed = False
        self._pub_verb = "PUB"
        #: Youzan's message layout for this client (see nsqx.wire.frames): binary ids,
        #: the ext part (ext topic, extend_support), (offset, size) before the body
        self.yz_ids = False
        self.yz_ext = False
        self.yz_detail = False
        now = clock.monotonic()
        #: when it last read a command, to a tick's precision (see tick())
        self._last_read = now
        self._read_since_tick = False
        self._last_heartbeat = now
        self._apply_settings()

    def __repr__(self) -> str:
        return f"<client {self.remote_address} {self.settings.client_id!r}>"

    def _apply_settings(self) -> None:
        s = self.settings
        self.msg_timeout = s.msg_timeout_ms / 1000
        self.heartbeat_interval = s.heartbeat_interval_ms / 1000
        self.output_buffer_size = s.output_buffer_size
        self.output_buffer_timeout = s.output_buffer_timeout_ms / 1000
        self.sample_rate = s.sample_rate

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.remote_address = f"{peer[0]}:{peer[1]}"
            self.remote_ip = str(peer[0])
        else:
            self.remote_address = str(peer or "")
        self.nsqd.clients.add(self)
        log.debug("TCP: new client(%s)", self.remote_address)
        if self._adopted is not None:
            # moved here by its SUB: it and what followed it, before anything more is read
            (sub, rest, partial), self._adopted = self._adopted, None
            for i, ev in enumerate([sub, *rest]):
                self._execute(ev)
                if self._halt:
                    if self._held is not None:  # an auth query: the rest waits for it
                        self._held.extend(rest[i:])
                        self._held_data.append(partial)
                    return
            self.data_received(partial)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        # (the time of it is taken by the next tick: a clock read per read costs more
        # than the ticks' 100 ms of precision are worth)
        self._read_since_tick = True
        plain = not self._auth
        local = self._workers is None
        events = self.parser.feed(data)
        for i, ev in enumerate(events):
            # a publisher's commands go straight to their handler (compiled: a direct
            # call, not a dictionary lookup and a call through Python's protocol): every
            # state accepts them, and without AUTH nothing else is checked (with
            # workers, unless its partition's owner is another worker: forwarded)
            kind = type(ev)
            if kind is _MPUB and plain:
                if local or not self._forward(ev):
                    self._on_mpub(cast(cmd.Mpub, ev))
            elif kind is _PUBS and plain:
                if local or not self._forward(ev):
                    self._on_pubs(cast(cmd.Pubs, ev))
            elif kind is _PUB and plain:
                if local or not self._forward(ev):
                    self._on_pub(cast(cmd.Pub, ev))
            elif kind is _SUB and self._handoff is not None:
                # (kept for a SUB that moves the connection: what follows goes with it)
                self._events, self._event_i = events, i
                self._execute(ev)
                self._events = _NO_EVENTS
            else:
                self._execute(ev)
            if self._halt:
                if self.closed:
                    return
                # an auth query is running: the rest of this read waits for its answer
                assert self._held is not None
                if not self._held_whole:
                    self._held.extend(events[i + 1 :])
                break
        published = bool(self._awaiting) or bool(self._forwarded)
        if published:
            self._await_acks()
        elif self._out and not self._acks_due:
            self.flush()
        if self._turn.spend_read_budget(len(data), self, published) and not self._write_paused:
            # libuv keeps reading a busy socket (up to 32 reads) before the loop runs
            # anything else; a publisher flooding MPUBs would starve every channel's
            # pump. Past the loop iteration's budget, yield until the next one.
            assert self._transport is not None
            self._transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._resume_reading)

    @property
    def answers_held(self) -> bool:
        """Whether answers of this connection wait for acknowledgements (a write, an
        fsync, the ISR): then it is nsqd, not the client, that has the next move."""
        return bool(self._groups)

    def _await_acks(self) -> None:
        """Hold the answers of this read, and everything after them, until every
        partition it published to acknowledged the publishes: written by the loop
        iteration's group commit (one write for all connections), fsynced with
        --sync-before-ack, held by the ISR if replicated.

        The connection goes on reading meanwhile (a publisher's next commands need not
        wait for a replication round trip or an fsync): each read's answers are a group,
        written in order once it and every earlier group are acknowledged. Past
        MAX_ACK_GROUPS groups waiting, reading stops until the oldest is answered."""
        parts, self._awaiting = self._awaiting, []
        forwarded = self._forwarded
        due = len(parts)
        if forwarded:
            self._forwarded = []
            due += len(forwarded)
        group = AckGroup(self, due, len(self._out))
        for ticket in forwarded:
            ticket.group = group
        self._groups.append(group)
        self._acks_due += due
        if len(self._groups) >= MAX_ACK_GROUPS and not self._paused_for_ack:
            assert self._transport is not None
            self._paused_for_ack = True
            self._transport.pause_reading()
        for part in parts:
            part.when_acknowledged(group)

    def _acknowledged(self, group: AckGroup, err: BaseException | None) -> None:
        self._acks_due -= 1
        group.due -= 1
        if err is not None and not self._ack_failed:
            self._ack_failed = True
            self._out_base += len(self._out)
            self._out.clear()
            self._groups.clear()  # none of the held answers goes out
            if isinstance(err, OSError):
                # the write or the fsync failed: E_PUB_FAILED / E_MPUB_FAILED /
                # E_DPUB_FAILED, then close
                verb = self._pub_verb
                log.error("[%s] - %s failed (%s); closing without acknowledging", self, verb, err)
                self._out.append(
                    encode_error(ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {err}"))
                )
            else:
                # not held by the ISR: close unanswered, the publisher looks up again
                log.error("[%s] - %s; closing without acknowledging", self, err)
            self._close_after_ack = True
            self.closed = self._halt = True
            self._tell_ready()
        if self._ack_failed:
            if not self._acks_due:
                self._flush_closing()  # the fatal error that closed us
            return
        groups = self._groups
        if groups[0].due:
            return  # the oldest group still waits (answers go out in order)
        end = 0
        while groups and not groups[0].due:
            end = groups.pop(0).end
        if groups:
            # write the answers of the groups acknowledged; later ones stay held
            out = self._out
            transport = self._transport
            if end and transport is not None and not transport.is_closing():
                transport.write(b"".join(out[:end]))
            del out[:end]
            self._out_base += end
            for g in groups:
                g.end -= end
            self._out_size = sum(map(len, out)) if out else 0
        elif self._close_after_ack:
            self._flush_closing()  # the answers, then the fatal error that closed us
            return
        else:
            self.flush()
            if self._handoff_to >= 0:
                self._hand_off(self._handoff_to, None)
        if self._paused_for_ack and len(groups) < MAX_ACK_GROUPS:
            self._paused_for_ack = False
            self._resume_reading()

    def _resume_reading(self) -> None:
        if (
            not self._write_paused
            and not self._paused_for_ack
            and not self.closed
            and self._held is None
            and self._transport is not None
        ):
            self._transport.resume_reading()

    def receive_plain(self, data: bytes) -> None:
        """Commands from an upgraded stream (decrypted, decompressed)."""
        if self._held is not None:
            self._held_data.append(data)
        else:
            self.data_received(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._halt = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.nsqd.clients.discard(self)
        if self.channel is not None:
            self.channel.remove_client(self)
        elif self._remote is not None:
            self._remote.unsubscribe()
            self._remote = None
        elif self._fanin is not None:
            self._leave_shards()
        log.debug("PROTOCOL(V2): [%s] exiting ioloop", self.remote_address)

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its commands and sending it messages
        # until it catches up, so that one client's backlog cannot grow without bound.
        self._write_paused = True
        if self._transport is not None:
            self._transport.pause_reading()
        self._tell_ready()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resume_reading()
        self._tell_ready()

    # -- output -----------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything buffered in one call (unless answers wait for their
        acknowledgement: then with them)."""
        if self._acks_due or self._awaiting or self._forwarded:
            return
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._out and self._transport is not None and not self.closed:
            self._transport.write(b"".join(self._out))
        self._out_base += len(self._out)
        self._out.clear()
        self._out_size = 0

    # -- as its channel's Consumer -----------------------------------------------------

    def ready(self) -> int:
        """How many messages it may have in flight now: its RDY while subscribed and
        writable, else 0."""
        if self.state != STATE_SUBSCRIBED or self._write_paused or self.closed:
            return 0
        return self.rdy

    def _tell_ready(self) -> None:
        """Tell the channel what :meth:`ready` says now (after each change of RDY,
        state, output pause or closing): the channel keeps it, rather than asking
        every client at every delivery."""
        if self.channel is not None:
            self.channel.ready_changed(self, self.ready())
        elif self._remote is not None:
            self._remote.ready(self.ready())
        elif self._fanin is not None:
            self._fanin.ready_changed()

    def drain(self) -> None:
        """nsqd drains (NSQD.start_drain): a subscribed client gets no more messages and
        is told so with CLOSE_WAIT, the answer to CLS, after what was already sent. It
        may still FIN, REQ and TOUCH what it holds; its RDY is ignored from now on, and
        a CLS of its own is answered CLOSE_WAIT again (not the fatal error of a second
        CLS). An NSQ 1.3 client ignores a CLOSE_WAIT it did not ask for, or (go-nsq)
        closes once its messages in flight are answered."""
        if self.state != STATE_SUBSCRIBED or self.closed:
            return
        self.state = STATE_CLOSING
        self._drained = True
        self._tell_ready()
        self._respond(_CLOSE_WAIT_FRAME)
        self.flush()

    @property
    def proxied(self) -> bool:
        """Subscribed to a partition another worker owns (its messages in flight are
        counted there)."""
        return self._remote is not None

    def send(self, frames: list[bytes], ids: list[bytes], flush: bool) -> float:
        """Buffer messages' frames (output_buffer_size/timeout); ``flush`` writes them
        at once. Returns how long they may wait in the buffer (seconds): the channel
        starts their timeout when the client can see them, not while buffered."""
        if self.yz_ids:
            channel = self.channel
            assert channel is not None
            frames = _youzan_frames(channel, frames, ids, self.yz_ext, self.yz_detail)
        elif self.channel is not None and self.channel.partition.extended:
            frames = _vanilla_frames(frames)
        return self._buffer(frames, len(ids), flush)

    def shard_send(
        self, shard: LocalShard, frames: list[bytes], ids: list[bytes], flush: bool
    ) -> float:
        """:meth:`send` for one shard of a fan-in (nsqx.nsqd.fanin)."""
        if shard.channel.partition.extended:
            frames = _vanilla_frames(frames)
        return self._buffer(frames, len(ids), flush)

    def _buffer(self, frames: list[bytes], count: int, flush: bool) -> float:
        self._out.extend(frames)
        self._out_size += sum(map(len, frames))
        self.message_count += count
        # flush when the buffer is full, when the channel says the client can take no
        # more (nothing else would follow soon), or when buffering is off; otherwise
        # within the timeout
        if flush or self._out_size >= self.output_buffer_size or self.output_buffer_timeout <= 0:
            self.flush()
            return 0.0
        # (This can put a deadline after a later one in the in-flight table; a scan then
        # finds it at most one output_buffer_timeout late.)
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self.output_buffer_timeout, self.flush)
        return self.output_buffer_timeout

    def remote_messages(self, data: bytes, count: int, flush: bool) -> None:
        """Messages from the worker that owns the subscribed partition, formatted
        there (nsqx.nsqd.workers.proxy): buffered and written as :meth:`send`'s."""
        if self.closed:
            return  # (the owner requeues them once it hears the connection closed)
        self._out.append(data)
        self._out_size += len(data)
        self.message_count += count
        if flush or self._out_size >= self.output_buffer_size or self.output_buffer_timeout <= 0:
            self.flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self.output_buffer_timeout, self.flush)

    def remote_error(self, frame: bytes, fatal: bool) -> None:
        """An error frame from the subscription's owner (a failed FIN, REQ or TOUCH, or
        a fatal error of the channel): sent now; a fatal one closes."""
        if self.closed:
            return
        self._out.append(frame)
        if fatal:
            log.error("[%s] - %s", self.remote_address, frame[8:].decode(errors="replace"))
            self._remote = None
            self.close()
        else:
            self.flush()

    def remote_refused(self) -> None:
        """The owner refused the SUB (its answer, an error, is on its way)."""
        self._remote = None
        self._sub_ev = None
        if self._fanin is not None:
            self._leave_shards()
        if self.state == STATE_SUBSCRIBED:
            self.state = STATE_INIT

    def remote_sharded(self, ticket: Ticket) -> None:
        """The worker the SUB went to says its topic is sharded (made just now): this
        connection subscribes to every shard, its answer in the place kept for it."""
        ev, self._sub_ev = self._sub_ev, None
        self._remote = None
        if ev is None or self.closed:
            ticket.answer = b""
            ticket.on_answer(ticket, None)
            return
        topic = self._topics.get(ev.topic)
        shards = self._workers.shards if self._workers is not None else None
        if (topic is None or not topic.sharded) and shards is not None:
            topic = shards.learned(ev.topic)  # (the word that it is came on another link)
        err: ProtocolError | None = None
        if topic is None or not topic.sharded:
            err = ProtocolError(E_TOPIC_NOT_EXIST, "")
        else:
            try:
                self._subscribe_shards(ev, topic, ticket.slot, ticket.group)
            except ProtocolError as e:
                err = e
        if err is not None:
            if self.state == STATE_SUBSCRIBED:
                self.state = STATE_INIT
            ticket.answer = encode_error(err)
            ticket.fatal = err.fatal
        else:
            ticket.answer = b""  # (the OK kept in its place)
        ticket.on_answer(ticket, None)
        self._tell_ready()

    @property
    def in_flight_count(self) -> int:
        """Messages in flight to this client (a fan-in's: from this worker's shards)."""
        if self._fanin is not None:
            return sum(s.held() for s in self._fanin.local())
        held = self.channel.held_by(self) if self.channel is not None else None
        return len(held) if held is not None else 0

    @property
    def remote_shards_held(self) -> int:
        """A fan-in's: the most the other workers' shards may have in flight to it."""
        fanin = self._fanin
        if fanin is None:
            return 0
        return sum(s.committed for s in fanin.sources if not isinstance(s, LocalShard))

    @property
    def finish_count(self) -> int:
        held = self.channel.held_by(self) if self.channel is not None else None
        return held.finish_count if held is not None else 0

    @property
    def requeue_count(self) -> int:
        held = self.channel.held_by(self) if self.channel is not None else None
        return held.requeue_count if held is not None else 0

    @property
    def timeout_count(self) -> int:
        held = self.channel.held_by(self) if self.channel is not None else None
        return held.timeout_count if held is not None else 0

    def _respond(self, frame: bytes) -> None:
        self._out.append(frame)

    def _error(self, err: ProtocolError) -> None:
        """Send an error frame; a fatal error then closes the connection."""
        if err.fatal:
            log.error("[%s] - %s", self.remote_address, err)
        self._out.append(encode_error(err))
        if err.fatal:
            self.close()

    def notice(self, frame: bytes) -> None:
        """A frame the client did not ask for (its channel's policy): written with what
        is written next, at the latest right after this turn (a flush now could send a
        SUB's answer that waits for its shards)."""
        self._out.append(frame)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(0, self.flush)

    def fail(self, err: ProtocolError) -> None:
        """Send an error frame now; a fatal one closes the connection."""
        self._error(err)
        self.flush()

    def close(self) -> None:
        """Flush what is buffered, then close."""
        if self.closed:
            return
        if self._awaiting or self._forwarded:
            self._await_acks()  # publishes of this read are answered first
        self.closed = True
        self._halt = True
        self._tell_ready()
        if self._acks_due:
            # answers wait for their acknowledgement: close once they are out
            self._close_after_ack = True
            return
        self._flush_closing()

    def _flush_closing(self) -> None:
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out))
        self._out_base += len(self._out)
        self._out.clear()
        if self._transport is not None:
            self._transport.close()

    def connection_closed(self) -> None:
        """The upgraded stream hung up by itself (a TLS failure): write nothing more."""
        self.closed = True
        self._halt = True
        self._tell_ready()

    # -- timers (called by nsqd's scan loop) ------------------------------------------

    def tick(self, now: float) -> None:
        """Heartbeats, and the close after two unanswered ones."""
        if self._read_since_tick:
            self._read_since_tick = False
            self._last_read = now
        if self._fanin is not None:
            self._fanin.tick()
        hb = self.heartbeat_interval
        if hb <= 0 or self.closed:
            return
        if now - self._last_read > 2 * hb:
            log.error(
                "[%s] - closing: no command for %.1fs (2 heartbeats)", self, now - self._last_read
            )
            self.close()
            return
        if now - self._last_heartbeat >= hb:
            self._last_heartbeat = now
            self._out.append(_HEARTBEAT_FRAME)
            self.flush()

    # -- commands ---------------------------------------------------------------------

    def _execute(self, ev: object) -> None:
        """Judge ``ev`` by protocol V2's rules, check its AUTH, and run its handler."""
        kind = type(ev)
        rule = _RULES[kind]
        verdict = pv2.judge(rule, self.state, self.heartbeat_interval > 0)
        if verdict != pv2.ACCEPT:
            if verdict == pv2.REFUSE:
                if kind is cmd.Cls and self._drained:
                    # a CLS crossing the drain's CLOSE_WAIT: the same answer again
                    self._respond(_CLOSE_WAIT_FRAME)
                    return
                self._error(pv2.refusal(rule, self.state))
            return
        if rule.auth and self._auth and not self._check_auth(ev, rule.auth):
            return
        if rule.auth and self._workers is not None:
            if kind is _SUB:
                if self._sub_remote(cast(cmd.Sub, ev)):
                    if self.nsqd.draining:
                        self.drain()
                    return
            elif self._forward(ev):
                return
        _HANDLERS[kind](self, ev)

    def _on_error(self, err: ProtocolError) -> None:
        self._error(err)

    def _on_identify(self, ev: cmd.Identify) -> None:
        try:
            self.settings, response = negotiate(ev.body, self.nsqd.server_limits, self.settings)
        except ProtocolError as err:
            self._error(err)
            return
        self._apply_settings()
        self._last_heartbeat = clock.monotonic()
        self._respond(encode_response(response))
        s = self.settings
        if s.tls_v1 or s.snappy or s.deflate:
            if self._stream is not None:
                # nsqd would stack a second TLS session or compressor on the stream and
                # lose the connection; refuse it plainly instead
                self._error(ProtocolError(E_IDENTIFY_FAILED, "IDENTIFY failed already upgraded"))
                return
            self._upgrade(s)
        elif self.parser.buffered:
            # the parser stops after IDENTIFY; nothing changed, so go on with the read
            self.data_received(b"")

    def _upgrade(self, s: ClientSettings) -> None:
        """Put TLS and/or compression under this connection, as nsqd does after its
        IDENTIFY response: TLS handshake then an encrypted OK, then a compressed OK."""
        self.flush()  # the IDENTIFY response goes out as it is
        rest = self.parser.take_buffered()
        raw = self._transport
        assert raw is not None
        stream = UpgradedStream(self, raw)
        if s.tls_v1:
            context = self.nsqd.tls_context
            assert context is not None
            log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", self.remote_address)
            stream.start_tls(context, self.nsqd.tls_handshake_timeout)
            if isinstance(self.parser, cmd.TLSRequiredParser):
                self.parser = cmd.CommandParser(self.nsqd.parser_limits, expect_magic=False)
            stream.write(_OK_FRAME)  # held until the handshake completes
        pair = codec_pair(s.snappy, s.deflate, s.deflate_level)
        if pair is not None:
            kind = "snappy" if s.snappy else "deflate"
            log.info("PROTOCOL(V2): [%s] upgrading connection to %s", self.remote_address, kind)
            stream.start_compression(*pair)
            self.snappy, self.deflate = s.snappy, s.deflate
            stream.write(_OK_FRAME)
        self._stream = stream
        self._transport = stream
        raw.set_protocol(stream)
        if rest:
            # bytes the client sent behind IDENTIFY belong to the upgraded stream
            stream.data_received(rest)

    def tls_established(self) -> None:
        """Called by the upgraded stream when the TLS handshake completed."""
        self.tls = True

    # -- AUTH -------------------------------------------------------------------------

    def _on_auth(self, ev: cmd.Auth) -> None:
        if self.auth_state is not None and self.auth_state.authorizations:
            self._error(ProtocolError(E_INVALID, "AUTH Already set"))
            return
        if self.nsqd.auth is None:
            self._error(ProtocolError(E_AUTH_DISABLED, "AUTH Disabled"))
            return
        self._auth_secret = ev.secret
        self._hold(None)
        self.nsqd.spawn(self._query_auth(None))

    def _check_auth(self, ev: object, verb: str) -> bool:
        """nsqd's CheckAuth: True when the client may go on with ``ev``. An expired
        authorization is fetched again first; ``ev`` then waits for the answer (and is
        judged again when it comes: the one AUTH hold, whatever the command)."""
        topic, channel = pv2.auth_target(ev)
        st = self.auth_state
        if st is None or not st.authorizations:
            self._error(ProtocolError(E_AUTH_FIRST, f"AUTH required before {verb}"))
            return False
        if st.expired(clock.monotonic()):
            self._hold(ev)
            self.nsqd.spawn(self._query_auth((verb, topic, channel)))
            return False
        if not st.allows(topic, channel):
            self._error(
                ProtocolError(E_UNAUTHORIZED, f'AUTH failed for {verb} on "{topic}" "{channel}"')
            )
            return False
        return True

    def _hold(self, ev: object | None) -> None:
        """Stop executing commands (and reading) until the auth server answers (or the
        worker a SUB moves the connection to is up)."""
        self._halt = True
        self._held = [cast(cmd.Event, ev)] if ev is not None else []
        if self._transport is not None:
            self._transport.pause_reading()

    async def _query_auth(self, check: tuple[str, str, str] | None) -> None:
        """Ask the auth server (for AUTH, or to renew for ``check``), then go on."""
        auth = self.nsqd.auth
        assert auth is not None
        session = self._stream.tls if self._stream is not None else None
        tls = session is not None and session.established
        common_name = session.peer_common_name() if session is not None and tls else ""
        try:
            state = await auth.query(self.remote_ip, tls, self._auth_secret, common_name)
        except AuthError as exc:
            # as nsqd: the reason goes to the log, never to an untrusted client
            if not self.closed:
                log.error("PROTOCOL(V2): [%s] Auth Failed %s", self.remote_address, exc)
                self.fail(ProtocolError(E_AUTH_FAILED, "AUTH failed"))
            return
        if self.closed:
            return
        self.auth_state = state
        if check is None:
            if not state.authorizations:
                self.fail(ProtocolError(E_UNAUTHORIZED, "AUTH No authorizations found"))
                return
            body = {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
            self._respond(encode_response(_go_json(body)))
        elif not state.allows(check[1], check[2]):
            verb, topic, channel = check
            self.fail(
                ProtocolError(E_UNAUTHORIZED, f'AUTH failed for {verb} on "{topic}" "{channel}"')
            )
            return
        self._release()

    def _release(self) -> None:
        """Execute what waited for the auth answer, then read again."""
        held, self._held = self._held or [], None
        self._halt = False
        for i, ev in enumerate(held):
            if not self._held_data:  # (more data behind them: it stays)
                self._events, self._event_i = held, i
            self._execute(ev)
            self._events = _NO_EVENTS
            if self._halt:
                if self.closed:
                    return
                # waiting again (an expired authorization met on the way)
                assert self._held is not None
                if not self._held_whole:
                    self._held.extend(held[i + 1 :])
                if self._awaiting or self._forwarded:
                    self._await_acks()
                else:
                    self.flush()
                return
        data, self._held_data = b"".join(self._held_data), []
        if data or self.parser.buffered:
            self.data_received(data)
        if self._awaiting or self._forwarded:
            self._await_acks()
        elif self._out:
            self.flush()
        self._resume_reading()

    def _on_sub(self, ev: cmd.Sub) -> None:
        if self.nsqd.sharding and fanin_wanted(ev, self.settings):
            topic = self._topics.get(ev.topic)
            if topic is None and self._workers is not None:
                try:
                    # made here (this worker owns partition 0): sharded if it may be
                    topic = self.nsqd.get_topic(ev.topic)
                except (OSError, ValueError):
                    topic = None
            if topic is not None and topic.sharded:
                slot = self._out_base + len(self._out)
                self._out.append(_OK_FRAME)  # (a refusal of a shard replaces it)
                try:
                    self._subscribe_shards(ev, topic, slot, None)
                except ProtocolError as err:
                    self._out.pop()
                    self._error(err)
                    return
                if self.nsqd.draining:
                    self.drain()
                return
        try:
            part, self.settings = sub_partition(self.nsqd, ev, self.settings, self.sample_rate)
            channel, late = sub_channel(self.nsqd, ev, part, self)
        except ProtocolError as err:
            self._error(err)
            return
        except OSError as err:  # a topic's files cannot be made (a full or read-only disk)
            self._error(ProtocolError("E_SUB_FAILED", f"SUB failed {err}"))
            return
        self.yz_ids, self.yz_ext, self.yz_detail = sub_layout(ev, self.settings, part)
        self.channel = channel
        self.state = _RULES[cmd.Sub].then
        if late is not None:
            self._error(late)
            return
        if self.yz_ids:
            self.parser.binary_ids = True
        self._respond(_OK_FRAME)
        if self.nsqd.draining:
            self.drain()  # subscribed, and told at once: nothing comes from here

    def _subscribe_shards(
        self, ev: cmd.Sub, topic: Topic, slot: int, group: AckGroup | None
    ) -> None:
        """Subscribe to every shard of ``topic``: this worker's here, the others'
        through their workers, each of whose answers is held as a forwarded SUB's
        (``group``: the read's, when it ended already). Raises the ProtocolError to
        answer if a shard here refuses."""
        _, self.settings = sub_partition(self.nsqd, ev, self.settings, self.sample_rate)
        fanin = FanIn(self)
        try:
            for part in list(topic.partitions.values()):
                shard = LocalShard(fanin, part.get_channel(ev.channel))
                channel, _ = sub_channel(self.nsqd, ev._replace(partition=part.id), part, shard)
                shard.channel = channel
                fanin.add(shard)
                channel.notify()  # (messages waiting and no RDY yet: it asks for some)
        except (ProtocolError, OSError) as err:
            fanin.close()
            if isinstance(err, OSError):
                raise ProtocolError("E_SUB_FAILED", f"SUB failed {err}") from None
            raise
        self._fanin = fanin
        self.channel = None
        self.state = _RULES[cmd.Sub].then
        self.yz_ids = self.yz_ext = self.yz_detail = False
        workers = self._workers
        shards = workers.shards if workers is not None else None
        if workers is not None and shards is not None:
            for pid in shards.every(ev.topic):
                if pid in topic.partitions:
                    continue
                owner = workers.owner(ev.topic, pid)
                remote, ticket = workers.subs.subscribe(
                    owner, self, ev, slot, self._shard_answered, pid, fanin
                )
                fanin.add(remote)
                if group is None:
                    self._forwarded.append(ticket)
                else:
                    ticket.group = group
                    group.due += 1
                    self._acks_due += 1

    def _shard_answered(self, ticket: Ticket, err: BaseException | None) -> None:
        """A shard's answer to a fan-in's SUB: an OK keeps the one kept in its place."""
        if ticket.answer == _OK_FRAME:
            ticket.answer = b""
        self._forward_answered(ticket, err)

    def _leave_shards(self) -> None:
        """Unsubscribe from every shard; answers still awaited count as given."""
        fanin, self._fanin = self._fanin, None
        if fanin is None:
            return
        pending = []
        for s in fanin.sources:
            ticket = getattr(s, "ticket", None)
            if ticket is not None:
                s.ticket = None  # type: ignore[attr-defined]
                pending.append(ticket)
        fanin.close()
        for ticket in pending:
            ticket.answer = b""
            ticket.on_answer(ticket, None)

    def _sub_remote(self, ev: cmd.Sub) -> bool:
        """Subscribe through the worker that owns the SUB's partition (False: this one
        owns it). As a forwarded publish, its answer is reserved and held, with all that
        follows, until the owner answers; meanwhile the connection counts as subscribed
        (a RDY may follow in the same read)."""
        workers = self._workers
        assert workers is not None
        owner = workers.owner(ev.topic, ev.partition)
        if owner == workers.index:
            return False
        if self._handoff is not None:
            if self._hand_off(owner, ev):
                return True
            if self._move_failed and self._wait_for_owner(owner, ev):
                return True
        slot = self._out_base + len(self._out)
        self._out.append(_OK_FRAME)  # (a placeholder: the owner's answer replaces it)
        remote, ticket = workers.subs.subscribe(owner, self, ev, slot, self._forward_answered)
        self._forwarded.append(ticket)
        self._remote = remote
        self._sub_ev = ev
        self.state = _RULES[cmd.Sub].then
        # the layout of ids does not depend on the partition: FIN, REQ and TOUCH behind
        # the SUB in this read are parsed as they will be sent
        self.yz_ids = sub_ids(ev, self.settings)
        if self.yz_ids:
            self.parser.binary_ids = True
        return True

    def _on_rdy(self, ev: cmd.Rdy) -> None:
        self.rdy = ev.value
        self._tell_ready()

    def _on_fin(self, ev: cmd.Fin) -> None:
        ids = [hex_id(i) for i in ev.ids] if self.yz_ids else ev.ids
        channel = self.channel
        if channel is None:
            if self._remote is not None:
                self._remote.fin(ids)
            elif self._fanin is not None:
                self._fanin_fin(ids)
            return
        for mid, reason in channel.finish(self, ids):
            self._error(ProtocolError(E_FIN_FAILED, f"FIN {mid.decode('latin-1')} failed {reason}"))

    def _on_req(self, ev: cmd.Req) -> None:
        if ev.requested_ns is not None:
            # NSQ 1.3's line: durations as integer nanoseconds
            log.info(
                "PROTOCOL(V2): [%s] REQ timeout %d out of range 0-%d. Setting to %d",
                self.remote_address,
                ev.requested_ns,
                int(self.nsqd.options.max_req_timeout * 1000) * 1_000_000,
                ev.timeout_ms * 1_000_000,
            )
        mid = hex_id(ev.id) if self.yz_ids else ev.id
        channel = self.channel
        if channel is None:
            if self._remote is not None:
                self._remote.req(mid, ev.timeout_ms, ev.id)
            elif self._fanin is not None:
                self._fanin_req(mid, ev.timeout_ms, ev.id)
            return
        reason = channel.requeue(self, mid, ev.timeout_ms)
        if reason:
            self._error(
                ProtocolError(E_REQ_FAILED, f"REQ {ev.id.decode('latin-1')} failed {reason}")
            )

    def _on_touch(self, ev: cmd.Touch) -> None:
        mid = hex_id(ev.id) if self.yz_ids else ev.id
        channel = self.channel
        if channel is None:
            if self._remote is not None:
                self._remote.touch(mid, ev.id)
            elif self._fanin is not None:
                self._fanin_touch(mid, ev.id)
            return
        reason = channel.touch(self, mid, self.nsqd.options.max_msg_timeout)
        if reason:
            self._error(
                ProtocolError(E_TOUCH_FAILED, f"TOUCH {ev.id.decode('latin-1')} failed {reason}")
            )

    def _fanin_fin(self, ids: list[bytes]) -> None:
        fanin = self._fanin
        assert fanin is not None
        # the FINs of a read, one batch per shard: a channel's finish costs about as
        # much for one id as for a hundred (profiled: one call per id made consuming
        # through shards take twice the CPU per message)
        source_of = fanin.source_of
        by_source: dict[Source | None, list[bytes]]
        if len(ids) > 1 and _one_prefix(ids):
            # the usual read: every id from one shard (its prefix), found in C
            by_source = {source_of(ids[0]): ids}
        else:
            by_source = {}
            for mid in ids:
                src = source_of(mid)
                batch = by_source.get(src)
                if batch is None:
                    by_source[src] = [mid]
                else:
                    batch.append(mid)
        over = False
        for src, batch in by_source.items():
            if isinstance(src, LocalShard):
                # (a FIN frees RDY for another shard only where more than the grant
                # was in flight: after it was lowered; a remote shard says so itself)
                over |= src.over
                failed = src.channel.finish(src, batch)
            elif src is not None:
                src.fin(batch)  # type: ignore[attr-defined]
                continue
            else:
                failed = [(mid, "ID not in flight") for mid in batch]
            for fid, reason in failed:
                self._error(
                    ProtocolError(E_FIN_FAILED, f"FIN {fid.decode('latin-1')} failed {reason}")
                )
        if over:
            fanin.freed()

    def _fanin_req(self, mid: bytes, timeout_ms: int, raw_id: bytes) -> None:
        fanin = self._fanin
        assert fanin is not None
        src = fanin.source_of(mid)
        over = False
        if isinstance(src, LocalShard):
            over = src.over
            reason = src.channel.requeue(src, mid, timeout_ms)
        elif src is not None:
            src.req(mid, timeout_ms, raw_id)  # type: ignore[attr-defined]
            reason = None
        else:
            reason = "ID not in flight"
        if reason:
            self._error(
                ProtocolError(E_REQ_FAILED, f"REQ {raw_id.decode('latin-1')} failed {reason}")
            )
        if over:
            fanin.freed()

    def _fanin_touch(self, mid: bytes, raw_id: bytes) -> None:
        fanin = self._fanin
        assert fanin is not None
        src = fanin.source_of(mid)
        if isinstance(src, LocalShard):
            reason = src.channel.touch(src, mid, self.nsqd.options.max_msg_timeout)
        elif src is not None:
            src.touch(mid, raw_id)  # type: ignore[attr-defined]
            reason = None
        else:
            reason = "ID not in flight"
        if reason:
            self._error(
                ProtocolError(E_TOUCH_FAILED, f"TOUCH {raw_id.decode('latin-1')} failed {reason}")
            )

    def _on_cls(self, ev: cmd.Cls) -> None:
        self.state = _RULES[cmd.Cls].then
        self._tell_ready()
        self._respond(_CLOSE_WAIT_FRAME)

    def _on_nop(self, ev: cmd.Nop) -> None:
        pass

    def _forward(self, ev: object) -> bool:
        """Forward a publish to the worker that owns its partition (False: this one
        owns it). Its answer is reserved in the output (an OK) and held, with all that
        follows, until the owner answers (:meth:`_forward_answered`)."""
        workers = self._workers
        assert workers is not None
        kind = type(ev)
        defer_ms = 0
        traces: list[int] | None = None
        headers: list[bytes] | None = None
        # (each event cast to its own type: compiled, a cast is checked)
        if kind is _PUB:
            pub = cast(cmd.Pub, ev)
            verb, topic, pid, bodies = "PUB", pub.topic, pub.partition, [pub.body]
        elif kind is _PUBS:
            pubs = cast(cmd.Pubs, ev)
            verb, topic, pid, bodies = "PUBS", pubs.topic, pubs.partition, pubs.bodies
        elif kind is _MPUB:
            mpub = cast(cmd.Mpub, ev)
            verb, topic, pid, bodies = "MPUB", mpub.topic, mpub.partition, mpub.bodies
        elif kind is cmd.Dpub:
            dpub = cast(cmd.Dpub, ev)
            verb, topic, pid, bodies = "DPUB", dpub.topic, -1, [dpub.body]
            defer_ms = dpub.defer_ms
        elif kind is cmd.PubTrace:
            pt = cast(cmd.PubTrace, ev)
            verb, topic, pid, bodies = "PUB_TRACE", pt.topic, pt.partition, [pt.body]
            traces = [pt.trace_id]
        elif kind is cmd.MpubTrace:
            mt = cast(cmd.MpubTrace, ev)
            verb, topic, pid, bodies = "MPUB_TRACE", mt.topic, mt.partition, mt.bodies
            traces = mt.trace_ids
        elif kind is cmd.PubExt:
            pe = cast(cmd.PubExt, ev)
            verb, topic, pid, bodies = "PUB_EXT", pe.topic, pe.partition, [pe.body]
            headers = [pe.header]
        else:
            me = cast(cmd.MpubExt, ev)
            verb, topic, pid, bodies = "MPUB_EXT", me.topic, me.partition, me.bodies
            headers = me.headers
        if (
            topic == self._route_topic
            and pid == self._route_pid
            and self._route_owner >= 0
            and self._route_gen == workers.route_generation
        ):
            owner = self._route_owner  # (a publisher keeps to one topic)
        else:
            owner = self._route_owner = workers.owner(topic, pid)
            self._route_topic = topic
            self._route_pid = pid
            self._route_gen = workers.route_generation
        if owner == workers.index:
            return False
        if self._handoff_to < 0 and self._handoff is not None and self.state == STATE_INIT:
            self._handoff_to = owner  # once this is answered (and nothing else is due)
        slot = self._out_base + len(self._out)
        # the answer if all goes well (the owner's answer replaces it if not)
        self._out.append(_OK_FRAME * len(bodies) if kind is _PUBS else _OK_FRAME)
        ticket = workers.forward(
            owner,
            slot,
            self._forward_answered,
            verb,
            topic,
            pid,
            bodies,
            defer_ms,
            traces,
            headers,
        )
        self._forwarded.append(ticket)
        if topic == self._pub_topic:
            self._pub_pending += len(bodies)
        else:
            self._fold_pub_counts()
            self._pub_topic = topic
            self._pub_pending = len(bodies)
        return True

    def _wait_for_owner(self, owner: int, ev: cmd.Sub) -> bool:
        """The SUB could not move its connection to worker ``owner``: that worker is
        starting (restarted after it died: its clients reconnect meanwhile) or its
        queue is full. Hold the SUB, with what follows it, and try again shortly: its
        answer waits for that worker either way, and a subscription proxied now would
        stay proxied. False: it waited long enough (it goes proxied)."""
        if self.nsqd.draining:
            return False  # (proxied, it is told at once that nothing comes)
        now = clock.monotonic()
        if self._owner_wait_until == 0.0:
            self._owner_wait_until = now + OWNER_WAIT
            log.info(
                "PROTOCOL(V2): [%s] SUB waits for worker %d to take the connection",
                self.remote_address,
                owner,
            )
        elif now >= self._owner_wait_until:
            return False
        # the SUB and what followed it in its read (it moves with them), held whole
        # (_hand_off found the SUB at _events[_event_i] before it tried the move)
        rest = self._events[self._event_i + 1 :]
        self._hold(ev)
        assert self._held is not None
        self._held.extend(rest)
        self._held_whole = True
        asyncio.get_running_loop().call_later(OWNER_RETRY, self._retry_sub)
        return True

    def _retry_sub(self) -> None:
        self._held_whole = False
        if not self.closed and self._held is not None:
            self._release()

    def _hand_off(self, owner: int, sub: cmd.Sub | None) -> bool:
        """Move this connection to worker ``owner`` (nsqx.nsqd.workers.handoff), if it
        is plain and nothing of it is in flight: every answer written, nothing read and
        not executed. ``sub``: the SUB that moves it, executed there. False: it stays
        (``_move_failed``: it could have gone, but that worker did not take it)."""
        self._handoff_to = -1
        self._move_failed = False
        handoff = self._handoff
        transport = self._transport
        workers = self._workers
        shards = workers.shards if workers is not None else None
        if sub is None and shards is not None and shards.sharded(self._route_topic):
            return False  # its topic became sharded meanwhile: it publishes here
        if (
            handoff is None
            or transport is None
            or self._handed
            or self._stream is not None
            or self.closed
            or self._held is not None
            or (sub is None and self.parser.buffered)
            or self._groups
            or self._awaiting
            or self._forwarded
        ):
            return False
        self.flush()
        if self._out or transport.get_write_buffer_size():
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        rest: list[cmd.Event] = []
        if sub is not None:
            events, i = self._events, self._event_i
            if not 0 <= i < len(events) or events[i] is not sub:
                return False
            rest = events[i + 1 :]
            if not all(type(ev) in _MOVES_WITH_SUB for ev in rest):
                return False
        partial = self.parser.take_buffered() if sub is not None and self.parser.buffered else b""
        self._fold_pub_counts()
        state = {
            "settings": self.settings,
            "connect_ts": self.connect_ts,
            "message_count": self.message_count,
            "pub_counts": self._pub_counts,
            "auth_state": self.auth_state,
            "auth_secret": self._auth_secret,
            "sub": sub,
            "rest": rest,
            "partial": partial,
        }
        fd = os.dup(sock.fileno())
        try:
            sent = handoff.send(owner, fd, state)
        finally:
            os.close(fd)  # the datagram holds its own reference until it is received
        if not sent and partial:
            self.parser.feed(partial)  # (an incomplete command: no events)
        if not sent:
            # (the owner's queue is full: many connections move at once; or its worker
            # is starting) the next forwarded publish tries again, a SUB waits
            self._move_failed = True
            return False
        self._handed = True  # once: later publishes elsewhere are forwarded
        log.debug("PROTOCOL(V2): [%s] moved to worker %d", self.remote_address, owner)
        self.closed = self._halt = True
        self.nsqd.clients.discard(self)
        # only this process's descriptor closes: the socket lives on at the owner
        transport.close()
        return True

    def adopt(self, state: dict[str, Any]) -> None:
        """Take over a connection another worker moved here (before connection_made)."""
        # its magic was read where it connected
        self.parser = cmd.CommandParser(self.nsqd.parser_limits, expect_magic=False)
        self.settings = state["settings"]
        self._apply_settings()
        self.connect_ts = state["connect_ts"]
        self.message_count = state["message_count"]
        self._pub_counts = state["pub_counts"]
        self.auth_state = state["auth_state"]
        self._auth_secret = state["auth_secret"]
        if state["sub"] is not None:
            self._adopted = (state["sub"], state["rest"], state["partial"])
        self._handed = True

    def _forward_answered(self, ticket: Ticket, err: BaseException | None) -> None:
        """A forwarded publish's owner answered (or its link broke: ``err``)."""
        answer = ticket.answer
        if err is None and answer is None:
            err = ConnectionError("its owner could not acknowledge it")
        elif err is None and answer:
            i = ticket.slot - self._out_base
            if 0 <= i < len(self._out):
                if ticket.answers > 1 and not ticket.fatal:
                    answer *= ticket.answers  # pipelined PUBs: one refusal each, as here
                self._out[i] = answer
            if ticket.fatal and not self.closed:
                # as a fatal error here: nothing after it is answered, then the close
                del self._out[i + 1 :]
                log.error("[%s] - %s", self.remote_address, answer[8:].decode(errors="replace"))
                self._close_after_ack = True
                self.closed = self._halt = True
                self._tell_ready()
        self._acknowledged(ticket.group, err)

    def _publish(
        self,
        verb: str,
        topic_name: str,
        bodies: list[bytes],
        defer_ms: int = 0,
        pid: int = cmd.DEFAULT_PARTITION,
        trace_ids: list[int] | None = None,
        exts: list[tuple[int, bytes]] | None = None,
    ) -> Published | None:
        try:
            part = pub_partition(self.nsqd, self._topics, topic_name, pid)
            published = part.publish(bodies, defer_ms, trace_ids, exts)
        except ProtocolError as err:
            self._error(err)
            return None
        except OSError as err:
            # nothing acknowledged: E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED, then close
            log.error("TOPIC(%s): write failed: %s", topic_name, err)
            self._error(ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {err}"))
            return None
        if topic_name == self._pub_topic:
            self._pub_pending += len(bodies)
        else:
            self._fold_pub_counts()
            self._pub_topic = topic_name
            self._pub_pending = len(bodies)
        self._pub_verb = verb
        if part.durable and part not in self._awaiting:
            # answered once written (the group commit), fsynced with --sync-before-ack,
            # and held by the ISR if replicated (Partition.when_acknowledged)
            self._awaiting.append(part)
        return published

    @property
    def pub_counts(self) -> dict[str, int]:
        """Messages this client published, per topic name (/stats: pub_counts)."""
        self._fold_pub_counts()
        return self._pub_counts

    def _fold_pub_counts(self) -> None:
        if self._pub_pending:
            topic = self._pub_topic
            self._pub_counts[topic] = self._pub_counts.get(topic, 0) + self._pub_pending
            self._pub_pending = 0

    def _on_pub(self, ev: cmd.Pub) -> None:
        if self._publish("PUB", ev.topic, [ev.body], 0, ev.partition) is not None:
            self._respond(_OK_FRAME)

    def _on_pubs(self, ev: cmd.Pubs) -> None:
        n = len(ev.bodies)
        out = self._out
        before = len(out)
        if self._publish("PUB", ev.topic, ev.bodies, 0, ev.partition) is not None:
            out.append(_OK_FRAME * n)
        elif not self.closed and len(out) == before + 1:
            out.extend([out[-1]] * (n - 1))  # a refusal that keeps the connection: one each

    def _on_mpub(self, ev: cmd.Mpub) -> None:
        if self._publish("MPUB", ev.topic, ev.bodies, 0, ev.partition) is not None:
            self._respond(_OK_FRAME)

    def _on_dpub(self, ev: cmd.Dpub) -> None:
        if self._publish("DPUB", ev.topic, [ev.body], ev.defer_ms) is not None:
            self._respond(_OK_FRAME)

    def _respond_traced(self, p: Published, trace_id: int, raw_size: int) -> None:
        # 30 bytes: OK, then the message id, trace id, virtual offset and raw size
        self._respond(traced_answer(p, trace_id, raw_size))

    def _on_pub_trace(self, ev: cmd.PubTrace) -> None:
        p = self._publish("PUB", ev.topic, [ev.body], 0, ev.partition, [ev.trace_id])
        if p is not None:
            self._respond_traced(p, ev.trace_id, p.raw_size)

    def _on_mpub_trace(self, ev: cmd.MpubTrace) -> None:
        p = self._publish("MPUB", ev.topic, ev.bodies, 0, ev.partition, ev.trace_ids)
        if p is not None:
            # the first message's id and offset, the whole batch's size (as Youzan)
            self._respond_traced(p, 0, p.raw_size)

    def _on_pub_ext(self, ev: cmd.PubExt) -> None:
        try:
            trace_ids, exts = ext_fields(self.nsqd, ev.topic, [ev.header])
        except ProtocolError as err:
            self._error(err)
            return
        trace_id = trace_ids[0]
        traces = [trace_id] if trace_id else None
        p = self._publish("PUB", ev.topic, [ev.body], 0, ev.partition, traces, exts)
        if p is None:
            return
        if trace_id is not None:  # a ##trace_id asks for the traced answer
            self._respond_traced(p, trace_id, p.raw_size)
        else:
            self._respond(_OK_FRAME)

    def _on_mpub_ext(self, ev: cmd.MpubExt) -> None:
        try:
            trace_ids, exts = ext_fields(self.nsqd, ev.topic, ev.headers)
        except ProtocolError as err:
            self._error(err)
            return
        traces = [t or 0 for t in trace_ids] if any(trace_ids) else None
        if self._publish("MPUB", ev.topic, ev.bodies, 0, ev.partition, traces, exts):
            self._respond(_OK_FRAME)


#: no events (a read's events are kept only while one of them executes)
_NO_EVENTS: Final[list[cmd.Event]] = []

#: the commands that may follow a SUB in the read that moves its connection (they
#: travel, parsed, with it)
_MOVES_WITH_SUB: Final = frozenset({cmd.Rdy, cmd.Fin, cmd.Req, cmd.Touch, cmd.Cls, cmd.Nop})


def _vanilla_frames(chunks: list[bytes]) -> list[bytes]:
    """Chunks of stored frames as an NSQ 1.3 client gets them (extended records cut
    down to vanilla frames)."""
    if not any(map(is_extended, chunks)):
        return chunks
    out: list[bytes] = []
    for chunk in chunks:
        if is_extended(chunk):
            out.extend(vanilla_frame(f) for f in split_chunks([chunk]))
        else:
            out.append(chunk)
    return out


# -- what SUB checks and does, wherever the client is (nsqx.nsqd.workers.proxy runs these
# for a client connected to another worker of the node)


def sub_partition(
    nsqd: NSQD, ev: cmd.Sub, settings: ClientSettings, sample_rate: int
) -> tuple[Partition, ClientSettings]:
    """The partition a SUB names, checked against its topic's settings as Youzan's nsqd
    checks them, and the client's settings as they apply to it (no dispatch tag on a
    topic that is not ext). Raises the ProtocolError to answer (OSError: the topic's
    files cannot be made)."""
    if ev.partition < 0 and ev.topic not in nsqd.topics:
        part: Partition | None = nsqd.get_topic(ev.topic).default_partition  # NSQ 1.3
    else:
        part = nsqd.find_partition(ev.topic, ev.partition)
        if part is None and ev.partition < 0:
            part = nsqd.get_topic(ev.topic).default_partition
    if part is None:
        raise ProtocolError(E_TOPIC_NOT_EXIST, "")
    if part.replica is not None and part.replica.leader is None:
        # consumers read from the leader only (Youzan): fatal, they look up again
        raise ProtocolError(E_FAILED_ON_NOT_LEADER, "")
    meta = part.topic.meta
    ordered = ev.mode == cmd.SUB_ORDERED
    if meta.ordered and not ordered:
        raise ProtocolError(E_SUB_ORDER_IS_MUST, "this topic is configured only allow ordered sub")
    if meta.ext:
        if not settings.extend_support and not nsqd.options.allow_sub_ext_compatible:
            raise ProtocolError(
                E_SUB_EXTEND_NEED, "this topic is extended and should identify as extend support."
            )
    elif settings.extend_support:
        raise ProtocolError(
            E_SUB_EXTEND_FORBIDDON,
            "this topic is not extended and should not identify as extend support.",
        )
    if ordered and sample_rate:
        raise ProtocolError(E_INVALID, "order consume is not allowed while sample rate is not 0")
    if not meta.ext and settings.desired_tag:
        settings = replace(settings, desired_tag="")  # as Youzan: no tags on such a topic
    return part, settings


def sub_ids(ev: cmd.Sub, settings: ClientSettings) -> bool:
    """Whether the subscribed client sees binary ids (Youzan's layout; the parser then
    reads FIN, REQ and TOUCH ids as 16 bytes)."""
    return settings.youzan or ev.partition >= 0 or ev.mode != cmd.SUB_PLAIN


def sub_layout(ev: cmd.Sub, settings: ClientSettings, part: Partition) -> tuple[bool, bool, bool]:
    """The message layout of a subscribed client (see nsqx.wire.frames): binary ids, the
    ext part, (offset, size) before the body."""
    return (
        sub_ids(ev, settings),
        part.topic.meta.ext and settings.extend_support,
        ev.mode != cmd.SUB_PLAIN,
    )


def sub_channel(
    nsqd: NSQD, ev: cmd.Sub, part: Partition, consumer: Consumer
) -> tuple[Channel, ProtocolError | None]:
    """Subscribe ``consumer`` to the SUB's channel (made if need be). Raises the
    ProtocolError to answer if refused; a start position that cannot be read is
    returned, as an error to answer once subscribed (as Youzan's nsqd)."""
    channel = part.channels.get(ev.channel)
    if channel is None:
        if part.topic.meta.disable_channel_auto_create:
            raise ProtocolError(
                E_SUB_CHANNEL_NOT_REGISTERED, "channel is not registered under topic."
            )
        channel = part.get_channel(ev.channel)
    limit = nsqd.options.max_channel_consumers
    if limit and len(channel.clients) >= limit:
        raise ProtocolError(
            "E_TOO_MANY_CHANNEL_CONSUMERS",
            f"channel consumers for {ev.topic}:{ev.channel} exceeds limit of {limit}",
        )
    first = not channel.clients
    channel.add_client(consumer)
    if ev.mode == cmd.SUB_ORDERED:
        channel.set_ordered(True)
    if ev.start is not None:
        if first:  # only the channel's first client moves it, as in Youzan's nsqd
            try:
                channel.reset_to(part.position(ev.start))
            except ValueError as err:
                return channel, ProtocolError(E_INVALID, str(err))
        else:
            log.debug("[%s] %s ignored: not the channel's first client", consumer, ev.start)
    return channel, None


def client_frames(
    channel: Channel,
    frames: list[bytes],
    ids: list[bytes],
    yz_ids: bool,
    yz_ext: bool,
    yz_detail: bool,
) -> list[bytes]:
    """A channel's frames as its client gets them: Youzan's layout (binary ids, ext,
    offsets) or NSQ 1.3's (extended records cut down)."""
    if yz_ids:
        return _youzan_frames(channel, frames, ids, yz_ext, yz_detail)
    if channel.partition.extended:
        return _vanilla_frames(frames)
    return frames


def _youzan_frames(
    channel: Channel, frames: list[bytes], ids: list[bytes], with_ext: bool, detail: bool
) -> list[bytes]:
    if not with_ext and not detail:
        # the usual case (go-nsq's plain SUB): vanilla chunks keep their size, only
        # their ids change; whole runs of equal frames are rewritten at once
        out: list[bytes] = []
        k = 0
        for chunk in frames:
            size = 0 if is_extended(chunk) else equal_frame_size(chunk)
            if size:
                n = len(chunk) // size
                out.append(youzan_ids(chunk, ids[k : k + n], size))
                k += n
                continue
            for f in split_chunks([chunk]):
                out.append(youzan_frame(f, False, None))
                k += 1
        return out
    frames = split_chunks(frames)
    if not detail:
        return [youzan_frame(f, with_ext, None) for f in frames]
    positions = channel.partition.positions(frames, ids)
    return [youzan_frame(f, with_ext, p) for f, p in zip(frames, positions, strict=True)]


def _go_json(obj: object) -> bytes:
    """JSON as Go's json.Marshal writes it: compact, with <, > and & escaped."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


#: protocol V2's rules (compiled: a Final alias is a C static, not a module lookup)
_RULES: Final = pv2.RULES

#: each command's handler, run once the rules accepted it (see ClientV2._execute)
_HANDLERS: Final[dict[type, Callable[[ClientV2, object], None]]] = {
    ProtocolError: ClientV2._on_error,  # type: ignore[dict-item]
    cmd.Identify: ClientV2._on_identify,  # type: ignore[dict-item]
    cmd.Auth: ClientV2._on_auth,  # type: ignore[dict-item]
    cmd.Sub: ClientV2._on_sub,  # type: ignore[dict-item]
    cmd.Rdy: ClientV2._on_rdy,  # type: ignore[dict-item]
    cmd.Fin: ClientV2._on_fin,  # type: ignore[dict-item]
    cmd.Req: ClientV2._on_req,  # type: ignore[dict-item]
    cmd.Touch: ClientV2._on_touch,  # type: ignore[dict-item]
    cmd.Cls: ClientV2._on_cls,  # type: ignore[dict-item]
    cmd.Nop: ClientV2._on_nop,  # type: ignore[dict-item]
    cmd.Pub: ClientV2._on_pub,  # type: ignore[dict-item]
    cmd.Pubs: ClientV2._on_pubs,  # type: ignore[dict-item]
    cmd.Mpub: ClientV2._on_mpub,  # type: ignore[dict-item]
    cmd.Dpub: ClientV2._on_dpub,  # type: ignore[dict-item]
    cmd.PubTrace: ClientV2._on_pub_trace,  # type: ignore[dict-item]
    cmd.MpubTrace: ClientV2._on_mpub_trace,  # type: ignore[dict-item]
    cmd.PubExt: ClientV2._on_pub_ext,  # type: ignore[dict-item]
    cmd.MpubExt: ClientV2._on_mpub_ext,  # type: ignore[dict-item]
}
