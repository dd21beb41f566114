"""Coordinator: nsqlookupd's administration of partitioned topics.

A single nsqlookupd is always the coordinator (Youzan's "lookupd leader"). It keeps
each partitioned topic's :class:`~nsqx.lookupd.topic_record.TopicRecord` in a
:class:`~nsqx.lookupd.meta_store.MetaStore`, places partitions on the registered
partition-aware nsqd nodes (:mod:`nsqx.lookupd.placement`), and creates them there
through the nsqd's HTTP API (:class:`~nsqx.lookupd.nsqd_client.NsqdClient`). When
several nsqlookupd share an etcd store, only the one that leads
(:mod:`nsqx.lookupd.leadership`) administers; the others follow the store
(:meth:`Coordinator.record_changed`) and serve lookups.

Reconciliation: a node is expected to register (``REGISTER t p [c]``) every partition
placed on it, and every channel created through lookupd on those partitions. A node
that (re)connects and, after a short grace, has not registered one of them on this
connection is asked to create it (nsqd ``/topic/create`` or ``/channel/create``),
again and again with a doubling delay until it does. So a node that was unreachable
at create time, or that lost its data, gets its partitions back. Something a node
registered and then unregistered on the same connection was deleted on purpose (nsqd's
own API) and is left alone.

Errors carry Youzan's status codes and texts where Youzan has them, so that tools
written for its lookupd read them the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

from nsqx.lookupd.liveness import Timing
from nsqx.lookupd.meta_store import MemoryMetaStore, MetaStore
from nsqx.lookupd.node_sessions import NodeSessions
from nsqx.lookupd.nsqd_client import NsqdCallError, NsqdClient
from nsqx.lookupd.placement import NoNodeAvailable, enough_nodes, place_partitions
from nsqx.lookupd.registration_db import (
    CHANNEL,
    CLIENT,
    TOPIC,
    Peer,
    Registration,
    RegistrationDB,
)
from nsqx.lookupd.replicas import Replicas
from nsqx.lookupd.topic_record import MAX_RETENTION_DAYS, MAX_SYNC_EVERY, TopicRecord
from nsqx.wire.topic_meta import MAX_PARTITION_NUM, TopicMeta

log = logging.getLogger("nsqx.lookupd")

# Youzan's error texts (consistence/), for the same situations.
#: ErrNodeUnavailable as its CoordErr prints it.
ERR_NODE_UNAVAILABLE = "ErrType:9 ErrCode:1 : No node is available for topic"
ERR_ALREADY_EXIST = "already exist"
ERR_TOPIC_NOT_CREATED = "topic is not created"
ERR_KEY_NOT_FOUND = "Key not found"
ERR_MAX_PARTITION = "max partition allowed exceed"
ERR_PARTITION_REDUCED = "the partition number can not be reduced"
ERR_MAX_RETENTION = "max retention days allowed exceed"
ERR_MAX_SYNC_EVERY = "max sync every allowed exceed"


class CoordinatorError(Exception):
    """An administrative request refused: HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


#: What a node should have: (topic, partition, channel), channel None for the partition.
Item = tuple[str, int, str | None]


@dataclass
class _Attempt:
    """Asking one node connection for one item: when next, and the delay after that."""

    next_at: float
    delay: float
    in_flight: bool = False
    asked: int = 0


class Coordinator:
    """Topic records, placement, and the calls that make nodes match them."""

    #: Seconds a (re)connected node has to register what it holds before it is asked.
    register_grace = 1.0
    #: First and longest delay between two asks for the same missing item.
    retry_min = 0.5
    retry_max = 30.0
    #: At most this many nsqd calls at once.
    max_concurrent_calls = 16

    def __init__(
        self,
        db: RegistrationDB,
        client: NsqdClient,
        inactive_producer_timeout: float,
        timing: Timing | None = None,
    ) -> None:
        self.db = db
        #: heartbeats, leases and the node timeout (nsqx.lookupd.liveness)
        self.timing = timing or Timing(2.0)
        #: With several nsqlookupd over etcd: the loop time until which this
        #: nsqlookupd's etcd session (which carries its node session keys) surely lasts;
        #: None for a single nsqlookupd, which can always grant a lease.
        self.session_deadline: Callable[[], float] | None = None
        #: With several nsqlookupd over etcd: whether this one's leadership surely
        #: holds now (None for a single nsqlookupd)
        self.leadership_valid: Callable[[], bool] | None = None
        #: Set by :meth:`start`; an empty in-memory store until then.
        self.store: MetaStore = MemoryMetaStore()
        self.client = client
        self.inactive_producer_timeout = inactive_producer_timeout
        #: topic -> record: the store's content, read at start and kept in step.
        self.records: dict[str, TopicRecord] = {}
        # administrative changes one at a time (each reads, decides, writes)
        self._admin = asyncio.Lock()
        self._calls = asyncio.Semaphore(self.max_concurrent_calls)
        # per connection (peer id): what it registered since it connected, when it
        # identified (loop time), and the asks for what it still lacks
        self._seen: dict[str, set[Item]] = {}
        self._identified_at: dict[str, float] = {}
        self._attempts: dict[tuple[str, str, int, str | None], _Attempt] = {}
        self._tasks: dict[tuple[str, str, int, str | None], asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._background: set[asyncio.Future[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        #: leaders, ISRs, epochs and elections of replicated topics
        self.replicas = Replicas(self)
        #: which nodes are alive: this nsqlookupd's connections, and with etcd every
        #: nsqlookupd's (set before :meth:`start`)
        self.sessions: NodeSessions = NodeSessions()
        #: True while this nsqlookupd administers the topics: always for a single one;
        #: for one of several sharing a store, while it holds the leadership.
        self.leading = False

    # -- life -------------------------------------------------------------------------

    async def start(self, store: MetaStore, *, leading: bool = True) -> None:
        """Take the store. A single nsqlookupd (``leading``) starts administering at once;
        one of several waits for :meth:`start_leading` and meanwhile follows the store's
        changes (:meth:`record_changed`)."""
        self.store = store
        self.sessions.on_ended(self.replicas.session_ended)
        if leading:
            await self.start_leading()

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        tasks = [
            t for t in (self._loop_task, *self._tasks.values(), *self._background) if t is not None
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.replicas.close()
        await self.sessions.close()
        await self.client.close()
        await self.store.close()

    # -- leadership (several nsqlookupd sharing a store) -------------------------------

    async def start_leading(self) -> None:
        """Start administering: load the records fresh from the store, list them in the
        registry, start reconciling."""
        records = await self.store.list()
        self.records = records
        for topic, record in records.items():
            self.db.add_registration(Registration(TOPIC, topic, ""))
            for channel in record.channels:
                self.db.add_registration(Registration(CHANNEL, topic, channel))
        if records:
            log.info("META: %d partitioned topic(s) loaded", len(records))
        self.leading = True
        self.replicas.start_leading()
        if self._loop_task is None and not self._closed:
            self._loop_task = asyncio.create_task(self._reconcile_loop(), name="lookupd-reconcile")

    async def stop_leading(self) -> None:
        """Stop administering at once: no more reconciliation or asks. Asks in flight
        finish (each is one idempotent nsqd call); the records stay, and follow the
        store."""
        self.leading = False
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for key in [k for k, a in self._attempts.items() if not a.in_flight]:
            del self._attempts[key]

    def record_changed(self, topic: str, record: TopicRecord | None) -> None:
        """The store's hook: another nsqlookupd changed ``topic``'s record (None: deleted).
        The registry follows, as it does on the nsqlookupd that made the change."""
        old = self.records.get(topic)
        if record is None:
            if old is not None:
                del self.records[topic]
                self._remove_keys(topic)
        else:
            self.records[topic] = record
            self.db.add_registration(Registration(TOPIC, topic, ""))
            for channel in record.channels:
                self.db.add_registration(Registration(CHANNEL, topic, channel))
            for channel in old.channels if old is not None else ():
                if channel not in record.channels:
                    self.db.remove_registration(Registration(CHANNEL, topic, channel))
        self._wake.set()

    # -- views ------------------------------------------------------------------------

    def record(self, topic: str) -> TopicRecord | None:
        """The topic's record, if it was created through lookupd."""
        return self.records.get(topic)

    def can_grant_lease(self, node_id: str) -> bool:
        """Whether a PING answered now may extend a node's lease: always for a single
        nsqlookupd; with etcd, only while this nsqlookupd's session (and so the node
        sessions it holds) surely outlasts the lease, and once the node's session key
        is in etcd under it, so that no other nsqlookupd can judge the node lost while
        the lease runs."""
        deadline = self.session_deadline
        if deadline is None:
            return True
        if asyncio.get_running_loop().time() + self.timing.lease >= deadline():
            return False
        return self.sessions.published(node_id)

    def may_decide(self) -> bool:
        """Whether this nsqlookupd's word counts now: it leads, and (several over
        etcd) its leadership's lease surely holds (an nsqlookupd waking from a stall
        may not have stepped down yet)."""
        if not self.leading:
            return False
        return self.leadership_valid is None or self.leadership_valid()

    def alive(self, node_id: str) -> bool:
        """Whether the node is alive: connected here and not silent, or (several
        nsqlookupd over etcd) holding a session with another nsqlookupd."""
        return node_id in self.nodes() or bool(self.sessions.holders(node_id))

    def nodes(self) -> dict[str, Peer]:
        """Placement targets (:func:`is_placement_target`) that are connected, active
        and not silent past the node timeout, by node id."""
        now = time.time_ns()
        timeout = int(self.inactive_producer_timeout * 1e9)
        nodes: dict[str, Peer] = {}
        for p in self.db.find_producers(CLIENT, "", ""):
            peer = p.peer
            if peer.lost or not is_placement_target(peer) or now - peer.last_update > timeout:
                continue
            old = nodes.get(peer.node_id)
            # a node that reconnected before its old connection was closed: the newest
            if old is None or peer.last_update >= old.last_update:
                nodes[peer.node_id] = peer
        return nodes

    # -- the interface of Replicas -----------------------------------------------------

    @property
    def admin_lock(self) -> asyncio.Lock:
        """Held by every administrative change (each reads, decides and writes)."""
        return self._admin

    async def save(self, topic: str, record: TopicRecord) -> None:
        """Store a topic's new record (it becomes the current one)."""
        await self._save(topic, record)

    def load(self) -> Counter[str]:
        """Replicas held per node id, over every record."""
        return self._load()

    def holds(self, peer: Peer, topic: str, partition: int) -> bool:
        """Whether the node registered the partition on its current connection."""
        return (topic, partition, None) in self._seen.get(peer.id, ())

    def ask_to_create(self, peer: Peer, topic: str, partition: int, record: TopicRecord) -> None:
        """Ask the node to create the partition now (in the background)."""
        task = asyncio.ensure_future(self._ask(peer, topic, partition, None, record))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def pending_asks(self) -> int:
        """How many (node, partition or channel) items are still to be registered."""
        return len(self._attempts)

    def _load(self) -> Counter[str]:
        return Counter(
            n for r in self.records.values() for held in r.placements.values() for n in held
        )

    # -- events from the TCP protocol -------------------------------------------------

    def peer_identified(self, peer: Peer) -> None:
        """A connection identified; if partition-aware, it may need asking later."""
        if peer.speaks_partitions:
            self.sessions.opened(peer)
            self._seen[peer.id] = set()
            self._identified_at[peer.id] = asyncio.get_running_loop().time()
            self._wake.set()
            self.replicas.peer_arrived(peer)

    def peer_registered(self, peer: Peer, topic: str, partition: int, channel: str | None) -> None:
        """The connection registered a partition (or a channel on it)."""
        seen = self._seen.get(peer.id)
        if seen is None:
            return
        seen.add((topic, partition, None))
        if channel is not None:
            seen.add((topic, partition, channel))
        self.replicas.registered(peer, topic, partition)

    def peer_gone(self, peer: Peer) -> None:
        """The connection closed: forget what it registered and its pending asks; a
        node that does not come back loses its leaderships (replicated topics)."""
        if peer.speaks_partitions:
            # its session (for other nsqlookupd) ends once any lease it holds has ended
            self.sessions.closed(peer, self.timing.lost_after(peer.last_heard))
        self.replicas.peer_gone(peer)
        self._seen.pop(peer.id, None)
        self._identified_at.pop(peer.id, None)
        for key in [k for k in self._attempts if k[0] == peer.id]:
            if not self._attempts[key].in_flight:
                del self._attempts[key]
        self._wake.set()

    # -- administration ---------------------------------------------------------------

    async def create_topic(self, topic: str, meta: TopicMeta) -> None:
        """Youzan's CreateTopic: store the meta, place the partitions, create them.

        Creating an existing topic with the same meta places what is not placed yet
        and asks again for what is missing; with another meta it is refused.
        """
        async with self._admin:
            if meta.partition_num > MAX_PARTITION_NUM:
                raise CoordinatorError(400, ERR_MAX_PARTITION)
            nodes = self.nodes()
            if not enough_nodes(meta, len(nodes)):
                log.info("META: %d node(s) cannot hold topic %s: %s", len(nodes), topic, meta)
                raise CoordinatorError(400, ERR_NODE_UNAVAILABLE)
            if meta.sync_every > MAX_SYNC_EVERY:
                meta = replace(meta, sync_every=MAX_SYNC_EVERY)
            old = self.records.get(topic)
            if old is not None and old.meta != meta:
                raise CoordinatorError(400, ERR_ALREADY_EXIST)
            record = old or TopicRecord(meta, self._adopted(topic, meta))
            record = self._place(topic, record, record.unplaced(), nodes)
            await self._save(topic, record)
            log.info("META: topic %s created: %s, placement %s", topic, meta, record.placements)
            await self._apply(topic, record, nodes)
            await self.replicas.tell_all(topic, record)

    async def expand_topic(self, topic: str, partition_num: int) -> None:
        """Youzan's ExpandTopicPartition: more partitions, placed as at create time."""
        async with self._admin:
            if partition_num > MAX_PARTITION_NUM:
                raise CoordinatorError(500, ERR_MAX_PARTITION)
            old = self.records.get(topic)
            if old is None:
                raise CoordinatorError(500, ERR_TOPIC_NOT_CREATED)
            if partition_num < old.meta.partition_num:
                raise CoordinatorError(500, ERR_PARTITION_REDUCED)
            meta = replace(old.meta, partition_num=partition_num)
            nodes = self.nodes()
            if not enough_nodes(meta, len(nodes)):
                raise CoordinatorError(500, ERR_NODE_UNAVAILABLE)
            record = self._place(topic, replace(old, meta=meta), meta_unplaced(old, meta), nodes)
            await self._save(topic, record)
            log.info(
                "META: topic %s expanded to %d partitions: %s",
                topic,
                partition_num,
                record.placements,
            )
            # every partition: the new ones are created, the old ones learn partition_num
            await self._apply(topic, record, nodes)
            await self.replicas.tell_all(topic, record)

    async def update_topic(
        self,
        topic: str,
        *,
        replica: int | None = None,
        sync_every: int | None = None,
        retention_days: int | None = None,
        upgrade_ext: bool = False,
        disable_channel_auto_create: bool | None = None,
        replication_ack: str | None = None,
    ) -> None:
        """Youzan's ChangeTopicMetaParam: change settings, tell every partition's node."""
        async with self._admin:
            if retention_days is not None and retention_days > MAX_RETENTION_DAYS:
                raise CoordinatorError(400, ERR_MAX_RETENTION)
            if sync_every is not None and sync_every > MAX_SYNC_EVERY:
                raise CoordinatorError(400, ERR_MAX_SYNC_EVERY)
            old = self.records.get(topic)
            if old is None:
                raise CoordinatorError(400, ERR_TOPIC_NOT_CREATED)
            meta = old.meta
            if sync_every is not None:
                meta = replace(meta, sync_every=sync_every)
            if retention_days is not None:
                meta = replace(meta, retention_days=retention_days)
            if replica is not None:
                meta = replace(meta, replica=replica)
            # ext can be turned on, never off (messages already carry headers)
            if upgrade_ext:
                meta = replace(meta, ext=True)
            if disable_channel_auto_create is not None:
                meta = replace(meta, disable_channel_auto_create=disable_channel_auto_create)
            if replication_ack is not None:
                meta = replace(meta, replication_ack=replication_ack)
            nodes = self.nodes()
            if not enough_nodes(meta, len(nodes)):
                raise CoordinatorError(400, ERR_NODE_UNAVAILABLE)
            record = replace(old, meta=meta)
            await self._save(topic, record)
            log.info("META: topic %s updated: %s", topic, meta)
            await self._apply(topic, record, nodes)

    async def delete_topic(self, topic: str, partition: int | None) -> None:
        """Youzan's DeleteTopic: ``partition`` None is ``**`` (the whole topic).

        Deletes the partitions on the nodes that hold or registered them, then forgets
        them here. A node that is down keeps its data and registers it again when it
        comes back (delete once more then).
        """
        async with self._admin:
            record = self.records.get(topic)
            key = Registration(TOPIC, topic, "")
            registered = [
                (p.peer, p.partition)
                for p in self.db.partition_producers(key)
                if partition is None or p.partition == partition
            ]
            placed = record is not None and (partition is None or partition in record.placements)
            if not placed and not registered:
                raise CoordinatorError(500, ERR_KEY_NOT_FOUND)
            targets: dict[tuple[str, int], Peer] = {}
            nodes = self.nodes()
            if record is not None:
                for pid, held in record.placements.items():
                    if partition is None or pid == partition:
                        for node_id in held:
                            if node_id in nodes:
                                targets[(node_id, pid)] = nodes[node_id]
            for peer, pid in registered:
                targets.setdefault((peer.node_id, pid), peer)
            # forget first, then let asks in flight finish: none can start after this
            if record is not None:
                if partition is None:
                    await self._forget(topic)
                else:
                    placements = {p: n for p, n in record.placements.items() if p != partition}
                    await self._save(topic, record.with_placements(placements))
            await self._settle(topic)
            log.info(
                "META: deleting topic %s partition %s on %d node(s)",
                topic,
                "**" if partition is None else partition,
                len(targets),
            )
            await self._gather(
                self._call(
                    self.client.delete_partition(peer.info, topic, pid),
                    f"delete {topic}:{pid} on {node_id}",
                )
                for (node_id, pid), peer in targets.items()
            )
            if partition is None:
                self._remove_keys(topic)
            else:
                for k in [key, *self.db.find_registrations(CHANNEL, topic, "*")]:
                    for p in self.db.partition_producers(k):
                        if p.partition == partition:
                            self.db.remove_producer(k, p.peer.id, partition)

    async def forget_topic(self, topic: str) -> None:
        """NSQ 1.3's lookupd ``/topic/delete`` on a partitioned topic: forget its record
        too (nodes are not called, as NSQ's lookupd calls none)."""
        async with self._admin:
            if topic in self.records:
                await self._forget(topic)
                await self._settle(topic)

    async def create_channel(self, topic: str, channel: str) -> bool:
        """Create a channel on every partition of a partitioned topic; False if the
        topic has no record (NSQ's /channel/create applies then).

        On a disable_channel_auto_create topic this registers the channel as Youzan's
        lookupd does (refused if it is registered already); on other partitioned topics
        it is idempotent.
        """
        async with self._admin:
            record = self.records.get(topic)
            if record is None:
                return False
            if channel in record.channels:
                if record.meta.disable_channel_auto_create:
                    raise CoordinatorError(400, f"channel {channel} already registered")
            else:
                record = replace(record, channels=(*record.channels, channel))
                await self._save(topic, record)
            self.db.add_registration(Registration(CHANNEL, topic, channel))
            self.db.add_registration(Registration(TOPIC, topic, ""))
            nodes = self.nodes()
            await self._gather(
                self._ask(peer, topic, pid, channel, record)
                for pid, held in record.placements.items()
                for node_id in held
                if (peer := nodes.get(node_id)) is not None
            )
            return True

    async def delete_channel(self, topic: str, channel: str) -> bool:
        """Delete a lookupd-created channel of a partitioned topic on every partition;
        False if the topic has no record (NSQ's /channel/delete applies then)."""
        async with self._admin:
            record = self.records.get(topic)
            if record is None:
                return False
            if channel not in record.channels:
                if record.meta.disable_channel_auto_create:
                    raise CoordinatorError(400, f"channel {channel} not registered")
                if not self.db.find_registrations(CHANNEL, topic, channel):
                    raise CoordinatorError(404, "CHANNEL_NOT_FOUND")
            else:
                channels = tuple(c for c in record.channels if c != channel)
                record = replace(record, channels=channels)
                await self._save(topic, record)
                # a create of this channel in flight must land before the delete
                await self._settle(topic)
            self.db.remove_registration(Registration(CHANNEL, topic, channel))
            nodes = self.nodes()
            await self._gather(
                self._call(
                    self.client.delete_channel(peer.info, topic, channel, pid),
                    f"delete channel {topic}:{pid}/{channel} on {node_id}",
                )
                for pid, held in record.placements.items()
                for node_id in held
                if (peer := nodes.get(node_id)) is not None
            )
            return True

    # -- helpers ----------------------------------------------------------------------

    def _place(
        self, topic: str, record: TopicRecord, partitions: list[int], nodes: dict[str, Peer]
    ) -> TopicRecord:
        if not partitions:
            return record
        try:
            new = place_partitions(
                partitions,
                replica=record.meta.replica,
                allow_multi=record.meta.allow_multi,
                nodes=list(nodes),
                existing=record.placements,
                load=self._load(),
            )
        except NoNodeAvailable as err:
            log.info("META: cannot place topic %s: %s", topic, err)
            raise CoordinatorError(400, ERR_NODE_UNAVAILABLE) from None
        record = record.with_placements({**record.placements, **new})
        if record.meta.replica > 1:
            record = record.with_first_epochs(sorted(new), "placed")
        return record

    def _adopted(self, topic: str, meta: TopicMeta) -> dict[int, tuple[str, ...]]:
        """Partitions of a topic made directly on nsqx nodes (before it had a record):
        they stay where they are, rather than get a second copy elsewhere."""
        placements: dict[int, tuple[str, ...]] = {}
        for p in self.db.partition_producers(Registration(TOPIC, topic, "")):
            if p.partition < meta.partition_num and is_placement_target(p.peer):
                placements.setdefault(p.partition, (p.peer.node_id,))
        return placements

    async def _save(self, topic: str, record: TopicRecord) -> None:
        await self.store.put(topic, record)
        self.records[topic] = record
        self.db.add_registration(Registration(TOPIC, topic, ""))

    async def _forget(self, topic: str) -> None:
        await self.store.delete(topic)
        self.records.pop(topic, None)
        self._wake.set()

    def _remove_keys(self, topic: str) -> None:
        for key in self.db.find_registrations(CHANNEL, topic, "*"):
            self.db.remove_registration(key)
        self.db.remove_registration(Registration(TOPIC, topic, ""))

    async def _settle(self, topic: str) -> None:
        """Wait for the asks in flight for ``topic``, so that none lands after a delete."""
        pending = [t for k, t in self._tasks.items() if k[1] == topic]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _apply(self, topic: str, record: TopicRecord, nodes: dict[str, Peer]) -> None:
        """Create (or update) every placed partition on its connected nodes, now."""
        await self._gather(
            self._ask(peer, topic, pid, None, record)
            for pid, held in record.placements.items()
            for node_id in held
            if (peer := nodes.get(node_id)) is not None
        )

    async def _gather(self, calls: Iterable[Awaitable[object]]) -> None:
        await asyncio.gather(*calls)

    async def _call(self, call: Awaitable[None], what: str, quiet: bool = False) -> bool:
        async with self._calls:
            try:
                await call
            except NsqdCallError as err:
                log.log(
                    logging.DEBUG if quiet else logging.WARNING, "NSQD: %s failed: %s", what, err
                )
                return False
        return True

    async def _ask(
        self, peer: Peer, topic: str, partition: int, channel: str | None, record: TopicRecord
    ) -> None:
        """Ask one node for one item now; a failure is retried by reconciliation."""
        key = (peer.id, topic, partition, channel)
        running = self._tasks.get(key)
        if running is not None:
            # an ask with an older record may be in flight: let it finish, then ask
            # with this one, so the node ends with the newest settings
            await asyncio.gather(asyncio.shield(running), return_exceptions=True)
        attempt = self._attempts.get(key)
        if attempt is None:
            loop = asyncio.get_running_loop()
            attempt = self._attempts[key] = _Attempt(loop.time(), self.retry_min)
        await asyncio.shield(self._start_ask(peer, key, attempt, record))

    def _start_ask(
        self,
        peer: Peer,
        key: tuple[str, str, int, str | None],
        attempt: _Attempt,
        record: TopicRecord,
    ) -> asyncio.Task[None]:
        attempt.in_flight = True
        task = asyncio.create_task(
            self._run_ask(peer, key, attempt, record), name=f"lookupd-ask {key}"
        )
        self._tasks[key] = task
        return task

    async def _run_ask(
        self,
        peer: Peer,
        key: tuple[str, str, int, str | None],
        attempt: _Attempt,
        record: TopicRecord,
    ) -> None:
        _, topic, partition, channel = key
        attempt.asked += 1
        info = peer.info
        name = f"{topic}:{partition}" + (f"/{channel}" if channel else "")
        what = f"create {name} on {peer.node_id} (ask #{attempt.asked})"
        # a node that stays unreachable would fill the log: the first asks and every
        # tenth are warnings, the others debug lines
        quiet = attempt.asked > 3 and attempt.asked % 10 != 0
        try:
            if channel is not None:
                ok = await self._call(
                    self.client.create_channel(info, topic, channel, partition), what, quiet
                )
            else:
                ok = await self._call(
                    self.client.create_partition(info, topic, partition, record.meta),
                    what,
                    quiet,
                )
                if ok:
                    self.replicas.created(peer, topic, partition, record)
                # a new or re-created partition also gets the channels made through lookupd
                channels = record.channels if ok else ()
                for ch in channels:
                    done = await self._call(
                        self.client.create_channel(info, topic, ch, partition),
                        f"create {topic}:{partition}/{ch} on {peer.node_id}",
                    )
                    ok = ok and done
            if ok:
                log.info("NSQD: %s OK", what)
        finally:
            loop = asyncio.get_running_loop()
            attempt.in_flight = False
            attempt.next_at = loop.time() + attempt.delay
            attempt.delay = min(attempt.delay * 2, self.retry_max)
            if self._tasks.get(key) is asyncio.current_task():
                del self._tasks[key]
            self._wake.set()

    # -- reconciliation ---------------------------------------------------------------

    def _wanted(self) -> dict[tuple[str, str, int, str | None], Peer]:
        """What connected nodes lack: placed items they have not registered since they
        connected, keyed as the attempts are. A missing partition stands for its
        channels too (asking for it creates them)."""
        wanted: dict[tuple[str, str, int, str | None], Peer] = {}
        nodes = self.nodes()
        for topic, record in self.records.items():
            for pid, held in record.placements.items():
                for node_id in held:
                    peer = nodes.get(node_id)
                    seen = self._seen.get(peer.id) if peer is not None else None
                    if peer is None or seen is None:
                        continue
                    if (topic, pid, None) not in seen:
                        wanted[(peer.id, topic, pid, None)] = peer
                        continue
                    for channel in record.channels:
                        if (topic, pid, channel) not in seen:
                            wanted[(peer.id, topic, pid, channel)] = peer
        return wanted

    def reconcile(self) -> float | None:
        """Start the asks that are due; returns the loop time of the next one, if any."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        wanted = self._wanted()
        for key in [k for k, a in self._attempts.items() if k not in wanted and not a.in_flight]:
            del self._attempts[key]
        next_at: float | None = None
        for key, peer in wanted.items():
            attempt = self._attempts.get(key)
            if attempt is None:
                start = self._identified_at.get(peer.id, now) + self.register_grace
                attempt = self._attempts[key] = _Attempt(start, self.retry_min)
            if attempt.in_flight:
                continue
            if attempt.next_at <= now:
                record = self.records[key[1]]
                if attempt.asked == 0:
                    log.info(
                        "RECONCILE: node %s has not registered %s:%d%s; asking it",
                        peer.node_id,
                        key[1],
                        key[2],
                        f"/{key[3]}" if key[3] else "",
                    )
                self._start_ask(peer, key, attempt, record)
            elif next_at is None or attempt.next_at < next_at:
                next_at = attempt.next_at
        return next_at

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._wake.clear()
            try:
                next_at = self.reconcile()
            except Exception:
                # a bug here must not stop reconciliation for good
                log.exception("RECONCILE: pass failed")
                next_at = loop.time() + self.retry_max
            timeout = None if next_at is None else max(0.0, next_at - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass


def is_placement_target(peer: Peer) -> bool:
    """True for an nsqd that lookupd may place partitions on: nsqx's nsqd (a
    distributed_id, and not Youzan's version). An NSQ 1.3 nsqd would register any
    partition as partition 0; Youzan's nsqd takes its partitions from etcd, not from
    HTTP calls. Both still register, and are found through /lookup."""
    return bool(peer.info.distributed_id) and "HA" not in peer.info.version


def meta_unplaced(old: TopicRecord, meta: TopicMeta) -> list[int]:
    """Partitions of ``meta`` that ``old`` has not placed (new ones included)."""
    return [p for p in range(meta.partition_num) if not old.placements.get(p)]
