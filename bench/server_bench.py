"""Throughput benchmark of an NSQ server (our nsqd, or any other, e.g. Go's nsqd).

Three phases, all with ``--size``-byte messages (200 by default) on one topic:

``pub``
    One TCP connection publishes MPUB batches of ``--batch`` (200) messages for
    ``--pub-seconds`` (10 s). The MPUB command is encoded once and written again and
    again; up to ``--window`` (16) MPUBs are outstanding, and a new one is written for
    every ``OK``. Only acknowledged messages count; the time runs until the last
    outstanding MPUB is acknowledged.
``sub``
    One connection, subscribed to the channel ``sub`` *before* the pub phase (so the
    channel exists and holds what the pub phase published), consumes with ``RDY 2500``
    for ``--sub-seconds`` (5 s). The FINs of all messages from one read go out in one
    write, and RDY is sent again whenever half of it was used, so the server is never
    starved whatever its RDY semantics. If the backlog runs dry (every acknowledged
    message was received, or 1 s went by without one) the phase ends early and the
    rate is computed up to the last message.
    Without the pub phase, an unreported pub phase fills the channel first.
``both``
    A fresh channel ``both`` is subscribed (RDY 2500) before publishing starts, so it
    sees only new messages; then one connection publishes as in ``pub`` while the
    other consumes as in ``sub``, for ``--both-seconds`` (10 s). Note that the ``sub``
    channel, if the sub phase ran, still exists and gets a copy of every message, as
    it would in NSQ.
``http-pub`` and ``http-mpub``
    The HTTP API: ``--http-concurrency`` (8) requests at a time on keep-alive
    connections (one aiohttp ClientSession) POST one message to ``/pub`` or a batch of
    ``--batch`` newline-separated messages to ``/mpub``, for ``--http-seconds`` (5 s)
    each. They publish to ``<topic>-http#ephemeral``, a topic without channels that
    keeps only --mem-queue-size messages, so memory stays flat; only ``200 OK``
    answers count, and the topic's message count (from ``/stats``) must match. They
    need the server's HTTP address: our own server listens on one; for another, give
    ``--nsqd-http-address`` (without it these phases are skipped).

For each phase the bench prints msgs/s, MB/s of payload (MB = 10^6 bytes), the
server's CPU time per message (utime + stime + reaped children of the server process
and its descendants, from ``/proc/<pid>/stat``, before and after the phase), the
server's CPU as a share of one core, and the client's own CPU share: a client near
100% is the bottleneck and the figures are a lower bound for the server. In the
``both`` phase, per message means per published message.

The client is built for speed: asyncio Protocol classes (no streams) on uvloop when it
is importable, the sans-IO codecs of ``nsqx.wire``, one precomputed MPUB, FINs
coalesced per read; it costs about 1 us per consumed message and much less per
published one. In the ``both`` phase the publisher runs by default in a separate
process (``--both-mode process``, a ``spawn``-ed child; the consumer stays in this
process), so that publisher and consumer are independent, as separate clients are: in
one Python thread (``--both-mode inline``) each waits for the other's callbacks, which
tends to pace the publisher to the consumer. On the 2-core machine this was written
on, the server needs one core and the client processes share the other; both modes
measured the same throughput there, within the noise of a shared machine.

Every consumed message is checked: body length ``--size`` and attempts >= 1; a bad
message, an error frame from the server, a closed connection or a stall (no MPUB
acknowledgement for 30 s) ends the bench with a non-zero exit status.

``--tls``, ``--snappy``, ``--deflate`` (one of the two compressions, optionally with
``--tls``) make every bench connection negotiate them in IDENTIFY, as clients do: TLS
handshake and encrypted OK, then the compressed OK; the compressors flush per write.
Compare the figures with a plain run (no option). With its own server the bench makes
a throwaway CA and certificate (trustme); for another server pass ``--tls-ca`` (without
it the server's certificate is not verified).

Without ``--nsqd-tcp-address`` the bench starts its own server,
``python -m nsqx nsqd --tcp-address=127.0.0.1:0 --http-address= --data-path=<tmpdir>``,
reads its port from the ``TCP: listening on HOST:PORT`` log line, and stops it at the
end. With ``--nsqd-tcp-address`` give ``--server-pid`` to get the CPU figures, else
they are n/a.

Run: ``make bench``, or ``.venv/bin/python bench/server_bench.py --help``. As a module
(``run_bench(BenchConfig(...))``), call it under ``if __name__ == "__main__":``, as
multiprocessing's ``spawn`` requires.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import quote

import aiohttp

from nsqx.wire import commands
from nsqx.wire.compression import Compressor, Decompressor, codec_pair
from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    MESSAGE_HEADER_SIZE,
    MSG_ATTEMPTS_AT,
    MSG_ID_AT,
    MSG_ID_END,
    OK,
    FrameDecoder,
)

_loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
try:
    import uvloop

    _loop_factory = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    _loop_factory = None

T = TypeVar("T")

PHASES = ("pub", "sub", "both", "http-pub", "http-mpub")
HTTP_PHASES = ("http-pub", "http-mpub")
SUB_CHANNEL = "sub"
BOTH_CHANNEL = "both"
#: An MPUB not acknowledged this long after the phase's end is a stall.
STALL_SECONDS = 30.0
#: The sub phase ends early after this long without a message (backlog drained).
IDLE_SECONDS = 1.0
CONNECT_TIMEOUT = 10.0
USER_AGENT = "nsqx-server-bench/0.1"
_LISTENING = re.compile(rb"(TCP|HTTP): listening on (\S+)")


class BenchError(Exception):
    """The bench cannot go on: the message says why."""


@dataclass
class BenchConfig:
    nsqd_tcp_address: str | None = None
    server_pid: int | None = None
    pub_seconds: float = 10.0
    sub_seconds: float = 5.0
    both_seconds: float = 10.0
    size: int = 200
    batch: int = 200
    window: int = 16
    rdy: int = 2500
    topic: str = field(default_factory=lambda: f"bench-{secrets.token_hex(4)}")
    phases: tuple[str, ...] = PHASES
    both_mode: str = "process"
    startup_timeout: float = 20.0
    nsqd_http_address: str | None = None
    http_seconds: float = 5.0
    http_concurrency: int = 8
    tls: bool = False
    snappy: bool = False
    deflate: bool = False
    #: CA to verify the server with (--tls); None: not verified
    tls_ca: str | None = None
    #: settings for the bench's channels (nsqx's POST /channel/config query), "": none
    channel_config: str = ""
    #: the interpreter whose nsqx runs our own server (None: this one), e.g. a wheel's venv
    nsqd_python: str | None = None

    @property
    def transport(self) -> str:
        """How connections are upgraded: plain, tls, snappy, tls+deflate..."""
        parts = [name for name in ("tls", "snappy", "deflate") if getattr(self, name)]
        return "+".join(parts) or "plain"


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop, uvloop's when available."""
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        return runner.run(coro)


def message_body(size: int) -> bytes:
    pattern = b"nsqx-bench-"
    return (pattern * (size // len(pattern) + 1))[:size]


# --- server CPU -------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _read_stats() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, cpu ticks: utime + stime + cutime + cstime) of every process."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        # fields after "(comm)": state is field 3, ppid 4, utime 14 .. cstime 17
        fields = data[data.rindex(b")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    return out


def server_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds used so far by ``pid`` and its descendants, or None if unknown."""
    if pid is None or not os.path.exists(f"/proc/{pid}/stat"):
        return None
    stats = _read_stats()
    if pid not in stats:
        return None
    children: dict[int, list[int]] = collections.defaultdict(list)
    for p, (ppid, _) in stats.items():
        children[ppid].append(p)
    ticks = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        ticks += stats[p][1]
        todo.extend(children.get(p, ()))
    return ticks / CLK_TCK


# --- connections ------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """A client connection: frame decoding, heartbeats, responses to awaited requests."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.failed: asyncio.Future[None] = self.loop.create_future()
        # a failure is reported by whoever awaits it; never "exception was never retrieved"
        self.failed.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closing = False
        self.settings: dict[str, Any] = {}
        # negotiated compression; before it is in place, input is cut after one frame
        # (the IDENTIFY answer, the TLS OK) and the rest kept for the decompressor
        self.compressor: Compressor | None = None
        self.decompressor: Decompressor | None = None
        self.one_frame = False
        self.head: list[bytes] = []
        self.stash: list[bytes] | None = None

    # -- asyncio callbacks --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            why = f": {exc}" if exc else ""
            self.fail(BenchError(f"{self.name}: the server closed the connection{why}"))

    def data_received(self, data: bytes) -> None:
        try:
            if self.decompressor is not None:
                data = self.decompressor.decompress(data)
            elif self.stash is not None:
                self.stash.append(data)
                return
            elif self.one_frame:
                data = self._cut_one_frame(data)
            frames = self.decoder.feed(data)
        except ProtocolError as err:
            self.fail(BenchError(f"{self.name}: undecodable data from the server: {err}"))
            return
        self.on_frames(frames)

    def _cut_one_frame(self, data: bytes) -> bytes:
        """Pass on one whole frame; stash what follows it (negotiation in progress)."""
        buf = b"".join(self.head) + data
        if len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            self.head = [buf]
            return b""
        end = 4 + int.from_bytes(buf[:4], "big")
        self.head = []
        self.one_frame = False
        self.stash = [buf[end:]]
        return buf[:end]

    def unstash(self) -> bytes:
        """Stop stashing; return what was stashed."""
        data = b"".join(self.stash or [])
        self.stash = None
        return data

    # -- frames --

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        for ftype, payload in frames:
            self.on_control(ftype, payload)

    def on_control(self, ftype: int, payload: bytes) -> None:
        """A frame that is not a message nor a counted OK."""
        if ftype == FRAME_RESPONSE:
            if payload == HEARTBEAT:
                self.write(commands.nop())
            elif self.waiters:
                self.waiters.popleft().set_result(payload)
            else:
                self.fail(BenchError(f"{self.name}: unexpected response frame {payload[:200]!r}"))
        elif ftype == FRAME_ERROR:
            text = payload.decode("utf-8", "replace")
            self.fail(BenchError(f"{self.name}: the server sent an error frame: {text}"))
        else:
            self.fail(BenchError(f"{self.name}: unexpected frame type {ftype} ({len(payload)} B)"))

    # -- helpers --

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            if self.compressor is not None:
                data = self.compressor.compress(data)
            self.transport.write(data)

    def expect(self) -> asyncio.Future[bytes]:
        """A future for the next response, for one the server sends unasked (upgrades)."""
        fut: asyncio.Future[bytes] = self.loop.create_future()
        self.waiters.append(fut)
        return fut

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        """Write a command that gets a response; the future gets the response's payload."""
        fut: asyncio.Future[bytes] = self.loop.create_future()
        if self.failed.done():
            fut.set_exception(self.failed.exception() or BenchError("connection failed"))
            return fut
        self.waiters.append(fut)
        self.write(data)
        return fut

    def fail(self, exc: BaseException) -> None:
        if not self.failed.done():
            self.failed.set_exception(exc)
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


async def until(aw: Awaitable[T], conns: Sequence[_Conn], timeout: float, what: str) -> T:
    """Await ``aw``, but raise as soon as one of ``conns`` fails, or after ``timeout``."""
    task: asyncio.Future[T] = asyncio.ensure_future(aw)
    failures = [c.failed for c in conns]
    waitables: list[asyncio.Future[Any]] = [task, *failures]
    done, _ = await asyncio.wait(waitables, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for f in failures:
        if f in done and f.exception() is not None:
            task.cancel()
            raise cast(BaseException, f.exception())
    if task in done:
        return task.result()
    task.cancel()
    raise BenchError(f"timed out after {timeout:g} s waiting for {what}")


def _check_failed(conns: Sequence[_Conn]) -> None:
    for c in conns:
        if c.failed.done() and c.failed.exception() is not None:
            raise cast(BaseException, c.failed.exception())


C = TypeVar("C", bound=_Conn)


def client_ssl_context(cfg: BenchConfig) -> ssl.SSLContext:
    if cfg.tls_ca:
        return ssl.create_default_context(cafile=cfg.tls_ca)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def connect(
    factory: Callable[[], C],
    host: str,
    port: int,
    client_id: str,
    cfg: BenchConfig,
    identify: dict[str, Any] | None = None,
) -> C:
    """Open a connection, send the magic and IDENTIFY (with feature negotiation and the
    ``identify`` fields, e.g. output buffering), and do the upgrades ``cfg`` asks for."""
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(factory, host, port), CONNECT_TIMEOUT
        )
    except (OSError, TimeoutError) as err:
        raise BenchError(f"cannot connect to {host}:{port}: {err}") from None
    conn.write(MAGIC_V2)
    body = {
        "client_id": client_id,
        "hostname": socket.gethostname(),
        "user_agent": USER_AGENT,
        "feature_negotiation": True,
        "tls_v1": cfg.tls,
        "snappy": cfg.snappy,
        "deflate": cfg.deflate,
        **(identify or {}),
    }
    conn.one_frame = cfg.tls or cfg.snappy or cfg.deflate
    resp = await until(
        conn.request(commands.identify(body)), [conn], CONNECT_TIMEOUT, "the IDENTIFY response"
    )
    if resp != OK:
        try:
            settings = json.loads(resp)
        except ValueError:
            raise BenchError(f"{conn.name}: bad IDENTIFY response {resp[:200]!r}") from None
        if not isinstance(settings, dict):
            raise BenchError(f"{conn.name}: bad IDENTIFY response {resp[:200]!r}")
        conn.settings = settings
    if conn.one_frame or conn.stash is not None:
        await upgrade(conn, cfg, host)
    return conn


async def upgrade(conn: _Conn, cfg: BenchConfig, host: str) -> None:
    """TLS (handshake, encrypted OK), then compression (compressed OK), as negotiated."""
    s = conn.settings
    for name in ("tls", "snappy", "deflate"):
        if getattr(cfg, name) and not s.get("tls_v1" if name == "tls" else name):
            raise BenchError(f"{conn.name}: the server did not agree to {name}")
    if cfg.tls:
        if conn.unstash():
            raise BenchError(f"{conn.name}: data before the TLS handshake")
        conn.one_frame = cfg.snappy or cfg.deflate
        ok = conn.expect()
        assert conn.transport is not None
        loop = asyncio.get_running_loop()
        tls_transport = await until(
            loop.start_tls(conn.transport, conn, client_ssl_context(cfg), server_hostname=host),
            [conn],
            CONNECT_TIMEOUT,
            "the TLS handshake",
        )
        assert tls_transport is not None
        conn.transport = cast(asyncio.Transport, tls_transport)
        if await until(ok, [conn], CONNECT_TIMEOUT, "the OK after TLS") != OK:
            raise BenchError(f"{conn.name}: no OK after the TLS handshake")
    pair = codec_pair(cfg.snappy, cfg.deflate, int(s.get("deflate_level") or 6))
    if pair is not None:
        rest = conn.unstash()
        conn.compressor, conn.decompressor = pair
        ok = conn.expect()
        if rest:
            conn.data_received(rest)
        if await until(ok, [conn], CONNECT_TIMEOUT, "the compressed OK") != OK:
            raise BenchError(f"{conn.name}: no OK after enabling compression")


class Publisher(_Conn):
    """Writes one precomputed MPUB again and again, at most ``window`` unacknowledged."""

    def __init__(self, name: str, mpub: bytes, window: int) -> None:
        super().__init__(name)
        self.mpub = mpub
        self.window = window
        self.active = False
        self.sending = False
        self.outstanding = 0
        self.acked = 0
        self.deadline = 0.0
        self.t0 = 0.0
        self.t_end = 0.0
        self.done: asyncio.Future[None] = self.loop.create_future()

    def start(self, seconds: float) -> None:
        self.active = self.sending = True
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + seconds
        self.outstanding = self.window
        self.write(self.mpub * self.window)

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        if not self.active:
            super().on_frames(frames)
            return
        acks = 0
        for ftype, payload in frames:
            if ftype == FRAME_RESPONSE and payload == OK:
                acks += 1
            else:
                self.on_control(ftype, payload)
        if not acks:
            return
        self.acked += acks
        self.outstanding -= acks
        if self.sending:
            if time.perf_counter() < self.deadline:
                self.outstanding += acks
                self.write(self.mpub if acks == 1 else self.mpub * acks)
            else:
                self.sending = False
        if not self.sending and self.outstanding == 0:
            self.t_end = time.perf_counter()
            self.active = False
            if not self.done.done():
                self.done.set_result(None)


class Consumer(_Conn):
    """Checks every message, FINs all messages of a read in one write, keeps RDY up."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__(name)
        self.expected = MESSAGE_HEADER_SIZE + size
        self.size = size
        self.rdy = 0
        self.rdy_left = 0
        self.counting = False
        self.count = 0  # messages received while counting
        self.total = 0  # all messages received
        self.bad = 0
        self.bad_examples: list[str] = []
        self.last_msg = 0.0

    def set_rdy(self, count: int) -> None:
        self.rdy = self.rdy_left = count
        self.write(commands.rdy(count))

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        ids: list[bytes] = []
        append = ids.append
        expected = self.expected
        for ftype, payload in frames:
            if ftype == FRAME_MESSAGE:
                # payload: [i64 timestamp][u16 attempts][16-byte id][body]
                if len(payload) == expected and (
                    payload[MSG_ATTEMPTS_AT] or payload[MSG_ATTEMPTS_AT + 1]
                ):
                    append(payload[MSG_ID_AT:MSG_ID_END])
                else:
                    self._bad_message(payload)
                    if len(payload) >= MESSAGE_HEADER_SIZE:
                        append(payload[MSG_ID_AT:MSG_ID_END])
            else:
                self.on_control(ftype, payload)
        if not ids:
            return
        n = len(ids)
        self.total += n
        if self.counting:
            self.count += n
            self.last_msg = time.perf_counter()
        out = commands.fin_many(ids)
        self.rdy_left -= n
        if self.rdy and self.rdy_left <= self.rdy // 2:
            out += commands.rdy(self.rdy)
            self.rdy_left = self.rdy
        self.write(out)

    def _bad_message(self, payload: bytes) -> None:
        self.bad += 1
        if len(self.bad_examples) < 5:
            if len(payload) < MESSAGE_HEADER_SIZE:
                what = f"message frame of {len(payload)} bytes, shorter than its header"
            else:
                attempts = int.from_bytes(payload[MSG_ATTEMPTS_AT:MSG_ID_AT], "big")
                what = (
                    f"message {payload[MSG_ID_AT:MSG_ID_END]!r}: body {len(payload) - MESSAGE_HEADER_SIZE} B "
                    f"(expected {self.size}), attempts {attempts}"
                )
            self.bad_examples.append(what)


async def open_consumer(
    host: str, port: int, cfg: BenchConfig, channel: str, name: str
) -> Consumer:
    topic, size = cfg.topic, cfg.size
    conn = await connect(lambda: Consumer(name, size), host, port, name, cfg)
    resp = await until(
        conn.request(commands.sub(topic, channel)), [conn], CONNECT_TIMEOUT, "the SUB response"
    )
    if resp != OK:
        raise BenchError(f"{name}: unexpected SUB response {resp[:200]!r}")
    return conn


# --- phases -----------------------------------------------------------------------------


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _cpu_fields(
    cpu0: float | None, cpu1: float | None, msgs: int, seconds: float
) -> dict[str, Any]:
    if cpu0 is None or cpu1 is None:
        return {"server_cpu_s": None, "server_cpu_us_per_msg": None, "server_cpu_pct": None}
    cpu = cpu1 - cpu0
    return {
        "server_cpu_s": round(cpu, 3),
        "server_cpu_us_per_msg": round(cpu * 1e6 / msgs, 3) if msgs else None,
        "server_cpu_pct": round(100 * _rate(cpu, seconds), 1),
    }


@dataclass
class PublishResult:
    msgs: int
    seconds: float
    client_cpu_s: float


async def publish_for(
    host: str, port: int, cfg: BenchConfig, seconds: float, watch: Sequence[_Conn] = ()
) -> PublishResult:
    """Publish for ``seconds`` on a new connection; return acknowledged messages."""
    mpub = commands.mpub(cfg.topic, [message_body(cfg.size)] * cfg.batch)
    pub = await connect(
        lambda: Publisher("publisher", mpub, cfg.window), host, port, "bench-pub", cfg
    )
    try:
        c0 = time.process_time()
        pub.start(seconds)
        await until(pub.done, [pub, *watch], seconds + STALL_SECONDS, "MPUB acknowledgements")
        cpu = time.process_time() - c0
    finally:
        pub.close()
    if not pub.acked:
        raise BenchError("publisher: no MPUB was acknowledged")
    return PublishResult(pub.acked * cfg.batch, pub.t_end - pub.t0, cpu)


async def http_publish_for(
    base: str, path: str, body: bytes, per_request: int, seconds: float, concurrency: int
) -> tuple[PublishResult, int]:
    """POST ``body`` to ``base + path`` from ``concurrency`` workers for ``seconds``.

    Returns the result and the messages of the warm-up requests (not in the result).
    """
    loop = asyncio.get_running_loop()
    url = base + path
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=STALL_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post() -> None:
            async with session.post(url, data=body) as resp:
                answer = await resp.read()
                if resp.status != 200 or answer != b"OK":
                    raise BenchError(f"POST {path}: {resp.status} {answer[:200]!r}")

        # open the connections before the clock starts, as the TCP phases do
        await asyncio.gather(*(post() for _ in range(concurrency)))
        warm = concurrency

        async def worker(stop_at: float) -> int:
            n = 0
            while loop.time() < stop_at:
                await post()
                n += 1
            return n

        c0 = time.process_time()
        t0 = loop.time()
        try:
            counts = await asyncio.gather(*(worker(t0 + seconds) for _ in range(concurrency)))
        except aiohttp.ClientError as err:
            raise BenchError(f"POST {path}: {err}") from None
        t1 = loop.time()
        cpu = time.process_time() - c0
    requests = sum(counts)
    if not requests:
        raise BenchError(f"POST {path}: no request answered")
    return PublishResult(requests * per_request, t1 - t0, cpu), warm * per_request


async def http_message_count(base: str, topic: str) -> int:
    """The topic's message count from the server's /stats."""
    url = f"{base}/stats?format=json&include_clients=false&include_mem=false&topic={quote(topic)}"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        stats = json.loads(await resp.read())
    return sum(t["message_count"] for t in stats.get("topics") or ())


async def configure_channel(base: str | None, cfg: BenchConfig, channel: str) -> None:
    """Give the channel --channel-config's policy (nsqx's /channel/config)."""
    if not cfg.channel_config:
        return
    if base is None:
        raise BenchError("--channel-config needs the server's HTTP address")
    url = f"{base}/channel/config?topic={quote(cfg.topic)}&channel={channel}&{cfg.channel_config}"
    async with aiohttp.ClientSession() as session, session.post(url) as resp:
        if resp.status != 200:
            raise BenchError(f"/channel/config: {resp.status} {await resp.text()}")


class Bench:
    def __init__(
        self,
        cfg: BenchConfig,
        host: str,
        port: int,
        server_pid: int | None,
        http_base: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.host = host
        self.port = port
        self.pid = server_pid
        self.http_base = http_base
        self.published = 0
        self.sub_consumer: Consumer | None = None

    def _pub_result(
        self, phase: str, r: PublishResult, cpu0: float | None, cpu1: float | None
    ) -> dict[str, Any]:
        return {
            "phase": phase,
            "seconds": round(r.seconds, 3),
            "msgs": r.msgs,
            "msgs_per_s": round(_rate(r.msgs, r.seconds), 1),
            "mb_per_s": round(_rate(r.msgs * self.cfg.size, r.seconds) / 1e6, 2),
            **_cpu_fields(cpu0, cpu1, r.msgs, r.seconds),
            "client_cpu_pct": round(100 * _rate(r.client_cpu_s, r.seconds), 1),
        }

    async def run(self) -> dict[str, dict[str, Any]]:
        cfg = self.cfg
        results: dict[str, dict[str, Any]] = {}
        try:
            if "sub" in cfg.phases:
                # the channel exists before anything is published, and keeps all of it
                self.sub_consumer = await open_consumer(
                    self.host, self.port, cfg, SUB_CHANNEL, "consumer(sub)"
                )
                await configure_channel(self.http_base, cfg, SUB_CHANNEL)
            if "pub" in cfg.phases:
                results["pub"] = await self.phase_pub("pub")
            elif "sub" in cfg.phases:
                await self.phase_pub("prefill")
            if "sub" in cfg.phases:
                results["sub"] = await self.phase_sub()
            if "both" in cfg.phases:
                results["both"] = await self.phase_both()
            for phase in HTTP_PHASES:
                if phase in cfg.phases:
                    results[phase] = await self.phase_http(phase)
        finally:
            if self.sub_consumer is not None:
                self.sub_consumer.close()
        return results

    async def phase_http(self, phase: str) -> dict[str, Any]:
        cfg = self.cfg
        assert self.http_base is not None
        # ephemeral and without channels: bounded by --mem-queue-size however many arrive
        topic = f"{cfg.topic}-http#ephemeral"
        before = await http_message_count(self.http_base, topic)
        body = message_body(cfg.size)
        if phase == "http-pub":
            path, per = f"/pub?topic={quote(topic)}", 1
        else:
            path, per = f"/mpub?topic={quote(topic)}", cfg.batch
            body = b"\n".join([body] * cfg.batch)
        cpu0 = server_cpu_seconds(self.pid)
        r, warm = await http_publish_for(
            self.http_base, path, body, per, cfg.http_seconds, cfg.http_concurrency
        )
        cpu1 = server_cpu_seconds(self.pid)
        counted = await http_message_count(self.http_base, topic) - before
        if counted != r.msgs + warm:
            raise BenchError(
                f"{phase}: {r.msgs + warm} messages acknowledged but the server counted {counted}"
            )
        out = self._pub_result(phase, r, cpu0, cpu1)
        out["concurrency"] = cfg.http_concurrency
        out["requests_per_s"] = round(_rate(r.msgs / per, r.seconds), 1)
        return out

    async def phase_pub(self, phase: str) -> dict[str, Any]:
        watch = [self.sub_consumer] if self.sub_consumer else []
        cpu0 = server_cpu_seconds(self.pid)
        r = await publish_for(self.host, self.port, self.cfg, self.cfg.pub_seconds, watch)
        cpu1 = server_cpu_seconds(self.pid)
        self.published += r.msgs
        return self._pub_result(phase, r, cpu0, cpu1)

    async def phase_sub(self) -> dict[str, Any]:
        cfg = self.cfg
        cons = self.sub_consumer
        assert cons is not None
        rdy = min(cfg.rdy, int(cons.settings.get("max_rdy_count", cfg.rdy)))
        cpu0 = server_cpu_seconds(self.pid)
        c0 = time.process_time()
        t0 = time.perf_counter()
        cons.counting = True
        cons.last_msg = t0
        cons.set_rdy(rdy)
        end = t0 + cfg.sub_seconds
        drained = False
        while True:
            _check_failed([cons])
            now = time.perf_counter()
            if now >= end:
                break
            if cons.total >= self.published or (cons.count and now - cons.last_msg >= IDLE_SECONDS):
                drained = True
                break
            await asyncio.sleep(min(0.01, end - now))
        t1 = time.perf_counter()
        cons.counting = False
        cons.set_rdy(0)
        client_cpu = time.process_time() - c0
        cpu1 = server_cpu_seconds(self.pid)
        seconds = (cons.last_msg - t0) if drained else (t1 - t0)
        n = cons.count
        self._check_consumer(cons, self.published)
        if n == 0:
            raise BenchError(
                f"consumer(sub): no message delivered in {t1 - t0:.1f} s "
                f"although {self.published} were published"
            )
        return {
            "phase": "sub",
            "seconds": round(seconds, 3),
            "msgs": n,
            "msgs_per_s": round(_rate(n, seconds), 1),
            "mb_per_s": round(_rate(n * cfg.size, seconds) / 1e6, 2),
            **_cpu_fields(cpu0, cpu1, n, t1 - t0),
            "client_cpu_pct": round(100 * _rate(client_cpu, t1 - t0), 1),
            "drained": drained,
        }

    def _check_consumer(self, cons: Consumer, published: int) -> None:
        if cons.bad:
            raise BenchError(
                f"{cons.name}: {cons.bad} malformed message(s), e.g. "
                + "; ".join(cons.bad_examples)
            )
        if cons.total > published:
            raise BenchError(
                f"{cons.name}: received {cons.total} messages but only {published} were "
                "published (duplicates?)"
            )

    async def phase_both(self) -> dict[str, Any]:
        cfg = self.cfg
        cons = await open_consumer(self.host, self.port, cfg, BOTH_CHANNEL, "consumer(both)")
        await configure_channel(self.http_base, cfg, BOTH_CHANNEL)
        try:
            rdy = min(cfg.rdy, int(cons.settings.get("max_rdy_count", cfg.rdy)))
            cons.set_rdy(rdy)
            if cfg.both_mode == "process":
                r, cpu0, t0, c0 = await self._publish_in_child(cons)
            else:
                cpu0 = server_cpu_seconds(self.pid)
                c0 = time.process_time()
                t0 = time.perf_counter()
                cons.counting = True
                r = await publish_for(self.host, self.port, cfg, cfg.both_seconds, [cons])
            t1 = time.perf_counter()
            cons.counting = False
            client_cpu = time.process_time() - c0
            cpu1 = server_cpu_seconds(self.pid)
            cons.set_rdy(0)
            # let FINs and the RDY 0 reach the server before closing
            await asyncio.sleep(0.05)
            _check_failed([cons])
        finally:
            cons.close()
        self.published += r.msgs
        self._check_consumer(cons, r.msgs)
        seconds = t1 - t0
        out = self._pub_result("both", r, cpu0, cpu1)
        n = cons.count
        if cfg.both_mode == "inline":
            # one process did both: its CPU is in client_cpu, not in r.client_cpu_s
            out["client_cpu_pct"] = round(100 * _rate(client_cpu, seconds), 1)
            out["consumer_cpu_pct"] = None
        else:
            out["consumer_cpu_pct"] = round(100 * _rate(client_cpu, seconds), 1)
        out.update(
            {
                "mode": cfg.both_mode,
                "sub_msgs": n,
                "sub_msgs_per_s": round(_rate(n, seconds), 1),
                "sub_mb_per_s": round(_rate(n * cfg.size, seconds) / 1e6, 2),
                "lag_msgs": r.msgs - n,
                **_cpu_fields(cpu0, cpu1, r.msgs, seconds),
            }
        )
        if n == 0:
            raise BenchError(f"consumer(both): no message delivered while {r.msgs} were published")
        return out

    async def _publish_in_child(
        self, cons: Consumer
    ) -> tuple[PublishResult, float | None, float, float]:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        mp = multiprocessing.get_context("spawn")
        parent, child = mp.Pipe()
        proc = mp.Process(
            target=_publisher_process,
            args=(self.host, self.port, asdict(cfg), child),
            name="bench-publisher",
            daemon=True,
        )
        proc.start()
        child.close()
        try:
            ready = await until(
                loop.run_in_executor(None, _recv, parent), [cons], 60, "the publisher process"
            )
            if "error" in ready:
                proc.join(1)
                status = "" if proc.exitcode is None else f" (exit status {proc.exitcode})"
                raise BenchError(f"publisher process: {ready['error']}{status}")
            cpu0 = server_cpu_seconds(self.pid)
            c0 = time.process_time()
            t0 = time.perf_counter()
            cons.counting = True
            parent.send("go")
            res = await until(
                loop.run_in_executor(None, _recv, parent),
                [cons],
                cfg.both_seconds + STALL_SECONDS + 5,
                "the publisher process",
            )
            if "error" in res:
                raise BenchError(f"publisher process: {res['error']}")
            r = PublishResult(res["msgs"], res["seconds"], res["client_cpu_s"])
            return r, cpu0, t0, c0
        finally:
            if proc.is_alive():
                proc.join(2)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            parent.close()


def _recv(conn: multiprocessing.connection.Connection) -> dict[str, Any]:
    try:
        return cast(dict[str, Any], conn.recv())
    except (EOFError, OSError):
        return {"error": "exited without a result"}


def _publisher_process(
    host: str, port: int, cfg_dict: dict[str, Any], conn: multiprocessing.connection.Connection
) -> None:
    """The ``both`` phase's publisher, in its own process: ready, wait for go, publish."""
    cfg = BenchConfig(**cfg_dict)
    try:
        result = run_loop(_publisher_main(host, port, cfg, conn))
        conn.send(result)
    except BaseException as err:  # report anything to the parent
        conn.send({"error": str(err) or repr(err)})
    finally:
        conn.close()


async def _publisher_main(
    host: str, port: int, cfg: BenchConfig, conn: multiprocessing.connection.Connection
) -> dict[str, Any]:
    mpub = commands.mpub(cfg.topic, [message_body(cfg.size)] * cfg.batch)
    pub = await connect(
        lambda: Publisher("publisher(both)", mpub, cfg.window), host, port, "bench-pub-both", cfg
    )
    try:
        conn.send({"ready": True})
        # nothing to serve on this loop while waiting: blocking is fine
        if conn.recv() != "go":
            return {"error": "not started"}
        c0 = time.process_time()
        pub.start(cfg.both_seconds)
        await until(pub.done, [pub], cfg.both_seconds + STALL_SECONDS, "MPUB acknowledgements")
        cpu = time.process_time() - c0
    finally:
        pub.close()
    if not pub.acked:
        raise BenchError("no MPUB was acknowledged")
    return {"msgs": pub.acked * cfg.batch, "seconds": pub.t_end - pub.t0, "client_cpu_s": cpu}


# --- our own server ---------------------------------------------------------------------


def server_command(
    data_path: str, extra: Sequence[str] = (), python: str | None = None
) -> list[str]:
    return [
        python or sys.executable,
        "-m",
        "nsqx",
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={data_path}",
        *extra,
    ]


def make_certificates(directory: str) -> tuple[str, str, str]:
    """A throwaway CA and a certificate for 127.0.0.1: (ca, cert, key) PEM paths."""
    try:
        import trustme
    except ImportError:  # pragma: no cover - a dev dependency
        raise BenchError("--tls with our own server needs trustme (pip install trustme)") from None
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = tuple(os.path.join(directory, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(paths[0])
    leaf.cert_chain_pems[0].write_to_path(paths[1])
    leaf.private_key_pem.write_to_path(paths[2])
    return paths[0], paths[1], paths[2]


def parse_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise BenchError(f"bad address {addr!r}: expected host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class OwnServer:
    """Our nsqd in a subprocess, on a free port, with a temporary data path."""

    def __init__(self, startup_timeout: float, cfg: BenchConfig | None = None) -> None:
        self.startup_timeout = startup_timeout
        self.tmp = tempfile.mkdtemp(prefix="nsqx-bench-")
        self.extra: list[str] = []
        self.python = cfg.nsqd_python if cfg is not None else None
        if cfg is not None and cfg.tls:
            cfg.tls_ca, cert, key = make_certificates(self.tmp)
            self.extra = [f"--tls-cert={cert}", f"--tls-key={key}"]
        self.output: collections.deque[str] = collections.deque(maxlen=40)
        self.address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._found = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> tuple[str, int]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            server_command(self.tmp, self.extra, self.python),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._found.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(1)
                raise BenchError(
                    f"the server exited with status {self.proc.returncode} before listening"
                    + self.tail()
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    "the server did not log 'TCP: listening on' and 'HTTP: listening on' "
                    f"within {self.startup_timeout:g} s" + self.tail()
                )
        assert self.address is not None
        return self.address

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.output.append(raw.decode("utf-8", "replace").rstrip())
            if not self._found.is_set():
                m = _LISTENING.search(raw)
                if m:
                    try:
                        addr = parse_address(m.group(2).decode())
                    except BenchError:
                        continue
                    if m.group(1) == b"TCP":
                        self.address = addr
                    else:
                        self.http_address = addr
                    if self.address and self.http_address:
                        self._found.set()

    def tail(self) -> str:
        if not self.output:
            return " (no server output)"
        return "\nlast server output:\n  " + "\n  ".join(self.output)

    def check_alive(self, context: str = "") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                (f"{context}; " if context else "")
                + f"the server exited with status {self.proc.returncode} during the bench"
                + self.tail()
            )

    def stop(self) -> str | None:
        """Stop the server; returns a complaint if it did not stop cleanly."""
        complaint = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                complaint = "the server did not exit within 10 s of SIGTERM; killed"
                self.proc.kill()
                self.proc.wait()
            else:
                if self.proc.returncode not in (0, -15):
                    complaint = f"the server exited with status {self.proc.returncode} on SIGTERM"
        if self._reader is not None:
            self._reader.join(2)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return complaint


# --- running and reporting --------------------------------------------------------------


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the configured phases; returns the report (raises BenchError on failure)."""
    server: OwnServer | None = None
    pid = cfg.server_pid
    load_at_start = round(os.getloadavg()[0], 2)
    http_base: str | None = None
    try:
        if cfg.nsqd_tcp_address:
            host, port = parse_address(cfg.nsqd_tcp_address)
            target = f"{host}:{port}"
            if cfg.nsqd_http_address:
                h, p = parse_address(cfg.nsqd_http_address)
                http_base = f"http://{h}:{p}"
        else:
            server = OwnServer(cfg.startup_timeout, cfg)
            host, port = server.start()
            pid = server.pid
            assert server.http_address is not None
            http_base = "http://{}:{}".format(*server.http_address)
            target = f"own nsqx nsqd at {host}:{port}, HTTP {http_base} (pid {pid})"
        if http_base is None:
            # another server and no HTTP address: the HTTP phases cannot run
            cfg.phases = tuple(x for x in cfg.phases if x not in HTTP_PHASES)
        try:
            phases = run_loop(Bench(cfg, host, port, pid, http_base).run())
        except BenchError as err:
            if server is not None:
                # its log says why, often: a traceback, its exit
                time.sleep(0.2)
                server.check_alive(str(err))
                raise BenchError(f"{err}{server.tail()}") from None
            raise
        if server is not None:
            server.check_alive()
    finally:
        complaint = server.stop() if server is not None else None
    report: dict[str, Any] = {
        "server": target,
        "server_pid": pid,
        "config": {
            "topic": cfg.topic,
            "size": cfg.size,
            "batch": cfg.batch,
            "window": cfg.window,
            "rdy": cfg.rdy,
            "both_mode": cfg.both_mode,
            "http_concurrency": cfg.http_concurrency,
            "transport": cfg.transport,
            "event_loop": "uvloop" if _loop_factory else "asyncio",
            "cpus": os.cpu_count(),
            "loadavg_1m_at_start": load_at_start,
        },
        "phases": phases,
    }
    if complaint:
        report["server_shutdown"] = complaint
    return report


def _fmt_cpu(phase: dict[str, Any]) -> str:
    per = phase["server_cpu_us_per_msg"]
    if per is None:
        return "server CPU n/a"
    return f"server CPU {per:.2f} us/msg ({phase['server_cpu_pct']:.0f}% of a core)"


def format_report(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [
        f"server: {report['server']}",
        f"topic {c['topic']}, {c['transport']}, {c['size']} B messages, "
        f"MPUB batches of {c['batch']}, "
        f"window {c['window']}, RDY {c['rdy']}, {c['event_loop']}, {c['cpus']} CPUs, "
        f"load average {c['loadavg_1m_at_start']} at start",
    ]
    for name, p in report["phases"].items():
        if name == "both":
            consumer = p["consumer_cpu_pct"]
            if consumer is None:
                client = f"client CPU {p['client_cpu_pct']:.0f}% (one process)"
            else:
                client = (
                    f"client CPU: publisher {p['client_cpu_pct']:.0f}%, consumer {consumer:.0f}%"
                )
            lines.append(
                f"both: {p['seconds']:.2f} s: published {p['msgs']:,} = "
                f"{p['msgs_per_s']:,.0f} msgs/s, {p['mb_per_s']:.1f} MB/s; consumed "
                f"{p['sub_msgs']:,} = {p['sub_msgs_per_s']:,.0f} msgs/s, "
                f"{p['sub_mb_per_s']:.1f} MB/s; {_fmt_cpu(p)} published; {client} "
                f"[{p['mode']}]"
            )
        elif name in HTTP_PHASES:
            lines.append(
                f"{name}: {p['msgs']:,} msgs in {p['seconds']:.2f} s = "
                f"{p['msgs_per_s']:,.0f} msgs/s ({p['requests_per_s']:,.0f} requests/s, "
                f"{p['concurrency']} at a time), {p['mb_per_s']:.1f} MB/s; {_fmt_cpu(p)}; "
                f"client CPU {p['client_cpu_pct']:.0f}%"
            )
        else:
            extra = " (backlog drained)" if p.get("drained") else ""
            lines.append(
                f"{name:4}: {p['msgs']:,} msgs in {p['seconds']:.2f} s{extra} = "
                f"{p['msgs_per_s']:,.0f} msgs/s, {p['mb_per_s']:.1f} MB/s; {_fmt_cpu(p)}; "
                f"client CPU {p['client_cpu_pct']:.0f}%"
            )
    if "server_shutdown" in report:
        lines.append(f"warning: {report['server_shutdown']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, bool]:
    p = argparse.ArgumentParser(
        description="Throughput benchmark of an NSQ server: pub, sub, and both at once.",
    )
    p.add_argument(
        "--nsqd-tcp-address",
        metavar="HOST:PORT",
        help="bench this running server instead of starting our own nsqd",
    )
    p.add_argument(
        "--server-pid",
        type=int,
        help="pid of the --nsqd-tcp-address server, for its CPU figures (else n/a)",
    )
    p.add_argument(
        "--nsqd-http-address",
        metavar="HOST:PORT",
        help="HTTP API of the --nsqd-tcp-address server, for the http-* phases",
    )
    p.add_argument("--pub-seconds", type=float, default=10.0)
    p.add_argument("--sub-seconds", type=float, default=5.0)
    p.add_argument("--both-seconds", type=float, default=10.0)
    p.add_argument("--http-seconds", type=float, default=5.0, help="each http-* phase")
    p.add_argument(
        "--http-concurrency", type=int, default=8, help="HTTP requests outstanding at most"
    )
    p.add_argument("--size", type=int, default=200, help="message body size in bytes")
    p.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    p.add_argument("--window", type=int, default=16, help="MPUBs outstanding at most")
    p.add_argument("--rdy", type=int, default=2500, help="consumers' RDY count")
    p.add_argument("--topic", help="topic name (default: bench-<random>, fresh each run)")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="comma-separated phases to run, among "
        + ",".join(PHASES)
        + " (always run in that order)",
    )
    p.add_argument(
        "--both-mode",
        choices=("process", "inline"),
        default="process",
        help="both phase: publisher in a separate process (default) or on the same loop",
    )
    p.add_argument("--tls", action="store_true", help="every connection negotiates TLS")
    p.add_argument("--snappy", action="store_true", help="every connection negotiates snappy")
    p.add_argument("--deflate", action="store_true", help="every connection negotiates deflate")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="CA to verify --nsqd-tcp-address's certificate with (else not verified)",
    )
    p.add_argument(
        "--nsqd-python",
        metavar="PATH",
        help="run our own nsqd with this interpreter's nsqx (e.g. .venv-compiled/bin/python)",
    )
    p.add_argument(
        "--channel-config",
        default="",
        metavar="QUERY",
        help="nsqx channel policy for the bench's channels, e.g. "
        "'max_attempts=5&message_ttl_ms=600000' (POST /channel/config)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.snappy and args.deflate:
        p.error("--snappy and --deflate exclude each other")
    phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    unknown = set(phases) - set(PHASES)
    if unknown or not phases:
        p.error(f"--phases: expected some of {','.join(PHASES)}, got {args.phases!r}")
    if args.size <= 0 or args.batch <= 0 or args.window <= 0 or args.rdy <= 0:
        p.error("--size, --batch, --window and --rdy must be positive")
    if args.http_concurrency <= 0:
        p.error("--http-concurrency must be positive")
    cfg = BenchConfig(
        nsqd_tcp_address=args.nsqd_tcp_address,
        nsqd_python=args.nsqd_python,
        server_pid=args.server_pid,
        pub_seconds=args.pub_seconds,
        sub_seconds=args.sub_seconds,
        both_seconds=args.both_seconds,
        size=args.size,
        batch=args.batch,
        window=args.window,
        rdy=args.rdy,
        phases=tuple(x for x in PHASES if x in phases),
        both_mode=args.both_mode,
        nsqd_http_address=args.nsqd_http_address,
        http_seconds=args.http_seconds,
        http_concurrency=args.http_concurrency,
        tls=args.tls,
        snappy=args.snappy,
        deflate=args.deflate,
        tls_ca=args.tls_ca,
        channel_config=args.channel_config,
    )
    if args.topic:
        cfg.topic = args.topic
    return cfg, args.json


def main(argv: Sequence[str] | None = None) -> int:
    cfg, as_json = parse_args(argv)
    try:
        report = run_bench(cfg)
    except BenchError as err:
        print(f"server_bench: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("server_bench: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
