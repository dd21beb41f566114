"""A TCP proxy the tests control, to cut the network between a leader and one
follower: it forwards a node's replication stream (the follower names itself in the
stream's URL, ``?node=``) until told to cut it; a cut stream is held open and silent,
as packets lost on a dead link, until healed."""

from __future__ import annotations

import asyncio
import re
import threading

_NODE = re.compile(rb"[?&]node=([^&\s]+)")


class CutProxy:
    """Forwards 127.0.0.1:<port> to a target port, in a thread of its own."""

    def __init__(self, target_port: int = 0) -> None:
        self.target_port = target_port
        self.port = 0
        self.cut_nodes: set[str] = set()
        self._held: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    def cut(self, node: str) -> None:
        self._loop.call_soon_threadsafe(self.cut_nodes.add, node)

    def heal(self, node: str) -> None:
        def heal() -> None:
            self.cut_nodes.discard(node)
            for w in self._held:
                w.close()
            self._held.clear()

        self._loop.call_soon_threadsafe(heal)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.readline()
        m = _NODE.search(first)
        node = m.group(1).decode() if m else ""
        if node in self.cut_nodes:
            self._held.append(writer)  # silent until healed
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        up_w.write(first)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    if node in self.cut_nodes:
                        # the link died: nothing more passes, both ends hang
                        self._held.extend((writer, up_w))
                        return
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))


class LinkProxy:
    """Forwards 127.0.0.1:<port> to a target port (any TCP protocol), in a thread of
    its own, until :meth:`cut`: then its connections are reset and new ones refused,
    as a link that went down."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.down = False
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    def cut(self) -> None:
        def cut() -> None:
            self.down = True
            for w in self._writers:
                w.transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_w]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
