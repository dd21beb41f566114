"""Fuzz targets for a live nsqd: its TCP (protocol V2) and HTTP inputs.

One nsqd runs in this process (so atheris sees the coverage of nsqd's code too) on an
event loop driven by the target. Each input is one conversation on a fresh
connection. A target fails when nsqd logs an unexpected exception (a traceback) or the
event loop reports one, answers HTTP 500, does not end a connection the peer ended,
keeps a client object after its connection is gone, or stops serving a plain
publish and consume (checked every HEALTH_EVERY inputs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from typing import Any

from aiohttp import web

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire import MAGIC_V2, FrameDecoder, decode_message
from nsqx.wire import commands as c
from nsqx.wire.compression import DeflateCompressor, SnappyCompressor

from fuzz.wire_targets import Input, split

HEALTH_EVERY = 200
#: topics made by the inputs are deleted this often (each has files and metadata)
CLEAN_EVERY = 50


class _Unexpected(logging.Handler):
    """Collects log records that carry a traceback (log.exception: a defect)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.records.append(record)


class LiveNsqd:
    """An in-process nsqd for a whole fuzzing run (with ``auth``: behind an auth server
    that grants everything to one random secret nobody can guess, and nothing to any
    other, so that anything published or subscribed is a hole in AUTH)."""

    _instances: dict[bool, LiveNsqd] = {}

    def __init__(self, auth: bool = False) -> None:
        self.auth = auth
        self.loop = asyncio.new_event_loop()
        self.problems: list[str] = []
        self.loop.set_exception_handler(self._loop_error)
        self.unexpected = _Unexpected()
        logger = logging.getLogger("nsqx")
        logger.addHandler(self.unexpected)
        self._level = logger.level
        logger.setLevel(logging.ERROR)  # quiet: protocol errors are normal
        self.data_path = tempfile.mkdtemp(prefix="nsqx-fuzz-")
        self.nsqd: NSQD = self.loop.run_until_complete(self._start())
        assert self.nsqd.tcp_address is not None and self.nsqd.http_address is not None
        self.tcp = self.nsqd.tcp_address
        self.http = self.nsqd.http_address
        self.runs = 0

    @classmethod
    def get(cls, auth: bool = False) -> LiveNsqd:
        if auth not in cls._instances:
            cls._instances[auth] = cls(auth)
        return cls._instances[auth]

    async def _auth_server(self) -> str:
        secret = os.urandom(24).hex()

        async def handle(request: web.Request) -> web.Response:
            if request.query.get("secret") != secret:
                return web.json_response({"message": "forbidden"}, status=403)
            grant = {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}
            return web.json_response({"ttl": 60, "authorizations": [grant]})

        app = web.Application()
        app.router.add_get("/auth", handle)
        self._auth_runner = web.AppRunner(app)
        await self._auth_runner.setup()
        await web.TCPSite(self._auth_runner, "127.0.0.1", 0).start()
        return f"127.0.0.1:{self._auth_runner.addresses[0][1]}"

    async def _start(self) -> NSQD:
        auth = [await self._auth_server()] if self.auth else []
        options = NsqdOptions(
            auth_http_addresses=auth,
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            https_address="",
            data_path=self.data_path,
            max_msg_size=4096,
            max_body_size=16384,
            mem_queue_size=100,
        )
        nsqd = NSQD(options)
        await nsqd.start()
        return nsqd

    def close(self) -> None:
        self.loop.run_until_complete(self.nsqd.close())
        if self.auth:
            self.loop.run_until_complete(self._auth_runner.cleanup())
        self.loop.close()
        logging.getLogger("nsqx").removeHandler(self.unexpected)
        logging.getLogger("nsqx").setLevel(self._level)
        shutil.rmtree(self.data_path, ignore_errors=True)
        LiveNsqd._instances.pop(self.auth, None)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.problems.append(f"event loop: {context.get('message')} {context.get('exception')!r}")

    def run(self, conversation: Any) -> None:
        """Run one input's conversation, then check nsqd is as it must be."""
        self.runs += 1
        self.loop.run_until_complete(asyncio.wait_for(conversation, 10))
        self.loop.run_until_complete(self._settle())
        if self.auth and self.nsqd.topics:
            # nothing may pass AUTH: not a topic made, not a message, not a subscriber
            self.problems.append(f"topics made without authorization: {list(self.nsqd.topics)}")
            for name in list(self.nsqd.topics):
                self.nsqd.delete_topic(name)
        if self.runs % CLEAN_EVERY == 0:
            for name in list(self.nsqd.topics):
                self.nsqd.delete_topic(name)
        if self.runs % HEALTH_EVERY == 0 and not self.auth:
            self.loop.run_until_complete(asyncio.wait_for(self.healthy(), 10))
        self.check()

    def check(self) -> None:
        found = self.problems + [
            self.unexpected.format(r)
            for r in self.unexpected.records  # with the traceback
        ]
        self.problems.clear()
        self.unexpected.records.clear()
        if found:
            raise AssertionError("nsqd misbehaved:\n" + "\n".join(found))

    async def _settle(self) -> None:
        """Every client of a finished conversation is gone (none leaks)."""
        for _ in range(200):
            if not self.nsqd.clients:
                return
            await asyncio.sleep(0.005)
        self.problems.append(f"{len(self.nsqd.clients)} clients left after their connections ended")

    async def healthy(self) -> None:
        """A plain PUB, SUB and FIN still work."""
        r, w = await asyncio.open_connection(*self.tcp)
        w.write(MAGIC_V2 + c.pub("fuzz_health", b"alive") + c.sub("fuzz_health", "h") + c.rdy(1))
        dec = FrameDecoder()
        while True:
            data = await r.read(65536)
            assert data, "nsqd closed a healthy connection"
            frames = dec.feed(data)
            msgs = [decode_message(p) for t, p in frames if t == 2]
            if msgs:
                assert msgs[0].body == b"alive"
                w.write(c.fin(msgs[0].id))
                break
        w.close()
        await w.wait_closed()
        self.nsqd.delete_topic("fuzz_health")


async def _converse(address: tuple[str, int], pieces: list[bytes]) -> bytes:
    """Send the pieces (one write each, the loop turning between them), end our side,
    and read until nsqd ends its side."""
    r, w = await asyncio.open_connection(*address)
    try:
        for piece in pieces:
            if w.is_closing():
                break
            w.write(piece)
            await asyncio.sleep(0)
        if not w.is_closing() and w.can_write_eof():
            w.write_eof()
        out = []
        while data := await asyncio.wait_for(r.read(65536), 5):
            out.append(data)
        return b"".join(out)
    except TimeoutError:
        raise AssertionError("nsqd did not end a connection whose peer ended") from None
    except OSError:  # nsqd closed first (a fatal error), or reset
        return b""
    finally:
        w.close()


def fuzz_nsqd_tcp(data: bytes) -> None:
    """Protocol V2 bytes, cut anywhere, to a live nsqd: as they are, or behind an
    IDENTIFY that negotiates deflate or snappy (then compressed as a client does, or
    as they are: a corrupt stream)."""
    inp = Input(data)
    mode = inp.below(8)
    magic = inp.flag()
    cuts = inp.cuts()
    rest = inp.rest()
    if mode < 4:  # half of the inputs: commands as they are
        pieces = split(MAGIC_V2 + rest if magic else rest, cuts)
    else:
        kind = "deflate" if mode in (4, 6) else "snappy"
        head = MAGIC_V2 + c.identify({"feature_negotiation": True, kind: True})
        if mode < 6:
            comp = DeflateCompressor(6) if kind == "deflate" else SnappyCompressor()
            pieces = [head] + [comp.compress(p) for p in split(rest, cuts)]
        else:
            pieces = [head, *split(rest, cuts)]
    live = LiveNsqd.get()
    live.run(_converse(live.tcp, pieces))


_METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]
_PATHS = [
    "/ping",
    "/info",
    "/pub",
    "/mpub",
    "/stats",
    "/metrics",
    "/topic/create",
    "/topic/delete",
    "/topic/empty",
    "/topic/pause",
    "/topic/unpause",
    "/channel/create",
    "/channel/delete",
    "/channel/empty",
    "/channel/pause",
    "/channel/unpause",
    "/channel/setoffset",
    "/channel/setorder",
    "/message/get",
    "/message/trace",
    "/message/trace/enable",
    "/message/trace/disable",
    "/range",
    "/config/max_msg_size",  # GET only (see below)
    "/nope",
]
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~&=%;+,/:#!*")


def _query(raw: bytes) -> str:
    """Fuzz bytes as a request line can carry them (some raw, the rest %-escaped)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


async def _http(address: tuple[str, int], request: bytes) -> int:
    r, w = await asyncio.open_connection(*address)
    try:
        w.write(request)
        head = await asyncio.wait_for(r.readuntil(b"\r\n"), 5)
        await asyncio.wait_for(r.read(), 5)  # Connection: close
        return int(head.split(b" ")[1])
    finally:
        w.close()


def fuzz_nsqd_http(data: bytes) -> None:
    """A request to every endpoint of nsqd's HTTP API with fuzzed method, query string
    and body: never a 500 (a handler that failed), never an exception logged."""
    inp = Input(data)
    method = _METHODS[inp.below(len(_METHODS))]
    path = _PATHS[inp.below(len(_PATHS))]
    if path.startswith("/config/") and method == "PUT":
        method = "GET"  # PUT /config changes nsqd itself (lookupd addresses): tested apart
    query_len = inp.below(128)
    rest = inp.rest()
    query, body = _query(rest[:query_len]), rest[query_len:]
    target = f"{path}?{query}" if query else path
    request = (
        f"{method} {target} HTTP/1.1\r\nHost: fuzz\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    live = LiveNsqd.get()
    status: list[int] = []

    async def one() -> None:
        status.append(await _http(live.http, request))

    live.run(one())
    assert status and status[0] != 500, (status, request)


def fuzz_nsqd_auth(data: bytes) -> None:
    """Protocol V2 bytes to a live nsqd behind an auth server that grants nothing to a
    secret one can guess: no topic is ever made, nothing published, no one subscribed."""
    inp = Input(data)
    cuts = inp.cuts()
    stream = MAGIC_V2 + inp.rest()
    live = LiveNsqd.get(auth=True)
    live.run(_converse(live.tcp, split(stream, cuts)))


TARGETS = {"nsqd_tcp": fuzz_nsqd_tcp, "nsqd_http": fuzz_nsqd_http, "nsqd_auth": fuzz_nsqd_auth}
