"""Helpers for the client tests: a lookupd-shaped HTTP server, a front that adds TLS,
deflate and AUTH to a real nsqd, a watcher of the RDY counts a consumer sends, and a
zlib codec to exercise the compression plumbing."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from nsqx.client.consumer import Consumer, _Link
from nsqx.wire import commands
from nsqx.wire.frames import MAGIC_V2, OK, encode_error, encode_response

_I32 = struct.Struct(">i")


def free_socket() -> socket.socket:
    """A listening-ready socket bound to a free loopback port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


class FakeLookupd:
    """An HTTP server answering GET /lookup?topic= in nsqlookupd's JSON shape."""

    def __init__(self) -> None:
        self.producers: dict[str, list[tuple[str, int]]] = {}
        self.requests = 0
        self.status = 200
        self.envelope = False
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, topic: str, *addresses: tuple[str, int]) -> None:
        self.producers[topic] = list(addresses)

    async def start(self) -> FakeLookupd:
        app = web.Application()
        app.router.add_get("/lookup", self._lookup)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = free_socket()
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def _lookup(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.status != 200:
            return web.json_response({"message": "INTERNAL_ERROR"}, status=self.status)
        topic = request.query.get("topic", "")
        if topic not in self.producers:
            return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
        body: dict[str, Any] = {
            "channels": [],
            "producers": [
                {
                    "remote_address": f"{host}:{port + 1}",
                    "hostname": "test",
                    "broadcast_address": host,
                    "tcp_port": port,
                    "http_port": port + 1,
                    "version": "1.3.0",
                }
                for host, port in self.producers[topic]
            ],
        }
        if self.envelope:
            body = {"status_code": 200, "status_txt": "OK", "data": body}
        return web.json_response(body)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class NsqFront:
    """Listens like nsqd and forwards to a real nsqd, adding what it lacks for now:
    TLS (``tls_v1``), deflate and AUTH. IDENTIFY goes upstream without them; the
    front rewrites the response, upgrades the client's stream, then relays bytes."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        tls: ssl.SSLContext | None = None,
        deflate: bool = False,
        auth_secret: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.tls = tls
        self.deflate = deflate
        self.auth_secret = auth_secret
        self.identify_bodies: list[dict[str, Any]] = []
        self.auth_secrets: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> NsqFront:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(4) == MAGIC_V2
        assert await reader.readline() == b"IDENTIFY\n"
        size = _I32.unpack(await reader.readexactly(4))[0]
        body = json.loads(await reader.readexactly(size))
        self.identify_bodies.append(body)
        ur, uw = await asyncio.open_connection(*self.upstream)
        up = dict(body, tls_v1=False, snappy=False, deflate=False)
        uw.write(MAGIC_V2 + commands.identify(up))
        size = _I32.unpack(await ur.readexactly(4))[0]
        data = await ur.readexactly(size)
        resp = json.loads(data[4:])
        use_tls = self.tls is not None and bool(body.get("tls_v1"))
        use_deflate = self.deflate and bool(body.get("deflate"))
        level = int(body.get("deflate_level") or 6)
        resp.update(
            tls_v1=use_tls,
            deflate=use_deflate,
            deflate_level=level if use_deflate else 0,
            snappy=False,
            auth_required=self.auth_secret is not None,
        )
        identify_response = encode_response(json.dumps(resp).encode())
        to_client: Callable[[bytes], bytes] = bytes
        from_client: Callable[[bytes], bytes] = bytes
        codec = ZlibCodec(level)
        if use_tls:
            assert self.tls is not None
            writer.write(identify_response)
            await writer.drain()
            await writer.start_tls(self.tls)
            writer.write(encode_response(OK))
        if use_deflate:
            to_client, from_client = codec.compress, codec.decompress
            compressed_ok = to_client(encode_response(OK))
            if use_tls:
                writer.write(compressed_ok)
            else:
                # the plain IDENTIFY response and the compressed OK in one write: the
                # client must switch codecs in the middle of a read
                writer.write(identify_response + compressed_ok)
        elif not use_tls:
            writer.write(identify_response)
        pending = b""
        if self.auth_secret is not None:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                pending += from_client(chunk)
                if len(pending) >= 9 and len(pending) >= 9 + _I32.unpack(pending[5:9])[0]:
                    break
            assert pending.startswith(b"AUTH\n")
            size = _I32.unpack(pending[5:9])[0]
            secret, pending = pending[9 : 9 + size], pending[9 + size :]
            self.auth_secrets.append(secret)
            if secret.decode() != self.auth_secret:
                writer.write(to_client(encode_error(b"E_UNAUTHORIZED AUTH failed")))
                await writer.drain()
                return
            reply = {"identity": "tester", "identity_url": "", "permission_count": 1}
            writer.write(to_client(encode_response(json.dumps(reply).encode())))
        if pending:
            uw.write(pending)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, fn: Any) -> None:
            try:
                while chunk := await src.read(65536):
                    dst.write(fn(chunk))
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, uw, from_client), pump(ur, writer, to_client))


class ZlibCodec:
    """Raw DEFLATE both ways, each write flushed (what NSQ's deflate stream is)."""

    def __init__(self, level: int = 6) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._d = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        return self._d.decompress(data)


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (openssl's command line)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class RdyWatcher:
    """Checks, on every RDY a consumer writes, that the counts of its live connections
    sum to at most max_in_flight and that none exceeds its nsqd's max_rdy_count."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.last: dict[int, int] = {}
        self.sent = 0
        self.errors: list[str] = []
        self.max_sum = 0

    def install(self, monkeypatch: Any) -> RdyWatcher:
        original = _Link.queue
        watcher = self

        def queue(conn: _Link, data: bytes) -> None:
            if data.startswith(b"RDY ") and conn.consumer is watcher.consumer:
                watcher.on_rdy(conn, int(data[4:-1]))
            original(conn, data)

        monkeypatch.setattr(_Link, "queue", queue)
        return self

    def on_rdy(self, conn: _Link, count: int) -> None:
        c = self.consumer
        self.sent += 1
        self.last[id(conn)] = count
        live = {id(x) for x in c._conns.values()}
        total = sum(v for k, v in self.last.items() if k in live)
        self.max_sum = max(self.max_sum, total)
        if total > c.max_in_flight:
            self.errors.append(f"sum of RDY {total} > max_in_flight {c.max_in_flight}")
        if count > conn.max_rdy_count:
            self.errors.append(f"RDY {count} > max_rdy_count {conn.max_rdy_count}")
        try:
            c.rdy.check()
        except AssertionError as exc:
            self.errors.append(str(exc))
