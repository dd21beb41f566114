"""InFlight: a channel's messages between its cursor and their FIN, sans-IO.

What a channel has handed out and not yet seen finished lives here: the messages in
flight to each consumer (:class:`Held`), the requeued ones waiting to go again ahead of
the log, the deferred ones waiting for their time, and the attempts of messages
delivered more than once. Messages are named by their 16-byte hex id while in flight
and by their log sequence while queued.

No clock is read here (every call that depends on time is given ``now``), no socket,
no event loop: tests drive it directly (tests/nsqd/test_inflight.py). The channel
(nsqx.nsqd.channel) does the IO around it: reading the log, sending, tracing, timers.

The timer rule of DESIGN.md holds: the messages in flight to one consumer share its
msg_timeout, so an insertion-ordered dict (id -> deadline) per consumer expires in
delivery order, and a scan stops at the first live entry; no heap entry per message.
Deferred messages are a heap keyed by due time.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from typing import Final, final

from nsqx.nsqd.guid import seq_of

__all__ = ["Held", "InFlight"]

#: (due ns, seq, attempts so far)
_Deferred = tuple[int, int, int]

_NO_DEADLINE: Final = -1.0


@final
class Held:
    """The messages in flight to one consumer of a channel, its counters, and what
    delivery needs to know of the consumer: ``ready``, how many messages it may have in
    flight now (its RDY, as it last told the channel), and two settings fixed by its
    IDENTIFY before SUB, ``timeout`` (its msg_timeout, seconds) and ``sample_rate``.

    ``_inflight`` maps id -> deadline (seconds, the caller's monotonic clock) in
    delivery order. A TOUCH clamped by max-msg-timeout can break that order: such
    entries wait in ``_irregular``, which is scanned whole (it is almost always empty).
    """

    def __init__(self, timeout: float, sample_rate: int = 0) -> None:
        self.timeout = timeout
        self.sample_rate = sample_rate
        self.ready = 0
        self._inflight: dict[bytes, float] = {}
        self._irregular: dict[bytes, float] = {}
        #: delivery time of touched messages (for the max-msg-timeout clamp)
        self._touched: dict[bytes, float] = {}
        #: messages this consumer finished, requeued, and let time out
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0

    def __len__(self) -> int:
        return len(self._inflight) + len(self._irregular)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self._inflight or msg_id in self._irregular

    def ids(self) -> list[bytes]:
        """The ids in flight (in delivery order, then the touched-aside ones)."""
        return [*self._inflight, *self._irregular]

    def add(self, ids: list[bytes], deadline: float) -> None:
        """Put ``ids`` in flight until ``deadline`` (one dict update for the batch)."""
        self._inflight.update(dict.fromkeys(ids, deadline))

    def deadline(self, msg_id: bytes) -> float:
        """When ``msg_id`` times out (-1 if it is not in flight here)."""
        d = self._inflight.get(msg_id)
        if d is None:
            d = self._irregular.get(msg_id, _NO_DEADLINE)
        return d

    def pop(self, msg_id: bytes) -> bool:
        """Take one message out of flight; False if it was not in flight here."""
        found = self._inflight.pop(msg_id, None) is not None
        if not found and self._irregular:
            found = self._irregular.pop(msg_id, None) is not None
        if found and self._touched:
            self._touched.pop(msg_id, None)
        return found

    def finish(self, ids: list[bytes]) -> list[bytes]:
        """Take ``ids`` out of flight (bulk); returns those that were not in flight."""
        pop = self._inflight.pop
        missing = [mid for mid in ids if pop(mid, None) is None]
        if missing and self._irregular:
            irregular_pop = self._irregular.pop
            missing = [mid for mid in missing if irregular_pop(mid, None) is None]
        if self._touched:
            touched_pop = self._touched.pop
            for mid in ids:
                touched_pop(mid, None)
        return missing

    def touch(self, msg_id: bytes, now: float, max_timeout: float) -> bool:
        """Restart ``msg_id``'s timeout at ``now`` (its full timeout again), but no later
        than ``max_timeout`` after its delivery. False if it is not in flight here."""
        timeout = self.timeout
        deadline = self._inflight.pop(msg_id, None)
        if deadline is None and self._irregular:
            deadline = self._irregular.pop(msg_id, None)
        if deadline is None:
            return False
        delivered = self._touched.get(msg_id)
        if delivered is None:
            delivered = self._touched[msg_id] = deadline - timeout
        new = min(now + timeout, delivered + max_timeout)
        inflight = self._inflight
        # the in-flight dict must stay ordered by deadline; a clamped one goes aside
        if not inflight or new >= next(reversed(inflight.values())):
            inflight[msg_id] = new
        else:
            self._irregular[msg_id] = new
        return True

    def expire(self, now: float) -> list[bytes]:
        """Take out and return the ids whose deadline is ``now`` or earlier."""
        out: list[bytes] = []
        inflight = self._inflight
        if inflight:
            for mid, deadline in inflight.items():
                if deadline > now:
                    break
                out.append(mid)
            for mid in out:
                del inflight[mid]
        if self._irregular:
            late = [mid for mid, d in self._irregular.items() if d <= now]
            for mid in late:
                del self._irregular[mid]
            out.extend(late)
        if out and self._touched:
            for mid in out:
                self._touched.pop(mid, None)
        return out

    def take_all(self) -> list[bytes]:
        """Take every message out of flight (the consumer left); returns their ids."""
        out = self.ids()
        self._inflight.clear()
        self._irregular.clear()
        self._touched.clear()
        return out


@final
class InFlight:
    """A channel's delivered-and-unfinished, requeued and deferred messages.

    One :class:`Held` per consumer (:meth:`attach`, :meth:`detach`); the requeued
    queue of (seq, attempts so far) goes out before the log; the deferred heap of
    (due ns, seq, attempts so far) moves to the requeued queue as it comes due
    (:meth:`release`); ``attempts`` keeps the count of in-flight messages delivered
    more than once (a first delivery, the usual case, has no entry). ``id_base`` is the
    partition's (see nsqx.nsqd.guid): it turns ids back into log sequences.
    """

    def __init__(self) -> None:
        self.requeued: deque[tuple[int, int]] = deque()
        self.deferred: list[_Deferred] = []
        self.attempts: dict[bytes, int] = {}
        self._held: list[Held] = []

    # -- consumers ----------------------------------------------------------------------

    def attach(self, timeout: float, sample_rate: int = 0) -> Held:
        """A new consumer (its msg_timeout and sample_rate): its table of messages in
        flight, empty."""
        held = Held(timeout, sample_rate)
        self._held.append(held)
        return held

    def detach(self, held: Held, id_base: int) -> list[bytes]:
        """A consumer left: what it had in flight is queued again at once, in the order
        it was delivered. Returns those ids."""
        if held in self._held:
            self._held.remove(held)
        ids = held.take_all()
        if ids:
            pop = self.attempts.pop
            self.requeued.extend((seq_of(m, id_base), pop(m, 1)) for m in ids)
        return ids

    @property
    def count(self) -> int:
        """Messages in flight, all consumers together."""
        n = 0
        for held in self._held:
            n += len(held)
        return n

    def holder(self, msg_id: bytes) -> Held | None:
        """The table that has ``msg_id`` in flight, if any."""
        for held in self._held:
            if msg_id in held:
                return held
        return None

    # -- acknowledgements ---------------------------------------------------------------

    def finish(self, held: Held, ids: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """FIN: ``ids`` are done. Returns (finished, not in flight at ``held``); an id
        given twice is finished once and missing once."""
        missing = held.finish(ids)
        # only what this consumer had in flight is finished: a late FIN of a message
        # now in flight elsewhere must not reset its attempts
        done = ids if not missing else _without(ids, missing)
        if self.attempts:
            attempts_pop = self.attempts.pop
            for mid in done:
                attempts_pop(mid, None)
        held.finish_count += len(done)
        return done, missing

    def requeue(self, held: Held, msg_id: bytes, seq: int, due_ns: int) -> bool:
        """REQ: ``msg_id`` (log sequence ``seq``) goes back to the queue now (``due_ns``
        0) or to the deferred heap until ``due_ns``. False if not in flight at ``held``."""
        if not held.pop(msg_id):
            return False
        attempts = self.attempts.pop(msg_id, 1)
        held.requeue_count += 1
        if due_ns <= 0:
            self.requeued.append((seq, attempts))
        else:
            heapq.heappush(self.deferred, (due_ns, seq, attempts))
        return True

    def expire(self, held: Held, now: float, id_base: int) -> list[bytes]:
        """Time out ``held``'s messages due by ``now``: they go to the back of the
        queue. Returns their ids."""
        expired = held.expire(now)
        if expired:
            pop = self.attempts.pop
            self.requeued.extend((seq_of(mid, id_base), pop(mid, 1)) for mid in expired)
            held.timeout_count += len(expired)
        return expired

    # -- the queue ----------------------------------------------------------------------

    def redelivered(self, msg_id: bytes, attempts: int) -> None:
        """``msg_id`` goes out again as its ``attempts``-th delivery."""
        self.attempts[msg_id] = attempts

    def forget(self, msg_id: bytes) -> None:
        """``msg_id`` was taken and will not be in flight (an ext filter finished it)."""
        self.attempts.pop(msg_id, None)

    def defer(self, seq: int, attempts: int, due_ns: int) -> None:
        """Hold ``seq`` until ``due_ns`` (a DPUB record, or one restored)."""
        heapq.heappush(self.deferred, (due_ns, seq, attempts))

    def release(self, now_ns: int) -> bool:
        """Move the deferred messages due by ``now_ns`` to the requeued queue."""
        deferred = self.deferred
        moved = False
        while deferred and deferred[0][0] <= now_ns:
            _, seq, attempts = heapq.heappop(deferred)
            self.requeued.append((seq, attempts))
            moved = True
        return moved

    def next_due(self) -> int:
        """When the earliest deferred message is due (ns); 0 if none is deferred."""
        return self.deferred[0][0] if self.deferred else 0

    def is_deferred(self, seq: int) -> bool:
        return any(s == seq for _, s, _ in self.deferred)

    def drop_queued(self) -> None:
        """Forget the requeued and deferred messages (in-flight ones stay in flight)."""
        self.requeued.clear()
        self.deferred.clear()

    def drop_below(self, seq: int) -> None:
        """Forget the requeued and deferred messages before ``seq``."""
        if self.requeued:
            self.requeued = deque(e for e in self.requeued if e[0] >= seq)
        if self.deferred:
            self.deferred = [e for e in self.deferred if e[1] >= seq]
            heapq.heapify(self.deferred)

    def clear(self) -> None:
        """Forget everything (the channel was deleted)."""
        self.drop_queued()
        self.attempts.clear()
        for held in self._held:
            held.take_all()

    # -- positions ----------------------------------------------------------------------

    def low_water(self, cursor: int, id_base: int) -> int:
        """The oldest log sequence still to deliver or to finish (``cursor`` if none)."""
        low = cursor
        if self.requeued:
            low = min(low, min(s for s, _ in self.requeued))
        if self.deferred:
            low = min(low, min(s for _, s, _ in self.deferred))
        for held in self._held:
            if len(held):
                low = min(low, min(seq_of(mid, id_base) for mid in held.ids()))
        return low

    def pending(self, id_base: int, to_wall: int) -> array[int]:
        """Every unfinished message as (seq, attempts so far, due wall-clock ns or 0)
        triples, for a checkpoint (see nsqx.store.cursor). ``to_wall`` turns the
        deferred heap's due times into wall-clock ones."""
        out = array("q")
        attempts_of = self.attempts.get
        for held in self._held:
            for mid in held.ids():
                out.extend((seq_of(mid, id_base), attempts_of(mid, 1), 0))
        for seq, attempts in self.requeued:
            out.extend((seq, attempts, 0))
        for due, seq, attempts in self.deferred:
            out.extend((seq, attempts, due + to_wall))
        return out


def _without(ids: list[bytes], missing: list[bytes]) -> list[bytes]:
    """``ids`` less one occurrence of each of ``missing`` (a FIN batch may repeat an id:
    the first one finished it, the second is missing)."""
    left: dict[bytes, int] = {}
    for mid in missing:
        left[mid] = left.get(mid, 0) + 1
    done = []
    for mid in ids:
        n = left.get(mid, 0)
        if n:
            left[mid] = n - 1
        else:
            done.append(mid)
    return done
