"""Producer (TCP, pipelined) against a real nsqd; HttpProducer against an HTTP server
speaking nsqd's /pub and /mpub shape (nsqd's own HTTP API is not merged yet)."""

from __future__ import annotations

import asyncio
import struct
import tempfile

import pytest
from aiohttp import web

from nsqx.client import (
    ConnectionClosedError,
    Consumer,
    HttpProducer,
    Producer,
    PublishError,
)
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire.frames import encode_response

from clienthelp import free_socket
from rawnsq import run, start_nsqd, wait_for


def addr(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


async def drain(nsqd: NSQD, topic: str, n: int) -> list[bytes]:
    got: list[bytes] = []
    async with Consumer(
        topic,
        "check",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=addr(nsqd),
        max_in_flight=100,
    ):
        await wait_for(lambda: len(got) >= n, what=f"{n} messages")
    return got


def test_pipelined_publishes_are_matched_in_order() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        async with Producer(addr(nsqd)) as p:
            futs = [p.publish("t", b"%d" % i) for i in range(2000)]
            await asyncio.gather(*futs)
            await p.multi_publish("t", [b"a", "b", bytearray(b"c")])
            await p.deferred_publish("t", b"later", 0.05)
            # pynsq's names
            await p.pub("t", b"p")
            await p.mpub("t", [b"m"])
            await p.dpub("t", b"d", 0)
        got = await drain(nsqd, "t", 2007)
        assert sorted(got) == sorted(
            [b"%d" % i for i in range(2000)] + [b"a", b"b", b"c"] + [b"later", b"p", b"m", b"d"]
        )
        await nsqd.close()

    run(body())


def test_a_refused_publish_fails_alone_and_the_next_reconnects() -> None:
    """nsqd closes the connection after E_BAD_MESSAGE: the publishes before it succeed,
    it gets PublishError, the ones after it ConnectionClosedError; then a new
    connection carries the next publish."""

    async def body() -> None:
        nsqd = await start_nsqd(max_msg_size=100)
        async with Producer(addr(nsqd)) as p:
            await p.connect()
            futs = [
                p.publish("t", b"ok1"),
                p.publish("t", b"ok2"),
                p.publish("t", b"x" * 200),
                p.publish("t", b"lost1"),
                p.publish("t", b"lost2"),
            ]
            results = await asyncio.gather(*futs, return_exceptions=True)
            assert results[:2] == [None, None]
            assert isinstance(results[2], PublishError)
            assert results[2].code == "E_BAD_MESSAGE" and "too big" in results[2].description
            assert all(isinstance(r, ConnectionClosedError) for r in results[3:])
            await p.publish("t", b"after")
        got = await drain(nsqd, "t", 3)
        assert sorted(got) == [b"after", b"ok1", b"ok2"]
        await nsqd.close()

    run(body())


def test_bad_input_is_refused_before_sending() -> None:
    async def body() -> None:
        p = Producer("127.0.0.1:1")
        with pytest.raises(ValueError, match="empty"):
            p.publish("t", b"")
        with pytest.raises(ValueError, match="invalid topic"):
            p.publish("no spaces", b"x")
        with pytest.raises(ValueError, match="at least one"):
            p.multi_publish("t", [])
        with pytest.raises(ValueError, match="delay"):
            p.deferred_publish("t", b"x", -1)
        await p.close()

    run(body())


def test_reconnects_after_nsqd_restart_and_fails_over() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        port = nsqd.tcp_address[1]  # type: ignore[index]
        dead = free_socket()  # bound, not listening: connections are refused
        dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
        async with Producer([dead_addr, addr(nsqd)], dial_timeout=0.5) as p:
            await p.publish("t", b"1")  # the first address is refused: the second works
            await nsqd.close()
            with pytest.raises(ConnectionClosedError):
                await p.publish("t", b"2")
            with pytest.raises(ConnectionClosedError, match="cannot connect"):
                await p.publish("t", b"3")
            nsqd = NSQD(
                NsqdOptions(
                    tcp_address=f"127.0.0.1:{port}",
                    http_address="",
                    data_path=tempfile.mkdtemp(prefix="nsqx-test-"),
                )
            )
            await nsqd.start()
            await p.publish("t", b"4")
        dead.close()
        assert await drain(nsqd, "t", 1) == [b"4"]
        await nsqd.close()

    run(body())


def test_idle_producer_answers_heartbeats() -> None:
    """nsqd closes a client after two unanswered heartbeats; an idle producer stays."""

    async def body() -> None:
        nsqd = await start_nsqd()
        async with Producer(addr(nsqd), heartbeat_interval=1) as p:
            await p.publish("t", b"1")
            conn = p._conn
            assert conn is not None
            nops = 0
            write = conn._write

            def counting_write(data: bytes) -> None:
                nonlocal nops
                nops += data.count(b"NOP\n")
                write(data)

            conn._write = counting_write  # type: ignore[method-assign]
            await wait_for(lambda: nops >= 3, timeout=15, what="3 heartbeats answered")
            await p.publish("t", b"2")
            assert p._conn is conn
        await nsqd.close()

    run(body())


class FakeNsqdHttp:
    """POST /pub and /mpub as nsqd 1.3 answers them."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, int]] = []
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> FakeNsqdHttp:
        app = web.Application()
        app.router.add_post("/pub", self.pub)
        app.router.add_post("/mpub", self.mpub)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        sock = free_socket()
        self.port = sock.getsockname()[1]
        await web.SockSite(self.runner, sock).start()
        return self

    @staticmethod
    def error(status: int, message: str) -> web.Response:
        return web.json_response({"message": message}, status=status)

    async def pub(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        body = await request.read()
        if not topic or " " in topic:
            return self.error(400, "INVALID_TOPIC")
        if not body:
            return self.error(400, "MSG_EMPTY")
        if len(body) > 1000:
            return self.error(413, "MSG_TOO_BIG")
        self.messages.append((topic, body, int(request.query.get("defer", "0"))))
        return web.Response(text="OK")

    async def mpub(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        assert request.query.get("binary") == "true"
        body = await request.read()
        (n,) = struct.unpack_from(">i", body, 0)
        pos = 4
        for _ in range(n):
            (size,) = struct.unpack_from(">i", body, pos)
            self.messages.append((topic, body[pos + 4 : pos + 4 + size], 0))
            pos += 4 + size
        return web.Response(text="OK")

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def test_http_producer() -> None:
    async def body() -> None:
        server = await FakeNsqdHttp().start()
        dead = free_socket()
        dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
        async with HttpProducer([dead_addr, f"http://127.0.0.1:{server.port}"]) as p:
            await p.publish("t", b"one")
            await p.multi_publish("t", [b"two", b"three\nwith newline"])
            await p.deferred_publish("t", b"later", 1.5)
            with pytest.raises(PublishError) as info:
                await p.publish("t", b"x" * 2000)
            assert info.value.code == "MSG_TOO_BIG"
        dead.close()
        assert server.messages == [
            ("t", b"one", 0),
            ("t", b"two", 0),
            ("t", b"three\nwith newline", 0),
            ("t", b"later", 1500),
        ]
        await server.close()

    run(body())


def test_http_producer_without_any_server() -> None:
    async def body() -> None:
        dead = free_socket()
        async with HttpProducer(f"127.0.0.1:{dead.getsockname()[1]}") as p:
            with pytest.raises(ConnectionClosedError, match="cannot connect"):
                await p.publish("t", b"x")
        dead.close()

    run(body())


def test_pipelining_far_ahead_is_not_a_write_timeout(nsqd_factory: object) -> None:
    """Tens of MB queued at once drain slowly: that is progress, not a dead peer."""
    proc = nsqd_factory()  # type: ignore[operator]

    async def body() -> None:
        async with Producer(f"127.0.0.1:{proc.tcp_port}", write_timeout=0.1) as p:
            batch = [b"x" * 1000] * 500
            await asyncio.gather(*(p.multi_publish("t", batch) for _ in range(80)))

    run(body())


def test_a_peer_that_stops_reading_is_a_write_timeout() -> None:
    async def body() -> None:
        stop_reading = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(4 + len(b"IDENTIFY\n"))
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
            writer.write(encode_response(b"OK"))
            await stop_reading.wait()  # and never read again

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        p = Producer(f"127.0.0.1:{port}", write_timeout=0.2)
        await p.connect()
        batch = [b"y" * 100_000] * 10
        futs = [p.multi_publish("t", batch) for _ in range(100)]  # 100 MB: more than buffers
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, ConnectionClosedError) for r in results)
        assert "write timeout" in str(results[0])
        stop_reading.set()
        server.close()

    run(body())
