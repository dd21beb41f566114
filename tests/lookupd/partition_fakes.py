"""In-process nsqlookupd and fake partition-aware nsqd nodes for the partition tests.

A :class:`FakeNsqd` is what lookupd sees of an nsqd: a V1 registration connection and
an HTTP API (aiohttp, on a free loopback port) that records lookupd's calls and, as a
real nsqd does, registers the partitions and channels it is asked to create. So the
tests need no nsqd, and check exactly what lookupd asks for.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions

T = TypeVar("T")
V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}


def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    """Run one async test body with a hard time limit."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


async def wait_for(cond: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """Poll a condition until it holds (tests wait on conditions, never on sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = cond()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def start_lookupd(data_path: str = "", **opts: Any) -> NSQLookupd:
    """An nsqlookupd in this loop on free ports, reconciling fast (tests wait for it).
    Fake nodes do not PING: a long node timeout unless a test sets one."""
    opts.setdefault("node_timeout", 600.0)
    lk = NSQLookupd(
        LookupdOptions(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            broadcast_address="127.0.0.1",
            data_path=data_path,
            **opts,
        )
    )
    lk.coordinator.register_grace = 0.05
    lk.coordinator.retry_min = 0.05
    lk.coordinator.retry_max = 0.4
    await lk.start()
    return lk


async def http(
    lk: NSQLookupd, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request to lookupd's HTTP API."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{lk.http_port}{path}", headers=headers, allow_redirects=False
        ) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


async def get_json(lk: NSQLookupd, path: str) -> Any:
    """A V1 GET that must succeed, decoded."""
    status, _, body = await http(lk, "GET", path, V1_ACCEPT)
    assert status == 200, (path, status, body)
    return json.loads(body)


async def post(lk: NSQLookupd, path: str) -> tuple[int, Any]:
    """A POST: (status, decoded body or None when empty)."""
    status, _, body = await http(lk, "POST", path)
    return status, (json.loads(body) if body else None)


class V1Client:
    """An asyncio lookupd V1 connection (what nsqd's registration speaks)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        # one command and its reply at a time (the HTTP handler also registers)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, lk: NSQLookupd) -> V1Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", lk.tcp_port)
        writer.write(b"  V1")
        return cls(reader, writer)

    async def _reply(self) -> bytes:
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        return await self.reader.readexactly(size)

    async def identify(self, **fields: Any) -> dict[str, Any]:
        body = json.dumps(fields).encode()
        async with self._lock:
            self.writer.write(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
            reply = await self._reply()
        return json.loads(reply)  # type: ignore[no-any-return]

    async def identify_raw(self, **fields: Any) -> bytes:
        body = json.dumps(fields).encode()
        async with self._lock:
            self.writer.write(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
            return await self._reply()

    async def command(self, line: str) -> bytes:
        async with self._lock:
            self.writer.write(line.encode() + b"\n")
            return await self._reply()

    async def closed(self) -> bool:
        """True once the server closed the connection."""
        try:
            return await self.reader.read(1) == b""
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


class FakeNsqd:
    """A partition-aware nsqd: it registers with lookupd, and its HTTP API records
    lookupd's calls and registers what it is asked to create (unless told not to)."""

    def __init__(self, name: str, *, version: str = "1.3.0-nsqx", distributed: bool = True):
        self.name = name
        self.version = version
        self.distributed = distributed
        #: (path, query) of every call lookupd made, in order.
        self.calls: list[tuple[str, dict[str, str]]] = []
        #: Answer lookupd's calls with this status (200: do it).
        self.status = 200
        #: Register what /topic/create and /channel/create create.
        self.auto_register = True
        self.conn: V1Client | None = None
        self.http_port = 0
        self._runner: web.AppRunner | None = None

    @property
    def tcp_port(self) -> int:
        # what it announces; nothing listens there (lookupd never connects to it)
        return self.http_port + 1

    @property
    def node_id(self) -> str:
        return f"127.0.0.1:{self.tcp_port}" if self.distributed else ""

    async def start_http(self) -> None:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.http_port = self._runner.addresses[0][1]

    async def connect(self, lk: NSQLookupd) -> dict[str, Any]:
        """Open the registration connection and IDENTIFY; returns lookupd's reply."""
        self.conn = await V1Client.connect(lk)
        fields: dict[str, Any] = {
            "broadcast_address": "127.0.0.1",
            "hostname": self.name,
            "http_port": self.http_port,
            "tcp_port": self.tcp_port,
            "version": self.version,
        }
        if self.distributed:
            fields["distributed_id"] = self.node_id
        return await self.conn.identify(**fields)

    async def register(self, topic: str, partition: int, channel: str | None = None) -> None:
        assert self.conn is not None
        line = f"REGISTER {topic} {partition}" + (f" {channel}" if channel else "")
        assert await self.conn.command(line) == b"OK"

    async def unregister(self, topic: str, partition: int, channel: str | None = None) -> None:
        assert self.conn is not None
        line = f"UNREGISTER {topic} {partition}" + (f" {channel}" if channel else "")
        assert await self.conn.command(line) == b"OK"

    async def disconnect(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    async def stop(self) -> None:
        await self.disconnect()
        if self._runner is not None:
            await self._runner.cleanup()

    def created(self, path: str = "/topic/create") -> list[dict[str, str]]:
        """The queries of the calls to ``path``."""
        return [q for p, q in self.calls if p == path]

    def partitions_created(self, topic: str) -> set[int]:
        return {int(q["partition"]) for q in self.created() if q["topic"] == topic}

    async def _handle(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.calls.append((request.path, query))
        if self.status != 200:
            return web.json_response({"message": "FAKE_FAILURE"}, status=self.status)
        if self.auto_register and self.conn is not None:
            if request.path == "/topic/create":
                await self.register(query["topic"], int(query["partition"]))
            elif request.path == "/channel/create":
                await self.register(query["topic"], int(query["partition"]), query["channel"])
            elif request.path == "/topic/delete":
                await self.unregister(query["topic"], int(query["partition"]))
        return web.Response(status=200)


async def start_nodes(lk: NSQLookupd, *names: str, **kw: Any) -> list[FakeNsqd]:
    """Fake nsqd nodes, started and registered with ``lk``."""
    nodes = []
    for name in names:
        node = FakeNsqd(name, **kw)
        await node.start_http()
        await node.connect(lk)
        nodes.append(node)
    return nodes
