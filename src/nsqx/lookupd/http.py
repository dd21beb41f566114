"""nsqlookupd's HTTP API (aiohttp): discovery for consumers, administration for operators.

Routes, status codes, JSON shapes and error texts are NSQ 1.3's: no response envelope
(an ``Accept: application/vnd.nsq; version=1.0`` header is accepted and changes nothing),
``{"message": "CODE"}`` for errors, 404 NOT_FOUND for an unknown path and 405
METHOD_NOT_ALLOWED (with ``Allow``) for a known path with the wrong method, and a
redirect for a path that differs from a route only by a trailing slash or letter case,
as Go's httprouter does. Parameters come from the URL's query string only, as in NSQ.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.lookupd.lookup_protocol_v1 import format_address
from nsqx.lookupd.registration_db import (
    CHANNEL,
    CLIENT,
    TOPIC,
    Producer,
    Registration,
    filter_active,
)
from nsqx.wire.names import is_valid_name

if TYPE_CHECKING:
    from nsqx.lookupd.nsqlookupd import NSQLookupd

log = logging.getLogger("nsqx.lookupd")

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
_V1_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
#: What Go's ``time.Time{}.UnixNano()`` returns: /debug shows it for "never tombstoned".
GO_ZERO_TIME_UNIX_NANO = -6795364578871345152


class HTTPError(Exception):
    """An API error: HTTP status and NSQ's message code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def go_json(obj: Any) -> bytes:
    """JSON as Go's encoding/json writes it: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text.encode()


def respond_v1(status: int, data: Any) -> web.Response:
    """NSQ's RespondV1: text as is, None as an empty body, anything else as JSON."""
    headers = dict(_V1_HEADERS)
    if status != 200:
        headers["Content-Type"] = JSON_CONTENT_TYPE
        return web.Response(status=status, body=go_json({"message": str(data)}), headers=headers)
    if data is None:
        return web.Response(status=200, body=b"", headers=headers)
    if isinstance(data, str):
        return web.Response(status=200, body=data.encode(), headers=headers)
    headers["Content-Type"] = JSON_CONTENT_TYPE
    return web.Response(status=200, body=go_json(data), headers=headers)


# --- query strings, as Go's url.ParseQuery reads them ----------------------------------

_HEX = "0123456789abcdefABCDEF"


def _unescape(s: str) -> str:
    """Go's url.QueryUnescape: '+' is a space, '%XX' a byte; a bad escape is an error."""
    if "%" not in s and "+" not in s:
        return s
    out = bytearray()
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "%":
            if i + 2 >= n:
                raise ValueError("invalid URL escape")
            hi, lo = s[i + 1], s[i + 2]
            if hi not in _HEX or lo not in _HEX:
                raise ValueError("invalid URL escape")
            out.append(int(hi + lo, 16))
            i += 3
        elif ch == "+":
            out.append(0x20)
            i += 1
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", errors="replace")


def parse_query(raw: str) -> dict[str, list[str]]:
    """Parse a raw query string like Go's url.ParseQuery; ValueError where Go errs.

    Pairs are split on '&' only; a ';' or a bad escape is an error (Go keeps parsing
    the other pairs but reports the error, which NSQ turns into INVALID_REQUEST).
    """
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = error or "invalid semicolon separator in query"
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            k, v = _unescape(key), _unescape(value)
        except ValueError as e:
            error = error or str(e)
            continue
        values.setdefault(k, []).append(v)
    if error is not None:
        raise ValueError(error)
    return values


class Params:
    """A request's query parameters; ``get`` gives the first value, as NSQ's ReqParams."""

    def __init__(self, request: web.Request) -> None:
        try:
            self.values = parse_query(request.rel_url.raw_query_string)
        except ValueError:
            raise HTTPError(400, "INVALID_REQUEST") from None

    def get(self, key: str) -> str | None:
        v = self.values.get(key)
        return v[0] if v else None

    def topic(self) -> str:
        """The ``topic`` parameter (any value, even empty); MISSING_ARG_TOPIC if absent."""
        topic = self.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return topic

    def topic_channel(self) -> tuple[str, str]:
        """Valid ``topic`` and ``channel``, checked in NSQ's order."""
        topic = self.topic()
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = self.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel


Handler = Callable[[web.Request], Awaitable[Any]]


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
        }
        self._lower = {path.lower(): path for path in self.routes}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
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
            try:
                data = await handler(request)
            except HTTPError as err:
                return respond_v1(err.status, err.message)
            except Exception:
                # Go's panic handler answers the same way
                log.exception("panic in HTTP handler")
                return respond_v1(500, "INTERNAL_ERROR")
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
        topic = Params(request).topic()
        return {"channels": [k.subkey for k in self.db.find_registrations(CHANNEL, topic, "*")]}

    async def lookup(self, request: web.Request) -> dict[str, Any]:
        topic = Params(request).topic()
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
        return {"channels": channels, "producers": [_peer_info(p) for p in producers]}

    async def create_topic(self, request: web.Request) -> None:
        topic = Params(request).topic()
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))

    async def delete_topic(self, request: web.Request) -> None:
        topic = Params(request).topic()
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
        for p in self.db.find_producers(TOPIC, topic, ""):
            if f"{p.peer.info.broadcast_address}:{p.peer.info.http_port}" == node:
                p.tombstone(now)

    async def create_channel(self, request: web.Request) -> None:
        topic, channel = Params(request).topic_channel()
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration(CHANNEL, topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration(TOPIC, topic, ""))

    async def delete_channel(self, request: web.Request) -> None:
        topic, channel = Params(request).topic_channel()
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
            for t in topics:
                tp = self.db.producer(Registration(TOPIC, t, ""), peer.id)
                tombstones.append(tp is not None and tp.is_tombstoned(lifetime, now))
            node = _peer_info(p)
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return {"producers": nodes}

    async def debug(self, request: web.Request) -> dict[str, Any]:
        data: dict[str, list[dict[str, Any]]] = {}
        for key, producers in self.db.items():
            for p in producers:
                info = p.peer.info
                # keys sorted, as Go marshals a map
                data.setdefault(str(key), []).append(
                    {
                        "broadcast_address": info.broadcast_address,
                        "hostname": info.hostname,
                        "http_port": info.http_port,
                        "id": p.peer.id,
                        "last_update": p.peer.last_update,
                        "tcp_port": info.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": p.tombstoned_at
                        if p.tombstoned
                        else GO_ZERO_TIME_UNIX_NANO,
                        "version": info.version,
                    }
                )
        return dict(sorted(data.items()))
