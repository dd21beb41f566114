"""RDY state: how a consumer spreads ``max_in_flight`` over its connections.

Plain logic, no I/O: methods take the time as an argument and return the RDY counts
to send, as ``[(key, count), ...]``; the consumer writes them. The rules are those of
NSQ's client guide (and of go-nsq and pynsq):

- a new connection starts at RDY 1 (the final number of connections is not known yet);
- max_in_flight is spread evenly: ``max(1, max_in_flight // connections)``;
- the sum of all RDY counts never exceeds max_in_flight, and no count exceeds the
  connection's ``max_rdy_count`` (2500 unless nsqd said otherwise);
- after messages arrive on a connection, its RDY is sent again when what is left of
  the last count is 0 or below 25% of it, or when the even share has changed;
- when max_in_flight is below the number of connections, a periodic redistribution
  takes RDY back from idle connections and gives RDY 1 to a random subset of the
  others, so that every nsqd is eventually read;
- in backoff all counts go to 0; afterwards a single connection gets RDY 1;
- a connection whose nsqd drains leaves at once, but the messages still in flight on
  it keep their part of max_in_flight (``held``) until they are answered.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: nsqd's max_rdy_count when it does not say (no feature negotiation).
DEFAULT_MAX_RDY_COUNT = 2500
#: is_starved() fires at this share of the last RDY, to anticipate starvation.
STARVED_SHARE = 0.85
#: RDY is sent again when less than this share of the last count is left.
REFRESH_SHARE = 0.25

Decisions = list[tuple[K, int]]


@dataclass(slots=True)
class ConnRdy(Generic[K]):
    """One connection's RDY state as the consumer sees it."""

    key: K
    max_rdy: int
    #: The last RDY count sent (nsqd's limit of messages in flight to us).
    rdy: int = 0
    #: What is left of ``rdy``: it counts down as messages arrive.
    remaining: int = 0
    #: Messages received on this connection and not yet answered.
    in_flight: int = 0
    #: When the last message arrived (0: never).
    last_msg_at: float = 0.0
    #: When RDY last went from 0 to a positive count.
    rdy_since: float = 0.0
    #: Messages received in total.
    received: int = 0


class RdyController(Generic[K]):
    """Keeps every connection's RDY count within the client guide's rules."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.rng = rng or random.Random()
        self.conns: dict[K, ConnRdy[K]] = {}
        #: Sum of every connection's ``rdy``.
        self.total = 0
        #: In backoff (level > 0): at most one message in flight overall.
        self.limited = False
        #: In a backoff timeout: no RDY at all.
        self.paused = False
        #: Set when some connection wanted RDY and got none; the next redistribution acts.
        self.need_redistribute = False
        #: Messages still in flight on connections that left (a draining nsqd's): they
        #: count against the budget until answered (see :meth:`release`).
        self.held = 0

    # -- the even share ---------------------------------------------------------------

    def per_conn(self) -> int:
        """max_in_flight spread evenly, at least 1 (unless max_in_flight is 0)."""
        n = len(self.conns)
        mif = self.max_in_flight
        if n == 0:
            return mif
        return min(max(1, mif // n), mif)

    def _budget(self) -> int:
        if self.paused:
            return 0
        return max((1 if self.limited else self.max_in_flight) - self.held, 0)

    def _set(self, c: ConnRdy[K], count: int, now: float, out: Decisions[K]) -> bool:
        """Set a connection's RDY within every limit. False when it could not be raised."""
        count = min(count, c.max_rdy)
        room = self._budget() - (self.total - c.rdy)
        wanted = count
        if count > room:
            count = max(room, 0)
        if count <= c.rdy and wanted > c.rdy:
            # It wanted more and cannot have it: nothing changes (never lower a count
            # because the budget is used elsewhere; the redistribution sorts that out).
            if c.rdy == 0:
                self.need_redistribute = True
            return False
        if c.rdy == 0 and count > 0:
            c.rdy_since = now
        self.total += count - c.rdy
        c.rdy = count
        c.remaining = count
        out.append((c.key, count))
        return True

    # -- connections come and go ------------------------------------------------------

    def add(self, key: K, max_rdy: int, now: float) -> Decisions[K]:
        """A subscribed connection: lower the others to the new share, then RDY 1."""
        out: Decisions[K] = []
        if key in self.conns:
            raise KeyError(f"connection {key!r} is already known")
        c = ConnRdy(key, max(0, max_rdy))
        self.conns[key] = c
        if not (self.paused or self.limited):
            share = self.per_conn()
            for other in self.conns.values():
                if other.rdy > share:
                    self._set(other, share, now, out)
        if not self.paused:
            self._set(c, 1, now, out)
        return out

    def remove(self, key: K, now: float, hold: int = 0) -> Decisions[K]:
        """A connection closed, or its nsqd drains: its RDY returns to the budget and
        busy ones may grow. ``hold``: messages still in flight on it, whose part of the
        budget comes back only as :meth:`release` says they were answered."""
        c = self.conns.pop(key, None)
        out: Decisions[K] = []
        if c is None:
            return out
        self.total -= c.rdy
        c.rdy = 0
        self.held += max(hold, 0)
        self._grow(now, out)
        return out

    def release(self, n: int, now: float) -> Decisions[K]:
        """``n`` messages held by a connection that left were answered (or are gone
        with it): their part of the budget comes back. The others grow when nothing
        is held any more (until then, as their messages arrive: :meth:`maybe_update`)."""
        out: Decisions[K] = []
        if n <= 0 or not self.held:
            return out
        self.held = max(self.held - n, 0)
        if not self.held:
            self._grow(now, out)
        return out

    def _grow(self, now: float, out: Decisions[K]) -> None:
        if not (self.paused or self.limited):
            share = self.per_conn()
            for other in self.conns.values():
                # only connections that already proved they have messages grow at once
                if 0 < other.rdy < share and other.received:
                    self._set(other, share, now, out)

    # -- messages ---------------------------------------------------------------------

    def received(self, key: K, n: int, now: float) -> None:
        """``n`` messages arrived on a connection."""
        c = self.conns.get(key)
        if c is not None:
            c.remaining -= n
            c.in_flight += n
            c.received += n
            c.last_msg_at = now

    def answered(self, key: K, n: int = 1) -> None:
        """``n`` messages of a connection were finished or requeued."""
        c = self.conns.get(key)
        if c is not None:
            c.in_flight = max(0, c.in_flight - n)

    def maybe_update(self, key: K, now: float) -> int | None:
        """After messages on a connection: the RDY to send, if it is time to send one."""
        if self.paused or self.limited:
            return None
        c = self.conns.get(key)
        if c is None:
            return None
        share = min(self.per_conn(), c.max_rdy)
        if c.rdy == share and c.remaining > 0 and c.remaining >= c.rdy * REFRESH_SHARE:
            return None
        out: Decisions[K] = []
        if c.rdy == share:
            # same count again: nsqd's window is unchanged, our count-down restarts
            c.remaining = c.rdy
            return c.rdy if c.rdy else None
        self._set(c, share, now, out)
        return out[0][1] if out else None

    # -- rotation when RDY is scarce ---------------------------------------------------

    def redistribute(self, now: float) -> Decisions[K]:
        """Periodic: take RDY from idle connections and hand RDY 1 to random others.

        Acts when max_in_flight is below the number of connections, when in backoff
        with several connections, or when a connection was refused RDY earlier.
        """
        out: Decisions[K] = []
        if self.paused or not self.conns:
            return out
        if len(self.conns) > self.max_in_flight:
            self.need_redistribute = True
        if self.limited and len(self.conns) > 1:
            self.need_redistribute = True
        if not self.need_redistribute:
            return out
        self.need_redistribute = False
        # When RDY is scarce, holding it too long is unfair to the other nsqd as well.
        scarce = self.limited or len(self.conns) > self.max_in_flight
        for c in self.conns.values():
            if c.rdy <= 0:
                continue
            idle = now - max(c.last_msg_at, c.rdy_since)
            if idle > self.low_rdy_idle_timeout or (
                scarce and now - c.rdy_since > self.low_rdy_timeout
            ):
                self._set(c, 0, now, out)
        available = self._budget() - self.total
        candidates = [c for c in self.conns.values() if c.rdy == 0 and c.in_flight == 0]
        while candidates and available > 0:
            c = candidates.pop(self.rng.randrange(len(candidates)))
            if self._set(c, 1, now, out):
                available -= 1
        return out

    def set_max_in_flight(self, max_in_flight: int, now: float) -> Decisions[K]:
        """Change max_in_flight: lower or raise every connection to the new share."""
        self.max_in_flight = max_in_flight
        out: Decisions[K] = []
        if self.paused or self.limited:
            if self.total > max_in_flight:
                for c in self.conns.values():
                    if c.rdy:
                        self._set(c, 0, now, out)
            return out
        share = self.per_conn()
        for c in self.conns.values():
            if c.rdy > share:
                self._set(c, share, now, out)
        budget = self._budget()
        # fewer in flight than connections: some give their RDY back (the idlest
        # first), redistribution moves it around later
        for c in sorted(self.conns.values(), key=lambda c: c.received):
            excess = self.total - budget
            if excess <= 0:
                break
            if c.rdy:
                self._set(c, max(c.rdy - excess, 0), now, out)
                self.need_redistribute = True
        for c in self.conns.values():
            # connections that never had a message start at 1, as new ones do; never
            # past the budget (more connections than max_in_flight: the rest get RDY by
            # redistribution)
            target = share if c.received else min(1, share)
            target = min(target, c.rdy + max(budget - self.total, 0))
            if c.rdy < target:
                self._set(c, target, now, out)
        if len(self.conns) > max_in_flight:
            self.need_redistribute = True
        return out

    # -- backoff ----------------------------------------------------------------------

    def pause(self, now: float) -> Decisions[K]:
        """Backoff starts (or continues): RDY 0 everywhere."""
        self.paused = True
        self.limited = True
        out: Decisions[K] = []
        for c in self.conns.values():
            if c.rdy:
                self._set(c, 0, now, out)
        return out

    def test_waters(self, now: float) -> Decisions[K]:
        """Backoff window over: RDY 1 on one random connection, 0 on the others."""
        self.paused = False
        self.limited = True
        out: Decisions[K] = []
        if self.total > 1:
            for c in self.conns.values():
                if c.rdy:
                    self._set(c, 0, now, out)
        if self.total >= 1 or not self.conns:
            return out
        keys = list(self.conns)
        c = self.conns[keys[self.rng.randrange(len(keys))]]
        self._set(c, 1, now, out)
        return out

    def resume(self, now: float) -> Decisions[K]:
        """Backoff is over: every connection gets its full share again."""
        self.paused = False
        self.limited = False
        out: Decisions[K] = []
        share = self.per_conn()
        for c in self.conns.values():
            if c.rdy > share:
                self._set(c, share, now, out)
        for c in self.conns.values():
            if c.rdy < share:
                self._set(c, share, now, out)
        if len(self.conns) > self.max_in_flight:
            self.need_redistribute = True
        return out

    # -- questions --------------------------------------------------------------------

    def is_starved(self) -> bool:
        """True when some connection has (nearly) as many messages in flight as its RDY.

        Batching handlers use it to know when to process a batch: waiting for more
        would wait for messages nsqd will not send.
        """
        for c in self.conns.values():
            if c.in_flight > 0 and c.in_flight >= c.rdy * STARVED_SHARE:
                return True
        return False

    def in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        total = sum(c.rdy for c in self.conns.values())
        assert total == self.total, f"total {self.total} != sum of counts {total}"
        assert self.total <= max(self._budget(), 0) or self.total == 0, (
            f"total RDY {self.total} > budget {self._budget()}"
        )
        for c in self.conns.values():
            assert 0 <= c.rdy <= c.max_rdy, f"{c.key}: RDY {c.rdy} outside 0..{c.max_rdy}"
