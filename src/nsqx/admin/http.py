"""nsqadmin's HTTP server: the page, its JSON API under ``/api``, ``/config``, ``/ping``.

The API is NSQ 1.3 nsqadmin's (same paths, bodies and answers, ``{"message": ...}``
on every answer, ``WARNING: ...`` when some servers did not answer, 502
``UPSTREAM_ERROR: ...`` when none did), plus what nsqx adds: ``?stats=true`` on
``/api/topics`` (every topic's counts and rate at once), ``/api/history`` (rates over
the last minutes), ``/api/lookupds``, partitions in topic and channel answers, the
``setoffset`` channel action (Youzan's replay), and ``partition_num`` when creating a
topic through nsqlookupd.

Every request body is checked: anything that is not the JSON object an endpoint wants
gets a 400 and harms nothing. Actions need an admin (``--admin-user``, identified by
``--acl-http-header``) when admins are configured: others get 403 ``FORBIDDEN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.admin import upstream_auth
from nsqx.admin.notify import admin_action, basic_auth_user
from nsqx.clusterinfo import aggregate
from nsqx.clusterinfo.info import (
    Partial,
    Producer,
    UpstreamError,
    http_base,
    supports_setoffset,
)
from nsqx.wire.names import is_valid_name

if TYPE_CHECKING:
    from nsqx.admin.nsqadmin import NSQAdmin

__all__ = ["make_app"]

log = logging.getLogger("nsqx.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_JSON_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
_POSITION_RE = re.compile(r"(?:(timestamp|virtual_queue|msgcount):(\d{1,19})|special:-1)\Z")
_NODE_RE = re.compile(r"(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}\Z")
#: the largest request body an endpoint reads (nsqadmin's /config limit)
MAX_BODY = 1024 * 1024
#: how nsqd's refusal of a channel it does not have reads in an UpstreamError
_NO_CHANNEL = " 404 CHANNEL_NOT_FOUND"


class ApiError(Exception):
    """An answer other than 200: the status and nsqadmin's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers=_JSON_HEADERS,
    )


def _answer(partial: Partial | None = None, **data: Any) -> web.Response:
    data["message"] = partial.message() if partial is not None else ""
    if partial is not None and partial.down:
        # nsqx: the servers that did not answer (``skipped``: not even asked, known not
        # to answer; see ClusterInfo.ask)
        data["not_answering"] = partial.down
    return _json(data)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as nsqadmin's JSON ``{"message": ...}``, never a traceback."""
    try:
        return await handler(request)
    except ApiError as err:
        return _json({"message": err.message}, err.status)
    except UpstreamError as err:
        log.error("%s %s: %s", request.method, request.path, err)
        return _json({"message": f"UPSTREAM_ERROR: {err}"}, 502)
    except web.HTTPRequestEntityTooLarge:
        return _json({"message": "BODY_TOO_BIG"}, 413)
    except web.HTTPMethodNotAllowed as err:
        resp = _json({"message": "METHOD_NOT_ALLOWED"}, 405)
        resp.headers["Allow"] = ", ".join(sorted(err.allowed_methods))
        return resp
    except web.HTTPNotFound:
        return _json({"message": "NOT_FOUND"}, 404)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _json({"message": "INTERNAL_ERROR"}, 500)


def _topic_arg(request: web.Request) -> str:
    topic = request.match_info["topic"]
    if not is_valid_name(topic):
        raise ApiError(400, "INVALID_TOPIC")
    return topic


def _channel_arg(request: web.Request) -> str:
    channel = request.match_info["channel"]
    if not is_valid_name(channel):
        raise ApiError(400, "INVALID_CHANNEL")
    return channel


def _node_arg(request: web.Request) -> str:
    node = request.match_info["node"]
    if not _NODE_RE.match(node):
        raise ApiError(400, "INVALID_NODE")
    return node


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or 400 INVALID_BODY."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "INVALID_BODY") from None
    if not isinstance(body, dict):
        raise ApiError(400, "INVALID_BODY")
    return body


def _str_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"INVALID_{key.upper()}")
    return value


class _Handlers:
    """The routes' handlers, sharing the admin's cluster view and settings."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.static_dir = Path(str(resources.files("nsqx.admin") / "static"))

    @property
    def ci(self) -> Any:
        return self.admin.cluster

    # -- helpers -------------------------------------------------------------------------

    def is_admin(self, request: web.Request) -> bool:
        """nsqadmin's rule: everyone without --admin-user, else the listed users."""
        users = self.admin.options.admin_users
        if not users:
            return True
        return request.headers.get(self.admin.options.acl_http_header, "") in users

    def require_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise ApiError(403, "FORBIDDEN")

    def notify(
        self, request: web.Request, action: str, topic: str, channel: str = "", node: str = ""
    ) -> None:
        log.info("ACTION: %s topic=%s channel=%s node=%s", action, topic, channel, node)
        if self.admin.notifier is None:
            return
        user = basic_auth_user(request.headers.get("Authorization", "")) or request.headers.get(
            self.admin.options.acl_http_header, ""
        )
        scheme = "https" if request.headers.get("X-Scheme") == "https" else request.scheme
        self.admin.notifier.send(
            admin_action(
                action,
                topic,
                channel,
                node,
                user=user,
                remote_ip=str(request.remote or ""),
                user_agent=request.headers.get("User-Agent", ""),
                url=f"{scheme}://{request.host}{request.path_qs}",
            )
        )

    @staticmethod
    def _all_failed(partial: Partial, attempted: int) -> None:
        """Raise when every node asked failed (some failing is a warning): 404
        ``CHANNEL_NOT_FOUND`` when each said it has no such channel, as nsqd says it."""
        if attempted and len(partial.errors) >= attempted:
            if all(_NO_CHANNEL in e for e in partial.errors):
                raise ApiError(404, "CHANNEL_NOT_FOUND")
            raise UpstreamError("; ".join(partial.errors))

    async def _node_action(
        self,
        topic: str,
        path: str,
        query: dict[str, str],
        data: bytes | None = None,
        nodes: list[str] | None = None,
    ) -> Partial:
        partial = Partial()
        if nodes is None:
            producers, partial = await self.ci.topic_producers(topic)
            nodes = [p.http_address for p in producers]
        result: Partial = await self.ci.post_nodes(nodes, path, query, data)
        self._all_failed(result, len(nodes))
        partial.extend(result)
        return partial

    # -- pages ---------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        opts = self.admin.options
        base = opts.base_path.rstrip("/") + "/"
        config = {
            "version": NSQ_VERSION,
            "base_path": base,
            "is_admin": self.is_admin(request),
            "nsqlookupd": opts.nsqlookupd_http_addresses,
            "nsqd": opts.nsqd_http_addresses,
            "refresh_ms": round(opts.refresh_interval * 1000),
            "history_interval": opts.history_interval,
            "history_length": opts.history_length,
        }
        # JSON inside <script>: "<", ">" and "&" escaped so no data can close the tag
        blob = (
            json.dumps(config)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        )
        page = self._static_text("index.html")
        page = page.replace("{{BASE}}", html.escape(base)).replace("{{CONFIG}}", blob)
        return web.Response(
            text=page,
            content_type="text/html",
            headers={
                "Cache-Control": "no-store",
                # the page loads only its own scripts: an injected one would not run
                "Content-Security-Policy": "default-src 'self'; style-src 'self' "
                "'unsafe-inline'; img-src 'self' data:; script-src 'self'",
            },
        )

    def _static_text(self, name: str) -> str:
        base = Path(self.admin.options.dev_static_dir or self.static_dir)
        return (base / name).read_text(encoding="utf-8")

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", content_type="text/plain")

    # -- reading -------------------------------------------------------------------------

    async def topics(self, request: web.Request) -> web.Response:
        topics, partial = await self.ci.topics()
        if request.query.get("inactive") == "true":
            inactive: dict[str, list[str]] = {}
            if self.ci.lookupd:
                for topic in topics:
                    producers, _ = await self.ci.topic_producers(topic)
                    if not producers:
                        channels, _ = await self.ci.lookupd_topic_channels(topic)
                        inactive[topic] = channels
            return _answer(partial, topics=inactive)
        if request.query.get("stats") != "true":
            return _answer(partial, topics=topics)
        producers, more = await self.ci.producers()
        partial.extend(more)
        rows, more = await self.ci.node_stats(producers, include_clients=False, none_is_error=False)
        partial.extend(more)
        rates = self.admin.history.live_rates(rows)
        names = sorted(set(topics) | {r["topic_name"] for r in rows})
        stats = []
        for name in names:
            t = aggregate.aggregate_topic(name, rows)
            stats.append(
                {
                    "topic_name": name,
                    "depth": t["depth"],
                    "message_count": t["message_count"],
                    "paused": t["paused"],
                    "channel_count": len(t["channels"]),
                    "node_count": len(t["nodes"]),
                    "partition_num": t["partition_num"],
                    "rate": rates.get(name),
                }
            )
        return _answer(partial, topics=names, stats=stats)

    async def _topic_rows(
        self, topic: str, channel: str = "", include_clients: bool = False
    ) -> tuple[list[Producer], list[dict[str, Any]], Partial, bool, int]:
        """(producers, per-node rows, errors, known, partition_num) of ``topic``.

        ``known``: some server knows the topic (a lookupd, or an nsqd that has it).
        ``partition_num``: the most any node or lookupd says (0: not partitioned).
        """
        (producers, partial, known), lookupd_num = await asyncio.gather(
            self.ci.lookup_topic(topic), self.ci.topic_partition_num(topic)
        )
        rows, more = await self.ci.node_stats(
            producers, topic, channel, include_clients, none_is_error=False
        )
        partial.extend(more)
        num = max((r.get("partition_num", 0) for r in rows), default=0)
        partitioned = num or any(r.get("partitions") for r in rows) or self.ci.placements.get(topic)
        if lookupd_num > 1 or partitioned:
            num = max(num, lookupd_num)
        known = known or bool(rows) or lookupd_num > 0
        return producers, rows, partial, known, num

    def _missing_partitions(
        self,
        topic: str,
        partition_num: int,
        rows: list[dict[str, Any]],
        producers: list[Producer],
        partial: Partial,
    ) -> list[dict[str, Any]]:
        """The partitions no answering node has: each with the node it was last seen on
        (by this admin or nsqlookupd) and why it is missing."""
        present = {p["partition"] for r in rows for p in r.get("partitions") or []}
        down = {d["node"] for d in partial.down}
        listed = {p.http_address for p in producers}
        answered = {r["node"] for r in rows}
        missing = []
        for pid in range(partition_num):
            if pid in present:
                continue
            node, hostname = self.ci.last_seen(topic, pid)
            if not node:
                reason = "unknown"
            elif node in down:
                reason = "not_answering"
            elif node in listed or node in answered:
                reason = "not_on_node"
            else:
                reason = "not_listed"
            missing.append({"partition": pid, "node": node, "hostname": hostname, "reason": reason})
        return missing

    async def topic(self, request: web.Request) -> web.Response:
        topic = _topic_arg(request)
        producers, rows, partial, known, num = await self._topic_rows(topic)
        if not known and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        data = aggregate.aggregate_topic(topic, rows)
        rates = self.admin.history.live_rates(rows)
        data["rate"] = rates.get(topic)
        for ch in data["channels"]:
            ch["rate"] = rates.get(f"{topic}/{ch['channel_name']}")
        data["partition_num"] = num
        data["missing_partitions"] = self._missing_partitions(topic, num, rows, producers, partial)
        data["setoffset_supported"] = any(supports_setoffset(p.version) for p in producers)
        return _answer(partial, **data)

    async def channel(self, request: web.Request) -> web.Response:
        topic, channel = _topic_arg(request), _channel_arg(request)
        producers, rows, partial, known, num = await self._topic_rows(topic, channel, True)
        if not known and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        channels = aggregate.aggregate_channels(rows)
        data = channels.get(channel)
        if data is None:
            listed: list[str] = []
            if self.ci.lookupd and not partial.down:
                with contextlib.suppress(UpstreamError):
                    listed, _ = await self.ci.lookupd_topic_channels(topic)
            if not partial.down and channel not in listed:
                raise ApiError(404, "CHANNEL_NOT_FOUND")
            # known to lookupd, or maybe on a node that does not answer
            data = aggregate.empty_channel(topic, channel)
        rates = self.admin.history.live_rates(rows)
        data["rate"] = rates.get(f"{topic}/{channel}")
        data["partition_num"] = num
        data["missing_partitions"] = self._missing_partitions(topic, num, rows, producers, partial)
        data["setoffset_supported"] = any(supports_setoffset(p.version) for p in producers)
        return _answer(partial, **data)

    async def channel_peek(self, request: web.Request) -> web.Response:
        """GET /api/topics/:topic/:channel/peek?n= (nsqx): the next messages of the
        channel on each node and partition that has it, changing nothing (nsqd's
        /channel/peek). Message bodies are shown: admins only."""
        self.require_admin(request)
        topic, channel = _topic_arg(request), _channel_arg(request)
        text = request.query.get("n", "10")
        if not text.isdigit() or not 1 <= int(text) <= 1000:
            raise ApiError(400, "INVALID_N")
        _, rows, partial, known, _ = await self._topic_rows(topic, channel)
        if not known and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        calls = [
            (row["node"], part)
            for row in rows
            for part in ([p["partition"] for p in row["partitions"]] or [0])
        ]
        found = await asyncio.gather(
            *(self._peek_one(node, part, topic, channel, text) for node, part in calls)
        )
        peeks = [f for f in found if f is not None]
        if not peeks and not partial.errors:
            raise ApiError(404, "CHANNEL_NOT_FOUND")  # (every node said so, as nsqd does)
        return _answer(partial, peeks=peeks)

    async def channel_config(self, request: web.Request) -> web.Response:
        """GET /api/topics/:topic/:channel/config (nsqx): the channel's policy on each
        node that has it (nsqd's /channel/config); Go's nsqd has none (an error row)."""
        topic, channel = _topic_arg(request), _channel_arg(request)
        _, rows, partial, known, _ = await self._topic_rows(topic, channel)
        if not known and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        query = urlencode({"topic": topic, "channel": channel}, quote_via=quote)

        async def one(node: str) -> dict[str, Any] | None:
            try:
                doc = await self.ci.get_json(f"{http_base(node)}/channel/config?{query}")
            except UpstreamError as err:
                if "CHANNEL_NOT_FOUND" in str(err):
                    return None
                return {"node": node, "error": str(err)}
            return {"node": node, **doc}

        found = await asyncio.gather(*(one(row["node"]) for row in rows))
        configs = [f for f in found if f is not None]
        if not configs and not partial.errors:
            raise ApiError(404, "CHANNEL_NOT_FOUND")  # (every node said so, as nsqd does)
        return _answer(partial, configs=configs)

    async def _peek_one(
        self, node: str, part: int, topic: str, channel: str, n: str
    ) -> dict[str, Any] | None:
        """One node's partition: its peek, or the error (None: no such channel there)."""
        query = {"topic": topic, "channel": channel, "partition": str(part), "n": n}
        url = f"{http_base(node)}/channel/peek?{urlencode(query, quote_via=quote)}"
        head: dict[str, Any] = {"node": node, "partition": part}
        try:
            doc = await self.ci.get_json(url)
        except UpstreamError as err:
            if "CHANNEL_NOT_FOUND" in str(err):
                return None
            # (an nsqd without peek, such as Go's, answers 404 page not found)
            return head | {"error": str(err), "messages": []}
        keep = ("paused", "depth", "in_flight_count", "deferred_count", "messages")
        return head | {k: doc.get(k) for k in keep}

    async def nodes(self, request: web.Request) -> web.Response:
        producers, partial = await self.ci.producers()
        nodes = [p.to_json() for p in producers]
        health, more = await self._health(producers)
        partial.extend(more)
        for node, text in zip(nodes, health, strict=True):
            node["health"] = text
            self._add_tombstones(node)
        listed = {f"{n['broadcast_address']}:{n['http_port']}" for n in nodes}
        for down in partial.down:
            if down["node"] in listed or not self.ci.nsqd:
                continue
            # an nsqd of --nsqd-http-address that did not answer: a row saying so
            host, _, port = down["node"].rpartition(":")
            nodes.append(
                Producer(down["node"], host.strip("[]"), 0, int(port or 0), "").to_json()
                | {"health": f"NOT ANSWERING: {down['error']}"}
            )
        return _answer(partial, nodes=nodes)

    def _add_tombstones(self, node: dict[str, Any]) -> None:
        """Mark the topics this admin tombstoned on the node (lookupd forgets them)."""
        address = f"{node['broadcast_address']}:{node['http_port']}"
        mine = self.admin.tombstones_of(address)
        if not mine:
            return
        topics = {t["topic"]: t for t in node["topics"]}
        for topic in mine:
            if topic in topics:
                topics[topic]["tombstoned"] = True
            else:
                node["topics"].append({"topic": topic, "tombstoned": True})
        node["topics"].sort(key=lambda t: t["topic"])

    async def _health(self, producers: list[Producer]) -> tuple[list[str], Partial]:
        """Each nsqd's ``/ping``: ``OK``, its error, or ``NOT ANSWERING: ...``."""
        partial = Partial()

        async def one(p: Producer) -> str:
            url = f"http://{p.http_address}/ping"
            try:
                status, text = await self.ci.ask(p.http_address, lambda: self.ci.get_text(url))
            except UpstreamError as err:
                if err.unreachable:
                    partial.down.append(self.ci.down_entry(err, p.http_address, p.hostname))
                    return f"NOT ANSWERING: {err}"
                return f"UNREACHABLE: {err}"
            return text.strip() if status == 200 else f"{status} {text.strip()}"[:200]

        return list(await asyncio.gather(*(one(p) for p in producers))), partial

    async def node(self, request: web.Request) -> web.Response:
        node = _node_arg(request)
        producers, partial = await self.ci.producers()
        producer = next((p for p in producers if p.http_address == node), None)
        if producer is None:
            raise ApiError(404, "NODE_NOT_FOUND")
        rows, more = await self.ci.node_stats([producer], include_clients=True, none_is_error=False)
        partial.extend(more)
        clients = [
            c | {"topic_name": r["topic_name"], "channel_name": ch["channel_name"]}
            for r in rows
            for ch in r["channels"]
            for c in ch["clients"]
        ]
        clients.sort(key=lambda c: (str(c.get("hostname", "")), str(c.get("client_id", ""))))
        total_messages = sum(r["message_count"] for r in rows)
        info = producer.to_json()
        self._add_tombstones(info)
        return _answer(
            partial,
            node=node,
            hostname=producer.hostname,
            version=producer.version,
            remote_addresses=producer.remote_addresses,
            tombstones=[t["topic"] for t in info["topics"] if t["tombstoned"]],
            topics=rows,
            clients=clients,
            total_messages=total_messages,
            total_clients=len(clients),
        )

    async def lookupds(self, request: web.Request) -> web.Response:
        async def one(addr: str) -> dict[str, Any]:
            out: dict[str, Any] = {"address": addr, "version": "", "health": ""}
            base = http_base(addr)
            try:
                info = await self.ci.ask(addr, lambda: self.ci.get_json(f"{base}/info"))
                out["version"] = str(info.get("version", "")) if isinstance(info, dict) else ""
                status, text = await self.ci.ask(addr, lambda: self.ci.get_text(f"{base}/ping"))
                out["health"] = text.strip() if status == 200 else f"{status} {text.strip()}"
            except UpstreamError as err:
                word = "NOT ANSWERING" if err.unreachable else "UNREACHABLE"
                out["health"] = f"{word}: {err}"
            return out

        found = await asyncio.gather(*(one(a) for a in self.ci.lookupd))
        return _answer(lookupds=list(found))

    async def counter(self, request: web.Request) -> web.Response:
        producers, partial = await self.ci.producers()
        rows, more = await self.ci.node_stats(producers, include_clients=False)
        partial.extend(more)
        stats: dict[str, dict[str, Any]] = {}
        for row in rows:
            for ch in row["channels"]:
                key = f"{row['topic_name']}:{ch['channel_name']}:{row['node']}"
                entry = stats.setdefault(
                    key,
                    {
                        "node": row["node"],
                        "topic_name": row["topic_name"],
                        "channel_name": ch["channel_name"],
                        "message_count": 0,
                    },
                )
                entry["message_count"] += ch["message_count"]
        return _answer(partial, stats=stats)

    async def history(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        channel = request.query.get("channel", "")
        if not is_valid_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        return _answer(now=time.time(), **self.admin.history.series(topic, channel))

    # -- actions -------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        body = await _body(request)
        topic, channel = _str_field(body, "topic"), _str_field(body, "channel")
        if not is_valid_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise ApiError(400, "INVALID_CHANNEL")
        partition_num = body.get("partition_num", 0) or 0
        if isinstance(partition_num, str) and partition_num.isdigit():
            partition_num = int(partition_num)
        if (
            isinstance(partition_num, bool)
            or not isinstance(partition_num, int)
            or not 0 <= partition_num <= 255
        ):
            raise ApiError(400, "INVALID_PARTITION_NUM")
        partial = Partial()
        if self.ci.lookupd:
            query = {"topic": topic}
            if partition_num:
                # nsqlookupd places the partitions on its nodes (Youzan's extension);
                # multipart lets it put several on one node when nodes are few
                query |= {
                    "partition_num": str(partition_num),
                    "replicator": "1",
                    "multipart": "true",
                }
            result = await self.ci.post_lookupds("topic/create", query)
            self._all_failed(result, len(self.ci.lookupd))
            partial.extend(result)
            if channel:
                q = {"topic": topic, "channel": channel}
                result = await self.ci.post_lookupds("channel/create", q)
                partial.extend(result)
                producers, more = await self.ci.topic_producers(topic)
                partial.extend(more)
                nodes = [p.http_address for p in producers]
                partial.extend(await self.ci.post_nodes(nodes, "channel/create", q))
        else:
            # nsqadmin without lookupd creates nothing; nsqx creates it on every nsqd
            if partition_num:
                raise ApiError(400, "PARTITIONS_NEED_LOOKUPD")
            producers, partial = await self.ci.producers()
            nodes = [p.http_address for p in producers]
            partial.extend(
                await self._node_action(topic, "topic/create", {"topic": topic}, nodes=nodes)
            )
            if channel:
                q = {"topic": topic, "channel": channel}
                partial.extend(await self._node_action(topic, "channel/create", q, nodes=nodes))
        self.notify(request, "create_topic", topic)
        if channel:
            self.notify(request, "create_channel", topic, channel)
        return _answer(partial)

    async def topic_action(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic = _topic_arg(request)
        body = await _body(request)
        action = _str_field(body, "action")
        if action not in ("pause", "unpause", "empty"):
            raise ApiError(400, "INVALID_ACTION")
        producers, partial = await self.ci.topic_producers(topic)
        if not producers and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        nodes = [p.http_address for p in producers]
        partial.extend(
            await self._node_action(topic, f"topic/{action}", {"topic": topic}, nodes=nodes)
        )
        self.notify(request, f"{action}_topic", topic)
        return _answer(partial)

    async def channel_action(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic, channel = _topic_arg(request), _channel_arg(request)
        body = await _body(request)
        action = _str_field(body, "action")
        if action == "setoffset":
            return await self._setoffset(request, topic, channel, body)
        query = {"topic": topic, "channel": channel}
        if action == "config":
            # (nsqx: dead letters, TTL, limits; each node checks the values)
            settings = body.get("settings")
            if not isinstance(settings, dict) or not all(
                isinstance(k, str) and k not in query and isinstance(v, str | int)
                for k, v in settings.items()
            ):
                raise ApiError(400, "INVALID_SETTINGS")
            query |= {k: str(v) for k, v in settings.items()}
            # every node with the topic, a replicated partition's followers too (lookupd
            # lists its leaders only): the policy must be there when one of them leads
            everyone, partial = await self.ci.producers()
            nodes = [p.http_address for p in everyone if any(t == topic for t, _ in p.topics)]
            result = await self._node_action(topic, "channel/config", query, nodes=nodes or None)
            partial.extend(result)
            self.notify(request, "config_channel", topic, channel)
            return _answer(partial)
        elif action == "replay_dead_letters":
            return await self._replay_dead_letters(request, topic, channel)
        elif action in ("pause", "unpause", "empty"):
            path = f"channel/{action}"
        else:
            raise ApiError(400, "INVALID_ACTION")
        producers, partial = await self.ci.topic_producers(topic)
        if not producers and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        nodes = [p.http_address for p in producers]
        partial.extend(await self._node_action(topic, path, query, nodes=nodes))
        self.notify(request, f"{action}_channel", topic, channel)
        return _answer(partial)

    async def _replay_dead_letters(
        self, request: web.Request, topic: str, channel: str
    ) -> web.Response:
        """Each nsqd that has the topic replays the channel's dead letters: the answer has
        their counts added up (``replayed``, ``missing``, ``scanned``, as nsqd's) and
        each node's own answer (``nodes``)."""
        producers, partial = await self.ci.topic_producers(topic)
        if not producers and not partial.errors:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        nodes = [p.http_address for p in producers]
        answers, result = await self.ci.post_nodes_answers(
            nodes, "channel/deadletter/replay", {"topic": topic, "channel": channel}
        )
        # nodes without the channel (it is on the others) are no failure
        refused = [e for e in result.errors if _NO_CHANNEL not in e]
        if nodes and not answers:
            self._all_failed(result, len(nodes))
        partial.extend(refused)
        totals: dict[str, int] = {}
        for answer in answers.values():
            for key, value in (answer if isinstance(answer, dict) else {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
        per_node = [
            {"node": node, **(answer if isinstance(answer, dict) else {})}
            for node, answer in sorted(answers.items())
        ]
        self.notify(request, "replay_dead_letters_channel", topic, channel)
        return _answer(partial, **totals, nodes=per_node)

    async def _setoffset(
        self, request: web.Request, topic: str, channel: str, body: dict[str, Any]
    ) -> web.Response:
        """Move a channel to a time, an offset, a count or the end (Youzan's setoffset)."""
        position = _str_field(body, "position")
        if not _POSITION_RE.match(position):
            raise ApiError(400, "INVALID_POSITION")
        wanted = body.get("partition")
        if wanted in (None, ""):
            wanted = None
        elif isinstance(wanted, str) and wanted.isdigit():
            wanted = int(wanted)
        if wanted is not None and (
            isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted <= 1023
        ):
            raise ApiError(400, "INVALID_PARTITION")
        producers, rows, partial, _, num = await self._topic_rows(topic)
        missing = self._missing_partitions(topic, num, rows, producers, partial)
        calls: list[tuple[str, int]] = []
        for row in rows:
            parts = [p["partition"] for p in row["partitions"]] or [0]
            for part in parts:
                if wanted is None or part == wanted:
                    calls.append((row["node"], part))
        lost = [m for m in missing if wanted is None or m["partition"] == wanted]
        if not calls and lost:
            raise UpstreamError("; ".join(_missing_text(m) for m in lost))
        if not calls:
            raise ApiError(404, "PARTITION_NOT_FOUND")
        # a partition that no answering node has is not moved: say so
        partial.errors.extend(f"not reset: {_missing_text(m)}" for m in lost)
        result = Partial()
        for node, part in calls:
            query = {"topic": topic, "channel": channel, "partition": str(part)}
            one = await self.ci.post_nodes([node], "channel/setoffset", query, position.encode())
            result.extend([_explain_setoffset(e) for e in one.errors])
        self._all_failed(result, len(calls))
        partial.extend(result)
        self.notify(request, "setoffset_channel", topic, channel)
        return _answer(partial)

    async def delete_topic(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic = _topic_arg(request)
        # the producers first: lookupd forgets them once the topic is deleted there
        producers, partial = await self.ci.topic_producers(topic)
        if self.ci.lookupd:
            partial.extend(await self.ci.post_lookupds("topic/delete", {"topic": topic}))
        nodes = [p.http_address for p in producers]
        partial.extend(
            await self._node_action(topic, "topic/delete", {"topic": topic}, nodes=nodes)
        )
        self.ci.forget_topic(topic)
        self.notify(request, "delete_topic", topic)
        return _answer(partial)

    async def delete_channel(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        topic, channel = _topic_arg(request), _channel_arg(request)
        producers, partial = await self.ci.topic_producers(topic)
        query = {"topic": topic, "channel": channel}
        if self.ci.lookupd:
            partial.extend(await self.ci.post_lookupds("channel/delete", query))
        nodes = [p.http_address for p in producers]
        partial.extend(await self._node_action(topic, "channel/delete", query, nodes=nodes))
        self.notify(request, "delete_channel", topic, channel)
        return _answer(partial)

    async def tombstone(self, request: web.Request) -> web.Response:
        self.require_admin(request)
        node = _node_arg(request)
        body = await _body(request)
        topic = _str_field(body, "topic")
        if not is_valid_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        partial = Partial()
        if self.ci.lookupd:
            result = await self.ci.post_lookupds("topic/tombstone", {"topic": topic, "node": node})
            self._all_failed(result, len(self.ci.lookupd))
            partial.extend(result)
        self.admin.tombstoned(topic, node)
        # then the topic goes from that node, as nsqadmin does
        partial.extend(await self.ci.post_nodes([node], "topic/delete", {"topic": topic}))
        self.notify(request, "tombstone_topic_producer", topic, node=node)
        return _answer(partial)

    # -- /config -------------------------------------------------------------------------

    async def config(self, request: web.Request) -> web.Response:
        opts = self.admin.options
        if opts.allow_config_from_cidr:
            net = ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
            try:
                remote = ipaddress.ip_address(request.remote or "")
            except ValueError:
                raise ApiError(400, "INVALID_REMOTE_ADDR") from None
            if remote not in net:
                raise ApiError(403, "FORBIDDEN")
        opt = request.match_info["opt"]
        if request.method == "PUT":
            raw = await request.read()
            if not raw:
                raise ApiError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    value = json.loads(raw)
                except (ValueError, UnicodeDecodeError):
                    raise ApiError(400, "INVALID_VALUE") from None
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ApiError(400, "INVALID_VALUE")
                opts.nsqlookupd_http_addresses = value
                self.ci.lookupd = list(value)
            elif opt == "log_level":
                level = raw.decode("utf-8", "replace").strip().lower()
                if level not in _LOG_LEVELS:
                    raise ApiError(400, "INVALID_VALUE")
                opts.log_level = level
                logging.getLogger("nsqx").setLevel(_LOG_LEVELS[level])
            else:
                raise ApiError(400, "INVALID_OPTION")
        if opt not in _CONFIG_OPTS:
            raise ApiError(400, "INVALID_OPTION")
        value = getattr(opts, _CONFIG_OPTS[opt])
        if isinstance(value, float) and opt in _DURATION_OPTS:
            value = round(value * 1e9)  # Go's time.Duration: nanoseconds
        return _json(value)


_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}
#: /config names -> AdminOptions fields (NSQ's config-file names)
_CONFIG_OPTS = {
    name: name
    for name in (
        "log_level",
        "log_prefix",
        "http_address",
        "base_path",
        "graphite_url",
        "proxy_graphite",
        "statsd_prefix",
        "statsd_counter_format",
        "statsd_gauge_format",
        "statsd_interval",
        "nsqlookupd_http_addresses",
        "nsqd_http_addresses",
        "http_client_connect_timeout",
        "http_client_request_timeout",
        "http_client_tls_insecure_skip_verify",
        "http_client_tls_root_ca_file",
        "http_client_tls_cert",
        "http_client_tls_key",
        "allow_config_from_cidr",
        "notification_http_endpoint",
        "acl_http_header",
        "admin_users",
        "history_interval",
        "history_length",
        "refresh_interval",
        "node_timeout",
    )
}
_DURATION_OPTS = {
    "statsd_interval",
    "http_client_connect_timeout",
    "http_client_request_timeout",
    "history_interval",
    "history_length",
    "refresh_interval",
    "node_timeout",
}


def _missing_text(m: dict[str, Any]) -> str:
    """A missing partition in words, for warnings."""
    where = f"last on {m['hostname'] or m['node']} ({m['node']})" if m["node"] else "never seen"
    why = {
        "not_answering": "its node is not answering",
        "not_on_node": "its node no longer has it",
        "not_listed": "its node is not in the cluster now",
    }.get(m["reason"], "no node has it")
    return f"partition {m['partition']} is missing: {why}, {where}"


def _explain_setoffset(error: str) -> str:
    if ": 404 NOT_FOUND" in error:
        return f"{error} (this nsqd has no /channel/setoffset: NSQ 1.3 cannot reset a channel)"
    return error


def make_app(admin: NSQAdmin) -> web.Application:
    """The admin's aiohttp application, every route under ``--base-path``."""
    h = _Handlers(admin)
    app = web.Application(
        middlewares=[_errors, *upstream_auth.middleware(admin.options.http_auth_forward)],
        client_max_size=MAX_BODY,
    )
    base = admin.options.base_path.rstrip("/")

    def bp(path: str) -> str:
        return base + path

    r = app.router
    for page in (
        "/",
        "/topics",
        "/topics/{topic}",
        "/topics/{topic}/{channel}",
        "/nodes",
        "/nodes/{node}",
        "/counter",
        "/lookup",
    ):
        r.add_get(bp(page) if page != "/" or not base else base + "/", h.index)
    if base:
        r.add_get(base, h.index)
    r.add_get(bp("/ping"), h.ping)
    r.add_get(bp("/api/topics"), h.topics)
    r.add_post(bp("/api/topics"), h.create)
    r.add_get(bp("/api/topics/{topic}"), h.topic)
    r.add_post(bp("/api/topics/{topic}"), h.topic_action)
    r.add_delete(bp("/api/topics/{topic}"), h.delete_topic)
    r.add_get(bp("/api/topics/{topic}/{channel}"), h.channel)
    r.add_post(bp("/api/topics/{topic}/{channel}"), h.channel_action)
    r.add_get(bp("/api/topics/{topic}/{channel}/peek"), h.channel_peek)
    r.add_get(bp("/api/topics/{topic}/{channel}/config"), h.channel_config)
    r.add_delete(bp("/api/topics/{topic}/{channel}"), h.delete_channel)
    r.add_get(bp("/api/nodes"), h.nodes)
    r.add_get(bp("/api/nodes/{node}"), h.node)
    r.add_delete(bp("/api/nodes/{node}"), h.tombstone)
    r.add_get(bp("/api/counter"), h.counter)
    r.add_get(bp("/api/history"), h.history)
    r.add_get(bp("/api/lookupds"), h.lookupds)
    r.add_get(bp("/config/{opt}"), h.config)
    r.add_put(bp("/config/{opt}"), h.config)
    static = Path(admin.options.dev_static_dir) if admin.options.dev_static_dir else h.static_dir
    r.add_static(bp("/static"), static)
    app["started"] = time.time()
    return app
