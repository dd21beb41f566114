"""Channel: a cursor over a topic partition's log that delivers to its subscribed clients.

The channel reads the log, picks who gets what and keeps the timers; what it has handed
out and not seen finished is its :class:`~nsqx.nsqd.inflight.InFlight` (sans-IO). It
reaches its clients only through :class:`Consumer`, as nsqd's channel.go does, so that
tests drive a channel with fake consumers (tests/nsqd/test_channel_unit.py).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import random
from bisect import bisect_right
from collections import deque
from typing import TYPE_CHECKING, Protocol

from nsqx.nsqd import clock
from nsqx.nsqd import tracer as tr
from nsqx.nsqd.channel_policy import NO_POLICY, OVERFLOW_DROP, ChannelPolicy, ReplayMark
from nsqx.nsqd.e2e import new_window
from nsqx.nsqd.inflight import Held, InFlight
from nsqx.store.cursor import CursorState, read_cursor, write_cursor
from nsqx.store.log import records, split_chunks
from nsqx.wire.ext import header_tag
from nsqx.wire.frames import (
    ATTEMPTS_AT,
    ID_AT,
    ID_END,
    attempts_of,
    encode_policy_notice,
    is_extended,
    record_parts,
    timestamp_of,
    with_attempts,
)
from nsqx.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.nsqd.partition import Partition
    from nsqx.nsqd.topic import Topic
    from nsqx.wire.errors import ProtocolError
    from nsqx.wire.identify import ClientSettings

log = logging.getLogger("nsqx.nsqd")


class Consumer(Protocol):
    """What a channel needs of a subscribed client (nsqd's ``Consumer`` in channel.go):
    ClientV2 is one, the unit tests have another.

    A consumer tells its channel how many messages it may have in flight (its RDY; 0
    while it cannot take any: closing, or its output backed up) with
    :meth:`Channel.ready_changed`, each time that changes; it starts at 0. One that can
    send its client a frame unasked has ``notice(frame)``: the channel tells a client
    that asked for it (IDENTIFY ``channel_policy``) its max_attempts."""

    #: for logs and traces
    remote_address: str
    #: how long a message may stay in flight before it is sent again (seconds); this
    #: and sample_rate are read once, when it subscribes
    msg_timeout: float
    #: 1-99: the percentage of messages it gets (the rest are consumed unsent); 0: all
    sample_rate: int
    #: its IDENTIFY (dispatch tag and ext filter, for an ext topic's routing)
    settings: ClientSettings

    def send(self, frames: list[bytes], ids: list[bytes], flush: bool) -> float:
        """Send (or buffer) these messages; ``flush``: write them now (nothing follows
        soon). Returns how long they may wait in its buffer before written (seconds,
        0 when written now): their timeout starts when the client can see them."""
        ...

    def close(self) -> None:
        """The channel is gone: close the connection."""
        ...

    def fail(self, err: ProtocolError) -> None:
        """Send an error now; a fatal one closes the connection (its partition moved)."""
        ...


def _smallest(heap: list[tuple[int, int, int]], k: int) -> list[tuple[int, int, int]]:
    """The ``k`` smallest entries of a heap, in order, walking only the heap's top (k log
    k, not a sort of the whole heap: a channel may hold a million deferred messages)."""
    out: list[tuple[int, int, int]] = []
    n = len(heap)
    candidates: list[tuple[tuple[int, int, int], int]] = [(heap[0], 0)]
    while candidates and len(out) < k:
        entry, i = heapq.heappop(candidates)
        out.append(entry)
        for j in (2 * i + 1, 2 * i + 2):
            if j < n:
                heapq.heappush(candidates, (heap[j], j))
    return out


def _sample(frames: list[bytes], ids: list[bytes], rate: int) -> tuple[list[bytes], list[bytes]]:
    """What a consumer with a ``sample_rate`` gets of these (as nsqd, a message sampled
    out is consumed without being sent)."""
    frames = split_chunks(frames)
    keep = [j for j in range(len(ids)) if random.randrange(100) <= rate]
    return [frames[j] for j in keep], [ids[j] for j in keep]


class Channel:
    """Channel maintains a cursor into the topic's log, the requeued and deferred
    messages, and hands messages to subscribed clients with spare RDY.

    Delivery is one pump per channel, scheduled once per loop iteration however many
    events asked for it. It takes requeued messages first, then the log, and gives
    each ready client a fair share in one batch: one list slice, one dict update and
    one write per client. In-flight messages live in ``flight`` (nsqx.nsqd.inflight),
    one insertion-ordered table per consumer, so timeouts are found by scanning heads.

    Two other dispatchers serve Youzan's extensions: an *ordered* channel (SUB_ORDERED,
    or a topic created orderedmulti) has one message in flight across all its clients,
    the lowest unfinished one, and sends the next after its FIN; a channel of an ext
    topic whose clients asked for a dispatch tag or an ext filter routes each message
    by its ext header.
    """

    def __init__(self, partition: Partition, name: str, start: int) -> None:
        self.partition = partition
        self.name = name
        self.ephemeral = is_ephemeral(name) or partition.ephemeral
        self.log = partition.log
        #: Next log sequence to deliver.
        self.cursor = start
        self.clients: list[Consumer] = []
        #: consumers told when the channel has messages and none of its consumers has
        #: room, and when it has none left (a fan-in's shards, nsqx.nsqd.fanin)
        self._starving: list[Consumer] = []
        #: each client's messages in flight
        self._held: dict[Consumer, Held] = {}
        #: in flight, requeued (ahead of the log) and deferred messages. Deferred due
        #: times are the monotonic clock's (ns): a wall clock set back or forward
        #: changes no delay (the cursor file keeps wall-clock times)
        self.flight = InFlight()
        self.paused = False
        self.deleted = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: publish-to-FIN latencies; None unless --e2e-processing-latency-percentile is set
        self.e2e = new_window(partition.nsqd.options)
        #: SUB_ORDERED made this channel ordered (it sticks, as in Youzan's nsqd, until
        #: /channel/setorder?order=false)
        self.ordered_flag = False
        #: /message/trace/enable for this channel
        self.trace_enabled = False
        #: trace ids of traced messages in flight (hex id -> trace id)
        self.traced: dict[bytes, int] = {}
        #: messages skipped by a client's ext filter (finished without being sent)
        self.filtered_count = 0
        #: an ext topic with clients that want tags or filters: route message by message
        self._routed = False
        self._pump_scheduled = False
        self._rr = 0
        self._loop = asyncio.get_running_loop()
        #: one timer for the earliest deferred message (not one per message), and its due
        #: time (wall clock ns): deferred messages come due within a timer tick of their
        #: time, not at the next scan (--queue-scan-interval)
        self._defer_timer: asyncio.TimerHandle | None = None
        self._defer_timer_due = 0
        #: dead letters, time-to-live, rate limits (nsqx.nsqd.channel_policy): set_policy
        self.policy: ChannelPolicy = NO_POLICY
        #: the policy's tests on the delivery path, kept as plain attributes (read per
        #: batch; the policy's own are properties)
        self._policy_active = False
        self._rate_limited = False
        self.dead_letter_count = 0
        self.expired_count = 0
        #: messages dropped by a maximum depth with overflow=drop_oldest
        self.dropped_count = 0
        #: messages being written to the dead-letter topic (seq -> attempts): pending,
        #: as if queued, until that publish is acknowledged
        self._dying: dict[int, int] = {}
        #: deferred (or requeued) messages at or past the cursor: held by ``flight``
        #: already, so a read of the log passes them (a replica that took its leader's
        #: deferred messages, take_leader_state; or a checkpoint of one)
        self.ahead: set[int] = set()
        #: the leader's deferred messages last taken (a follower's channel)
        self._leader_deferred: list[tuple[int, int, int]] = []
        #: with max_attempts: when stretches of the log were first delivered (their end
        #: sequences, in order, and wall ns; a stretch per millisecond at most), and the
        #: last delivery time (wall ns) of messages out on their last attempt: a dead
        #: letter's first and last delivery
        self._sent_ends: list[int] = []
        self._sent_times: list[int] = []
        self._last_sent: dict[bytes, int] = {}
        #: with a TTL: the messages from this sequence on are fresh until this time
        #: (wall ns; the log is in publish order), so most batches need no look at it
        self._fresh_from = 0
        self._fresh_until = 0
        #: how far /channel/deadletter/replay has looked in each dead-letter topic and
        #: partition (nsqx.nsqd.dead_letters.mark_key -> its mark); kept in nsqd.dat
        self.replay_marks: dict[str, ReplayMark] = {}
        #: the rate limits' token buckets (messages, bytes), when they were filled
        #: (monotonic s), the mean size of a delivered message, the timer that pumps
        #: again when tokens are back
        self._msg_tokens = 0.0
        self._byte_tokens = 0.0
        self._tokens_at = 0.0
        self._mean_size = 256.0
        self._rate_timer: asyncio.TimerHandle | None = None
        self._checkpoint_soon = False
        #: set when the cursor state changed since the last checkpoint
        self.dirty = False
        #: size and time of the last checkpoint (to pace very large ones)
        self.checkpoint_size = 0
        self.checkpoint_at = 0.0
        self.cursor_path: str | None = None
        if partition.durable and not self.ephemeral:
            self.cursor_path = os.path.join(partition.channel_dir, f"{name}.cursor")
            self._restore()

    @property
    def topic(self) -> Topic:
        return self.partition.topic

    @property
    def ordered(self) -> bool:
        """One message in flight at a time, in log order (SUB_ORDERED, orderedmulti)."""
        return self.ordered_flag or self.partition.topic.meta.ordered

    def set_ordered(self, ordered: bool) -> None:
        """SUB_ORDERED (True) or /channel/setorder."""
        if ordered != self.ordered_flag:
            self.ordered_flag = ordered
            log.info("CHANNEL(%s): ordered %s", self.name, ordered)
            self.notify()

    def set_policy(self, policy: ChannelPolicy) -> None:
        """New dead-letter, TTL or rate settings (/channel/config, or nsqd.dat)."""
        if policy == self.policy:
            return
        log.info("CHANNEL(%s): policy %s", self.name, policy.changed_json())
        attempts_changed = policy.max_attempts != self.policy.max_attempts
        if attempts_changed:
            self._forget_sent()
            self._last_sent.clear()
        self._fresh_until = 0
        if policy.rate_limited and not self.policy.rate_limited:
            self._tokens_at = clock.monotonic()
            self._msg_tokens = self._byte_tokens = 0.0
        refused = self.policy.refuses
        self.policy = policy
        self._policy_active = policy.active
        self._rate_limited = policy.rate_limited
        if refused or policy.refuses:
            self.partition.limits_changed()
        if policy.max_attempts:
            # (not now: while nsqd.dat loads, the dead-letter topic may not be loaded yet)
            self._loop.call_soon(self._reap)
        if attempts_changed:  # (its consumers that asked are told)
            for c in self.clients:
                self._tell_policy(c)
        self.notify()  # (messages may die, expire, or go faster now)

    def _tell_policy(self, client: Consumer) -> None:
        """Tell a consumer that asked for it (IDENTIFY ``channel_policy``: nsqx.client)
        the channel's max_attempts: it then leaves giving up to the channel, which makes
        a dead letter of the message, rather than finish it after its own max_attempts
        as go-nsq does. NSQ 1.3's clients never ask."""
        notice = getattr(client, "notice", None)  # (a consumer that cannot: not told)
        if notice is not None and client.settings.channel_policy:
            notice(encode_policy_notice(self.policy.max_attempts))

    # -- checkpoints ------------------------------------------------------------------

    def _restore(self) -> None:
        assert self.cursor_path is not None
        try:
            state = read_cursor(self.cursor_path)
        except ValueError as err:
            log.error("CHANNEL(%s): %s; starting at the oldest message", self.name, err)
            state = CursorState(self.log.start, self.log.start)
        if state is None:
            return
        lo, hi = self.log.start, self.log.end
        self.cursor = min(max(state.cursor, lo), hi)
        to_mono = clock.monotonic_ns() - clock.time_ns()
        flight = self.flight
        cursor = self.cursor
        for seq, attempts, due in state.entries():
            if not lo <= seq < hi:
                continue  # gone from the log (deleted segment, or lost with the page cache)
            if due:
                flight.defer(seq, attempts, due + to_mono)
            else:
                flight.requeued.append((seq, attempts))
            if seq >= cursor:
                self.ahead.add(seq)  # (a replica's: its leader's deferred messages)
        self._arm_deferred()

    def cursor_state(self) -> CursorState:
        """The checkpoint of this channel now (see nsqx.store.cursor)."""
        to_wall = clock.time_ns() - clock.monotonic_ns()
        pending = self.flight.pending(self.partition.id_base, to_wall)
        for seq, attempts in self._dying.items():
            # (not acknowledged by the dead-letter topic yet: dies again after a crash)
            pending.extend((seq, attempts, 0))
        confirmed = min(pending[::3], default=self.cursor)
        return CursorState(min(confirmed, self.cursor), self.cursor, pending)

    def checkpoint(self) -> None:
        """Write the cursor file now, if the channel is durable."""
        if self.cursor_path is None or self.deleted:
            return
        self.dirty = False
        write_cursor(self.cursor_path, self.cursor_state())

    # -- state ------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages waiting (not in flight, not deferred)."""
        # (messages ahead of the cursor that the deferred heap holds are not waiting)
        ahead = len(self.ahead)
        end = self.partition.visible_end
        # (sequences without a record: skipped after damage or a crash)
        missing = self.log.missing_between(self.cursor, end) if self.cursor < end else 0
        return len(self.flight.requeued) + max(end - self.cursor - ahead - missing, 0)

    def reported_depths(self) -> tuple[int, int]:
        """(depth, deferred_count) as /stats and /channel/peek report them: NSQ defers a
        DPUB when it is published, so one in the log that the cursor has not reached
        and that is not due yet counts as deferred, not waiting (here it waits in the
        log until the cursor reaches it)."""
        end = self.partition.visible_end
        later = 0
        if self.cursor < end:
            now = clock.time_ns()
            ahead = self.ahead  # (held by the deferred heap already: counted there)
            later = sum(
                1
                for seq, due in self.log.deferred_between(self.cursor, end)
                if due > now and seq not in ahead
            )
        return self.depth - later, self.deferred_count + later

    @property
    def in_flight_count(self) -> int:
        return self.flight.count

    @property
    def deferred_count(self) -> int:
        return len(self.flight.deferred)

    def low_water(self) -> int:
        """The oldest log sequence this channel may still deliver."""
        low = self.flight.low_water(self.cursor, self.partition.id_base)
        if self._dying:
            low = min(low, min(self._dying))
        return low

    # -- clients ----------------------------------------------------------------------

    def held_by(self, client: Consumer) -> Held | None:
        """``client``'s messages in flight and its counters (None if not subscribed)."""
        return self._held.get(client)

    def add_client(self, client: Consumer) -> None:
        self.clients.append(client)
        if getattr(client, "wants_starved", False):
            self._starving.append(client)
        # (its msg_timeout and sample_rate are read once: IDENTIFY comes before SUB)
        self._held[client] = self.flight.attach(client.msg_timeout, client.sample_rate)
        self._update_routing()
        if self.policy.max_attempts:
            self._tell_policy(client)

    def remove_client(self, client: Consumer) -> None:
        """A client left: whatever it had in flight is queued again at once."""
        held = self._held.pop(client, None)
        if held is None:
            return
        self.clients.remove(client)
        if client in self._starving:
            self._starving.remove(client)
        ids = self.flight.detach(held, self.partition.id_base)
        if ids and self.traced:
            for mid in ids:
                self._trace_end(tr.REQ, mid, client, {"reason": "client left"})
        if ids and self.policy.max_attempts:
            self._reap()
        self._update_routing()
        if self.clients:
            self.notify()
        elif self.ephemeral and is_ephemeral(self.name):
            self.partition.delete_channel(self.name)

    def _update_routing(self) -> None:
        self._routed = self.partition.topic.meta.ext and any(
            c.settings.desired_tag or c.settings.ext_filter is not None for c in self.clients
        )

    def detach(self) -> None:
        """nsqd is stopping: stop delivering (state stays on disk)."""
        self.paused = True
        self._disarm_deferred()

    def close(self) -> None:
        """Deleted: close subscribers, forget everything, remove the cursor file."""
        self.deleted = True
        self._disarm_deferred()
        self._dying.clear()
        for c in list(self.clients):
            c.close()
        self.clients.clear()
        self._held.clear()
        self.flight.clear()
        self.traced.clear()
        if self.cursor_path is not None:
            try:
                os.remove(self.cursor_path)
            except FileNotFoundError:
                pass

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.notify()

    def empty(self) -> None:
        """Drop every queued and deferred message (in-flight ones stay in flight)."""
        self.flight.drop_queued()
        self.cursor = max(self.cursor, self.partition.visible_end)
        self.dirty = True

    def reset_to(self, seq: int) -> None:
        """Replay or skip: deliver from ``seq`` on (SUB_ADVANCED, /channel/setoffset).
        Queued and deferred messages are forgotten (those from ``seq`` on come again
        from the log); messages in flight stay in flight."""
        self.seek(min(max(seq, self.log.start), self.log.end))
        log.info("CHANNEL(%s): reset to sequence %d", self.name, self.cursor)
        self.notify()

    def seek(self, seq: int) -> None:
        """Deliver from ``seq`` on, as is (the partition moved under the channel: a
        truncated or reset log, a follower taking its leader's positions). Queued and
        deferred messages are forgotten; messages in flight stay in flight."""
        self.cursor = seq
        self.flight.drop_queued()
        self.ahead.clear()
        self._leader_deferred = []
        self._forget_sent()
        self.dirty = True

    # -- replication ------------------------------------------------------------------

    def deferred_for_replicas(self, limit: int) -> list[tuple[int, int, int]]:
        """The deferred messages (REQ with a delay, DPUB) as (sequence, attempts so far,
        due time in ms of the wall clock), the ``limit`` earliest due: what a leader
        sends its followers so that a new leader keeps the schedule."""
        deferred = self.flight.deferred
        if not deferred:
            return []
        to_wall = clock.time_ns() - clock.monotonic_ns()
        taken = deferred if len(deferred) <= limit else _smallest(deferred, limit)
        return [(seq, attempts, (due + to_wall) // 1_000_000) for due, seq, attempts in taken]

    def take_leader_state(
        self, cursor: int, deferred: list[tuple[int, int, int]], leader_now_ms: int
    ) -> None:
        """A follower's channel takes its leader's position (the oldest message the
        leader still needs) and deferred messages, each due as long after now as it was
        after ``leader_now_ms`` on the leader (the nodes' clocks need not agree): if it
        leads next, it delivers from there, the deferred ones when due (the log's read
        passes them)."""
        if cursor == self.cursor and deferred == self._leader_deferred:
            return
        self.seek(cursor)
        if deferred:
            now = clock.monotonic_ns()
            defer = self.flight.defer
            ahead = self.ahead
            for seq, attempts, due_ms in deferred:
                if seq < cursor:
                    continue
                defer(seq, attempts, now + max(due_ms - leader_now_ms, 0) * 1_000_000)
                ahead.add(seq)
            self._leader_deferred = deferred
            self._arm_deferred()

    def advance_to(self, seq: int) -> None:
        """Count everything below ``seq`` as consumed (a range consumer, such as a Spark
        query, reports its progress); messages in flight stay in flight."""
        self.cursor = max(self.cursor, seq)
        self.flight.drop_below(seq)
        self.dirty = True

    def drop_before(self, seq: int) -> None:
        """Memory bound of ephemeral channels: forget queued messages below ``seq``."""
        self.cursor = max(self.cursor, seq)
        self.dirty = True

    # -- delivery ---------------------------------------------------------------------

    def notify(self) -> None:
        """Something may be deliverable: run the pump once this loop iteration."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self.pump)

    def ready_changed(self, client: Consumer, ready: int) -> None:
        """``client`` may now have ``ready`` messages in flight (its RDY, or 0 while it
        cannot take any): deliver if it has room."""
        held = self._held.get(client)
        if held is not None:
            held.ready = ready
            if ready > len(held):
                self.notify()

    def _ready(self) -> list[tuple[Consumer, Held, int]]:
        """The clients with spare RDY (and how much), starting with the next in turn."""
        held_of = self._held
        ready = []
        for c in self.clients:
            held = held_of[c]
            spare = held.ready - len(held)
            if spare > 0:
                ready.append((c, held, spare))
        if len(ready) > 1:
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr :] + ready[: self._rr]
        return ready

    def pump(self) -> None:
        self._pump_scheduled = False
        if self.paused or self.deleted or not self.clients:
            return
        ready = self._ready()
        if not ready:
            if self._starving:
                if self.flight.requeued or self.partition.visible_end > self.cursor:
                    # messages and no room: a fan-in's shard asks its connection for RDY
                    for c in self._starving:
                        c.starved()  # type: ignore[attr-defined]
                else:
                    for c in self._starving:
                        c.sated()  # type: ignore[attr-defined]
            return
        # what the rate limits let go now (-1: no limit)
        limit = self._rate_room() if self._rate_limited else -1
        if limit == 0:
            return  # (the rate timer pumps again)
        if self.ordered:
            self._pump_ordered(ready[0][0], ready[0][1])
            return
        if self._routed:
            self._pump_routed(ready, limit)
            return
        now = clock.monotonic()
        left = len(ready)
        tracing = self.partition.extended or self.trace_enabled or self.topic.trace_enabled
        requeued = self.flight.requeued
        room_left = sent = False
        for c, held, spare in ready:
            avail = len(requeued) + self.partition.visible_end - self.cursor
            if avail <= 0:
                break
            # an even share of what is there, so that one client cannot take it all
            share = min(spare, -(-avail // left))
            left -= 1
            if limit >= 0:
                if limit == 0:
                    break
                share = min(share, limit)
            room_left |= share < spare
            frames, ids = self._take(share)
            if frames:
                sent = True
                if limit >= 0:
                    limit = max(limit - len(ids), 0)
                    self._rate_spent(frames, len(ids))
                if tracing:
                    self._trace_start(frames, ids, c)
                # written now when the client can take no more (nothing else would
                # follow soon); else buffered as it asked (output_buffer_*)
                self._send(c, held, frames, ids, len(ids) >= spare, now)
        if limit == 0:
            self._rate_room()  # (arms the timer for the next tokens)
        elif len(requeued) + self.partition.visible_end > self.cursor:
            if room_left and sent:
                # a client with less room than its share left messages that another one
                # has room for: go round again (found by tests/nsqd/test_channel_states.py)
                self.notify()
            elif self._starving and not room_left:
                # every consumer full and messages left: a fan-in's shard asks for RDY
                for c in self._starving:
                    c.starved()  # type: ignore[attr-defined]
        elif self._starving:
            # nothing left: a shard that asked for RDY asks no more (else its old ask
            # keeps the RDY it holds from a shard that has messages)
            for c in self._starving:
                c.sated()  # type: ignore[attr-defined]

    def _send(
        self,
        c: Consumer,
        held: Held,
        frames: list[bytes],
        ids: list[bytes],
        flush: bool,
        now: float,
    ) -> None:
        """Hand a batch to ``c`` and put it in flight (one dict update)."""
        if held.sample_rate:
            frames, ids = _sample(frames, ids, held.sample_rate)
            if not ids:
                return
        delay = c.send(frames, ids, flush)
        held.add(ids, now + held.timeout + delay)

    def _pump_ordered(self, client: Consumer, held: Held) -> None:
        """One message in flight for the whole channel: the lowest unfinished one, to
        the next client with room; the next one only after its FIN (or REQ 0, or a
        timeout, which send it again)."""
        if self.flight.count:
            return
        ext_filter = client.settings.ext_filter if self.topic.meta.ext else None
        for _ in range(1000):  # messages an ext filter skips: a bounded run per pump
            frame, mid = self._take_ordered()
            if frame is None:
                return
            if ext_filter is not None:
                _trace_id, ver, ext, _ = record_parts(frame)
                if not ext_filter.match(ver, ext):
                    self._skip_filtered(mid)
                    continue
            if self.partition.extended or self.trace_enabled or self.topic.trace_enabled:
                self._trace_start([frame], [mid], client)
            if self._rate_limited:
                self._rate_spent([frame], 1)
            self._send(client, held, [frame], [mid], True, clock.monotonic())
            return
        self.notify()

    def _take_ordered(self) -> tuple[bytes | None, bytes]:
        """The lowest unfinished message (requeued ones come before the cursor's), its
        deferral ignored: ordered channels never delay (as Youzan's)."""
        requeued = self.flight.requeued
        policy = self.policy
        while requeued:
            k = min(range(len(requeued)), key=lambda i: requeued[i][0])
            seq, attempts = requeued[k]
            del requeued[k]
            if self._policy_active and self._dies(seq, attempts):
                continue
            frame = self.log.get(seq)
            if frame is None:
                continue  # dropped (emptied, or an ephemeral overflow)
            if policy.message_ttl_ms and self._expired(frame):
                continue
            mid = frame[ID_AT:ID_END]
            if attempts:
                frame = with_attempts(frame, attempts + 1)
                self.flight.redelivered(mid, attempts + 1)
            if attempts and attempts + 1 >= policy.max_attempts > 0:
                self._last_sent[mid] = clock.time_ns()
            return frame, mid
        end = self.partition.visible_end
        while self.cursor < end:
            if policy.message_ttl_ms:
                self._expire_log()
            lo = self.cursor
            f, i = self.log.read(lo, 1)
            if not i:
                self.cursor = self.log.resume_at(lo)  # trimmed, or a gap after damage
                if self.cursor == lo:
                    break
                continue
            self.cursor = lo + 1
            self.dirty = True
            self.message_count += 1
            if self.flight.is_deferred(lo):
                continue  # also deferred from before the channel was ordered
            frame = split_chunks(f)[0]
            if policy.message_ttl_ms and self._expired(frame):
                continue
            if policy.max_attempts:
                self._first_sent(lo + 1)
            return frame, i[0]
        return None, b""

    def _pump_routed(self, ready: list[tuple[Consumer, Held, int]], limit: int) -> None:
        """Route each message by its ext header: a message with a dispatch tag goes to a
        client that asked for that tag if there is one, every other message to clients
        without a tag; a client's ext filter finishes what it does not match unsent.
        What no client can take now waits at the front of the queue."""
        now = clock.monotonic()
        room = {c: spare for c, _, spare in ready}
        by_tag: dict[str, list[Consumer]] = {}
        for c in self.clients:
            by_tag.setdefault(c.settings.desired_tag, []).append(c)
        want = sum(room.values())
        frames, ids = self._take(want if limit < 0 else min(want, limit))
        if not ids:
            return
        if limit >= 0:
            self._rate_spent(frames, len(ids))
        frames = split_chunks(frames)
        out: dict[Consumer, tuple[list[bytes], list[bytes]]] = {}
        back: list[tuple[int, int]] = []
        skipped = 0
        rr = self._rr
        for frame, mid in zip(frames, ids, strict=True):
            _, ver, ext, _ = record_parts(frame)
            tag = header_tag(ver, ext) if ext else ""
            group = by_tag.get(tag) if tag else None
            if not group:
                group = by_tag.get("", [])
            takers = [c for c in group if room.get(c, 0) > 0]
            if not takers:
                attempts = int.from_bytes(frame[ATTEMPTS_AT:ID_AT], "big") - 1
                back.append((self.partition.seq_of(mid), attempts))
                self.flight.forget(mid)
                continue
            rr += 1
            c = takers[rr % len(takers)]
            flt = c.settings.ext_filter
            if flt is not None and not flt.match(ver, ext):
                self._skip_filtered(mid)
                skipped += 1
                continue
            room[c] -= 1
            f_list, i_list = out.setdefault(c, ([], []))
            f_list.append(frame)
            i_list.append(mid)
        self._rr = rr
        if back:
            self.flight.requeued.extendleft(reversed(back))
        for c, (f_list, i_list) in out.items():
            self._trace_start(f_list, i_list, c)
            self._send(c, self._held[c], f_list, i_list, room[c] <= 0, now)
        if skipped and not back:
            # what a filter skipped left room: take more (else a client with RDY 1
            # whose next message is filtered would wait for ever)
            self.notify()

    def _skip_filtered(self, mid: bytes) -> None:
        """A message a client's ext filter refused: finished for the channel, unsent."""
        self.flight.forget(mid)
        self.filtered_count += 1
        self.dirty = True
        if self.trace_enabled or self.topic.trace_enabled:
            self.partition.nsqd.tracer.record("FILTERED", self.partition, mid, 0, channel=self.name)

    # -- tracing ----------------------------------------------------------------------

    def _trace_start(self, frames: list[bytes], ids: list[bytes], client: Consumer) -> None:
        """START events for the traced messages among these (and remember them in
        flight, for their FIN, REQ or TIMEOUT)."""
        everything = self.trace_enabled or self.topic.trace_enabled
        if not everything and not any(map(is_extended, frames)):
            return
        tracer = self.partition.nsqd.tracer
        for frame, mid in zip(split_chunks(frames), ids, strict=True):
            trace_id = record_parts(frame).trace_id
            if trace_id or everything:
                self.traced[mid] = trace_id
                tracer.record(
                    tr.START,
                    self.partition,
                    mid,
                    trace_id,
                    channel=self.name,
                    client=client.remote_address,
                    extra={"attempts": int.from_bytes(frame[ATTEMPTS_AT:ID_AT], "big")},
                )

    def _trace_end(
        self, event: str, mid: bytes, client: Consumer, extra: dict[str, object] | None = None
    ) -> None:
        trace_id = self.traced.pop(mid, None)
        if trace_id is not None:
            self.partition.nsqd.tracer.record(
                event,
                self.partition,
                mid,
                trace_id,
                channel=self.name,
                client=client.remote_address,
                extra=extra,
            )

    def _take(self, k: int) -> tuple[list[bytes], list[bytes]]:
        frames: list[bytes] = []
        ids: list[bytes] = []
        requeued = self.flight.requeued
        policy = self.policy
        active = self._policy_active
        if requeued:
            get = self.log.get
            while requeued and len(ids) < k:
                seq, attempts = requeued.popleft()
                if active and self._dies(seq, attempts):
                    continue
                frame = get(seq)
                if frame is None:  # dropped (ephemeral overflow or emptied)
                    continue
                if active and policy.message_ttl_ms and self._expired(frame):
                    continue
                mid = frame[ID_AT:ID_END]
                if attempts:
                    frame = with_attempts(frame, attempts + 1)
                    self.flight.redelivered(mid, attempts + 1)
                if attempts and active and attempts + 1 >= policy.max_attempts > 0:
                    self._last_sent[mid] = clock.time_ns()
                frames.append(frame)
                ids.append(mid)
        end = self.partition.visible_end
        while len(ids) < k and self.cursor < end:
            if active and policy.message_ttl_ms:
                self._expire_log()
            lo = self.cursor
            f, i = self.log.read(lo, min(k - len(ids), end - lo))
            if not i:
                self.cursor = self.log.resume_at(lo)  # trimmed, or a gap after damage
                if self.cursor == lo:
                    break
                continue
            hi = lo + len(i)
            self.cursor = hi
            self.dirty = True
            self.message_count += hi - lo
            deferred = self.log.deferred_between(lo, hi)
            if deferred or self.ahead:
                f, i = self._defer_from_log(deferred, lo, f, i)
            if active and policy.max_attempts:
                self._first_sent(hi)
            if frames:
                frames.extend(f)
                ids.extend(i)
            else:
                frames, ids = f, i
        return frames, ids

    # -- the policy: dead letters, time-to-live, rate limits ----------------------------

    def _dies(self, seq: int, attempts: int) -> bool:
        """A queued message delivered ``attempts`` times already: True if that is
        max_attempts, and it goes to the dead-letter topic rather than out again."""
        max_attempts = self.policy.max_attempts
        if not max_attempts or attempts < max_attempts:
            return False
        if seq in self._dying:
            return True  # (on its way already)
        frame = self.log.get(seq)
        if frame is None:
            return True  # gone from the log (emptied, an ephemeral overflow)
        self._dying[seq] = attempts
        self.dirty = True
        mid = frame[ID_AT:ID_END]
        last = self._last_sent.pop(mid, 0)
        first = self._first_delivery(seq)
        self.partition.nsqd.dead_letter(
            self, frame, attempts, first, last or first, lambda err: self._dead(seq, err)
        )
        return True

    def _reap(self) -> None:
        """Send the queued messages on their last attempt to the dead-letter topic now,
        whether or not a consumer is ready (after timeouts, a consumer leaving, a new
        policy)."""
        max_attempts = self.policy.max_attempts
        requeued = self.flight.requeued
        if self.deleted or not max_attempts or not any(a >= max_attempts for _, a in requeued):
            return
        self.flight.requeued = deque(e for e in requeued if e[1] < max_attempts)
        for seq, attempts in [e for e in requeued if e[1] >= max_attempts]:
            self._dies(seq, attempts)

    def _first_sent(self, end: int) -> None:
        """The log up to ``end`` went out for the first time now."""
        now = clock.time_ns()
        times = self._sent_times
        if times and now - times[-1] < 1_000_000:
            self._sent_ends[-1] = end  # (the same millisecond: one stretch)
        else:
            self._sent_ends.append(end)
            times.append(now)

    def _forget_sent(self) -> None:
        self._sent_ends.clear()
        self._sent_times.clear()

    def _first_delivery(self, seq: int) -> int:
        """When ``seq`` was first delivered (wall ns, to the millisecond; 0: not known,
        as after a restart)."""
        i = bisect_right(self._sent_ends, seq)
        return self._sent_times[i] if i < len(self._sent_times) else 0

    def _dead(self, seq: int, err: BaseException | None) -> None:
        """The dead letter of ``seq`` was acknowledged by its topic (``err`` None): the
        message is finished here; or it failed: it waits a second and dies again."""
        attempts = self._dying.pop(seq, None)
        if attempts is None or self.deleted:
            return
        if err is not None:
            log.warning(
                "CHANNEL(%s): dead letter to %s failed (%s); trying again in 1s",
                self.name,
                self.policy.dead_letter_topic_for(self.topic.name),
                err,
            )
            self.flight.defer(seq, attempts, clock.monotonic_ns() + 1_000_000_000)
            self._arm_deferred()
            return
        self.dead_letter_count += 1
        self.dirty = True
        # soon rather than at the next checkpoint (a crash now must not make a second
        # dead letter of it); once for the dead letters of a loop iteration (an fsync)
        if not self._checkpoint_soon:
            self._checkpoint_soon = True
            self._loop.call_soon(self._dead_checkpoint)

    def _dead_checkpoint(self) -> None:
        self._checkpoint_soon = False
        self.checkpoint()

    def _expired(self, frame: bytes) -> bool:
        """True (and counted) if the message was published longer ago than the TTL."""
        ts = timestamp_of(frame)
        if ts >= clock.time_ns() - self.policy.message_ttl_ms * 1_000_000:
            return False
        self.expired_count += 1
        self.dirty = True
        return True

    def _expire_log(self) -> None:
        """Move the cursor past the log's expired messages (found by time: the log is
        in publish order), counting them. The messages from the cursor on are then
        fresh (a batch read from there needs no test per message; only a clock set
        back, making the log's times go backwards, lets a few expired ones through)."""
        now = clock.time_ns()
        if self.cursor >= self._fresh_from and now < self._fresh_until:
            return
        frame = self.log.get(self.cursor)
        if frame is None:
            return
        ttl = self.policy.message_ttl_ms * 1_000_000
        cutoff = now - ttl
        published = timestamp_of(frame)
        if published >= cutoff:
            self._fresh_from = self.cursor
            self._fresh_until = published + ttl
            return
        to = min(self.log.seek_time(cutoff), self.partition.visible_end)
        if to > self.cursor:
            self.expired_count += to - self.cursor
            self.cursor = to
            self.dirty = True

    def bytes_waiting(self) -> int:
        """Bytes of the log from the cursor to what channels may see."""
        log_ = self.log
        end = self.partition.visible_end
        if self.cursor >= end:
            return 0
        start = log_.offset_of(self.cursor)
        stop = log_.end_offset if end >= log_.end else log_.offset_of(end)
        return 0 if start is None or stop is None else stop - start

    def full(self) -> str:
        """Why the channel is at its maximum depth ("" if it is not)."""
        p = self.policy
        # (the cheap count first: DPUBs not yet due are looked for only near the maximum)
        if p.max_depth and self.depth >= p.max_depth:
            depth = self.reported_depths()[0]
            if depth >= p.max_depth:
                return f"channel {self.name} has {depth} messages (max_depth {p.max_depth})"
        if p.max_depth_bytes:
            waiting = self.bytes_waiting()
            if waiting >= p.max_depth_bytes:
                return (
                    f"channel {self.name} has {waiting} bytes waiting "
                    f"(max_depth_bytes {p.max_depth_bytes})"
                )
        return ""

    def _drop_oldest(self) -> bool:
        """Over a maximum depth with overflow=drop_oldest: forget the oldest waiting
        messages (requeued ones first, then the log from the cursor), counted."""
        p = self.policy
        dropped = 0
        requeued = self.flight.requeued
        if p.max_depth and self.depth > p.max_depth:
            excess = self.reported_depths()[0] - p.max_depth
            while excess > 0 and requeued:
                requeued.popleft()
                excess -= 1
                dropped += 1
            end = self.partition.visible_end
            while excess > 0 and self.cursor < end:
                to = min(self.cursor + excess, end)
                passed = self._drop_log_to(to)
                dropped += passed
                excess -= passed
        if p.max_depth_bytes and self.bytes_waiting() > p.max_depth_bytes:
            end = self.partition.visible_end
            log_ = self.log
            stop = log_.end_offset if end >= log_.end else log_.offset_of(end)
            if stop is not None:
                to = min(max(log_.seek_offset(stop - p.max_depth_bytes), self.cursor), end)
                dropped += self._drop_log_to(to)
        if not dropped:
            return False
        self.dropped_count += dropped
        self.dirty = True
        return True

    def _drop_log_to(self, to: int) -> int:
        """Move the cursor to ``to``, dropping the waiting messages passed: DPUBs not yet
        due among them are deferred (not waiting, so not dropped), as :meth:`_take`
        defers them. Returns how many were dropped."""
        lo = self.cursor
        self.cursor = to
        later = self.log.deferred_between(lo, to)
        if not later:
            return to - lo
        now_ns = clock.time_ns()
        to_mono = clock.monotonic_ns() - now_ns
        kept = 0
        for seq, due in later:
            if due > now_ns:
                self.flight.defer(seq, 0, due + to_mono)
                kept += 1
        if kept:
            self._arm_deferred()
        return to - lo - kept

    def _rate_room(self) -> int:
        """How many messages the rate limits let go now (the buckets filled for the
        time since); 0 arms a timer that pumps again when there is room."""
        p = self.policy
        now = clock.monotonic()
        dt = now - self._tokens_at
        self._tokens_at = now
        room = 1 << 30
        wait = 0.0
        # a tenth of a second's worth at most: deliveries are paced, not bursts
        if p.max_msgs_per_sec:
            rate = p.max_msgs_per_sec
            self._msg_tokens = min(max(rate / 10, 1.0), self._msg_tokens + dt * rate)
            room = int(self._msg_tokens)
            if room <= 0:
                wait = (1.0 - self._msg_tokens) / rate
        if p.max_bytes_per_sec:
            rate = p.max_bytes_per_sec
            self._byte_tokens = min(max(rate / 10, 1.0), self._byte_tokens + dt * rate)
            if self._byte_tokens <= 0:
                room = 0
                wait = max(wait, (1.0 - self._byte_tokens) / rate)
            else:
                room = min(room, max(1, int(self._byte_tokens // self._mean_size)))
        if room <= 0 and self._rate_timer is None and not self.deleted:
            self._rate_timer = self._loop.call_later(max(wait, 0.001), self._rate_wake)
        return max(room, 0)

    def _rate_wake(self) -> None:
        self._rate_timer = None
        self.notify()

    def _rate_spent(self, frames: list[bytes], n: int) -> None:
        """``n`` messages (these frames) went: take them from the buckets."""
        self._msg_tokens -= n
        if self.policy.max_bytes_per_sec:
            size = sum(map(len, frames))
            self._byte_tokens -= size
            self._mean_size = 0.9 * self._mean_size + 0.1 * (size / n)

    def peek(self, n: int) -> list[tuple[int, bytes, int]]:
        """The next ``n`` messages this channel would deliver, as (sequence, stored
        frame, the attempt it would be), changing nothing: the requeued ones first, in
        their order, then the log from the cursor, DPUBs not yet due left out (as
        :meth:`_take` takes them). In-flight and deferred messages are not next."""
        out: list[tuple[int, bytes, int]] = []
        get = self.log.get
        now_ns = clock.time_ns()
        max_attempts = self.policy.max_attempts
        # (what would die or expire rather than go out is not next either)
        oldest = (
            now_ns - self.policy.message_ttl_ms * 1_000_000 if self.policy.message_ttl_ms else 0
        )
        for seq, attempts in self.flight.requeued:
            if len(out) >= n:
                return out
            frame = get(seq)
            if frame is None or (max_attempts and attempts >= max_attempts):
                continue
            if oldest and timestamp_of(frame) < oldest:
                continue
            out.append((seq, frame, attempts + 1 if attempts else attempts_of(frame)))
        end = self.partition.visible_end
        later: set[int] = set()
        hi = 0
        for seq, frame in records(self.log, self.cursor, end):
            if len(out) >= n:
                break
            if seq >= hi:  # the DPUBs not yet due in the next stretch
                hi = min(end, seq + n - len(out))
                later = {s for s, due in self.log.deferred_between(seq, hi) if due > now_ns}
            if seq not in later and not (oldest and timestamp_of(frame) < oldest):
                out.append((seq, frame, attempts_of(frame)))
        return out

    def _defer_from_log(
        self, deferred: list[tuple[int, int]], lo: int, frames: list[bytes], ids: list[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        # DPUB records are held in the deferred heap until due (their due time is wall
        # clock, written at publish time: from here on the monotonic clock counts)
        now_ns = clock.time_ns()
        to_mono = clock.monotonic_ns() - now_ns
        skip = set()
        ahead = self.ahead
        for seq, due in deferred:
            if due > now_ns and seq not in ahead:
                self.flight.defer(seq, 0, due + to_mono)
                skip.add(seq - lo)
        if ahead:
            # held by the deferred heap (or requeued) already: not delivered from here
            hi = lo + len(ids)
            for seq in [s for s in ahead if s < hi]:
                ahead.discard(seq)
                if seq >= lo:
                    skip.add(seq - lo)
        if not skip:
            return frames, ids
        self._arm_deferred()
        frames = split_chunks(frames)
        keep = [j for j in range(len(frames)) if j not in skip]
        return [frames[j] for j in keep], [ids[j] for j in keep]

    # -- acknowledgements -------------------------------------------------------------

    def _not_in_flight(self, client: Consumer, msg_id: bytes) -> str:
        holder = self.flight.holder(msg_id)
        if holder is not None and holder is not self._held.get(client):
            return "client does not own message"
        return "ID not in flight"

    def finish(self, client: Consumer, ids: list[bytes]) -> list[tuple[bytes, str]]:
        """FIN: forget the messages. Returns (id, reason) for those not in flight."""
        held = self._held.get(client)
        if held is None:
            return [(mid, self._not_in_flight(client, mid)) for mid in ids]
        done, missing = self.flight.finish(held, ids)
        if self._last_sent:
            pop = self._last_sent.pop
            for mid in done:
                pop(mid, None)
        if self.traced:
            for mid in done:
                if mid in self.traced:
                    self._trace_end(tr.FIN, mid, client)
        self.dirty = True
        if self.e2e is not None:
            self.e2e.record(self.log, done, self.partition.id_base)
        self.notify()
        if not missing:
            return []
        return [(mid, self._not_in_flight(client, mid)) for mid in missing]

    def requeue(self, client: Consumer, msg_id: bytes, timeout_ms: int) -> str | None:
        """REQ: back to the queue now (0) or after ``timeout_ms``. Returns an error.

        On an ordered channel a REQ with a delay is ignored (the message stays in flight
        and times out), as Youzan's nsqd does: a delay would break the order."""
        held = self._held.get(client)
        if held is None:
            return self._not_in_flight(client, msg_id)
        if self.ordered and timeout_ms > 0:
            return None if msg_id in held else self._not_in_flight(client, msg_id)
        # (the id is the client's: only one in flight here is known to be hex)
        if msg_id not in held:
            return self._not_in_flight(client, msg_id)
        due = clock.monotonic_ns() + timeout_ms * 1_000_000 if timeout_ms > 0 else 0
        dies = self.flight.attempts.get(msg_id, 1) >= self.policy.max_attempts > 0
        if dies:
            due = 0  # its last attempt: to the dead-letter topic now, not after the delay
        if not self.flight.requeue(held, msg_id, self.partition.seq_of(msg_id), due):
            return self._not_in_flight(client, msg_id)
        if dies:
            self._dies(*self.flight.requeued.pop())  # (requeued last, just now)
        if self.traced:
            self._trace_end(tr.REQ, msg_id, client, {"delay_ms": timeout_ms})
        self.dirty = True
        self.requeue_count += 1
        if due:
            self._arm_deferred()
        self.notify()  # the message goes again, or the client's RDY has room again
        return None

    def touch(self, client: Consumer, msg_id: bytes, max_msg_timeout: float) -> str | None:
        """TOUCH: restart the message's timeout, up to max-msg-timeout since delivery."""
        held = self._held.get(client)
        if held is None or not held.touch(msg_id, clock.monotonic(), max_msg_timeout):
            return self._not_in_flight(client, msg_id)
        return None

    # -- timers -----------------------------------------------------------------------

    def scan(self, now: float, now_ns: int) -> None:
        """Time out in-flight messages and release due deferred ones (batched); both
        times are the monotonic clock's (seconds, ns)."""
        moved = False
        flight = self.flight
        id_base = self.partition.id_base
        for c, held in self._held.items():
            expired = flight.expire(held, now, id_base)
            if expired:
                if self.traced:
                    for mid in expired:
                        self._trace_end(tr.TIMEOUT, mid, c)
                self.timeout_count += len(expired)
                moved = True
        if moved and self.policy.max_attempts:
            self._reap()
        if self._release_deferred(now_ns):
            moved = True
        policy = self.policy
        if self._policy_active:
            if policy.message_ttl_ms and not self.paused:
                # (without consumers the pump does not run: depth shows live messages)
                before = self.cursor
                self._expire_log()
                moved |= self.cursor != before
            if policy.bounded and policy.overflow == OVERFLOW_DROP:
                moved |= self._drop_oldest()
            if len(self._sent_ends) > 4096:
                # (what is below the low water is finished; found rarely: it costs)
                i = bisect_right(self._sent_ends, self.low_water())
                del self._sent_ends[:i]
                del self._sent_times[:i]
        if moved:
            self.notify()

    def _release_deferred(self, now_ns: int) -> bool:
        """Move the deferred messages due by ``now_ns`` to the requeued ones."""
        moved = self.flight.release(now_ns)
        self._arm_deferred()
        if moved and self.policy.max_attempts:
            self._reap()  # (a dead letter to try again, or a REQ'd one past its attempts)
        return moved

    def _arm_deferred(self) -> None:
        """Have the timer go off when the earliest deferred message is due."""
        due = self.flight.next_due()
        if not due or self.deleted:
            return
        timer = self._defer_timer
        if timer is not None:
            if self._defer_timer_due <= due:
                return  # it goes off first; it re-arms for the next
            timer.cancel()
        self._defer_timer_due = due
        # at least a timer tick (1 ms): the loop's timers may round a little early
        delay = max((due - clock.monotonic_ns()) / 1e9, 0.001)
        self._defer_timer = self._loop.call_later(delay, self._deferred_timer)

    def _disarm_deferred(self) -> None:
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None

    def _deferred_timer(self) -> None:
        self._defer_timer = None
        if self._release_deferred(clock.monotonic_ns()):
            self.notify()
