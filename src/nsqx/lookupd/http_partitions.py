"""nsqlookupd's HTTP API for partitioned topics: Youzan's ``/lookup`` form,
``/listlookup`` and the topic administration of Youzan's lookupd.

Which requests are Youzan's: a ``/lookup`` with an ``access``, ``metainfo``,
``partition`` or ``consistent`` parameter, ``/listlookup``, a ``/topic/create`` with
``partition_num`` or ``replicator``, a ``/topic/delete`` with ``partition``, and
``/topic/partition/expand`` and ``/topic/meta/update``. Everything else is NSQ 1.3's
API, unchanged (:mod:`nsqx.lookupd.http`).

The discovery answers (``/lookup``, ``/listlookup``) are negotiated as Youzan's are:
V1 for a request with ``Accept: application/vnd.nsq; version=1.0`` (what both of
Youzan's clients send), wrapped otherwise. Administrative answers are always V1, as in
Youzan. Validation follows Youzan's nsqlookupd/http.go: same checks, order, codes and
texts, except where this module says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqx.lookupd.coordinator import CoordinatorError
from nsqx.lookupd.http_api import HTTPError, Negotiated, Params, go_atoi
from nsqx.lookupd.leadership import NO_NODE_JSON, LookupdNode
from nsqx.lookupd.registration_db import CHANNEL, TOPIC, Producer, Registration
from nsqx.lookupd.topic_record import MAX_LOAD_FACTOR, UNKNOWN_TOPIC_META_JSON
from nsqx.wire.lookupd import parse_partition_id
from nsqx.wire.names import is_valid_name
from nsqx.wire.topic_meta import MAX_PARTITION_NUM, MAX_REPLICATOR, REPLICATION_ACKS, TopicMeta

if TYPE_CHECKING:
    from nsqx.lookupd.nsqlookupd import NSQLookupd

#: Parameters that make a /lookup Youzan's.
YOUZAN_LOOKUP_PARAMS = ("access", "metainfo", "partition", "consistent")

#: Youzan's answer (400) to an administrative write sent to an nsqlookupd that does not
#: lead (consistence.ErrFailedOnNotLeader).
ERR_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"

#: /topic/meta/update cannot change the replicator of a topic (yet).
REPLICATOR_CHANGE_NOT_AVAILABLE = (
    "INVALID_ARG_TOPIC_REPLICATOR changing the replicator of a topic is not supported"
)


def youzan_peer_info(p: Producer) -> dict[str, Any]:
    """Youzan's PeerInfo JSON (struct order): NSQ's six fields with ``id`` first and
    ``distributed_id`` last."""
    info = p.peer.info
    return {
        "id": p.peer.id,
        "remote_address": p.peer.remote_address,
        "hostname": info.hostname,
        "broadcast_address": info.broadcast_address,
        "tcp_port": info.tcp_port,
        "http_port": info.http_port,
        "version": info.version,
        "distributed_id": info.distributed_id,
    }


def _error(err: CoordinatorError) -> HTTPError:
    return HTTPError(err.status, err.message)


def _int_param(
    params: Params, key: str, default: str, low: int, high: int | None, code: str
) -> int:
    """An integer parameter as Youzan reads it (empty means ``default``); ``code`` for
    anything that is not an integer in [low, high]."""
    value = go_atoi(params.get(key) or default)
    if value is None or value < low or (high is not None and value > high):
        raise HTTPError(400, code)
    return value


class PartitionAPI:
    """The handlers; :class:`~nsqx.lookupd.http.LookupdHTTP` routes to them."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.coordinator = lookupd.coordinator

    # -- discovery --------------------------------------------------------------------

    @staticmethod
    def is_youzan_lookup(params: Params) -> bool:
        """True for a /lookup with one of Youzan's parameters (even empty)."""
        return any(params.get(k) is not None for k in YOUZAN_LOOKUP_PARAMS)

    def lookup(self, params: Params) -> Negotiated:
        """Youzan's /lookup: channels, meta (with ``metainfo``), producers, partitions.

        ``partitions`` maps each partition to the node that serves it (its placed
        leader when several registered it); ``producers`` lists every node once.
        ``access=w`` leaves out tombstoned nodes, ``access=r`` (the default) keeps
        them so that consumers drain them. An unknown topic is an empty answer, as in
        Youzan (NSQ's form says 404).
        """
        try:
            return Negotiated(self._lookup(params))
        except HTTPError as err:
            err.negotiate = True
            raise

    def _lookup(self, params: Params) -> dict[str, Any]:
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        access = params.get("access") or "r"
        if access not in ("r", "w"):
            raise HTTPError(400, "INVALID_ACCESS_MODE")
        partition_param = params.get("partition") or ""
        wanted: int | None = None
        if partition_param:
            wanted = parse_partition_id(partition_param)
            if wanted is None:
                # Youzan matches the text against its registrations: nothing matches
                wanted = -1

        opts = self.lookupd.options
        now = time.time_ns()
        inactive = int(opts.inactive_producer_timeout * 1e9)
        lifetime = int(opts.tombstone_lifetime * 1e9)
        everything = self.db.partition_producers(Registration(TOPIC, topic, ""))
        leaders = self.coordinator.replicas.leaders(topic)
        entries = [
            p
            for p in everything
            if (wanted is None or p.partition == wanted)
            and now - p.peer.last_update <= inactive
            and not (access == "w" and p.is_tombstoned(lifetime, now))
            # a replicated partition is served by its leader only
            and (leaders is None or leaders.get(p.partition) == p.peer.node_id)
        ]
        record = self.coordinator.record(topic)
        serving: dict[int, Producer] = {}
        for p in entries:
            current = serving.get(p.partition)
            leader = record.leader(p.partition) if record is not None else None
            if current is None or (p.peer.node_id == leader and current.peer.node_id != leader):
                serving[p.partition] = p
        producers: dict[str, Producer] = {}
        for p in entries:
            producers.setdefault(p.peer.id, p)

        if wanted is None:
            channels = [k.subkey for k in self.db.find_registrations(CHANNEL, topic, "*")]
        else:
            channels = [
                k.subkey
                for k in self.db.find_registrations(CHANNEL, topic, "*")
                if any(p.partition == wanted for p in self.db.partition_producers(k))
            ]
        # Go marshals a map with its keys sorted as strings ("10" before "2")
        partitions = {str(pid): youzan_peer_info(serving[pid]) for pid in sorted(serving, key=str)}
        answer: dict[str, Any] = {"channels": channels}
        if params.get("metainfo"):
            if record is not None:
                answer["meta"] = record.meta.lookup_json()
            elif everything:
                # partitions made directly on nsqd: what their registrations show
                derived = TopicMeta(max(p.partition for p in everything) + 1)
                answer["meta"] = derived.lookup_json()
            else:
                answer["meta"] = dict(UNKNOWN_TOPIC_META_JSON)
        answer["partitions"] = partitions
        answer["producers"] = [youzan_peer_info(p) for p in producers.values()]
        return answer

    async def listlookup(self) -> Negotiated:
        """Youzan's /listlookup: the nsqlookupd nodes and their leader.

        A single nsqlookupd is the only node and the leader. With etcd, the nodes are
        those with a session and the leader is the one that holds the leader key (its
        ``Epoch`` is that key's create revision), or Youzan's zero node while none is
        known. Youzan's node id is ``ip:rpc_port:tcp_port:nsqlookup``; nsqx has no RPC
        port, so ``RpcPort`` is empty. Clients use ``NodeIP`` and ``HttpPort``.
        """
        lk = self.lookupd
        leadership = lk.leadership
        if leadership is not None:
            nodes = [n.to_json() for n in await leadership.nodes()]
            leader = leadership.leader
            return Negotiated(
                {
                    "lookupdleader": leader.to_json() if leader else dict(NO_NODE_JSON),
                    "lookupdnodes": nodes,
                }
            )
        node = LookupdNode.make(lk.options.broadcast_address, lk.tcp_port, lk.http_port).to_json()
        return Negotiated({"lookupdleader": node, "lookupdnodes": [dict(node)]})

    # -- administration ---------------------------------------------------------------

    def leader_only(self, topic: str | None = None) -> None:
        """Refuse an administrative write on an nsqlookupd that does not lead, as
        Youzan's does. With ``topic``, only if that topic is partitioned (has a record):
        NSQ 1.3's writes change this nsqlookupd's registry only, which any may do."""
        if self.coordinator.leading:
            return
        if topic is None or self.coordinator.record(topic) is not None:
            raise HTTPError(400, ERR_NOT_LEADER)

    @staticmethod
    def is_youzan_create(params: Params) -> bool:
        """True for a /topic/create of a partitioned topic."""
        return params.get("partition_num") is not None or params.get("replicator") is not None

    async def create_topic(self, params: Params) -> None:
        """Youzan's ``/topic/create?topic&partition_num&replicator[&...]``."""
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        if not params.get("partition_num"):
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION_NUM")
        pnum = _int_param(
            params, "partition_num", "", 1, MAX_PARTITION_NUM, "INVALID_ARG_TOPIC_PARTITION_NUM"
        )
        if not params.get("replicator"):
            raise HTTPError(400, "MISSING_ARG_TOPIC_REPLICATOR")
        replica = _int_param(
            params, "replicator", "", 1, MAX_REPLICATOR, "INVALID_ARG_TOPIC_REPLICATOR"
        )
        suggest = _int_param(
            params, "suggestload", "0", 0, MAX_LOAD_FACTOR, "INVALID_ARG_TOPIC_LOAD_FACTOR"
        )
        # Youzan takes any integer here (and Go's parse error text for retention); a
        # negative count of days or messages means nothing, so nsqx refuses it
        sync_every = _int_param(params, "syncdisk", "0", 0, None, "INVALID_ARG_TOPIC_SYNC_DISK")
        retention = _int_param(params, "retention", "0", 0, None, "INVALID_ARG_TOPIC_RETENTION")
        replication_ack = _replication_ack(params)
        self.leader_only()
        meta = TopicMeta(
            partition_num=pnum,
            replica=replica,
            suggest_lf=suggest,
            sync_every=sync_every,
            retention_days=retention,
            ordered=params.get("orderedmulti") == "true",
            multipart=params.get("multipart") == "true",
            ext=params.get("extend") == "true",
            disable_channel_auto_create=params.get("disable_channel_auto_create") == "true",
            replication_ack=replication_ack or "",
        )
        try:
            await self.coordinator.create_topic(topic, meta)
        except CoordinatorError as err:
            raise _error(err) from None

    async def delete_topic(self, topic: str, partition: str) -> None:
        """Youzan's ``/topic/delete?topic&partition=**``; nsqx also takes one partition
        (Youzan says REMOVE_SINGLE_PARTITION_NOT_ALLOWED)."""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not partition:
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
        pid: int | None = None
        if partition != "**":
            pid = parse_partition_id(partition)
            if pid is None:
                raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION")
        self.leader_only()
        try:
            await self.coordinator.delete_topic(topic, pid)
        except CoordinatorError as err:
            raise _error(err) from None

    async def expand_topic(self, request: web.Request) -> None:
        """Youzan's ``/topic/partition/expand?topic&partition_num``."""
        params = Params(request)
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not params.get("partition_num"):
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION_NUM")
        pnum = _int_param(
            params, "partition_num", "", 1, MAX_PARTITION_NUM, "INVALID_ARG_TOPIC_PARTITION_NUM"
        )
        self.leader_only()
        try:
            await self.coordinator.expand_topic(topic, pnum)
        except CoordinatorError as err:
            raise _error(err) from None

    async def isr_leave(self, request: web.Request) -> None:
        """nsqx: ``POST /partition/isr/leave?topic&partition&node&epoch``: a leader
        reports an in-sync replica that stays behind."""
        await self._isr_report(request, self.coordinator.replicas.isr_leave)

    async def isr_join(self, request: web.Request) -> None:
        """nsqx: ``POST /partition/isr/join?topic&partition&node&epoch``: a leader
        reports a replica that caught up."""
        await self._isr_report(request, self.coordinator.replicas.isr_join)

    async def move_partition(self, request: web.Request) -> dict[str, Any]:
        """Youzan's ``POST /topic/partition/move?topic&partition&move_leader=true
        [&move_to=node]``: the partition's leadership goes to another in-sync replica
        (moving data to other nodes is not supported)."""
        params = Params(request)
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not params.get("partition"):
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
        pid = parse_partition_id(params.get("partition") or "")
        if pid is None:
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        if params.get("move_leader") != "true":
            raise HTTPError(400, "only move_leader=true is supported")
        try:
            leader = await self.coordinator.replicas.move_leader(
                topic, pid, params.get("move_to") or None
            )
        except ValueError as err:
            raise HTTPError(400, str(err)) from None
        return {"leader": leader}

    async def drain_node(self, request: web.Request) -> dict[str, Any]:
        """nsqx: ``POST /cluster/node/drain?node=<id>``: move every leadership of the
        node (its distributed_id, as /nodes lists it) to other in-sync replicas."""
        node = Params(request).get("node") or ""
        if not node:
            raise HTTPError(400, "MISSING_ARG_NODE")
        moved = await self.coordinator.replicas.drain(node)
        return {"moved": moved}

    async def leader_unreachable(self, request: web.Request) -> None:
        """nsqx: ``POST /partition/leader/unreachable?topic&partition&node&epoch``: an
        in-sync follower cannot hear its leader."""
        await self._isr_report(request, self.coordinator.replicas.leader_unreachable, True)

    async def leader_restarted(self, request: web.Request) -> dict[str, Any]:
        """nsqx: ``POST /partition/leader/restarted?topic&partition&node&epoch``: a node
        that led the partition when it stopped asks for an election (it may have lost
        what it had not fsynced). ``{"epoch": n}`` once decided (the role of epoch ``n``
        says who leads); 503 while too few replicas answer (it asks again)."""
        params = Params(request)
        topic = params.get("topic") or ""
        node = params.get("node") or ""
        pid = parse_partition_id(params.get("partition") or "")
        if not topic or not node or pid is None:
            raise HTTPError(400, "MISSING_ARG")
        self.leader_only()
        result, epoch = await self.coordinator.replicas.leader_restarted(topic, pid, node)
        if result != "OK":
            raise HTTPError(503, result)
        return {"epoch": epoch}

    async def node_roles(self, request: web.Request) -> dict[str, Any]:
        """nsqx: ``POST /cluster/node/roles?node=<id>``: a node that holds a new lease
        asks which leaderships it may acknowledge writes for (fencing: see
        nsqx.lookupd.replicas). 409 if this nsqlookupd does not count it alive."""
        node = Params(request).get("node") or ""
        if not node:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.leader_only()
        roles = self.coordinator.replicas.confirm_roles(node)
        if roles is None:
            raise HTTPError(409, "E_NODE_NOT_ALIVE")
        return {"roles": roles}

    async def partition_history(self, request: web.Request) -> dict[str, Any]:
        """nsqx: ``GET /partition/history?topic[&partition]``: each partition's epoch,
        leader, ISR and replicas now, and its latest epoch changes (when and why)."""
        params = Params(request)
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        record = self.coordinator.record(topic)
        if record is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        only = params.get("partition")
        pid = parse_partition_id(only) if only else None
        if only and pid is None:
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION")
        partitions: dict[str, Any] = {}
        for p, placement in sorted(record.placements.items()):
            if pid is not None and p != pid:
                continue
            partitions[str(p)] = {
                "epoch": record.epoch_of(p),
                "leader": placement[0] if placement else "",
                "isr": list(record.isr_of(p)),
                "replicas": list(placement),
                "history": [c.to_json() for c in record.history.get(p, ())],
            }
        return {"topic": topic, "replica": record.meta.replica, "partitions": partitions}

    async def _isr_report(
        self,
        request: web.Request,
        action: Callable[[str, int, str, int | None], Awaitable[str]],
        need_epoch: bool = False,
    ) -> None:
        params = Params(request)
        topic = params.get("topic") or ""
        node = params.get("node") or ""
        pid = parse_partition_id(params.get("partition") or "")
        if not topic or not node or pid is None:
            raise HTTPError(400, "MISSING_ARG")
        raw_epoch = params.get("epoch") or ""
        epoch = int(raw_epoch) if raw_epoch.isdigit() else None
        if epoch is None and (raw_epoch or need_epoch):
            raise HTTPError(400, "INVALID_ARG_EPOCH")
        # nsqd tries the next nsqlookupd on this answer, until it reaches the leader
        self.leader_only()
        result = await action(topic, pid, node, epoch)
        if result != "OK":
            raise HTTPError(409, result)

    async def update_topic_meta(self, request: web.Request) -> None:
        """Youzan's ``/topic/meta/update?topic[&replicator&syncdisk&retention&upgradeext
        &disable_channel_auto_create]`` and nsqx's ``replication_ack``: absent parameters
        stay as they are."""
        params = Params(request)
        topic = params.get("topic") or ""
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        replica: int | None = None
        if params.get("replicator"):
            replica = _int_param(
                params, "replicator", "", 1, MAX_REPLICATOR, "INVALID_ARG_TOPIC_REPLICATOR"
            )
            record = self.coordinator.record(topic)
            if record is not None and record.meta.replica != replica:
                raise HTTPError(400, REPLICATOR_CHANGE_NOT_AVAILABLE)
        sync_every: int | None = None
        if params.get("syncdisk"):
            sync_every = _int_param(params, "syncdisk", "", 0, None, "INVALID_ARG_TOPIC_SYNC_DISK")
        retention: int | None = None
        if params.get("retention"):
            retention = _int_param(params, "retention", "", 0, None, "INVALID_ARG_TOPIC_RETENTION")
        disable = params.get("disable_channel_auto_create")
        replication_ack = _replication_ack(params)
        self.leader_only()
        try:
            await self.coordinator.update_topic(
                topic,
                replication_ack=replication_ack,
                replica=replica,
                sync_every=sync_every,
                retention_days=retention,
                upgrade_ext=params.get("upgradeext") == "true",
                disable_channel_auto_create={"true": True, "false": False}.get(disable or ""),
            )
        except CoordinatorError as err:
            raise _error(err) from None

    async def create_channel(self, topic: str, channel: str) -> bool:
        """A channel of a partitioned topic, on every partition; False if the topic is
        not partitioned (NSQ's /channel/create then)."""
        self.leader_only(topic)
        try:
            return await self.coordinator.create_channel(topic, channel)
        except CoordinatorError as err:
            raise _error(err) from None

    async def delete_channel(self, topic: str, channel: str) -> bool:
        """The reverse of :meth:`create_channel`."""
        self.leader_only(topic)
        try:
            return await self.coordinator.delete_channel(topic, channel)
        except CoordinatorError as err:
            raise _error(err) from None


def _replication_ack(params: Params) -> str | None:
    """nsqx's ``replication_ack`` (durable|written; None if absent): when a publish of a
    replicated topic is answered (docs/replication.md)."""
    value = params.get("replication_ack")
    if not value:
        return None
    if value not in REPLICATION_ACKS:
        raise HTTPError(400, "INVALID_ARG_TOPIC_REPLICATION_ACK")
    return value
