"""The floor of a single-PUB round trip on uvloop: a server that speaks just enough of
protocol V2 for ``bench_writer --batch-size 1`` (the magic, then PUB/MPUB commands, each
answered with an OK frame) and does nothing else: no parsing beyond the frame, no log,
no topic. What nsqd costs on top of the event loop and its system calls is the
difference to it (docs/benchmarks.md, "Busy polling").

    python bench/minimal_server.py --port 4150 [--log FILE] [--busy-poll 200]

``--log FILE`` appends each body to FILE with one ``os.writev`` before answering (what a
durable append adds); ``--busy-poll US`` keeps the loop polling for US microseconds after
each read, as nsqd's --busy-poll does for a lone connection. Point
``bench/latency_bench.py --target min=tcp:127.0.0.1:PORT:PID --phases pub-rtt
--generators go`` at it (the py generator sends IDENTIFY, which this server does not
speak).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import time

import uvloop

OK = struct.pack(">ii", 6, 0) + b"OK"
_SIZE = struct.Struct(">i")


class Poller:
    """Keeps the loop polling (a ready callback makes it poll without blocking) for
    ``window`` seconds after the last read."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.last = 0.0
        self.on = False

    def read(self) -> None:
        self.last = time.monotonic()
        if self.window and not self.on:
            self.on = True
            asyncio.get_running_loop().call_soon(self._poll)

    def _poll(self) -> None:
        if time.monotonic() - self.last < self.window:
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self.on = False


class MinimalV2(asyncio.Protocol):
    def __init__(self, log_fd: int | None, poller: Poller) -> None:
        self.log_fd = log_fd
        self.poller = poller
        self.buf = b""
        self.magic = False
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def data_received(self, data: bytes) -> None:
        self.poller.read()
        buf = self.buf + data
        if not self.magic:
            if len(buf) < 4:
                self.buf = buf
                return
            buf, self.magic = buf[4:], True
        assert self.transport is not None
        while True:
            nl = buf.find(b"\n")
            if nl < 0 or len(buf) < nl + 5:
                break
            end = nl + 5 + _SIZE.unpack_from(buf, nl + 1)[0]
            if len(buf) < end:
                break
            if self.log_fd is not None:
                os.writev(self.log_fd, [buf[nl + 5 : end]])
            buf = buf[end:]
            self.transport.write(OK)
        self.buf = buf


async def serve(port: int, log_fd: int | None, poller: Poller) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MinimalV2(log_fd, poller), "127.0.0.1", port)
    print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default=None, help="append each body to this file")
    ap.add_argument("--busy-poll", type=float, default=0.0, help="microseconds")
    args = ap.parse_args()
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.log else None
    uvloop.run(serve(args.port, fd, Poller(args.busy_poll / 1e6)))


if __name__ == "__main__":
    main()
