"""The HTTP API of a node of several workers: one node's answers, whichever worker
took the request.

Each worker answers on the node's HTTP address (the kernel spreads connections over
them) and on its own loopback port (``WorkerSet.internal_http``). A request is routed
by what it is about (:func:`route`):

- one partition's data (``/pub``, ``/mpub``, ``/range``, ``/message/get``,
  ``/channel/setoffset``, ``/partition/*``, and the topic and channel actions that name
  a ``partition``): forwarded as it is to the partition's owner (a request that names no
  partition goes to partition 0's owner, as a publish over TCP does), whose answer is
  returned as it is;
- a whole topic, whose partitions may be spread over the workers (its channels, pause,
  delete, empty, tracing), ``PUT /config/*`` and ``POST /drain``: sent to every worker,
  answered with the first real error, else a success (:func:`combine`; a worker that
  does not host the topic answers 404, which only counts when every worker does);
- node-wide reads (``/stats``, ``/metrics``, ``/ping``, ``/info``): every worker's own
  part, merged into one node's answer by the HTTP layer (nsqx.nsqd.stats,
  nsqx.nsqd.metrics; /info is the receiver's with the node's start, the earliest);
- anything else, and any request whose topic or partition is missing or malformed, is
  answered where it arrived: the same handler then gives a single nsqd's error.

A request between workers carries :data:`FORWARDED`, so that its receiver answers it
with its own part, never forwarding it again, and :data:`PEER`, the original client's
address, for ``--http-admin-allow``. ``/replication/stream`` is a WebSocket whose
partition is in its first message: the HTTP layer reads it and proxies the stream
(:meth:`HttpRouter.proxy_websocket`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from nsqx.nsqd.guid import PARTITION_SHIFT
from nsqx.wire.names import is_valid_name

if TYPE_CHECKING:
    from nsqx.nsqd.workers.forwarding import WorkerSet

log = logging.getLogger("nsqx.nsqd")

#: set on a request one worker sends another: answer it here, with this worker's part
FORWARDED: Final = "X-Nsqx-Forwarded"
#: the original client's address on a forwarded request (for --http-admin-allow)
PEER: Final = "X-Nsqx-Peer"
#: on every answer of a worker: its index (which worker answered, for operators and tests)
WORKER: Final = "X-Nsqx-Worker"

# what a route says
LOCAL: Final = 0  # answered where it arrived
OWNER: Final = 1  # forwarded to one worker
EVERY: Final = 2  # sent to every worker, answers combined
STATS: Final = 3  # every worker's part, merged
METRICS: Final = 4
PING: Final = 5
INFO: Final = 6

#: answered by one partition's owner (``partition``, default: partition 0's owner)
_OWNER_PATHS = frozenset(
    {
        "/pub",
        "/mpub",
        "/range",
        "/topic/create",
        "/channel/setoffset",
        "/channel/peek",
        "/topic/peek",
        "/partition/role",
        "/partition/fence",
        "/partition/state",
    }
)
#: the named partition's owner, or every worker when no partition is named
_SPLIT_PATHS = frozenset(
    {
        "/topic/delete",
        "/topic/empty",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
        "/channel/setorder",
        "/channel/config",
        "/channel/deadletter/replay",
        "/message/trace",
    }
)
#: every worker, always
_EVERY_PATHS = frozenset(
    {
        "/topic/pause",
        "/topic/unpause",
        "/message/trace/enable",
        "/message/trace/disable",
        "/drain",
    }
)
_NODE_READS = {"/stats": STATS, "/metrics": METRICS, "/ping": PING, "/info": INFO}

_INT = re.compile(r"[+-]?[0-9]+")

#: not passed on either way: they describe one connection, not the request
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
        "date",
        "server",
    }
)

#: an answer this small is read whole; a longer one (a range read) is streamed
_WHOLE_BELOW = 1 << 16


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request is answered: ``kind`` (LOCAL, OWNER ...) and, for OWNER, the
    worker."""

    kind: int
    worker: int = -1


_LOCAL = Route(LOCAL)


@dataclass(slots=True)
class Answer:
    """A worker's answer, read whole."""

    status: int
    headers: CIMultiDict[str]
    body: bytes

    @property
    def ok(self) -> bool:
        return self.status == 200


def _int(params: dict[str, list[str]], key: str, default: int) -> int | None:
    """An integer parameter, ``default`` when absent, None when malformed."""
    values = params.get(key)
    if not values:
        return default
    text = values[0]
    return int(text) if _INT.fullmatch(text) else None


def route(workers: WorkerSet, path: str, method: str, params: dict[str, list[str]]) -> Route:
    """Where the request ``method path?params`` is answered (see the module's doc)."""
    kind = _NODE_READS.get(path)
    if kind is not None:
        return Route(kind)
    if path.startswith("/config/"):
        return Route(EVERY) if method == "PUT" else _LOCAL
    if path in _EVERY_PATHS:
        return Route(EVERY)
    owner_path = path in _OWNER_PATHS
    if not owner_path and path not in _SPLIT_PATHS and path != "/message/get":
        return _LOCAL
    names = params.get("topic")
    topic = names[0] if names else ""
    if not is_valid_name(topic):
        return _LOCAL  # the handler's own error, where it arrived
    if path == "/message/get" and params.get("search_mode", [""])[0] == "id":
        pos = _int(params, "search_pos", -1)
        pid = None if pos is None else pos >> PARTITION_SHIFT
    elif owner_path or "partition" in params:
        if path == "/topic/delete" and params["partition"][0] == "**":
            return Route(EVERY)  # (every partition, as no partition)
        pid = _int(params, "partition", -1)
    else:
        return Route(EVERY)
    if pid is None:
        return _LOCAL
    return Route(OWNER, workers.owner(topic, pid))


def combine(answers: list[Answer]) -> Answer:
    """One answer for a request every worker answered: the first error that is not a
    404 (a worker without the topic says 404), else the first success, else the most
    telling 404 (a missing channel or partition rather than a missing topic)."""
    for a in answers:
        if a.status not in (200, 404):
            return a
    for a in answers:
        if a.ok:
            return a
    for a in answers:
        if b"TOPIC_NOT_FOUND" not in a.body:
            return a
    return answers[0]


def forwarded_headers(request: web.BaseRequest, token: str) -> CIMultiDict[str]:
    """The request's headers as they go to another worker (Authorization, the
    cluster's secret, Content-Type, Accept, X-Forwarded-For ...), marked forwarded and
    with the client's address."""
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in request.headers.items():
        if k.lower() not in _HOP_BY_HOP:
            out.add(k, v)
    # the node's secret token: a client cannot pass its request off as a worker's
    out[FORWARDED] = token
    if PEER not in out:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if isinstance(peer, tuple):
            out[PEER] = str(peer[0])
    return out


def _answer_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


class WorkerUnavailable(Exception):
    """A worker did not answer (it died, or is restarting)."""


class HttpRouter:
    """One worker's client of the other workers' HTTP APIs (one shared session)."""

    #: a forwarded request's limit: longer than any handler waits (a role change waits
    #: a second for its confirmation, a publish for its ISR)
    TIMEOUT = 60.0

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers
        self._session: aiohttp.ClientSession | None = None

    @property
    def index(self) -> int:
        return self.workers.index

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256),
                timeout=aiohttp.ClientTimeout(total=self.TIMEOUT),
                auto_decompress=False,  # the bytes go back as they came
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, index: int, path_qs: str) -> URL:
        return URL(f"http://{self.workers.internal_http(index)}{path_qs}", encoded=True)

    async def call(
        self,
        index: int,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        body: bytes,
    ) -> Answer:
        """``method path_qs`` on worker ``index``, its answer read whole."""
        try:
            async with self._client().request(
                method,
                self._url(index, path_qs),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            ) as resp:
                return Answer(resp.status, _answer_headers(resp.headers), await resp.read())
        except (aiohttp.ClientError, TimeoutError) as err:
            log.error("WORKERS: %s %s on worker %d failed: %r", method, path_qs, index, err)
            raise WorkerUnavailable(str(err)) from None

    async def every(
        self, method: str, path_qs: str, headers: CIMultiDict[str], body: bytes
    ) -> list[Answer]:
        """The request on every worker (this one too, through its own port: the same
        handler, the same checks), their answers in worker order."""
        return list(
            await asyncio.gather(
                *(self.call(i, method, path_qs, headers, body) for i in range(self.workers.count))
            )
        )

    async def forward(
        self, index: int, request: web.BaseRequest, body: bytes
    ) -> web.StreamResponse:
        """The request answered by worker ``index``, its answer returned as it is
        (status, headers, body; a long body streamed through)."""
        headers = forwarded_headers(request, self.workers.spec.token)
        try:
            async with self._client().request(
                request.method,
                self._url(index, request.raw_path),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            ) as resp:
                out_headers = _answer_headers(resp.headers)
                length = resp.content_length
                if length is not None and length < _WHOLE_BELOW:
                    return web.Response(
                        status=resp.status, body=await resp.read(), headers=out_headers
                    )
                stream = web.StreamResponse(status=resp.status, headers=out_headers)
                if length is not None:
                    stream.content_length = length
                await stream.prepare(request)
                async for chunk in resp.content.iter_chunked(1 << 18):
                    await stream.write(chunk)
                await stream.write_eof()
                return stream
        except (aiohttp.ClientError, TimeoutError) as err:
            log.error(
                "WORKERS: %s %s on worker %d failed: %r", request.method, request.path, index, err
            )
            raise WorkerUnavailable(str(err)) from None

    async def proxy_websocket(
        self, index: int, request: web.BaseRequest, ws: web.WebSocketResponse, first: bytes
    ) -> None:
        """Join the client's WebSocket ``ws`` (whose ``first`` message was read here)
        to the same request on worker ``index``, both ways, until either side closes."""
        headers = forwarded_headers(request, self.workers.spec.token)
        for k in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
            headers.popall(k, None)
        try:
            upstream = await self._client().ws_connect(
                self._url(index, request.raw_path),
                headers=headers,
                max_msg_size=0,
                heartbeat=5.0,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            log.error("WORKERS: WebSocket to worker %d failed: %r", index, err)
            raise WorkerUnavailable(str(err)) from None
        try:
            await upstream.send_bytes(first)

            tasks = [
                asyncio.create_task(_relay(upstream, ws)),
                asyncio.create_task(_relay(ws, upstream)),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await upstream.close()


_WebSocket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _relay(source: _WebSocket, sink: _WebSocket) -> None:
    """Pass a WebSocket's messages on to another until it closes."""
    async for msg in source:
        if msg.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(msg.data)
        else:
            break
