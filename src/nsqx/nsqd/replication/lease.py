"""NodeLease: how long this node's partition leaders may acknowledge writes.

Each partition-aware nsqlookupd that grants leases answers this node's PINGs with OK; an
answered PING extends the lease to ``lease`` seconds after the PING was *sent* (this
node's monotonic clock). nsqlookupd judges the node lost no earlier than the lease plus
a margin after it *heard* the PING, which is later (nsqx.lookupd.liveness), so while the
lease runs no other node can have been elected in this node's place.

A lease that ran out and is granted again starts a new *generation*: a leadership is
confirmed for one generation (``/cluster/node/roles``), because while the lease was out
the coordinator may have elected another leader and told this node nothing yet.

Sans-IO: times are passed in, so tests drive it without clocks or sockets.
"""

from __future__ import annotations


class NodeLease:
    """The lease granted by answered PINGs, and its generations."""

    def __init__(self) -> None:
        #: monotonic time until which acknowledgements are allowed (0: never granted)
        self.until = 0.0
        #: bumped each time a lease starts after none was held (0: none ever)
        self.generation = 0
        #: True once any nsqlookupd announced leases: from then on leaders need one
        #: (with none, as with an nsqlookupd older than leases, leadership is confirmed
        #: by the coordinator's word alone, as before)
        self.required = False

    def grant(self, sent: float, duration: float) -> bool:
        """A PING sent at ``sent`` was answered with a lease of ``duration`` seconds;
        True if this starts a new generation (no lease was held when it was sent)."""
        end = sent + duration
        new = sent >= self.until
        if new:
            self.generation += 1
        if end > self.until:
            self.until = end
        return new

    def lapse(self) -> None:
        """Hold no lease from now on: the next grant starts a new generation (a worker
        that cannot hear its node's lead worker, which holds the lease for it)."""
        self.until = 0.0

    def valid(self, now: float) -> bool:
        """Whether a leader may acknowledge at ``now``."""
        return now < self.until

    def remaining(self, now: float) -> float:
        return max(self.until - now, 0.0)
