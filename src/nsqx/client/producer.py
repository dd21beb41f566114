"""Producers: publish over TCP (PUB, MPUB, DPUB, pipelined) or over nsqd's HTTP API.

:class:`Producer` keeps one connection to an nsqd. Publishes are written at once and
their responses matched in order, so many can be outstanding: ``await`` each one for
round trips, or gather them to pipeline. A lost connection fails the publishes it was
carrying (each with its own error) and the next publish reconnects, trying the
configured addresses in turn.

Youzan's extensions: a publish may name a partition (``PUB <t> <p>``), carry a trace id
(PUB_TRACE / MPUB_TRACE, answered with a :class:`TraceResult`) or a JSON ext header
(PUB_EXT / MPUB_EXT). Publishing by key, to whichever nsqd leads the key's partition,
is :class:`~nsqx.client.partition_producer.PartitionProducer`'s job.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

from nsqx.client import codec
from nsqx.client.config import Config
from nsqx.client.conn import Connection, Frames, split_address
from nsqx.client.errors import (
    ConnectionClosedError,
    NSQError,
    NSQServerError,
    PublishError,
)
from nsqx.client.youzan import TRACED_RESPONSE_SIZE, TraceResult, check_trace_id, ext_header
from nsqx.wire import commands
from nsqx.wire.errors import (
    E_FAILED_ON_NOT_LEADER,
    E_FAILED_ON_NOT_WRITABLE,
    NON_FATAL_ON_PUB,
)
from nsqx.wire.frames import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT, OK
from nsqx.wire.names import is_valid_name

log = logging.getLogger("nsqx.client")

Body = bytes | bytearray | memoryview | str

_I32 = struct.Struct(">i")
_NOP = commands.nop()
#: nsqd is not (or no longer) the partition's leader: its connection is retired once
#: the publishes it carries are answered, and the next publish opens another
_RETIRE_CODES = frozenset({E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE})


def _as_bytes(body: Body) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, str):
        return body.encode()
    return bytes(body)


def _check_topic(topic: str) -> None:
    if not is_valid_name(topic):
        raise ValueError(f"invalid topic name {topic!r}")


def _check_body(body: bytes) -> None:
    if not body:
        raise ValueError("nsqd refuses empty messages")


def _check_partition(partition: int | None) -> None:
    if partition is None:
        return
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"a partition is an int >= 0 (got {partition!r})")


def mpub_body(bodies: Sequence[bytes]) -> bytes:
    """An MPUB body: ``[u32 count]([u32 size][bytes])*`` (also HTTP /mpub?binary=true)."""
    return b"".join(_mpub_parts(bodies))


def _mpub_parts(bodies: Sequence[bytes]) -> list[bytes]:
    """The MPUB body in a few pieces (joined once, with the command line, by the caller).

    Empty bodies raise ValueError (nsqd refuses them, and closes the connection).
    """
    pack = _I32.pack
    sizes = set(map(len, bodies))
    if 0 in sizes:
        raise ValueError("nsqd refuses empty messages")
    if len(sizes) == 1:
        # equal sizes (the usual batch): one separator, one join in C
        prefix = pack(sizes.pop())
        return [pack(len(bodies)), prefix, prefix.join(bodies)]
    parts = [pack(len(bodies))]
    for b in bodies:
        parts.append(pack(len(b)))
        parts.append(b)
    return parts


def _as_bytes_list(bodies: Iterable[Body]) -> list[bytes]:
    datas = bodies if isinstance(bodies, list) else list(bodies)
    if not datas:
        raise ValueError("multi_publish needs at least one message")
    if set(map(type, datas)) != {bytes}:
        datas = [_as_bytes(b) for b in datas]
    return datas  # type: ignore[return-value]


class _PubConn(Connection):
    def __init__(self, producer: Producer, host: str, port: int) -> None:
        super().__init__(
            host,
            port,
            producer.config,
            on_frames=producer._on_frames,
            on_lost=producer._on_lost,
        )
        #: One future per command sent, answered in order (None, or a TraceResult).
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        #: Refused as not the leader: no new publishes; closed once waiters are empty.
        self.retired = False


class Producer:
    """Publishes to nsqd over TCP; responses are matched to publishes in order.

    ``nsqd_tcp_addresses`` is one ``"host:port"`` or several: the producer uses one
    connection at a time and moves to the next address when one cannot be reached.
    Options are :class:`Config`'s. Every publish method returns an awaitable that
    completes when nsqd acknowledged, or raises :class:`PublishError` (nsqd refused)
    or :class:`ConnectionClosedError` (the connection ended first: the message may or
    may not have been published).
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Iterable[str],
        *,
        config: Config | None = None,
        **options: Any,
    ) -> None:
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        self.addresses = [split_address(a) for a in nsqd_tcp_addresses]
        if not self.addresses:
            raise ValueError("give at least one nsqd address")
        self.config = (config or Config()).with_options(**options)
        for name in ("snappy", "deflate"):
            if getattr(self.config, name):
                codec.codec_factory(name)
        self._conn: _PubConn | None = None
        self._next = 0
        self._pending: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False
        #: "PUB topic\n" of every topic published to (checked once)
        self._pub_heads: dict[str, bytes] = {}
        #: the same with a partition: "PUB topic partition\n"
        self._part_heads: dict[tuple[str, int], bytes] = {}
        #: retired connections still waiting for answers
        self._retired: set[_PubConn] = set()

    def __repr__(self) -> str:
        state = "connected" if self._conn is not None else "idle"
        return f"<Producer {state}>"

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def connect(self) -> None:
        """Connect now (publishing connects on its own when needed)."""
        if self.connected:
            return
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._connecting)
        if not self.connected:
            raise ConnectionClosedError("could not connect to any nsqd")

    async def close(self) -> None:
        """Wait for outstanding publishes, then close the connection."""
        self._closed = True
        if self._connecting is not None:
            await asyncio.shield(self._connecting)
        for conn in [self._conn, *self._retired]:
            if conn is None:
                continue
            if conn.waiters:
                await asyncio.gather(*conn.waiters, return_exceptions=True)
            conn.close()
            await conn.wait_closed()
        self._conn = None

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- publishing ---------------------------------------------------------------------

    def publish(self, topic: str, body: Body, partition: int | None = None) -> asyncio.Future[None]:
        """PUB one message (to ``partition`` of the topic, or nsqd's default one)."""
        data = _as_bytes(body)
        _check_body(data)
        if partition is None:
            head = self._pub_heads.get(topic)
            if head is None:
                _check_topic(topic)
                head = self._pub_heads[topic] = b"PUB %s\n" % topic.encode()
        else:
            head = self._part_head(topic, partition)
        return self._request(b"".join((head, _I32.pack(len(data)), data)))

    def _part_head(self, topic: str, partition: int) -> bytes:
        head = self._part_heads.get((topic, partition))
        if head is None:
            _check_topic(topic)
            _check_partition(partition)
            head = self._part_heads[topic, partition] = b"PUB %s %d\n" % (
                topic.encode(),
                partition,
            )
        return head

    def multi_publish(
        self, topic: str, bodies: Iterable[Body], partition: int | None = None
    ) -> asyncio.Future[None]:
        """MPUB: several messages, atomically."""
        datas = _as_bytes_list(bodies)
        if partition is None:
            if topic not in self._pub_heads:
                _check_topic(topic)
                self._pub_heads[topic] = b"PUB %s\n" % topic.encode()
            line = b"MPUB " + topic.encode() + b"\n"
        else:
            line = b"M" + self._part_head(topic, partition)
        parts = _mpub_parts(datas)
        size = sum(map(len, parts))
        # one join: the 40 KB of a batch of 200 are copied once
        return self._request(b"".join((line, _I32.pack(size), *parts)))

    def publish_trace(
        self, topic: str, body: Body, trace_id: int, partition: int | None = None
    ) -> asyncio.Future[TraceResult]:
        """PUB_TRACE: one message with a trace id (a business u64, e.g. an order id);
        nsqd answers with the message's id, offset and raw size."""
        data = _as_bytes(body)
        _check_body(data)
        _check_topic(topic)
        _check_partition(partition)
        return self._request(commands.pub_trace(topic, partition, check_trace_id(trace_id), data))

    def multi_publish_trace(
        self,
        topic: str,
        bodies: Iterable[Body],
        trace_ids: Iterable[int],
        partition: int | None = None,
    ) -> asyncio.Future[TraceResult]:
        """MPUB_TRACE: several messages with a trace id each; the answer gives the first
        message's id and offset, and the raw size of the whole batch."""
        datas = _as_bytes_list(bodies)
        traces = [check_trace_id(t) for t in trace_ids]
        if len(traces) != len(datas):
            raise ValueError(f"{len(traces)} trace ids for {len(datas)} messages")
        if 0 in set(map(len, datas)):
            raise ValueError("nsqd refuses empty messages")
        _check_topic(topic)
        _check_partition(partition)
        return self._request(commands.mpub_trace(topic, partition, traces, datas))

    def publish_ext(
        self,
        topic: str,
        body: Body,
        ext: Mapping[str, Any] | None = None,
        *,
        tag: str | None = None,
        trace_id: int | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[TraceResult | None]:
        """PUB_EXT: one message with a JSON ext header (see :func:`ext_header`: ``tag``
        is the dispatch tag, ``trace_id`` the ``##trace_id``). The topic must have been
        created with ext support. The answer is a :class:`TraceResult` when the header
        has a trace id, else None."""
        data = _as_bytes(body)
        _check_body(data)
        _check_topic(topic)
        _check_partition(partition)
        header = ext_header(ext, tag=tag, trace_id=trace_id)
        return self._request(commands.pub_ext(topic, partition, header, data))

    def multi_publish_ext(
        self,
        topic: str,
        bodies: Iterable[Body],
        exts: Iterable[Mapping[str, Any] | None],
        partition: int | None = None,
    ) -> asyncio.Future[None]:
        """MPUB_EXT: several messages, each with its ext header (None: an empty one)."""
        datas = _as_bytes_list(bodies)
        headers = [ext_header(e) for e in exts]
        if len(headers) != len(datas):
            raise ValueError(f"{len(headers)} ext headers for {len(datas)} messages")
        if 0 in set(map(len, datas)):
            raise ValueError("nsqd refuses empty messages")
        _check_topic(topic)
        _check_partition(partition)
        return self._request(commands.mpub_ext(topic, partition, headers, datas))

    def deferred_publish(self, topic: str, body: Body, delay: float) -> asyncio.Future[None]:
        """DPUB: a message delivered after ``delay`` seconds."""
        data = _as_bytes(body)
        _check_body(data)
        _check_topic(topic)
        if delay < 0:
            raise ValueError(f"delay must be >= 0 (got {delay})")
        return self._request(commands.dpub(topic, int(delay * 1000), data))

    # pynsq's names
    pub = publish
    mpub = multi_publish
    dpub = deferred_publish

    def _request(self, cmd: bytes) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            fut.set_exception(ConnectionClosedError("the producer is closed"))
            return fut
        conn = self._conn
        if conn is not None and not conn.closed:
            waiters = conn.waiters
            waiters.append(fut)
            if len(waiters) == 1:
                conn.write(cmd)  # nothing outstanding: no reason to wait (round trips)
            else:
                conn.queue(cmd)  # pipelining: one write per loop iteration
            return fut
        self._pending.append((cmd, fut))
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        return fut

    # -- connection ---------------------------------------------------------------------

    async def _connect(self) -> None:
        error: BaseException | None = None
        try:
            for i in range(len(self.addresses)):
                host, port = self.addresses[(self._next + i) % len(self.addresses)]
                conn = _PubConn(self, host, port)
                try:
                    await conn.connect()
                except (NSQError, OSError, TimeoutError) as exc:
                    log.warning("%s:%d: cannot connect: %s", host, port, exc)
                    error = exc
                    continue
                except Exception as exc:
                    # never leave the pending publishes hanging
                    log.exception("%s:%d: cannot connect", host, port)
                    error = exc
                    continue
                self._next = (self._next + i) % len(self.addresses)
                self._conn = conn
                conn.start_reading()
                pending, self._pending = self._pending, []
                for cmd, fut in pending:
                    if fut.done():
                        continue  # cancelled before it could be sent: not published
                    conn.waiters.append(fut)
                    conn.queue(cmd)
                conn.flush()
                return
            pending, self._pending = self._pending, []
            for _, fut in pending:
                if not fut.done():
                    failed = ConnectionClosedError(f"cannot connect to any nsqd: {error}")
                    failed.__cause__ = error
                    fut.set_exception(failed)
        finally:
            self._connecting = None

    def _on_frames(self, conn: Connection, frames: Frames) -> None:
        assert isinstance(conn, _PubConn)
        waiters = conn.waiters
        for ftype, data in frames:
            if ftype == FRAME_RESPONSE:
                if data == OK and waiters:
                    fut = waiters.popleft()
                    if not fut.done():
                        fut.set_result(None)
                elif data == HEARTBEAT:
                    conn.queue(_NOP)
                elif len(data) == TRACED_RESPONSE_SIZE and data[:2] == OK and waiters:
                    fut = waiters.popleft()
                    if not fut.done():
                        fut.set_result(TraceResult.from_response(data))
                else:
                    log.warning("%s: unexpected response %r", conn.key, data[:100])
            elif ftype == FRAME_ERROR:
                err = NSQServerError.from_frame(data)
                perr = PublishError(err.code, err.description)
                if waiters:
                    fut = waiters.popleft()
                    if not fut.done():
                        fut.set_exception(perr)
                if perr.code in _RETIRE_CODES:
                    # Youzan's nsqd keeps the connection open and answers the publishes
                    # behind this one; once they are answered, it is closed
                    log.warning("%s: %s: this connection takes no more publishes", conn.key, perr)
                    self._retire(conn)
                elif perr.code in NON_FATAL_ON_PUB:
                    log.warning("%s: nsqd refused a publish: %s", conn.key, perr)
                elif perr.fatal:
                    log.error("%s: nsqd refused a publish: %s", conn.key, perr)
                    conn.close(perr)
            else:
                conn.handle_control(ftype, data)
        if conn.retired and not conn.waiters:
            conn.close()
        conn.flush()

    def _retire(self, conn: _PubConn) -> None:
        conn.retired = True
        self._retired.add(conn)
        if self._conn is conn:
            self._conn = None
            self._next = (self._next + 1) % len(self.addresses)

    def _on_lost(self, conn: Connection, exc: BaseException | None) -> None:
        assert isinstance(conn, _PubConn)
        self._retired.discard(conn)
        if self._conn is conn:
            self._conn = None
            # move on: the next connection starts with the next address
            self._next = (self._next + 1) % len(self.addresses)
        why = f": {exc}" if exc else ""
        while conn.waiters:
            fut = conn.waiters.popleft()
            if not fut.done():
                err = ConnectionClosedError(
                    f"{conn.key}: connection closed before nsqd answered{why} "
                    "(the message may or may not have been published)"
                )
                fut.set_exception(err)


class HttpProducer:
    """Publishes through nsqd's HTTP API: POST /pub (``defer`` for delays) and /mpub.

    ``nsqd_http_addresses`` are ``host:port`` or URLs; a request goes to the first that
    accepts the connection (a refused connection moves on to the next address).
    """

    def __init__(
        self,
        nsqd_http_addresses: str | Iterable[str],
        *,
        timeout: float = 5.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if isinstance(nsqd_http_addresses, str):
            nsqd_http_addresses = [nsqd_http_addresses]
        self.urls = [(a if "://" in a else "http://" + a).rstrip("/") for a in nsqd_http_addresses]
        if not self.urls:
            raise ValueError("give at least one nsqd HTTP address")
        self.timeout = timeout
        self._session = session
        self._own_session = session is None
        self._next = 0

    async def __aenter__(self) -> HttpProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    async def publish(self, topic: str, body: Body) -> None:
        """POST /pub?topic=."""
        data = _as_bytes(body)
        _check_body(data)
        _check_topic(topic)
        await self._post("/pub", {"topic": topic}, data)

    async def multi_publish(self, topic: str, bodies: Iterable[Body]) -> None:
        """POST /mpub?topic=&binary=true."""
        datas = _as_bytes_list(bodies)
        _check_topic(topic)
        await self._post("/mpub", {"topic": topic, "binary": "true"}, mpub_body(datas))

    async def deferred_publish(self, topic: str, body: Body, delay: float) -> None:
        """POST /pub?topic=&defer=ms (nsqd has no /dpub)."""
        data = _as_bytes(body)
        _check_body(data)
        _check_topic(topic)
        if delay < 0:
            raise ValueError(f"delay must be >= 0 (got {delay})")
        await self._post("/pub", {"topic": topic, "defer": str(int(delay * 1000))}, data)

    pub = publish
    mpub = multi_publish
    dpub = deferred_publish

    async def _post(self, path: str, params: dict[str, str], data: bytes) -> None:
        import aiohttp  # only the HTTP producer needs it

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        session = self._session
        error: BaseException | None = None
        for i in range(len(self.urls)):
            url = self.urls[(self._next + i) % len(self.urls)] + path
            try:
                async with session.post(url, params=params, data=data) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        self._next = (self._next + i) % len(self.urls)
                        return
                    raise _http_error(resp.status, text)
            except aiohttp.ClientConnectorError as exc:
                # not connected: nothing was sent, another nsqd may take it
                log.warning("%s: cannot connect: %s", url, exc)
                error = exc
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ConnectionClosedError(
                    f"{url}: {exc or type(exc).__name__} "
                    "(the message may or may not have been published)"
                ) from exc
        raise ConnectionClosedError(f"cannot connect to any nsqd: {error}") from error


def _http_error(status: int, text: str) -> PublishError:
    message = text.strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        message = parsed["message"]
    return PublishError(message or f"HTTP_{status}", f"(HTTP {status})")
