"""Load, in small: many connections keeping their heartbeats, a consumer that never
reads, a publisher that never reads its answers. The full-size runs and their figures:
bench/load_bench.py and docs/reliability.md."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import struct
from pathlib import Path
from typing import Any

from nsqx.wire import MAGIC_V2, FrameDecoder
from nsqx.wire import commands as c

from nsqdproc import start_nsqd
from rawnsq import Raw, run, wait_for
from rawnsq import start_nsqd as start_inproc

N_CONNECTIONS = int(os.environ.get("NSQX_LOAD_CONNECTIONS", "1000"))
HEARTBEAT = b"_heartbeat_"


class Idle(asyncio.Protocol):
    """An idle subscriber: answers every heartbeat with a NOP, reads nothing else."""

    def __init__(self, setup: bytes) -> None:
        self.setup = setup
        self.buf = b""
        self.heartbeats = 0
        self.lost = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(MAGIC_V2 + self.setup)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        while len(buf) - pos >= 8:
            size, ftype = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos - 4 < size:
                break
            if ftype == 0 and buf[pos + 8 : pos + 4 + size] == HEARTBEAT:
                self.heartbeats += 1
                assert self.transport is not None
                self.transport.write(c.nop())
            pos += 4 + size
        self.buf = buf[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _stats(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url + "/stats?format=json", timeout=30) as resp:
        return json.loads(resp.read())


def test_many_connections_keep_their_heartbeats(tmp_path: Path) -> None:
    """N idle subscribers (1000 here; 10,000 in the benchmark) all get and answer their
    heartbeats while a few connections move messages: nsqd keeps every one, and each
    costs a few KiB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * N_CONNECTIONS + 200
    if hard < need:
        import pytest

        pytest.skip(f"open files hard limit {hard} < {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    nsqd = start_nsqd(tmp_path, "--http-address=127.0.0.1:0")

    async def body() -> None:
        loop = asyncio.get_running_loop()
        rss0 = _rss_kb(nsqd.proc.pid)
        idle: list[Idle] = []
        setup = c.identify({"heartbeat_interval": 1000}) + c.sub("load", "idle") + c.rdy(0)
        for _ in range(N_CONNECTIONS):
            _, proto = await loop.create_connection(lambda: Idle(setup), *nsqd.tcp_address)
            idle.append(proto)
        pub = await Raw.connect(nsqd.tcp_address)
        sub = await Raw.connect(nsqd.tcp_address)
        await sub.subscribe("work", "c", rdy=100, heartbeat_interval=1000)
        for i in range(20):
            pub.send(c.mpub("work", [b"m%d-%d" % (i, k) for k in range(50)]))
        for _ in range(20):
            assert await pub.response() == b"OK"
        for _ in range(1000):
            m = await sub.message()
            sub.send(c.fin(m.id))
        # every idle connection answers two heartbeats: none is dropped
        await wait_for(lambda: min(p.heartbeats for p in idle) >= 2, timeout=30, what="heartbeats")
        assert not any(p.lost for p in idle)
        doc = _stats(nsqd.http_url)
        (topic,) = [t for t in doc["topics"] if t["topic_name"] == "load"]
        assert len(topic["channels"][0]["clients"]) == N_CONNECTIONS
        per_conn_kb = (_rss_kb(nsqd.proc.pid) - rss0) / N_CONNECTIONS
        assert per_conn_kb < 64, f"{per_conn_kb:.1f} KiB per connection"
        for p in idle:
            assert p.transport is not None
            p.transport.close()

    try:
        run(body(), timeout=120)
    finally:
        nsqd.stop()


def test_a_consumer_that_never_reads_is_dropped_and_stalls_no_one() -> None:
    """A consumer stops reading (and answering heartbeats): what nsqd buffers for it is
    bounded (it stops sending at the transport's high-water mark), the other consumer
    gets every message meanwhile, and after two heartbeat intervals nsqd drops it; its
    messages in flight go to the other one at once."""

    async def body() -> None:
        nsqd = await start_inproc()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.setblocking(False)
        await asyncio.get_running_loop().sock_connect(slow, nsqd.tcp_address)
        slow.send(
            MAGIC_V2 + c.identify({"heartbeat_interval": 1000}) + c.sub("t", "c") + c.rdy(500)
        )
        good = await Raw.connect(nsqd)
        await good.subscribe("t", "c", rdy=500, heartbeat_interval=1000)
        pub = await Raw.connect(nsqd)
        bodies = [b"%05d" % i + b"x" * 1000 for i in range(5000)]
        for i in range(0, 5000, 100):
            pub.send(c.mpub("t", bodies[i : i + 100]))
            assert await pub.response() == b"OK"
        ch = nsqd.topics["t"].channels["c"]
        slow_client = next(
            cl
            for cl in ch.clients
            if cl is not None
            and cl.rdy == 500
            and cl.remote_address.endswith(str(slow.getsockname()[1]))
        )
        assert slow_client._transport is not None
        # bounded: the high-water mark (64 KiB) plus the batch that crossed it
        buffered = slow_client._transport.get_write_buffer_size()
        assert buffered <= 64 * 1024 + 500 * 1040, buffered
        got: set[bytes] = set()
        while len(got) < 5000:
            m = await good.message(timeout=10)
            got.add(m.body)
            good.send(c.fin(m.id))
        assert got == set(bodies)
        await wait_for(lambda: slow_client.closed, what="the slow consumer dropped")
        slow.close()
        await nsqd.close()

    run(body())


def test_a_publisher_that_never_reads_its_answers_gets_backpressure() -> None:
    """PUBs pipelined without reading the answers: once the answers fill the transport
    nsqd stops reading that publisher (its socket fills, the publisher waits), so
    nothing grows without bound; everything it sent is answered once it reads."""

    async def body() -> None:
        nsqd = await start_inproc()
        sock = socket.socket()  # small socket buffers: the stall comes sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, nsqd.tcp_address)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.transport.pause_reading()
        writer.write(MAGIC_V2)
        await wait_for(lambda: bool(nsqd.clients), what="the connection")
        (server,) = nsqd.clients
        assert server._transport is not None
        # nsqd's side too: small kernel buffers, so the answers back up soon
        server._transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
        )
        one = b"PUB flood\n" + struct.pack(">i", 100) + b"z" * 100
        chunk = one * 500
        sent = 0
        while not server._write_paused:
            writer.write(chunk)
            sent += 500
            assert sent < 1_000_000, "nsqd never stopped reading"
            while writer.transport.get_write_buffer_size() > 256 * 1024:
                await asyncio.sleep(0.001)  # nsqd's turn
                if server._write_paused:
                    break
        # nsqd stopped reading us: what it holds for us is bounded
        assert server._transport.get_write_buffer_size() < 1024 * 1024
        taken = server.pub_counts["flood"]
        assert taken < sent  # the rest waits in the sockets, not in nsqd's memory
        writer.transport.resume_reading()
        answers = 0
        frames = FrameDecoder()
        while answers < sent:
            data = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert data
            for ftype, payload in frames.feed(data):
                assert (ftype, payload) == (0, b"OK")
                answers += 1
        assert nsqd.topics["flood"].message_count == sent
        writer.close()
        await nsqd.close()

    run(body())
