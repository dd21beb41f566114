"""Links between the worker processes of one node.

Each worker listens on a unix socket in the abstract namespace (nothing on disk to clean
up; Linux only) and connects to each other worker when it first has something for it.
A link is one-way in purpose: the worker that opened it sends its requests there
(publishes to forward, subscriptions to proxy, calls) and gets their answers back on
it. So a worker that dies takes exactly its own requests with it: the link it opened
closes at its peers (its subscriptions are dropped, their messages requeued), and the
links others opened to it close at them (their waiting publishes are failed unanswered).

What travels is a batch per loop turn: every item a worker has for one peer during an
iteration of its event loop goes out as one frame (a 4-byte length, then a pickled
list of tuples). Pickle is safe here because only a process of the same user may
connect (SO_PEERCRED is checked), who could read this process's memory anyway.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nsqx.nsqd")

_LEN = struct.Struct(">I")
#: the first item on a new link: who opened it
HELLO = "hello"

#: called with (link, item) for each item that arrives
Handler = Callable[["Link", tuple[Any, ...]], None]


def link_address(prefix: str, index: int) -> str:
    """The abstract unix socket address of worker ``index`` of the node ``prefix``."""
    return f"\0{prefix}-w{index}"


class Link(asyncio.Protocol):
    """One connection between two workers: batches of items out, items in."""

    def __init__(self, links: PeerLinks, peer: int, outgoing: bool) -> None:
        self.links = links
        #: the other worker's index (-1 until its hello arrives, on an incoming link)
        self.peer = peer
        self.outgoing = outgoing
        self.transport: asyncio.Transport | None = None
        self._outbox: list[tuple[Any, ...]] = []
        self._scheduled = False
        # (kept: asyncio.get_running_loop() makes a getpid system call each time)
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self.closed = False
        #: called once when the link is gone (after connection_lost)
        self.on_close: list[Callable[[Link], None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and not self.outgoing:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                log.error("WORKERS: refused a link from uid %d", uid)
                transport.close()
                self.closed = True
                return
        if self.outgoing:
            self.send((HELLO, self.links.index))

    def send(self, item: tuple[Any, ...]) -> None:
        """Queue ``item``; everything queued in this loop turn goes out as one frame."""
        if self.closed:
            return
        self._outbox.append(item)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._outbox or self.closed or self.transport is None:
            return  # (not connected yet: the connect flushes)
        items, self._outbox = self._outbox, []
        body = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        self.transport.write(_LEN.pack(len(body)) + body)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            items = pickle.loads(memoryview(buf)[pos + 4 : pos + 4 + size])
            pos += 4 + size
            for item in items:
                if item[0] == HELLO:
                    self.peer = int(item[1])
                    self.links.incoming_ready(self)
                    continue
                try:
                    self.links.handler(self, item)
                except Exception:
                    log.exception("WORKERS: handling %r from worker %d failed", item[0], self.peer)
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.links.lost(self)
        for hook in self.on_close:
            try:
                hook(self)
            except Exception:
                log.exception("WORKERS: a link's close hook failed")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class PeerLinks:
    """This worker's links to the other workers of its node."""

    def __init__(self, index: int, count: int, prefix: str, handler: Handler) -> None:
        self.index = index
        self.count = count
        self.prefix = prefix
        self.handler = handler
        #: links this worker opened, by peer
        self._out: dict[int, Link] = {}
        #: links the other workers opened to this one
        self.incoming: set[Link] = set()
        self._server: asyncio.AbstractServer | None = None
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._closing = False
        #: called with each outgoing link once it is connected
        self.on_connect: list[Callable[[Link], None]] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # (bound here: uvloop takes no abstract address as a path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(link_address(self.prefix, self.index))
        sock.listen(128)
        sock.setblocking(False)
        self._server = await loop.create_unix_server(lambda: Link(self, -1, False), sock=sock)

    def link(self, peer: int) -> Link:
        """The link to ``peer`` (opened now if there is none: items queue until it is)."""
        link = self._out.get(peer)
        if link is None or link.closed:
            link = Link(self, peer, True)
            self._out[peer] = link
            self._connecting[peer] = asyncio.get_running_loop().create_task(self._connect(link))
        return link

    async def _connect(self, link: Link) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.01
        # a peer that is (re)starting has not bound its socket yet: try for a while
        for _ in range(200):
            if self._closing:
                break
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, link_address(self.prefix, link.peer))
                await loop.create_unix_connection(lambda: link, sock=sock)
                self._connecting.pop(link.peer, None)
                for hook in self.on_connect:
                    hook(link)
                link._flush()
                return
            except OSError:
                sock.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
        self._connecting.pop(link.peer, None)
        log.error("WORKERS: cannot reach worker %d", link.peer)
        link.connection_lost(None)

    def incoming_ready(self, link: Link) -> None:
        self.incoming.add(link)

    def lost(self, link: Link) -> None:
        if link.outgoing:
            if self._out.get(link.peer) is link:
                del self._out[link.peer]
        else:
            self.incoming.discard(link)
        if not self._closing:
            log.info(
                "WORKERS: link %s worker %d closed",
                "to" if link.outgoing else "from",
                link.peer,
            )

    async def close(self) -> None:
        self._closing = True
        for task in list(self._connecting.values()):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in [*self._out.values(), *self.incoming]:
            link.close()
