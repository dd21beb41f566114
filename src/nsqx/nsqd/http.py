"""nsqd's HTTP API (NSQ 1.3): publish, administer topics and channels, stats, config.

A thin aiohttp shell over the same NSQD objects the TCP protocol uses: /pub and /mpub
publish through :meth:`Topic.publish`, exactly as PUB and MPUB do. Routing is one dict
lookup so that paths, methods and errors behave as NSQ's router does: 404 NOT_FOUND for
an unknown path, 405 METHOD_NOT_ALLOWED (with ``Allow``) for a known path and another
method. Every response carries ``X-NSQ-Content-Type: nsq; version=1.0``; errors are
``{"message":"CODE"}``; the 0.x response envelope is gone and the Accept header is ignored.

In a worker of a node (``--workers``), a request is first routed
(nsqx.nsqd.workers.http_routes): to its partition's owner, to every worker, or
gathered from every worker and merged here into one node's /stats, /metrics or /ping.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus, urlencode

from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.compiled import build_description
from nsqx.nsqd import dead_letters as dl
from nsqx.nsqd import http_auth, http_params
from nsqx.nsqd import peek as pk
from nsqx.nsqd import stats as st
from nsqx.nsqd.channel_policy import FORMAT_EXT, ChannelPolicy, PolicyError
from nsqx.nsqd.guid import PARTITION_SHIFT, SEQ_MASK
from nsqx.nsqd.http_auth import guarded
from nsqx.nsqd.metrics import Metrics, merge_exposition
from nsqx.nsqd.options import split_address
from nsqx.nsqd.replication.leader import CommitFailed
from nsqx.nsqd.replication.replica import StaleEpoch
from nsqx.nsqd.replication.state import ReplicaRole
from nsqx.nsqd.workers import http_routes as wr
from nsqx.nsqd.workers.forwarding import V_DPUB, V_MPUB, V_PUB, Ticket
from nsqx.nsqd.workers.http_handoff import FirstRequest, FirstRequestSite
from nsqx.store.log import MessageLog, RangeFramesOut
from nsqx.wire import members
from nsqx.wire import replication as rp
from nsqx.wire.commands import parse_consume_start, parse_mpub_body
from nsqx.wire.errors import E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, ProtocolError
from nsqx.wire.frames import ATTEMPTS_AT, ID_AT, ID_END, TIMESTAMP_AT, record_parts
from nsqx.wire.names import is_valid_name
from nsqx.wire.range import encode_range_frames
from nsqx.wire.topic_meta import TopicMeta

if TYPE_CHECKING:
    import ssl

    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition
    from nsqx.nsqd.topic import Topic

log = logging.getLogger("nsqx.nsqd")

NSQ_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json; charset=utf-8"

#: Options of NsqdOptions that are durations (seconds here, nanoseconds in /config).
DURATION_OPTIONS = frozenset(
    {
        "http_client_connect_timeout",
        "http_client_request_timeout",
        "sync_timeout",
        "msg_timeout",
        "max_msg_timeout",
        "max_req_timeout",
        "max_dpub_timeout",
        "max_heartbeat_interval",
        "max_output_buffer_timeout",
        "min_output_buffer_timeout",
        "output_buffer_timeout",
        "statsd_interval",
        "e2e_processing_latency_window_time",
    }
)
#: NsqdOptions attributes that are no flag in NSQ, so /config does not know them.
_HIDDEN_OPTIONS = frozenset({"queue_scan_interval", "client_timeout", "node_id", "cluster_secret"})
#: config names that differ from the attribute name
_CONFIG_ALIASES = {"id": "node_id"}
#: NSQ's LogLevel values (lg.DEBUG=1 ... lg.FATAL=5): /config shows the number
_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}

#: options that are Go integer enums in NSQ, shown as NSQ shows them
_GO_ENUMS: dict[str, dict[Any, Any]] = {
    "tls_required": {"false": 0, "tcp-https": 1, "true": 2},
    "tls_min_version": {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304},
}

#: How long the body of a refused request is read and discarded before closing.
LINGER_SECONDS = 0.5

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_INT = re.compile(r"[+-]?[0-9]+")
#: what names the channel in /channel/config (the rest are its settings)
_CHANNEL_KEYS = frozenset({"topic", "channel", "partition"})


#: how long POST /partition/role waits for a new leadership's confirmation (seconds)
CONFIRM_WAIT = 1.0


#: publishes a worker sends to their partition's owner over the link (not as HTTP)
_LINK_PUBLISHES = frozenset({"/pub", "/mpub"})
#: (as a request line has them: nsqx.nsqd.workers.http_handoff)
_LINK_PUBLISH_PATHS = frozenset(p.encode() for p in _LINK_PUBLISHES)


@dataclass(frozen=True, slots=True)
class _HttpPublish:
    """An HTTP publish, read and checked: its topic, body as sent, messages, defer and
    partition (-1: none named)."""

    topic: str
    raw: bytes
    bodies: list[bytes]
    defer_ms: int
    partition: int


class HTTPError(Exception):
    """An API error: the status and NSQ's message code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _respond(status: int, body: bytes, content_type: str | None) -> web.Response:
    headers = dict(NSQ_HEADERS)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return web.Response(status=status, body=body, headers=headers)


def ok_text(text: str | bytes = b"OK") -> web.Response:
    """A 200 plain-text answer (``OK``, the text /stats)."""
    return _respond(200, text.encode() if isinstance(text, str) else text, _TEXT)


def ok_json(data: Any) -> web.Response:
    """A 200 JSON answer, compact as Go's encoding/json writes it."""
    return _respond(200, json.dumps(data, separators=(",", ":")).encode(), _JSON)


def ok_empty() -> web.Response:
    """NSQ's answer to a successful action: 200 and no body."""
    return _respond(200, b"", None)


def _as_response(answer: wr.Answer) -> web.Response:
    """Another worker's answer, as it came."""
    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


def error_response(status: int, message: str) -> web.Response:
    body = json.dumps({"message": message}, separators=(",", ":")).encode()
    return _respond(status, body, _JSON)


def parse_query(raw: str) -> dict[str, list[str]]:
    """Go's url.ParseQuery: bad %-escapes and ``;`` are errors (400 INVALID_REQUEST)."""
    params: dict[str, list[str]] = {}
    if not raw:
        return params
    if "%" not in raw and "+" not in raw and ";" not in raw:
        # the usual query (?topic=name): nothing to decode
        for part in raw.split("&"):
            if part:
                key, _, value = part.partition("=")
                params.setdefault(key, []).append(value)
        return params
    if ";" in raw or _BAD_ESCAPE.search(raw):
        raise HTTPError(400, "INVALID_REQUEST")
    for part in raw.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            k = unquote_plus(key, errors="strict")
            v = unquote_plus(value, errors="strict")
        except UnicodeDecodeError:
            raise HTTPError(400, "INVALID_REQUEST") from None
        params.setdefault(k, []).append(v)
    return params


async def read_limited(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request body, or None as soon as it proves longer than ``limit`` bytes.

    Reads chunk by chunk, so an oversized body is refused without being held whole.
    """
    content = request.content
    length = request.content_length
    if length == 0:
        return b""
    if length is not None and length <= limit:
        # the usual case: the length is known and allowed, read it in one call
        try:
            return await content.readexactly(length)
        except asyncio.IncompleteReadError:
            raise HTTPError(400, "INVALID_REQUEST") from None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def _too_big(message: str) -> web.Response:
    resp = error_response(413, message)
    # the rest of the body was not read: do not reuse the connection
    resp.force_close()
    return resp


# StreamResponse: /range streams its body, /replication/stream is a WebSocket
Handler = Callable[
    ["HTTPServer", web.BaseRequest, dict[str, list[str]]], Awaitable[web.StreamResponse]
]


class HTTPServer:
    """The HTTP API of one NSQD; :meth:`start` binds it, :meth:`close` stops it.

    The same instance can serve several sites (HTTP and, given an SSL context, HTTPS).
    """

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self._runner: web.ServerRunner | None = None
        self._sites: list[web.BaseSite] = []
        self._unix_paths: list[str] = []
        self._metrics: Metrics | None = None  # made on the first scrape
        #: --http-admin-allow, parsed on first use
        self._admin_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None = None
        workers = nsqd.workers
        #: a worker's routing of requests to the other workers (None: a single process)
        self._router = wr.HttpRouter(workers) if workers is not None else None
        #: the port of this worker's own loopback listener (0: none)
        self._internal_port = (
            workers.spec.internal_http_ports[workers.index]
            if workers is not None and workers.spec.internal_http_ports
            else 0
        )

    # -- lifecycle --------------------------------------------------------------------

    async def start(
        self, address: str, ssl_context: ssl.SSLContext | None = None
    ) -> tuple[str, int] | None:
        """Listen on ``host:port`` (port 0: any free one) or a unix socket path.

        Returns the bound (host, port), or None for a unix socket.
        """
        scheme = "HTTPS" if ssl_context is not None else "HTTP"
        if "/" in address:
            runner = await self._started_runner()
            site: web.BaseSite = web.UnixSite(runner, address, ssl_context=ssl_context)
            await site.start()
            self._sites.append(site)
            self._unix_paths.append(address)
            log.info("%s: listening on %s", scheme, address)
            return None
        host, port = split_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        return await self.start_socket(sock, ssl_context)

    async def start_socket(
        self,
        sock: socket.socket,
        ssl_context: ssl.SSLContext | None = None,
        *,
        node_address: bool = False,
    ) -> tuple[str, int]:
        """Serve on a bound socket (a worker's, inherited from its supervisor).

        ``node_address``: the node's plain HTTP address, where a connection whose first
        request publishes to another worker's partition moves there
        (nsqx.nsqd.workers.http_handoff).
        """
        runner = await self._started_runner()
        scheme = "HTTPS" if ssl_context is not None else "HTTP"
        bound = sock.getsockname()
        handoff = self.nsqd.workers.handoff if self.nsqd.workers is not None else None
        site: web.BaseSite
        if node_address and ssl_context is None and handoff is not None:
            site = FirstRequestSite(runner, sock, self._first_request_owner, handoff, 1024)
        else:
            site = web.SockSite(runner, sock, ssl_context=ssl_context, backlog=1024)
        await site.start()
        self._sites.append(site)
        log.info("%s: listening on %s:%d", scheme, bound[0], bound[1])
        return (bound[0], bound[1])

    async def _started_runner(self) -> web.ServerRunner:
        """The one runner every listener of this API shares (made on first use)."""
        if self._runner is None:
            # An unread body (a request refused early) is drained for at most
            # LINGER_SECONDS so the client can read the answer; a 413 then closes.
            server = web.Server(self._handler(), access_log=None, lingering_time=LINGER_SECONDS)
            self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
            await self._runner.setup()
        return self._runner

    def adopted(self, first: bytes) -> Callable[[], asyncio.Protocol] | None:
        """The protocol factory for an HTTP connection another worker moved here, whose
        first bytes (``first``) it read (nsqx.nsqd.workers.http_handoff); None while
        this API is closed."""
        server = self._runner.server if self._runner is not None else None
        if server is None:
            return None
        return lambda: FirstRequest(server, None, None, first)

    def _first_request_owner(self, line: bytes) -> int:
        """The worker that owns what the request line ``line`` publishes to, when that
        is another worker (else -1: answered here)."""
        router = self._router
        method, _, rest = line.partition(b" ")
        if router is None or method != b"POST":
            return -1
        target, _, _version = rest.partition(b" ")
        path, _, query = target.partition(b"?")
        if path not in _LINK_PUBLISH_PATHS:
            return -1
        try:
            params = parse_query(query.decode("latin-1"))
        except HTTPError:
            return -1  # its error, where it arrived
        r = wr.route(router.workers, path.decode(), "POST", params)
        if r.kind == wr.OWNER and r.worker != router.index:
            return r.worker
        return -1

    async def close(self) -> None:
        """Stop listening and close connections (in-flight requests get a second)."""
        if self._router is not None:
            await self._router.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._sites.clear()
        for path in self._unix_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._unix_paths.clear()

    # -- dispatch ---------------------------------------------------------------------

    def _handler(self) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        # a worker says which worker answered; a single process pays nothing for it
        handle = self._handle if self._router is None else self._handle_in_worker
        # --http-auth (off: handle itself), judged on the parameters handlers read
        return guarded(
            handle, self.nsqd.options, self.nsqd.auth, ROUTES, parse_query, self._from_worker
        )

    async def _handle_in_worker(self, request: web.BaseRequest) -> web.StreamResponse:
        resp = await self._handle(request)
        if not resp.prepared and self._router is not None:
            resp.headers[wr.WORKER] = str(self._router.index)
        return resp

    def _from_worker(self, request: web.BaseRequest) -> bool:
        """A request another worker forwarded (it arrived on this worker's own loopback
        port, where that worker checked TLS and the client's address)."""
        if not self._internal_port or self._router is None:
            return False
        sent = request.headers.get(wr.FORWARDED, "")
        if not hmac.compare_digest(sent.encode(), self._router.workers.spec.token.encode()):
            return False
        name = request.transport.get_extra_info("sockname") if request.transport else None
        return isinstance(name, tuple) and name[1] == self._internal_port

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        methods = ROUTES.get(path)
        if methods is None and path.startswith("/config/"):
            opt = path[len("/config/") :]
            if opt and "/" not in opt:
                methods = _CONFIG_ROUTE
        if methods is None:
            return error_response(404, "NOT_FOUND")
        if (
            self.nsqd.options.tls_required == "true"
            and not request.secure
            and not self._from_worker(request)
        ):
            # --tls-required=true covers HTTP too (tcp-https leaves it open), as in NSQ
            https = self.nsqd.https_address
            body = {"message": "TLS_REQUIRED", "https_port": https[1] if https else -1}
            return web.Response(
                status=403,
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json; charset=utf-8", **NSQ_HEADERS},
            )
        handler = methods.get(request.method)
        if handler is not None and self._refused_admin(request, path):
            return error_response(403, "FORBIDDEN")
        if path in MEMBER_PATHS and not members.is_member(
            self.nsqd.options.cluster_secret, request.headers
        ):
            log.warning("HTTP: %s %s refused: not a member of the cluster", request.method, path)
            return error_response(403, members.NOT_A_MEMBER)
        if handler is None:
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
            if request.method == "OPTIONS":
                resp = ok_empty()
                resp.headers["Allow"] = allow
                return resp
            resp = error_response(405, "METHOD_NOT_ALLOWED")
            resp.headers["Allow"] = allow
            return resp
        try:
            params = parse_query(request.query_string)
            if (unknown := http_params.refusal(request.method, path, params)) is not None:
                return error_response(400, unknown)
            if self._router is not None and not self._from_worker(request):
                routed = await self._routed(self._router, request, params)
                if routed is not None:
                    return routed
            return await handler(self, request, params)
        except wr.WorkerUnavailable:
            return error_response(503, "WORKER_UNAVAILABLE")
        except HTTPError as err:
            if err.status == 413:
                return _too_big(err.message)
            return error_response(err.status, err.message)
        except Exception:
            log.exception("HTTP: %s %s failed", request.method, path)
            return error_response(500, "INTERNAL_ERROR")

    def _refused_admin(self, request: web.BaseRequest, path: str) -> bool:
        """An admin action from outside --http-admin-allow (a unix socket is local:
        its file's permissions decide)."""
        allow = self._admin_networks
        if allow is None:
            nets = self.nsqd.options.http_admin_allow
            allow = self._admin_networks = [ipaddress.ip_network(n, strict=False) for n in nets]
        if not allow:
            return False
        if path not in ADMIN_PATHS and not (
            (path.startswith("/config/") and request.method == "PUT")
            or (path == "/channel/config" and request.method == "POST")
        ):
            return False
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if self._from_worker(request):
            # the client's address, as the worker it connected to saw it (none: a unix
            # socket's client)
            sent = request.headers.get(wr.PEER)
            peer = (sent, 0) if sent else None
        if not isinstance(peer, tuple):
            return False
        try:
            ip = ipaddress.ip_address(peer[0])
        except ValueError:
            return True
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in allow):
            return False
        log.warning("HTTP: %s %s from %s refused (--http-admin-allow)", request.method, path, ip)
        return True

    # -- a node of several workers ----------------------------------------------------

    async def _routed(
        self, router: wr.HttpRouter, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.StreamResponse | None:
        """The answer to a request that another worker answers, or all of them do; None
        when this worker answers it alone (its own partition, or a request that names
        none: then the handler's own error is a single nsqd's)."""
        r = wr.route(router.workers, request.path, request.method, params)
        kind = r.kind
        if kind == wr.LOCAL or (kind == wr.OWNER and r.worker == router.index):
            return None
        if kind == wr.STATS:
            return await self._node_stats(router, request, params)
        if kind == wr.METRICS:
            answers = await self._every(router, request, b"")
            texts = [a.body.decode() for a in answers]
            return _respond(200, merge_exposition(texts), answers[0].headers.get("Content-Type"))
        if kind == wr.PING:
            answers = await self._every(router, request, b"")
            bad = next((a for a in answers if not a.ok), None)
            return ok_text() if bad is None else _as_response(bad)
        if kind == wr.INFO:
            answers = await self._every(router, request, b"")
            bad = next((a for a in answers if not a.ok), None)
            if bad is not None:
                return _as_response(bad)
            infos = [json.loads(a.body) for a in answers]
            info = infos[router.index]
            info["start_time"] = min(i["start_time"] for i in infos)
            return ok_json(info)
        if kind == wr.OWNER and request.method == "POST" and request.path in _LINK_PUBLISHES:
            read = self._read_pub if request.path == "/pub" else self._read_mpub
            pub = await read(request, params)
            self._check_publishable()
            if pub.bodies:
                return await self._publish_on_link(router, r.worker, request, pub)
            return await router.forward(r.worker, request, pub.raw)
        body = await self._body_to_forward(request)
        if kind == wr.OWNER:
            return await router.forward(r.worker, request, body)
        answers = await self._every(router, request, body)
        if request.path == "/message/trace" and any(a.ok for a in answers):
            events = [e for a in answers if a.ok for e in json.loads(a.body)["events"]]
            events.sort(key=lambda e: e.get("ts", 0))
            return ok_json({"events": events})
        return _as_response(wr.combine(answers))

    @staticmethod
    async def _every(
        router: wr.HttpRouter, request: web.BaseRequest, body: bytes, path_qs: str = ""
    ) -> list[wr.Answer]:
        headers = wr.forwarded_headers(request, router.workers.spec.token)
        return await router.every(request.method, path_qs or request.raw_path, headers, body)

    async def _body_to_forward(self, request: web.BaseRequest) -> bytes:
        """The body of a request to forward, refused as its handler refuses one too big
        (read here: it goes to each worker whole)."""
        o = self.nsqd.options
        path = request.path
        if path == "/pub":
            limit, code = o.max_msg_size, "MSG_TOO_BIG"
        elif path == "/mpub":
            limit, code = o.max_body_size, "BODY_TOO_BIG"
        elif path.startswith("/config/"):
            limit, code = o.max_msg_size, "INVALID_VALUE"
        else:
            limit, code = 1 << 20, "BODY_TOO_BIG"
        if (request.content_length or 0) > limit:
            raise HTTPError(413, code)
        body = await read_limited(request, limit)
        if body is None:
            raise HTTPError(413, code)
        return body

    async def _node_stats(
        self, router: wr.HttpRouter, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """/stats of the node: every worker's own, in JSON, merged (nsqx.nsqd.stats)."""
        query = {k: v[0] for k, v in params.items()}
        text = query.get("format") != "json"
        query["format"] = "json"
        answers = await self._every(router, request, b"", "/stats?" + urlencode(query))
        bad = next((a for a in answers if not a.ok), None)
        if bad is not None:
            return _as_response(bad)
        merged = st.merge_stats_json([json.loads(a.body) for a in answers])
        if not text:
            return ok_json(merged)
        return ok_text(
            st.format_text(
                st.stats_from_json(merged),
                merged.get("memory"),
                merged["health"],
                float(merged["start_time"]),
            )
        )

    # -- helpers ----------------------------------------------------------------------

    @staticmethod
    def _get(params: dict[str, list[str]], key: str, missing: str) -> str:
        values = params.get(key)
        if not values:
            raise HTTPError(400, missing)
        return values[0]

    def _topic_name(self, params: dict[str, list[str]]) -> str:
        name = self._get(params, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return name

    def _topic_and_channel(self, params: dict[str, list[str]]) -> tuple[str, str]:
        # NSQ's GetTopicChannelArgs: note the *_ARG_* codes here
        topic = self._get(params, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = self._get(params, "channel", "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        if topic not in self.nsqd.topics:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel

    def _partitions(self, topic: Topic, params: dict[str, list[str]]) -> list[Partition]:
        """The local partitions a request names: ``partition`` (one), else all."""
        if "partition" not in params:
            return list(topic.partitions.values())
        part = topic.partitions.get(_int_param(params, "partition", -1))
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return [part]

    def _existing_channels(self, params: dict[str, list[str]]) -> list[Channel]:
        """The channel in the partitions the request names (404 if it is in none)."""
        topic, channel = self._topic_and_channel(params)
        found = [
            ch
            for p in self._partitions(self.nsqd.topics[topic], params)
            if (ch := p.channels.get(channel)) is not None
        ]
        if not found:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return found

    def _one_partition(self, params: dict[str, list[str]]) -> Partition:
        """``topic`` and ``partition`` (default: the topic's default partition)."""
        name = self._topic_name(params)
        topic = self.nsqd.topics.get(name)
        if topic is None or not topic.partitions:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        part = topic.partition(_int_param(params, "partition", -1))
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return part

    def _check_publishable(self) -> None:
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")

    # -- handlers ---------------------------------------------------------------------

    async def ping(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        health = self.nsqd.health()
        if health != "OK":
            return _respond(500, health.encode(), _TEXT)
        return ok_text()

    async def drain(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        """POST /drain [nsqx]: begin a drain (docs/drain.md; asking again changes
        nothing) and say what it still waits for. No parameters (http_params)."""
        self.nsqd.start_drain()
        return ok_json({"draining": self.nsqd.draining, "in_flight": self.nsqd.in_flight_count()})

    async def info(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        o = self.nsqd.options
        return ok_json(
            {
                "version": NSQ_VERSION,
                "broadcast_address": o.broadcast_address,
                "hostname": socket.gethostname(),
                "http_port": self.nsqd.http_address[1] if self.nsqd.http_address else -1,
                "tcp_port": self.nsqd.tcp_address[1] if self.nsqd.tcp_address else -1,
                "start_time": int(self.nsqd.start_time),
                "max_heartbeat_interval": _ns(o.max_heartbeat_interval),
                "max_output_buffer_size": o.max_output_buffer_size,
                "max_output_buffer_timeout": _ns(o.max_output_buffer_timeout),
                "max_deflate_level": o.max_deflate_level,
                # nsqx's own: whether the hot path runs compiled (docs/install.md)
                "build": build_description(),
            }
        )

    async def pub(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        pub = await self._read_pub(request, params)
        self._check_publishable()
        await self._publish(pub.topic, pub.bodies, pub.defer_ms, pub.partition)
        return ok_text()

    async def _read_pub(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> _HttpPublish:
        """POST /pub's message, checked as nsqd checks it (in its order)."""
        limit = self.nsqd.options.max_msg_size
        if (request.content_length or 0) > limit:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await read_limited(request, limit)
        if body is None:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        name = self._topic_name(params)
        defer_ms = 0
        if "defer" in params:
            text = params["defer"][0]
            if not _INT.fullmatch(text):
                raise HTTPError(400, "INVALID_DEFER")
            defer_ms = int(text)
            if not 0 <= defer_ms <= self.nsqd.options.dpub_limit() * 1000:
                raise HTTPError(400, "INVALID_DEFER")
        return _HttpPublish(name, body, [body], defer_ms, _int_param(params, "partition", -1))

    def _pub_partition(self, name: str, pid: int) -> Partition:
        """Where an HTTP publish goes: as PUB over TCP (a topic that does not exist is
        made as NSQ 1.3 makes it, unless a partition is named)."""
        topic = self.nsqd.topics.get(name)
        if topic is None or not topic.partitions:
            if pid >= 0:
                raise HTTPError(404, "TOPIC_NOT_FOUND")
            topic = self.nsqd.get_topic(name)
        if pid < 0 and topic.meta.ordered:
            raise HTTPError(400, "INVALID_PARTITION")  # an ordered topic needs one named
        part = topic.partition(pid)
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return part

    async def _publish(
        self, name: str, bodies: list[bytes], defer_ms: int = 0, pid: int = -1
    ) -> None:
        """Publish as TCP does: written (by the loop iteration's group commit) before
        the answer; fsynced too with --sync-before-ack."""
        try:
            part = self._pub_partition(name, pid)
            replica = part.replica
            if replica is not None:
                code = E_FAILED_ON_NOT_WRITABLE if self.nsqd.draining else replica.write_error()
                if code is not None:
                    raise HTTPError(503, code)
            part.publish(bodies, defer_ms)
            if part.durable:
                # written now, not at the end of the loop iteration: a request costs
                # far more than its write, and its answer would wait an iteration more
                err = part.commit()
                if err is not None:
                    raise err
        except OSError as err:
            log.error("TOPIC(%s): write failed: %s", name, err)
            raise HTTPError(500, "PUB_FAILED") from None
        except ProtocolError as err:
            # a full topic (a channel's max_depth): try again later, as for 503 EXITING
            raise HTTPError(503, err.code[2:] if err.code.startswith("E_") else err.code) from None
        if (self.nsqd.options.sync_before_ack and part.durable) or replica is not None:
            try:
                await self.nsqd.acknowledged({part.key})
            except CommitFailed:
                raise HTTPError(503, E_FAILED_ON_NOT_LEADER) from None

    async def mpub(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        pub = await self._read_mpub(request, params)
        self._check_publishable()
        if pub.bodies:
            await self._publish(pub.topic, pub.bodies, 0, pub.partition)
        else:
            self._pub_partition(pub.topic, pub.partition)
        return ok_text()

    async def _read_mpub(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> _HttpPublish:
        """POST /mpub's messages, checked as nsqd checks them (in its order)."""
        o = self.nsqd.options
        if (request.content_length or 0) > o.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        name = self._topic_name(params)
        body = await read_limited(request, o.max_body_size)
        if body is None:
            raise HTTPError(413, "BODY_TOO_BIG")
        if "binary" in params:  # as NSQ: present at all means binary, whatever its value
            try:
                bodies = parse_mpub_body(body, o.max_msg_size)
            except ProtocolError as err:
                # NSQ answers 413 with the TCP error code minus "E_"
                raise HTTPError(413, err.code[2:]) from None
        else:
            # newline-separated; empty lines are dropped
            bodies = [line for line in body.split(b"\n") if line]
            if any(len(b) > o.max_msg_size for b in bodies):
                raise HTTPError(413, "MSG_TOO_BIG")
        return _HttpPublish(name, body, bodies, 0, _int_param(params, "partition", -1))

    async def _publish_on_link(
        self, router: wr.HttpRouter, owner: int, request: web.BaseRequest, pub: _HttpPublish
    ) -> web.StreamResponse:
        """An HTTP publish to another worker's partition, sent to it over the link as a
        TCP publish is (one frame per loop turn for every connection's, acknowledged
        as its own), rather than as an HTTP request: a third of the work. What the
        owner refuses (nothing was written) or fails to write is sent again as the HTTP
        request, so that the answer is the one a single nsqd's handler gives."""
        workers = router.workers
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[tuple[bytes | None, BaseException | None]]
        answered = loop.create_future()

        def on_answer(ticket: Ticket, err: BaseException | None) -> None:
            if not answered.done():
                answered.set_result((ticket.answer, err))

        verb = V_MPUB if request.path == "/mpub" else V_DPUB if pub.defer_ms else V_PUB
        workers.forward(
            owner, 0, on_answer, verb, pub.topic, pub.partition, pub.bodies, pub.defer_ms
        )
        answer, err = await answered
        if err is not None:
            raise wr.WorkerUnavailable(str(err))  # (LinkLost: it died before it answered)
        if answer == b"":
            return ok_text()
        if answer is None:  # written, but not held by the ISR
            raise HTTPError(503, E_FAILED_ON_NOT_LEADER)
        # refused, or its write failed: as an HTTP request, for a single nsqd's answer
        return await router.forward(owner, request, pub.raw)

    # range reads (nsqx): stateless reads of a partition by sequence, for Spark

    async def range_read(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.StreamResponse:
        """GET /range: records of a topic partition, by sequence, offset or time."""
        name = self._topic_name(params)
        topic = self.nsqd.topics.get(name)
        if topic is None or not topic.partitions:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        part = topic.partitions.get(_int_param(params, "partition", 0))
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        log_ = part.log
        if not log_.durable:
            raise HTTPError(400, "TOPIC_NOT_DURABLE")
        # positions and budgets are counts: a negative one is refused, not clamped
        ints = {
            k: _int_param(params, k, 0)
            for k in ("start", "start_offset", "start_time", "end", "max_messages", "max_bytes")
        }
        for k, v in ints.items():
            if v < 0:
                raise HTTPError(400, f"INVALID_{k.upper()}")
        if "start_offset" in params:
            start = log_.seek_offset(ints["start_offset"])
        elif "start_time" in params:
            start = log_.seek_time(ints["start_time"])
        else:
            start = ints["start"]
        start = max(start, log_.start)
        # a replicated partition is read up to its commit point only
        readable = part.readable_end
        end = min(ints["end"], readable) if "end" in params else readable
        max_messages = (
            min(ints["max_messages"], MAX_RANGE_MESSAGES) if "max_messages" in params else 10_000
        )
        max_bytes = min(ints["max_bytes"], MAX_RANGE_BYTES) if "max_bytes" in params else 8 << 20
        head, chunks = await range_steps(
            log_, start, max_messages, max_bytes, end, readable if part.replica else None
        )
        resp = web.StreamResponse(
            headers={"Content-Type": "application/octet-stream", **NSQ_HEADERS}
        )
        resp.content_length = len(head) + sum(map(len, chunks))
        await resp.prepare(request)
        await resp.write(head)
        # frames leave in writes of about a step each; write() waits while the client
        # is slower than that (aiohttp's drain), and other work runs in between
        group: list[bytes] = []
        size = 0
        for chunk in chunks:
            group.append(chunk)
            size += len(chunk)
            if size >= RANGE_STEP_BYTES:
                await resp.write(group[0] if len(group) == 1 else b"".join(group))
                group, size = [], 0
        if group:
            await resp.write(b"".join(group))
        await resp.write_eof()
        return resp

    async def channel_setoffset(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /channel/setoffset: move a channel to a position (Youzan's: the body is
        ``timestamp:<sec>``, ``virtual_queue:<offset>``, ``msgcount:<n>`` or
        ``special:-1``, backwards to replay or forwards to skip; the channel must exist),
        or forward to ``sequence`` (nsqx: a range consumer such as Spark reports what it
        consumed, so lag shows in /stats; the channel is made if needed)."""
        try:
            _, channel = self._topic_and_channel(params)
            part = self._one_partition(params)
        except HTTPError as err:
            if err.message in ("TOPIC_NOT_FOUND", "PARTITION_NOT_FOUND"):
                raise HTTPError(404, "E_TOPIC_NOT_EXIST") from None  # Youzan's answer
            raise
        if part.replica is not None and part.replica.leader is None:
            # a follower's positions come from its leader (Youzan's answer)
            raise HTTPError(400, E_FAILED_ON_NOT_LEADER)
        if "sequence" in params:
            seq = _int_param(params, "sequence", -1)
            if seq < 0:
                raise HTTPError(400, "MISSING_ARG_SEQUENCE")
            part.get_channel(channel).advance_to(min(seq, part.log.end))
            return ok_empty()
        ch = part.channels.get(channel)
        if ch is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        body = await read_limited(request, 1024)
        if body is None:
            raise HTTPError(413, "BODY_TOO_BIG")
        if not body:
            raise HTTPError(406, "MSG_EMPTY")
        try:
            start = parse_consume_start(body.strip())
            seq = part.position(start)
        except ValueError as err:
            raise HTTPError(400, str(err)) from None
        ch.reset_to(seq)
        return ok_empty()

    async def channel_setorder(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /channel/setorder?order=true|false: SUB_ORDERED's sticky flag, set or
        cleared (Youzan's)."""
        order = params.get("order", [""])[0]
        if order not in ("true", "false"):
            raise HTTPError(400, "INVALID_OPTION")
        for ch in self._existing_channels(params):
            ch.set_ordered(order == "true")
        self._persist()
        return ok_empty()

    async def channel_config(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /channel/config?topic&channel[&partition] (nsqx): the channel's policy
        (dead letters, message TTL, rate limits: nsqx.nsqd.channel_policy). POST with
        any of its settings as parameters changes those (an empty value: the default)
        on the channel in every partition named."""
        channels = self._existing_channels(params)
        if request.method == "POST":
            given = {k: v[0] for k, v in params.items() if k not in _CHANNEL_KEYS}
            topic = channels[0].topic.name
            try:
                policy = channels[0].policy.updated(given)
                policy.check_for(topic, channels[0].name)
            except PolicyError as err:
                raise HTTPError(400, str(err)) from None
            self._check_dead_letter_format(policy, topic)
            for ch in channels:
                # (a follower's too: it delivers by it once it leads)
                ch.set_policy(policy)
            self._persist()
        ch = channels[0]
        return ok_json(
            {
                "topic_name": ch.topic.name,
                "channel_name": ch.name,
                **ch.policy.to_json(),
                "dead_letters_to": ch.policy.dead_letter_topic_for(ch.topic.name),
            }
        )

    def _check_dead_letter_format(self, policy: ChannelPolicy, topic: str) -> None:
        """Dead letters in the ``ext`` format need an ``extend`` topic (400 if the topic
        is here and is not one, or is not made yet)."""
        if not policy.max_attempts or policy.dead_letter_format != FORMAT_EXT:
            return
        name = policy.dead_letter_topic_for(topic)
        workers = self.nsqd.workers
        if workers is not None and not workers.owns(name, 0):
            return  # (another worker's topic: its refusals are logged and retried)
        target = self.nsqd.topics.get(name)
        if target is None or not target.meta.ext:
            raise HTTPError(
                400,
                "DEAD_LETTER_TOPIC_NOT_EXT: create it first with "
                f"POST /topic/create?topic={name}&extend=true",
            )

    async def channel_deadletter_replay(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /channel/deadletter/replay?topic&channel[&partition][&n=1000] (nsqx): give
        the channel back up to n of its dead letters (nsqx.nsqd.dead_letters.replay)."""
        n = _int_param(params, "n", 1000)
        if not 1 <= n <= dl.MAX_REPLAY:
            raise HTTPError(400, "INVALID_N")
        channels = _writable([ch.partition for ch in self._existing_channels(params)])
        total = {"replayed": 0, "missing": 0, "scanned": 0}
        for part in channels:
            ch = part.channels[params["channel"][0]]
            name = ch.policy.dead_letter_topic_for(ch.topic.name)
            workers = self.nsqd.workers
            if workers is not None and not workers.owns(name, 0):
                raise HTTPError(400, "DEAD_LETTER_TOPIC_ON_ANOTHER_WORKER")
            for k, v in dl.replay(self.nsqd, ch, n).items():
                total[k] += v
        await dl.checkpointed(self.nsqd)
        self._persist()  # (the marks: after the letters queued again are on disk)
        return ok_json(total)

    async def message_get(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /message/get?topic&partition&search_mode=count|id|virtual_offset&search_pos:
        one message, read from the log without touching any channel (Youzan's)."""
        name = self._topic_name(params)
        mode = params.get("search_mode", [""])[0]
        pos = _int_param(params, "search_pos", -1)
        if "search_pos" not in params:
            raise HTTPError(400, "MISSING_ARG_SEARCH_POS")
        pid = pos >> PARTITION_SHIFT if mode == "id" else _int_param(params, "partition", -1)
        topic = self.nsqd.topics.get(name)
        part = topic.partition(pid) if topic is not None else None
        if part is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        log_ = part.log
        if mode == "count":
            seq = max(pos - 1, 0)  # counted from 1, as Youzan counts
        elif mode == "id":
            n = pos & SEQ_MASK
            seq = n - 1 if n > part.id_base else n  # (guid.seq_of)
        elif mode == "virtual_offset":
            seq = log_.seek_offset(pos)  # not at a message's start: the next message
        else:
            raise HTTPError(400, "search mode should be one of id/count/virtual_offset")
        frame = log_.get(seq)
        offset = log_.offset_of(seq) if frame is not None else None
        if frame is None or offset is None:
            raise HTTPError(404, "MESSAGE_NOT_FOUND")
        msg_id = int(frame[ID_AT:ID_END], 16)  # (as stored: guid.py)
        if mode == "id" and msg_id != pos:
            raise HTTPError(404, "MESSAGE_NOT_FOUND")
        trace_id, _ver, ext, body_at = record_parts(frame)
        body = frame[body_at:]
        out: dict[str, Any] = {
            "id": msg_id,
            "trace_id": trace_id,
            "body": body.decode("utf-8", "replace"),
            "timestamp": int.from_bytes(frame[TIMESTAMP_AT:ATTEMPTS_AT], "big", signed=True),
            # as Youzan's: a message in the log has no deliveries
            "attempts": 0,
            "offset": offset,
            "queue_cnt_index": seq + 1,
            "ext": ext.decode("utf-8", "replace")
            if params.get("needext", [""])[0] == "true"
            else "",
        }
        return ok_json(out)

    async def channel_peek(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /channel/peek?topic&channel[&partition][&n=10] (nsqx): the next n messages
        the channel would deliver, changing nothing (nsqx.nsqd.peek)."""
        _, channel = self._topic_and_channel(params)
        part = self._one_partition(params)
        ch = part.channels.get(channel)
        if ch is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return ok_json(pk.peek_channel(ch, _peek_count(params)))

    async def topic_peek(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /topic/peek?topic[&partition][&sequence|offset|timestamp][&n=10] (nsqx): n
        messages of the partition's log from a position (a sequence, a virtual offset or
        a time in seconds; default the oldest kept), changing nothing."""
        part = self._one_partition(params)
        log_ = part.log
        if "sequence" in params:
            seq = _int_param(params, "sequence", 0)
            if seq < 0:
                raise HTTPError(400, "INVALID_SEQUENCE")
        elif "offset" in params:
            offset = _int_param(params, "offset", 0)
            if offset < 0:
                raise HTTPError(400, "INVALID_OFFSET")
            seq = log_.seek_offset(offset)
        elif "timestamp" in params:
            seq = log_.seek_time(_int_param(params, "timestamp", 0) * 1_000_000_000)
        else:
            seq = log_.start
        return ok_json(pk.peek_log(part, seq, _peek_count(params)))

    async def message_trace_switch(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /message/trace/enable|disable?topic[&channel]: trace every message of a
        topic, or of one channel (Youzan's)."""
        on = request.path.endswith("enable")
        name = self._get(params, "topic", "MISSING_ARG_TOPIC")
        topic = self.nsqd.topics.get(name)
        if topic is None:
            return ok_empty()  # nothing to trace, as Youzan's nsqd answers
        channel = params.get("channel", [""])[0]
        if channel:
            for part in topic.partitions.values():
                ch = part.channels.get(channel)
                if ch is not None:
                    ch.trace_enabled = on
        else:
            topic.trace_enabled = on
        log.info("TOPIC(%s): trace %s %s", name, "enabled" if on else "disabled", channel)
        return ok_empty()

    async def message_trace(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /message/trace?topic&(trace_id|msg_id)[&partition]: the recorded history
        of a traced message (nsqx's: Youzan sends its events to a remote service)."""
        name = self._topic_name(params)
        if "trace_id" not in params and "msg_id" not in params:
            raise HTTPError(400, "MISSING_ARG_TRACE_ID")
        trace_id = _int_param(params, "trace_id", -1) if "trace_id" in params else None
        msg_id = _int_param(params, "msg_id", -1) if "msg_id" in params else None
        pid = _int_param(params, "partition", -1) if "partition" in params else None
        events = self.nsqd.tracer.find(name, trace_id=trace_id, msg_id=msg_id, partition=pid)
        return ok_json({"events": events})

    async def stats(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        def first(key: str) -> str:
            values = params.get(key)
            return values[0] if values else ""

        include_clients = _BOOL_PARAMS.get(first("include_clients"), True)
        include_mem = _BOOL_PARAMS.get(first("include_mem"), True)
        snapshot = st.get_stats(self.nsqd, first("topic"), first("channel"), include_clients)
        mem = st.mem_stats() if include_mem else None
        health = self.nsqd.health()
        start = float(self.nsqd.start_time)
        if first("format") == "json":
            loop = self.nsqd.loop_monitor.snapshot() if include_mem else None
            return ok_json(st.stats_json(snapshot, mem, health, start, loop))
        return ok_text(st.format_text(snapshot, mem, health, start))

    async def metrics(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        if self._metrics is None:
            self._metrics = Metrics(self.nsqd)
        body, content_type = self._metrics.render()
        return _respond(200, body, content_type)

    # replication (nsqlookupd and the other nodes call these; see docs/replication.md)

    def _replica_partition(self, params: dict[str, list[str]]) -> Partition:
        name = self._topic_name(params)
        part = self.nsqd.find_partition(name, _int_param(params, "partition", -1))
        if part is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return part

    async def partition_role(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /partition/role?topic&partition, body: the role JSON (the coordinator
        tells a node who leads, who is in sync, and the epoch)."""
        part = self._replica_partition(params)
        body = await read_limited(request, 1 << 20)
        try:
            role = ReplicaRole.from_json(json.loads(body or b""))
        except ValueError as err:
            raise HTTPError(400, f"INVALID_ROLE {err}") from None
        if part.replica is None:
            if role.replica < 2 or not part.durable:
                raise HTTPError(400, "NOT_REPLICATED")
            part.replicate()
        assert part.replica is not None
        try:
            part.replica.apply_role(role)
        except StaleEpoch as err:
            raise HTTPError(409, f"E_STALE_EPOCH {err}") from None
        # a new leadership asks the coordinator to confirm it within this node's lease
        # before answering, so that the coordinator's work (a create, an election) is
        # done when the partition takes writes
        await self.nsqd.replication.wait_confirmed(part.replica, CONFIRM_WAIT)
        return ok_empty()

    async def partition_fence(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /partition/fence?topic&partition&epoch: the coordinator is about to move
        this leadership away: stop acknowledging now (writes are held) until the new
        role arrives, or the leadership is confirmed again (the move did not happen).
        409 if this node does not lead the partition in that epoch."""
        part = self._replica_partition(params)
        epoch = _int_param(params, "epoch", -1)
        if part.replica is None or not part.replica.fence(epoch):
            raise HTTPError(409, "E_NOT_LEADER_IN_EPOCH")
        return ok_empty()

    async def partition_state(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """GET /partition/state?topic&partition: the log's end and the replica's role
        (the coordinator elects the ISR member with the newest log)."""
        part = self._replica_partition(params)
        out: dict[str, Any] = {
            "start": part.log.start,
            "end": part.log.end,
            "end_offset": part.log.end_offset,
            "node": self.nsqd.node_id,
        }
        if part.replica is not None:
            out.update(part.replica.stats())
        return ok_json(out)

    async def replication_stream(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.StreamResponse:
        """GET /replication/stream: a follower's WebSocket (nsqx.wire.replication)."""
        ws = web.WebSocketResponse(max_msg_size=0, heartbeat=5.0)
        await ws.prepare(request)
        try:
            first = await ws.receive(timeout=10.0)
            hello = rp.decode(first.data) if first.type.name == "BINARY" else None
        except (rp.ReplicationProtocolError, TimeoutError):
            hello = None
        if not isinstance(hello, rp.Hello):
            await ws.send_bytes(rp.encode_refused(rp.Refused("E_BAD_HELLO", "no HELLO")))
            await ws.close()
            return ws
        router = self._router
        if router is not None and not self._from_worker(request):
            owner = router.workers.owner(hello.topic, hello.partition)
            if owner != router.index:
                # the partition's owner serves the stream; this worker carries it
                try:
                    await router.proxy_websocket(owner, request, ws, first.data)
                except wr.WorkerUnavailable:
                    refused = rp.Refused(E_FAILED_ON_NOT_LEADER, "worker unavailable")
                    await ws.send_bytes(rp.encode_refused(refused))
                await ws.close()
                return ws
        part = self.nsqd.find_partition(hello.topic, hello.partition)
        replica = part.replica if part is not None else None
        leader = replica.leader if replica is not None else None
        if replica is None or leader is None:
            await ws.send_bytes(
                rp.encode_refused(rp.Refused(E_FAILED_ON_NOT_LEADER, "not the leader"))
            )
            await ws.close()
            return ws
        answer = leader.accept(hello)
        if isinstance(answer, rp.Refused):
            log.warning("REPL: %s: refused %s: %s", part, hello.node, answer.message)
            await ws.send_bytes(rp.encode_refused(answer))
            await ws.close()
            return ws
        await ws.send_bytes(rp.encode_welcome(answer))
        await leader.serve(hello.node, ws, answer.truncate_to, request, answer.durable)
        await ws.close()
        return ws

    # topics

    async def topic_create(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """POST /topic/create?topic: NSQ 1.3's. With ``partition`` or ``partition_num``
        (and Youzan's orderedmulti, extend, multipart, disable_channel_auto_create,
        retention, syncdisk, replicator), the partition is made with those settings:
        what nsqlookupd asks of each node it places a partition on."""
        name = self._topic_name(params)
        if not _SETTINGS_PARAMS.intersection(params):
            self.nsqd.get_topic(name)
            return ok_empty()
        topic = self.nsqd.topics.get(name)
        base = topic.meta if topic is not None else TopicMeta()
        try:
            meta = replace(
                base,
                partition_num=_int_param(params, "partition_num", base.partition_num),
                replica=_int_param(params, "replicator", base.replica),
                ordered=_bool_param(params, "orderedmulti", base.ordered),
                ext=_bool_param(params, "extend", base.ext),
                multipart=_bool_param(params, "multipart", base.multipart),
                disable_channel_auto_create=_bool_param(
                    params, "disable_channel_auto_create", base.disable_channel_auto_create
                ),
                retention_days=_int_param(params, "retention", base.retention_days),
                sync_every=_int_param(params, "syncdisk", base.sync_every),
                replication_ack=(params.get("replication_ack") or [base.replication_ack])[0],
            )
            self.nsqd.create_partition(name, _int_param(params, "partition", 0), meta)
        except ValueError as err:
            log.error("TOPIC(%s): create refused: %s", name, err)
            raise HTTPError(400, "INVALID_PARTITION") from None
        return ok_empty()

    async def topic_delete(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        name = self._get(params, "topic", "MISSING_ARG_TOPIC")
        topic = self.nsqd.topics.get(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if "partition" in params and params["partition"][0] != "**":
            pid = _int_param(params, "partition", -1)
            if pid not in topic.partitions:
                raise HTTPError(404, "PARTITION_NOT_FOUND")
            topic.remove_partition(pid)
            if topic.partitions:
                self._persist()
                return ok_empty()
        self.nsqd.delete_topic(name)
        return ok_empty()

    async def topic_empty(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        topic = self.nsqd.topics.get(self._topic_name(params))
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        for part in _writable(self._partitions(topic, params)):
            part.empty()
        return ok_empty()

    async def topic_pause(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        name = self._get(params, "topic", "MISSING_ARG_TOPIC")
        topic = self.nsqd.topics.get(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if request.path.endswith("unpause"):
            topic.unpause()
        else:
            topic.pause()
        # persisted at once, so that a crash cannot silently undo it
        self._persist()
        return ok_empty()

    # channels

    async def channel_create(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        """In every local partition, or the one ``partition`` names."""
        topic, channel = self._topic_and_channel(params)
        for part in self._partitions(self.nsqd.topics[topic], params):
            part.get_channel(channel)
        return ok_empty()

    async def channel_delete(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        for ch in self._existing_channels(params):
            ch.partition.delete_channel(ch.name)
        return ok_empty()

    async def channel_empty(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        found = self._existing_channels(params)
        writable = _writable([ch.partition for ch in found])
        for ch in found:
            if any(ch.partition is p for p in writable):
                ch.empty()
        return ok_empty()

    async def channel_pause(
        self, request: web.BaseRequest, params: dict[str, list[str]]
    ) -> web.Response:
        for ch in self._existing_channels(params):
            if request.path.endswith("unpause"):
                ch.unpause()
            else:
                ch.pause()
        self._persist()
        return ok_empty()

    def _persist(self) -> None:
        try:
            self.nsqd.persist_metadata()
        except OSError:
            log.exception("failed to persist metadata")
            raise HTTPError(500, "INTERNAL_ERROR") from None

    # config

    async def config(self, request: web.BaseRequest, params: dict[str, list[str]]) -> web.Response:
        opt = request.path[len("/config/") :]
        if request.method == "PUT":
            limit = self.nsqd.options.max_msg_size
            body = await read_limited(request, limit)
            if not body:  # too big or empty: NSQ says 413 INVALID_VALUE to both
                raise HTTPError(413, "INVALID_VALUE")
            self._put_config(opt, body)
        found, value = get_option(self.nsqd, opt)
        if not found:
            raise HTTPError(400, "INVALID_OPTION")
        return ok_json(value)

    def _put_config(self, opt: str, body: bytes) -> None:
        options = self.nsqd.options
        if opt == "nsqlookupd_tcp_addresses":
            try:
                value = json.loads(body)
            except ValueError:
                raise HTTPError(400, "INVALID_VALUE") from None
            if value is None:
                value = []
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                raise HTTPError(400, "INVALID_VALUE")
            options.nsqlookupd_tcp_addresses = list(value)
            self.nsqd.lookupd_addresses_changed()
        elif opt == "log_level":
            level = body.decode("latin-1").strip().lower()
            if level not in _LOG_LEVELS:
                raise HTTPError(400, "INVALID_VALUE")
            options.log_level = level
            self.nsqd.set_log_level(level)
        else:
            raise HTTPError(400, "INVALID_OPTION")


_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
#: /topic/create parameters that make it Youzan's (a partition with settings)
_SETTINGS_PARAMS = frozenset(
    {
        "partition",
        "partition_num",
        "replicator",
        "orderedmulti",
        "extend",
        "multipart",
        "disable_channel_auto_create",
        "retention",
        "syncdisk",
        "replication_ack",
    }
)


def _bool_param(params: dict[str, list[str]], key: str, default: bool) -> bool:
    values = params.get(key)
    if not values:
        return default
    value = _BOOL_PARAMS.get(values[0].lower())
    if value is None:
        raise HTTPError(400, f"INVALID_{key.upper()}")
    return value


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def get_option(nsqd: NSQD, name: str) -> tuple[bool, Any]:
    """An option by its config name as NSQ's /config shows it (durations in ns)."""
    attr = _CONFIG_ALIASES.get(name, name)
    if attr in _HIDDEN_OPTIONS and name not in _CONFIG_ALIASES:
        return False, None
    if attr.startswith("_") or not hasattr(nsqd.options, attr):
        return False, None
    value = getattr(nsqd.options, attr)
    if callable(value):
        return False, None
    if attr in DURATION_OPTIONS:
        return True, _ns(value)
    if attr == "log_level":
        return True, _LOG_LEVELS.get(value, value)
    if attr in _GO_ENUMS:
        return True, _GO_ENUMS[attr].get(value, value)
    if isinstance(value, list):
        return True, list(value)
    return True, value


_R = HTTPServer
ROUTES: dict[str, dict[str, Handler]] = {
    "/ping": {"GET": _R.ping},
    "/info": {"GET": _R.info},
    "/drain": {"POST": _R.drain},
    "/pub": {"POST": _R.pub},
    "/mpub": {"POST": _R.mpub},
    "/stats": {"GET": _R.stats},
    "/metrics": {"GET": _R.metrics},
    "/topic/create": {"POST": _R.topic_create},
    "/topic/delete": {"POST": _R.topic_delete},
    "/topic/empty": {"POST": _R.topic_empty},
    "/topic/pause": {"POST": _R.topic_pause},
    "/topic/unpause": {"POST": _R.topic_pause},
    "/channel/create": {"POST": _R.channel_create},
    "/channel/delete": {"POST": _R.channel_delete},
    "/channel/empty": {"POST": _R.channel_empty},
    "/channel/pause": {"POST": _R.channel_pause},
    "/channel/unpause": {"POST": _R.channel_pause},
    "/channel/setoffset": {"POST": _R.channel_setoffset},
    "/channel/setorder": {"POST": _R.channel_setorder},
    "/channel/config": {"GET": _R.channel_config, "POST": _R.channel_config},
    "/channel/deadletter/replay": {"POST": _R.channel_deadletter_replay},
    "/channel/peek": {"GET": _R.channel_peek},
    "/topic/peek": {"GET": _R.topic_peek},
    "/message/get": {"GET": _R.message_get},
    "/message/trace": {"GET": _R.message_trace},
    "/message/trace/enable": {"POST": _R.message_trace_switch},
    "/message/trace/disable": {"POST": _R.message_trace_switch},
    "/range": {"GET": _R.range_read},
    "/partition/role": {"POST": _R.partition_role},
    "/partition/fence": {"POST": _R.partition_fence},
    "/partition/state": {"GET": _R.partition_state},
    "/replication/stream": {"GET": _R.replication_stream},
}


def range_body(
    log_: MessageLog, start: int, max_messages: int, max_bytes: int, end: int | None = None
) -> bytes:
    """The body of a range read of ``log_`` from ``start`` (see nsqx.wire.range)."""
    found = log_.read_frames(start, max_messages, max_bytes, end)
    return encode_range_frames(
        log_.end,
        log_.end_offset,
        found.first,  # past start if the records there are gone
        found.run_lengths,
        found.run_timestamps,
        found.run_offsets,
        found.sizes,
        found.chunks,
    )


#: bounds of one range read (a reader asks again for more)
MAX_RANGE_MESSAGES = 100_000
MAX_RANGE_BYTES = 64 * 1024 * 1024
#: bytes of frames a range read takes from the log (and writes out) in one step on the
#: event loop; between steps nsqd's consumers and publishers get their turn, so a
#: 64 MiB read delays them by one step (a fraction of a millisecond), not by the whole
#: read. 256 KiB rather than 1 MiB: a live consumer's p99 latency during Spark's reads
#: was 10-20% lower (bench/spark_bench.py --latency) at the same read rate
RANGE_STEP_BYTES = 1 << 18


async def range_steps(
    log_: MessageLog,
    start: int,
    max_messages: int,
    max_bytes: int,
    end: int | None = None,
    readable_end: int | None = None,
) -> tuple[bytes, list[bytes]]:
    """A range read of ``log_`` (the body of :func:`range_body`, as its header and
    tables, then the frames as chunks), taken in steps of at most RANGE_STEP_BYTES of
    frames that yield to the event loop between them. ``readable_end`` (a replicated
    partition's commit point) is the end the header reports instead of the log's.

    The log may change between steps: appends only add records after the ones read,
    and a step that finds its next record deleted (reclaimed meanwhile) or a gap ends
    the read there, as one read stops at a gap: the reader asks again from where it
    stopped and sees the loss then. The partition's end is taken after the last step.
    """
    parts: list[RangeFramesOut] = []
    seq = start
    count = taken = 0
    # where the records start: past ``start`` if those are gone (from the first step,
    # which also says so when it finds none)
    first = max(start, log_.start)
    while count < max_messages and taken < max_bytes:
        try:
            found = log_.read_frames(
                seq, max_messages - count, min(RANGE_STEP_BYTES, max_bytes - taken), end
            )
        except OSError:
            if not parts:
                raise
            break  # a segment deleted under a later step: what was read stands
        if not parts:
            first = found.first
        if not found.count or (parts and found.first != seq):
            break
        parts.append(found)
        count += found.count
        taken += sum(map(len, found.chunks))
        seq = found.first + found.count
        if count < max_messages and taken < max_bytes:
            await asyncio.sleep(0)
    lengths, timestamps, offsets, sizes = array("i"), array("q"), array("q"), array("i")
    chunks: list[bytes] = []
    for found in parts:
        lengths += found.run_lengths
        timestamps += found.run_timestamps
        offsets += found.run_offsets
        sizes += found.sizes
        chunks += found.chunks
    end_seq, end_offset = log_.end, log_.end_offset
    if readable_end is not None and readable_end < end_seq:
        # the offset of the first record past the commit point
        end_seq, end_offset = readable_end, log_.offset_of(readable_end) or end_offset
    head = encode_range_frames(end_seq, end_offset, first, lengths, timestamps, offsets, sizes, [])
    return head, chunks


def _writable(parts: list[Partition]) -> list[Partition]:
    """The partitions whose positions this node decides: not a replicated partition's
    followers (their channels' positions come from the leader, which would undo a
    change within half a second). 400 E_FAILED_ON_NOT_LEADER if none is left, as
    Youzan's nsqd answers on a follower."""
    out = [p for p in parts if p.replica is None or p.replica.leader is not None]
    if parts and not out:
        raise HTTPError(400, E_FAILED_ON_NOT_LEADER)
    return out


def _peek_count(params: dict[str, list[str]]) -> int:
    n = _int_param(params, "n", pk.DEFAULT_PEEK)
    if not 1 <= n <= pk.MAX_PEEK:
        raise HTTPError(400, "INVALID_N")
    return n


def _int_param(params: dict[str, list[str]], key: str, default: int) -> int:
    values = params.get(key)
    if not values:
        return default
    text = values[0]
    if not _INT.fullmatch(text):
        raise HTTPError(400, f"INVALID_{key.upper()}")
    return int(text)


_CONFIG_ROUTE: dict[str, Handler] = {"GET": _R.config, "PUT": _R.config}

#: what only members of the cluster may use (with --cluster-secret): changing a
#: partition's role and pulling its log
MEMBER_PATHS = frozenset({"/partition/role", "/partition/fence", "/replication/stream"})


#: what --http-admin-allow restricts (with PUT /config/* and POST /channel/config): every
#: action that changes topics, channels, partitions or settings, as --http-auth
#: classifies them (nsqx.nsqd.http_auth); reads and publishing stay open, and the
#: replication stream is the cluster's (MEMBER_PATHS)
ADMIN_PATHS = (http_auth.TOPIC_ACTIONS | http_auth.CHANNEL_ACTIONS | http_auth.NODE_ACTIONS) - {
    "/replication/stream"
}
