"""Test helpers: an in-process nsqd and a raw protocol client built on nsqx.wire."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    FrameDecoder,
    Message,
    decode_message,
)
from nsqx.wire import commands as c
from nsqx.wire.frames import YouzanMessage, decode_youzan_message

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    """Run one async test body with a hard time limit."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


async def start_nsqd(**opts: Any) -> NSQD:
    """An nsqd in this event loop on a free loopback port."""
    opts.setdefault("data_path", tempfile.mkdtemp(prefix="nsqx-test-"))
    opts.setdefault("http_address", "")
    opts.setdefault("https_address", "")  # never the fixed default port 4152
    options = NsqdOptions(tcp_address="127.0.0.1:0", **opts)
    nsqd = NSQD(options)
    await nsqd.start()
    return nsqd


async def wait_for(cond: Callable[[], bool], timeout: float = 10, what: str = "condition") -> None:
    """Poll a condition (tests wait on conditions, never on fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Raw:
    """A bare protocol V2 connection: send bytes, read frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, bytes]] = []
        self.answer_heartbeats = True

    @classmethod
    async def connect(cls, nsqd: NSQD | tuple[str, int], magic: bool = True) -> Raw:
        """Connect to an in-process NSQD or to a (host, port)."""
        address = nsqd if isinstance(nsqd, tuple) else nsqd.tcp_address
        assert address is not None
        r, w = await asyncio.open_connection(*address)
        raw = cls(r, w)
        if magic:
            w.write(MAGIC_V2)
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def _fill(self, timeout: float) -> bool:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
        except TimeoutError:
            return True
        if not data:
            return False
        for ftype, payload in self.decoder.feed(data):
            if ftype == FRAME_RESPONSE and payload == HEARTBEAT and self.answer_heartbeats:
                self.send(c.nop())
                continue
            self.frames.append((ftype, payload))
        return True

    async def frame(self, timeout: float = 10) -> tuple[int, bytes]:
        """The next frame (heartbeats answered and skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.frames:
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError("no frame arrived")
            if not await self._fill(left):
                raise ConnectionError("connection closed")
        return self.frames.pop(0)

    async def response(self) -> bytes:
        ftype, data = await self.frame()
        assert ftype == FRAME_RESPONSE, (ftype, data)
        return data

    async def error(self) -> bytes:
        ftype, data = await self.frame()
        assert ftype == FRAME_ERROR, (ftype, data)
        return data

    async def message(self, timeout: float = 10) -> Message:
        ftype, data = await self.frame(timeout)
        assert ftype == FRAME_MESSAGE, (ftype, data)
        return decode_message(data)

    async def messages(self, n: int, timeout: float = 10) -> list[Message]:
        return [await self.message(timeout) for _ in range(n)]

    async def yz_message(
        self, with_ext: bool = False, detail: bool = False, timeout: float = 10
    ) -> YouzanMessage:
        """A message as a Youzan-mode client gets it (binary id, trace id, ...)."""
        ftype, data = await self.frame(timeout)
        assert ftype == FRAME_MESSAGE, (ftype, data)
        return decode_youzan_message(data, with_ext, detail)

    async def closed(self, timeout: float = 10) -> bool:
        """True once the server has closed the connection (frames still collected)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not await self._fill(deadline - loop.time()):
                return True
        return False

    async def nothing_for(self, seconds: float) -> bool:
        """True when no frame arrives in ``seconds`` (used to show absence)."""
        await self._fill(seconds)
        return not self.frames

    async def identify(self, **fields: Any) -> dict[str, Any]:
        fields.setdefault("feature_negotiation", True)
        self.send(c.identify(fields))
        resp = await self.response()
        return json.loads(resp) if resp != b"OK" else {}

    async def subscribe(self, topic: str, channel: str, rdy: int = 0, **identify: Any) -> None:
        if identify:
            await self.identify(**identify)
        self.send(c.sub(topic, channel))
        assert await self.response() == b"OK"
        if rdy:
            self.send(c.rdy(rdy))

    async def publish(self, topic: str, *bodies: bytes) -> None:
        for b in bodies:
            self.send(c.pub(topic, b))
        for _ in bodies:
            assert await self.response() == b"OK"

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
