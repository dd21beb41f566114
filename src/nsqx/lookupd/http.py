"""nsqlookupd's HTTP API (aiohttp): discovery for consumers, administration for operators.

Routes, status codes, JSON shapes and error texts are NSQ 1.3's: no response envelope
(an ``Accept: application/vnd.nsq; version=1.0`` header is accepted and changes nothing),
``{"message": "CODE"}`` for errors, 404 NOT_FOUND for an unknown path and 405
METHOD_NOT_ALLOWED (with ``Allow``) for a known path with the wrong method, and a
redirect for a path that differs from a route only by a trailing slash or letter case,
as Go's httprouter does. Parameters come from the URL's query string only, as in NSQ.

Requests in Youzan's form (partitioned topics) go to
:class:`~nsqx.lookupd.http_partitions.PartitionAPI`; only they can get Youzan's wrapped
answers, so an NSQ 1.3 client never sees one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.lookupd.http_api import (
    HTTPError,
    Negotiated,
    Params,
    accepts_v1,
    respond_v1,
    respond_wrapped,
)
from nsqx.lookupd.http_auth import install as install_http_auth
from nsqx.lookupd.http_partitions import ERR_NOT_LEADER, PartitionAPI
from nsqx.lookupd.lookup_protocol_v1 import format_address
from nsqx.lookupd.meta_store import (
    ConflictError,
    MetaStoreError,
    MetaStoreUnavailable,
    NotLeaderError,
)
from nsqx.lookupd.registration_db import (
    CHANNEL,
    CLIENT,
    TOPIC,
    Producer,
    Registration,
    filter_active,
)
from nsqx.wire import members
from nsqx.wire.lookupd import parse_partition_id
from nsqx.wire.names import is_valid_name

if TYPE_CHECKING:
    from nsqx.lookupd.nsqlookupd import NSQLookupd

log = logging.getLogger("nsqx.lookupd")

#: What Go's ``time.Time{}.UnixNano()`` returns: /debug shows it for "never tombstoned".
GO_ZERO_TIME_UNIX_NANO = -6795364578871345152


Handler = Callable[[web.Request], Awaitable[Any]]

#: what only members of the cluster may use (with --cluster-secret): the cluster's and
#: the topics' administration; lookups and listings stay open
MEMBER_PATHS = frozenset(
    {
        "/topic/create",
        "/topic/delete",
        "/channel/create",
        "/channel/delete",
        "/topic/tombstone",
        "/topic/partition/expand",
        "/topic/meta/update",
        "/topic/partition/move",
        "/partition/isr/leave",
        "/partition/isr/join",
        "/partition/leader/unreachable",
        "/partition/leader/restarted",
        "/cluster/node/roles",
        "/cluster/node/drain",
    }
)


def meta_store_error(err: MetaStoreError) -> tuple[int, str]:
    """The answer to a write that a shared meta store refused: Youzan's not-leader
    answer, or a 500 that says what to do."""
    if isinstance(err, NotLeaderError):
        return 400, ERR_NOT_LEADER
    if isinstance(err, ConflictError):
        return 500, f"E_META_CONFLICT {err}"
    if isinstance(err, MetaStoreUnavailable):
        return 500, f"E_META_UNAVAILABLE {err}"
    return 500, f"E_META_FAILED {err}"


def _peer_info(p: Producer) -> dict[str, Any]:
    info = p.peer.info
    return {
        "remote_address": p.peer.remote_address,
        "hostname": info.hostname,
        "broadcast_address": info.broadcast_address,
        "tcp_port": info.tcp_port,
        "http_port": info.http_port,
        "version": info.version,
    }


class LookupdHTTP:
    """The API's handlers and the router that dispatches to them."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.partitions = PartitionAPI(lookupd)
        get, post = "GET", "POST"
        #: path -> method -> handler; "/ping" is plain text, the rest NSQ's V1 JSON.
        self.routes: dict[str, dict[str, Handler]] = {
            "/ping": {get: self.ping},
            "/info": {get: self.info},
            "/debug": {get: self.debug},
            "/lookup": {get: self.lookup},
            "/topics": {get: self.topics},
            "/channels": {get: self.channels},
            "/nodes": {get: self.nodes},
            "/topic/create": {post: self.create_topic},
            "/topic/delete": {post: self.delete_topic},
            "/channel/create": {post: self.create_channel},
            "/channel/delete": {post: self.delete_channel},
            "/topic/tombstone": {post: self.tombstone_topic_producer},
            # Youzan's
            "/listlookup": {get: self.listlookup},
            "/topic/partition/expand": {post: self.partitions.expand_topic},
            "/topic/meta/update": {post: self.partitions.update_topic_meta},
            # nsqx's replication: leaders report followers behind / caught up
            "/partition/isr/leave": {post: self.partitions.isr_leave},
            "/partition/isr/join": {post: self.partitions.isr_join},
            # followers that cannot hear their leader; a node confirming its leaderships
            # within a new lease; each partition's epoch history
            "/partition/leader/unreachable": {post: self.partitions.leader_unreachable},
            # a node that led a partition when it stopped asks for an election
            "/partition/leader/restarted": {post: self.partitions.leader_restarted},
            "/cluster/node/roles": {post: self.partitions.node_roles},
            "/partition/history": {get: self.partitions.partition_history},
            "/topic/partition/move": {post: self.partitions.move_partition},
            "/cluster/node/drain": {post: self.partitions.drain_node},
            "/cluster/nodes": {get: self.cluster_nodes},
        }
        self._lower = {path.lower(): path for path in self.routes}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        install_http_auth(app, self.lookupd.options, self.routes)
        return app

    # -- routing ------------------------------------------------------------------------

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        response = await self._route(request)
        log.info(
            "%d %s %s (%s) %.3fms",
            response.status,
            request.method,
            request.rel_url,
            format_address(request.transport.get_extra_info("peername"))
            if request.transport
            else "",
            (time.perf_counter() - start) * 1000,
        )
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        methods = self.routes.get(path)
        if methods is not None and method in methods:
            handler = methods[method]
            if path in MEMBER_PATHS and not members.is_member(
                self.lookupd.options.cluster_secret, request.headers
            ):
                log.warning("%s %s refused: not a member of the cluster", method, path)
                return respond_v1(403, members.NOT_A_MEMBER)
            try:
                data = await handler(request)
            except HTTPError as err:
                if err.negotiate and not accepts_v1(request):
                    # Youzan's wrapped error is always a 500
                    return respond_wrapped(500, err.message, None)
                return respond_v1(err.status, err.message)
            except MetaStoreError as err:
                # a shared store refused the write: nothing was changed
                return respond_v1(*meta_store_error(err))
            except Exception:
                # Go's panic handler answers the same way
                log.exception("panic in HTTP handler")
                return respond_v1(500, "INTERNAL_ERROR")
            if isinstance(data, Negotiated):
                if not accepts_v1(request):
                    return respond_wrapped(200, "OK", data.data)
                data = data.data
            if path == "/ping":
                return web.Response(
                    status=200, body=data.encode(), content_type="text/plain", charset="utf-8"
                )
            return respond_v1(200, data)
        if method != "CONNECT" and path != "/":
            fixed = self._fixed_path(path, method)
            if fixed is not None:
                # httprouter: 301 for GET, 307 (same method) otherwise
                query = request.rel_url.raw_query_string
                location = f"{fixed}?{query}" if query else fixed
                status = 301 if method == "GET" else 307
                return web.Response(status=status, headers={"Location": location})
        allowed = sorted(m for m in (methods or {}) if m != method)
        if allowed:
            allow = ", ".join(sorted([*allowed, "OPTIONS"]))
            if method == "OPTIONS":
                return web.Response(status=200, headers={"Allow": allow})
            resp = respond_v1(405, "METHOD_NOT_ALLOWED")
            resp.headers["Allow"] = allow
            return resp
        return respond_v1(404, "NOT_FOUND")

    def _fixed_path(self, path: str, method: str) -> str | None:
        """The route a near-miss path means: trailing slash toggled, or letter case."""
        candidates = [path[:-1] if path.endswith("/") else path + "/"]
        lowered = path.rstrip("/").lower() if path != "/" else path
        if lowered in self._lower:
            candidates.append(self._lower[lowered])
        for cand in candidates:
            if cand != path and method in self.routes.get(cand, {}):
                return cand
        return None

    # -- handlers -----------------------------------------------------------------------

    def _now(self) -> int:
        return time.time_ns()

    async def ping(self, request: web.Request) -> str:
        return "OK"

    async def info(self, request: web.Request) -> dict[str, Any]:
        return {"version": NSQ_VERSION}

    async def topics(self, request: web.Request) -> dict[str, Any]:
        return {"topics": [k.key for k in self.db.find_registrations(TOPIC, "*", "")]}

    async def channels(self, request: web.Request) -> dict[str, Any]:
        params = Params(request)
        topic = params.topic()
        keys = self.db.find_registrations(CHANNEL, topic, "*")
        raw = params.get("partition")
        if raw:
            # Youzan's filter: the channels registered on that partition
            pid = parse_partition_id(raw)
            keys = [
                k for k in keys if any(p.partition == pid for p in self.db.partition_producers(k))
            ]
        return {"channels": [k.subkey for k in keys]}

    async def cluster_nodes(self, request: web.Request) -> dict[str, Any]:
        """The partition-aware nsqd with a session, and which nsqlookupd hold it
        (``local``: this one; with etcd, the others by id)."""
        view = self.lookupd.coordinator.sessions.view()
        return {"nodes": [{"node_id": n, "sessions": held} for n, held in view.items()]}

    async def listlookup(self, request: web.Request) -> Negotiated:
        return await self.partitions.listlookup()

    async def lookup(self, request: web.Request) -> dict[str, Any] | Negotiated:
        params = Params(request)
        if self.partitions.is_youzan_lookup(params):
            return self.partitions.lookup(params)
        topic = params.topic()
        if not self.db.find_registrations(TOPIC, topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        opts = self.lookupd.options
        channels = [k.subkey for k in self.db.find_registrations(CHANNEL, topic, "*")]
        producers = filter_active(
            self.db.find_producers(TOPIC, topic, ""),
            int(opts.inactive_producer_timeout * 1e9),
            int(opts.tombstone_lifetime * 1e9),
            self._now(),
        )
        leaders = self.lookupd.coordinator.replicas.leaders(topic)
        if leaders is not None:
            # a replicated topic is served by its partitions' leaders only
            lead = set(leaders.values())
            producers = [p for p in producers if p.peer.node_id in lead]
        return {"channels": channels, "producers": [_peer_info(p) for p in producers]}

    async def create_topic(self, request: web.Request) -> None:
        params = Params(request)
        if self.partitions.is_youzan_create(params):
            return await self.partitions.create_topic(params)
        topic = params.topic()
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))

    async def delete_topic(self, request: web.Request) -> None:
        params = Params(request)
        topic = params.topic()
        partition = params.get("partition")
        if partition is not None:
            return await self.partitions.delete_topic(topic, partition)
        # NSQ's delete forgets the keys; a partitioned topic's record goes with them
        # (its nsqd keep their data, as NSQ's lookupd leaves nsqd alone)
        self.partitions.leader_only(topic)
        await self.lookupd.coordinator.forget_topic(topic)
        for key in self.db.find_registrations(CHANNEL, topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", key.subkey, topic)
            self.db.remove_registration(key)
        for key in self.db.find_registrations(TOPIC, topic, ""):
            log.info("DB: removing topic(%s)", topic)
            self.db.remove_registration(key)

    async def tombstone_topic_producer(self, request: web.Request) -> None:
        params = Params(request)
        topic = params.topic()
        node = params.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        now = self._now()
        # every partition the node registered for the topic
        for p in self.db.partition_producers(Registration(TOPIC, topic, "")):
            if f"{p.peer.info.broadcast_address}:{p.peer.info.http_port}" == node:
                p.tombstone(now)

    async def create_channel(self, request: web.Request) -> None:
        topic, channel = Params(request).topic_channel()
        if await self.partitions.create_channel(topic, channel):
            return
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration(CHANNEL, topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))

    async def delete_channel(self, request: web.Request) -> None:
        topic, channel = Params(request).topic_channel()
        if await self.partitions.delete_channel(topic, channel):
            return
        keys = self.db.find_registrations(CHANNEL, topic, channel)
        if not keys:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for key in keys:
            self.db.remove_registration(key)

    async def nodes(self, request: web.Request) -> dict[str, Any]:
        opts = self.lookupd.options
        now = self._now()
        lifetime = int(opts.tombstone_lifetime * 1e9)
        # tombstoned nodes are listed (with their tombstones); only inactive ones are not
        clients = filter_active(
            self.db.find_producers(CLIENT, "", ""),
            int(opts.inactive_producer_timeout * 1e9),
            0,
            now,
        )
        nodes = []
        for p in clients:
            peer = p.peer
            topics = [k.key for k in self.db.lookup_registrations(peer.id) if k.category == TOPIC]
            tombstones = []
            partitions: dict[str, list[str]] = {}
            for t in topics:
                entries = self.db.peer_producers(Registration(TOPIC, t, ""), peer.id)
                tombstones.append(any(e.is_tombstoned(lifetime, now) for e in entries))
                partitions[t] = [str(e.partition) for e in entries]
            node = _peer_info(p)
            node["tombstones"] = tombstones
            node["topics"] = topics
            if peer.speaks_partitions:
                # Youzan's extra key, for partition-aware nodes only: an NSQ 1.3 node
                # keeps NSQ's exact shape
                node["partitions"] = partitions
            nodes.append(node)
        return {"producers": nodes}

    async def debug(self, request: web.Request) -> dict[str, Any]:
        data: dict[str, list[dict[str, Any]]] = {}
        for key, producers in self.db.items():
            for p in producers:
                info = p.peer.info
                entry: dict[str, Any] = {
                    "broadcast_address": info.broadcast_address,
                    "hostname": info.hostname,
                    "http_port": info.http_port,
                    "id": p.peer.id,
                    "last_update": p.peer.last_update,
                    "tcp_port": info.tcp_port,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": p.tombstoned_at if p.tombstoned else GO_ZERO_TIME_UNIX_NANO,
                    "version": info.version,
                }
                if p.peer.speaks_partitions and key.category != CLIENT:
                    entry["distributed_id"] = info.distributed_id
                    entry["partition"] = p.partition
                # keys sorted, as Go marshals a map
                data.setdefault(str(key), []).append(dict(sorted(entry.items())))
        return dict(sorted(data.items()))
