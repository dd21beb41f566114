"""Against a scripted server that answers like an nsqd without feature negotiation
(IDENTIFY gets a plain OK), and that sends a fatal error frame mid-stream."""

from __future__ import annotations

import asyncio
import struct

from nsqx.client import Consumer, Message
from nsqx.wire.frames import (
    CLOSE_WAIT,
    FRAME_ERROR,
    MAGIC_V2,
    OK,
    encode_frame,
    encode_message_frame,
    encode_response,
)

from rawnsq import run, wait_for


class OldNsqd:
    """Speaks just enough protocol V2: OK to IDENTIFY and SUB, records every command,
    sends messages on demand."""

    def __init__(self) -> None:
        self.commands: list[list[bytes]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> OldNsqd:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: list[bytes] = []
        self.commands.append(seen)
        self.writers.append(writer)
        try:
            assert await reader.readexactly(4) == MAGIC_V2
            while line := await reader.readline():
                seen.append(line)
                if line in (b"IDENTIFY\n", b"AUTH\n"):
                    size = struct.unpack(">i", await reader.readexactly(4))[0]
                    await reader.readexactly(size)
                    writer.write(encode_response(OK))
                elif line.startswith(b"SUB "):
                    writer.write(encode_response(OK))
                elif line == b"CLS\n":
                    writer.write(encode_response(CLOSE_WAIT))
        except (OSError, asyncio.IncompleteReadError):
            pass

    def send(self, conn: int, data: bytes) -> None:
        self.writers[conn].write(data)

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()


def test_without_feature_negotiation_max_rdy_is_2500_and_fatal_errors_reconnect() -> None:
    async def body() -> None:
        server = await OldNsqd().start()
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=f"127.0.0.1:{server.port}",
            max_in_flight=5000,
            reconnect_delay=0.01,
        )
        async with c:
            conn = next(iter(c._conns.values()))
            assert conn.features == {} and conn.max_rdy_count == 2500
            await wait_for(lambda: b"RDY 1\n" in server.commands[0], what="RDY 1")
            server.send(0, encode_message_frame(1, 1, b"0" * 16, b"first"))
            # one connection: the share is max_in_flight, capped at the assumed 2500
            await wait_for(lambda: b"RDY 2500\n" in server.commands[0], what="RDY 2500")
            assert got == [b"first"]
            assert b"FIN 0000000000000000\n" in server.commands[0]
            # a fatal error: the client closes and, nsqd being given by address, reconnects
            server.send(0, encode_frame(FRAME_ERROR, b"E_INVALID cannot do that"))
            await wait_for(lambda: len(server.commands) == 2, what="a new connection")
            await wait_for(lambda: b"RDY 1\n" in server.commands[1], what="RDY 1 again")
            assert len(c.connections) == 1
        await server.close()

    run(body())


def test_non_fatal_errors_keep_the_connection() -> None:
    async def body() -> None:
        server = await OldNsqd().start()
        handled: list[Message] = []
        c = Consumer("t", "c", handled.append, nsqd_tcp_addresses=f"127.0.0.1:{server.port}")
        async with c:
            await wait_for(lambda: b"RDY 1\n" in server.commands[0], what="RDY 1")
            server.send(0, encode_frame(FRAME_ERROR, b"E_FIN_FAILED FIN 0 failed ID not in flight"))
            server.send(0, encode_message_frame(1, 1, b"1" * 16, b"still here"))
            await wait_for(lambda: len(handled) == 1, what="a message after the error")
            assert len(server.commands) == 1 and len(c.connections) == 1
        await server.close()

    run(body())
