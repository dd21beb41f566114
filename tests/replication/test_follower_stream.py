"""The follower's side of the replication stream against a leader played by the test
(a real asyncio server on a loopback port): the WebSocket handshake, HELLO, WELCOME,
batches appended and acknowledged, pings answered; and a leader that answers
nonsense (a refused upgrade, a frame of absurd length) makes the follower drop the
connection and come again, nothing appended."""

from __future__ import annotations

import asyncio
import re
import struct
from types import SimpleNamespace
from typing import Any

from nsqx.nsqd.replication.follower import FollowerReplication
from nsqx.wire import replication as rp
from nsqx.wire import websocket as ws
from nsqx.wire.batch import StoredBatch


class FakeLog:
    def __init__(self) -> None:
        self.start = 0
        self.end = 0
        self.end_offset = 0


class FakePartition:
    """What the follower asks of a partition, recorded."""

    name = "t"
    id = 0

    def __init__(self) -> None:
        self.log = FakeLog()
        self.appended: list[StoredBatch] = []
        self.commits: list[int] = []

    def append_replicated(self, batches: list[StoredBatch]) -> None:
        for b in batches:
            if b.first != self.log.end:
                raise ValueError(f"batch at {b.first} does not follow {self.log.end}")
            self.log.end += b.messages
        self.appended += batches

    def committed(self, seq: int) -> None:
        self.commits.append(seq)

    def apply_cursors(self, *cursors: Any) -> None:
        pass


class FakeReplica:
    node_id = "127.0.0.1:1"

    def __init__(self) -> None:
        self.part = FakePartition()
        self.role = SimpleNamespace(epoch=3, history=((3, 0),))
        self.history: tuple[tuple[int, int], ...] = ()
        self.intact = False
        self.durable_end = 0
        self.syncs = 0

    def sync_soon(self) -> None:
        self.syncs += 1

    def log_cut(self, end: int) -> None:
        pass

    def adopt_history(self, history: tuple[tuple[int, int], ...]) -> None:
        self.history = history

    def node_timeout(self) -> float:
        return 2.0

    def member_headers(self) -> dict[str, str]:
        return {}


class Leader:
    """One connection at a time: ``script(reader, writer, next_message)``."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        frames = ws.FrameReader()
        pending: list[tuple[int, Any]] = []

        async def next_message() -> tuple[int, bytes]:
            while not pending:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("the follower closed")
                pending.extend(frames.feed(data))
            opcode, payload = pending.pop(0)
            return opcode, bytes(payload)

        try:
            await self.script(reader, writer, next_message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    match = re.search(rb"Sec-WebSocket-Key: (\S+)", head)
    assert match is not None and head.startswith(b"GET /replication/stream?node=")
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + ws.accept_value(match.group(1)) + b"\r\n\r\n"
    )
    return head


def message(payload: bytes) -> bytes:
    return rp.ws_binary_head(len(payload)) + payload


def test_the_follower_appends_acknowledges_and_answers_pings() -> None:
    async def body() -> None:
        seen: dict[str, Any] = {}
        done = asyncio.Event()

        async def script(reader: Any, writer: Any, next_message: Any) -> None:
            await accept(reader, writer)
            opcode, data = await next_message()
            hello = rp.decode(data)
            assert opcode == ws.OP_BINARY and isinstance(hello, rp.Hello)
            seen["hello"] = hello
            writer.write(message(rp.encode_welcome(rp.Welcome(4, [(3, 0), (4, 0)], 0))))
            assert rp.decode((await next_message())[1]) == rp.Ack(0)
            # two batches in one message, big enough to be received straight into the
            # stream's buffer, in pieces; a ping in the same write
            chunk = b"f" * 40_000
            batches = [
                StoredBatch(0, 2, 0, 0, 20_000, chunk),
                StoredBatch(2, 1, 40_000, 0, 0, b"g"),
            ]
            data = message(rp.encode_batches(0, batches)) + bytes((0x89, 4)) + b"ping"
            for i in range(0, len(data), 7_000):
                writer.write(data[i : i + 7_000])
                await writer.drain()
            answers = {await next_message(), await next_message()}
            assert answers == {(ws.OP_PONG, b"ping"), (ws.OP_BINARY, rp.encode_ack(3))}
            done.set()
            await reader.read()  # until the follower goes

        leader = Leader(script)
        address = await leader.start()
        replica = FakeReplica()
        follower = FollowerReplication(replica, address)  # type: ignore[arg-type]
        await asyncio.wait_for(done.wait(), 10)
        assert follower.connected
        assert seen["hello"].node == FakeReplica.node_id and seen["hello"].epoch == 3
        assert replica.history == ((3, 0), (4, 0))
        assert [b.chunk for b in replica.part.appended] == [b"f" * 40_000, b"g"]
        await follower.close()
        assert leader.server is not None
        leader.server.close()

    asyncio.run(body())


def test_a_leader_answering_nonsense_is_dropped_and_tried_again() -> None:
    async def body() -> None:
        async def script(reader: Any, writer: Any, next_message: Any) -> None:
            if leader.connections == 1:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            elif leader.connections == 2:
                await accept(reader, writer)
                await next_message()  # HELLO
                # a frame that claims 2**62 bytes: refused, not allocated
                writer.write(bytes((0x82, 127)) + struct.pack(">Q", 1 << 62))
            else:
                await accept(reader, writer)
                await next_message()
                writer.write(b"\x82\x05\x7fjunk")  # a message of an unknown kind
            await reader.read()  # the follower closes

        leader = Leader(script)
        address = await leader.start()
        replica = FakeReplica()
        follower = FollowerReplication(replica, address)  # type: ignore[arg-type]
        for _ in range(200):
            if leader.connections >= 4:
                break
            await asyncio.sleep(0.05)
        assert leader.connections >= 4  # it came again after each
        assert not replica.part.appended and not follower.connected
        await follower.close()
        assert leader.server is not None
        leader.server.close()

    asyncio.run(body())


def test_a_follower_asked_for_its_durable_end_fsyncs_and_reports_it() -> None:
    async def body() -> None:
        done = asyncio.Event()
        got: list[rp.Message] = []

        async def script(reader: Any, writer: Any, next_message: Any) -> None:
            await accept(reader, writer)
            hello = rp.decode((await next_message())[1])
            assert isinstance(hello, rp.Hello) and hello.durable  # it offers
            welcome = rp.Welcome(4, [(3, 0), (4, 0)], 0, None, True)  # and is asked
            writer.write(message(rp.encode_welcome(welcome)))
            got.append(rp.decode((await next_message())[1]))  # ACK 0
            got.append(rp.decode((await next_message())[1]))  # what is durable already
            writer.write(message(rp.encode_batches(0, [StoredBatch(0, 2, 0, 0, 0, b"ab")])))
            got.append(rp.decode((await next_message())[1]))  # ACK 2
            done.set()
            got.append(rp.decode((await next_message())[1]))  # DURABLE 2, once fsynced
            done.set()
            await reader.read()

        leader = Leader(script)
        address = await leader.start()
        replica = FakeReplica()
        follower = FollowerReplication(replica, address)  # type: ignore[arg-type]
        await asyncio.wait_for(done.wait(), 10)
        done.clear()
        assert got == [rp.Ack(0), rp.Durable(0), rp.Ack(2)]
        assert replica.syncs == 2  # at the stream's start, and for the appended batch
        follower.durable_advanced(2)  # (what the partition's fsync reports)
        await asyncio.wait_for(done.wait(), 10)
        assert got[-1] == rp.Durable(2)
        await follower.close()
        assert leader.server is not None
        leader.server.close()

    asyncio.run(body())
