"""One node to nsqlookupd: the other workers' topology and the lead's lookupd state.

Only the lead worker (index 0) talks to nsqlookupd (nsqx.nsqd.lookup). Each other worker
opens a link to it and sends, first, everything it hosts (:data:`TOPO_SYNC`: every
partition and its channels), then each of its topology events as it happens
(:data:`TOPO`); the lead registers the union of all workers. Back on the same link the
lead sends what only it learns from nsqlookupd: the lookupds' HTTP addresses and node
timeout, whether leases are required (:data:`NODE_STATE`), and every lease it is
granted (:data:`LEASE`: the answered PING's send time and the lease's length, on
CLOCK_MONOTONIC, which every process of the machine shares). Each worker's
replication manager takes them as the lead's does, so its partition leaders
acknowledge within the node's lease.

A worker whose link to the lead breaks (the lead died and is being restarted) treats
the lease as lapsed at once (no acknowledging without it: the lead may have lost it
meanwhile, and nsqlookupd may have elected another leader), and reopens the link, which
sends its topology again to the new lead.

This side, :class:`LeadLink`, is the other workers'; the lead's side lives in
:class:`nsqx.nsqd.lookup.LookupManager`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.workers.links import Link

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.workers.forwarding import WorkerSet

log = logging.getLogger("nsqx.nsqd")

#: worker -> lead: (TOPO_SYNC, index, Snapshot): everything the worker hosts
TOPO_SYNC: Final = "topo_sync"
#: worker -> lead: (TOPO, index, kind, topic, channel, partition): one TopologyEvent
TOPO: Final = "topo"
#: lead -> worker: (NODE_STATE, NodeState fields...)
NODE_STATE: Final = "node_state"
#: lead -> worker: (LEASE, sent, duration): a PING sent at ``sent`` answered with a lease
LEASE: Final = "lease"

#: the lead worker's index
LEAD: Final = 0
#: how long a worker waits before it reopens a broken link to the lead (seconds)
RELINK_DELAY = 0.1

#: topic -> partition -> its channels
Snapshot = dict[str, dict[int, list[str]]]


class NodeState(NamedTuple):
    """What the lead knows of the node's lookupds, for the other workers."""

    #: ``host:port`` of the connected lookupds' HTTP APIs
    http_addresses: list[str]
    #: the longest node timeout the lookupds announced (seconds)
    node_timeout: float
    #: whether a lookupd announced leases (leaders then acknowledge only within one)
    lease_required: bool


def snapshot(nsqd: NSQD) -> Snapshot:
    """Every partition this process hosts, and its channels."""
    return {
        name: {pid: list(part.channels) for pid, part in topic.partitions.items()}
        for name, topic in nsqd.topics.items()
    }


def event_item(index: int, event: TopologyEvent) -> tuple[Any, ...]:
    return (TOPO, index, event.kind, event.topic, event.channel, event.partition)


def item_event(item: tuple[Any, ...]) -> TopologyEvent:
    _, _, kind, topic, channel, pid = item
    return TopologyEvent(kind, topic, channel, pid)


class LeadLink:
    """A worker's (not the lead's) side: its topology to the lead, the lead's lookupd
    state and leases back."""

    def __init__(
        self,
        nsqd: NSQD,
        workers: WorkerSet,
        on_state: Callable[[NodeState], None],
        on_lease: Callable[[float, float], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.nsqd = nsqd
        self.workers = workers
        self._on_state = on_state
        self._on_lease = on_lease
        self._on_lost = on_lost
        #: the lead's latest word (None: not heard since the link was (re)opened)
        self.state: NodeState | None = None
        self._link: Link | None = None
        self._relink: asyncio.TimerHandle | None = None
        self._closed = False
        workers.handlers[NODE_STATE] = self._node_state
        workers.handlers[LEASE] = self._lease

    def start(self) -> None:
        """Send everything hosted here to the lead, and follow the topology from now."""
        self.nsqd.watchers.append(self._topology)
        self._open()

    def close(self) -> None:
        self._closed = True
        if self._topology in self.nsqd.watchers:
            self.nsqd.watchers.remove(self._topology)
        if self._relink is not None:
            self._relink.cancel()
            self._relink = None

    def _open(self) -> None:
        self._relink = None
        if self._closed:
            return
        link = self.workers.links.link(LEAD)
        if link is self._link:
            return
        self._link = link
        link.on_close.append(self._lost)
        # the snapshot and the events after it go out in order on this link
        link.send((TOPO_SYNC, self.workers.index, snapshot(self.nsqd)))

    def _lost(self, link: Link) -> None:
        if link is not self._link:
            return
        self._link = None
        self.state = None
        if self._closed:
            return
        log.warning("WORKERS: link to the lead worker lost: the lease counts as lapsed")
        self._on_lost()
        self._relink = asyncio.get_running_loop().call_later(RELINK_DELAY, self._open)

    def _topology(self, event: TopologyEvent) -> None:
        link = self._link
        if link is not None:
            # (a link down drops it: the sync that reopens it covers it)
            link.send(event_item(self.workers.index, event))

    def _node_state(self, link: Link, item: tuple[Any, ...]) -> None:
        if link is not self._link:
            return
        state = NodeState(*item[1:])
        self.state = state
        self._on_state(state)

    def _lease(self, link: Link, item: tuple[Any, ...]) -> None:
        if link is not self._link:
            return
        _, sent, duration = item
        self._on_lease(sent, duration)
