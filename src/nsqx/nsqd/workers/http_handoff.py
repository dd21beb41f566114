"""Moving a plain HTTP connection to the worker that owns what its first request
publishes to (SCM_RIGHTS, as a TCP client's connection moves: nsqx.nsqd.workers.handoff).

HTTP publishers keep their connections open (keep-alive) and mostly publish to one
topic. One that landed on a worker that does not own its topic's partition would cross
a link with every request: a forwarded publish and its acknowledgement, a write and a
read on each side, and the round trip added to every answer. Instead, the worker reads
the connection's first bytes before aiohttp does; when they start a request line of a
publish (``POST /pub``, ``POST /mpub``) that another worker owns, the socket goes to
that worker with the bytes read so far, and the owner's aiohttp parses them as if it had
read them itself. Bytes the client sent meanwhile wait in the socket's kernel buffer:
nothing is lost or reordered, and the client sees nothing of it.

A connection moves at most once, before its first request: later requests to another
partition are forwarded as usual (nsqx.nsqd.workers.http_routes). Only the node's plain
HTTP address does this: HTTPS keeps its TLS state in this process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Final, cast

from aiohttp import web

from nsqx.nsqd.workers.handoff import Handoff

log = logging.getLogger("nsqx.nsqd")

#: the state key of a moved HTTP connection: the bytes its first worker read
HTTP_STATE: Final = "http"
#: bytes read before the decision at most: a request line longer than this is answered
#: where it arrived (aiohttp refuses lines past 8190 bytes anyway)
FIRST_LINE_LIMIT: Final = 8192

#: the only method of a publish (a connection that starts otherwise is served here)
_POST: Final = b"POST "

#: the worker that answers a request line (``b"POST /pub?topic=t HTTP/1.1"``), or -1
#: for this one
Decide = Callable[[bytes], int]


class FirstRequest(asyncio.Protocol):
    """A connection's protocol until its first request line is read: then it moves the
    connection to its owner, or hands it to aiohttp's protocol here.

    ``decide`` None: a connection another worker moved here, served at once with the
    bytes that worker read (``first``), before anything else is read from it.
    """

    __slots__ = ("_buf", "_decide", "_handoff", "_pending", "_server", "_transport")

    def __init__(
        self,
        server: web.Server,
        decide: Decide | None,
        handoff: Handoff | None,
        first: bytes = b"",
        pending: set[FirstRequest] | None = None,
    ) -> None:
        self._server = server
        self._decide = decide
        self._handoff = handoff
        self._buf = first
        self._transport: asyncio.Transport | None = None
        #: the site's connections not yet given to aiohttp (closed when it stops)
        self._pending = pending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._decide is None:
            self._serve()
        elif self._pending is not None:
            self._pending.add(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        self._buf = buf
        end = buf.find(b"\r\n", 0, FIRST_LINE_LIMIT)
        if end < 0 and len(buf) < FIRST_LINE_LIMIT:
            if buf[: len(_POST)] == _POST[: len(buf)]:
                return  # maybe a publish: its request line is not whole yet
            self._serve()  # not one (another method, TLS on the plain port): aiohttp's
            return
        decide = self._decide
        owner = decide(buf[:end]) if decide is not None and end >= 0 else -1
        if owner >= 0 and self._move(owner):
            return
        self._serve()

    def eof_received(self) -> bool | None:
        # closed before a whole request line: aiohttp answers what there is, and ends
        handler = self._serve()
        return handler.eof_received() if handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # before its first request line: nothing to answer
        if self._pending is not None:
            self._pending.discard(self)

    def close(self) -> None:
        """Close the connection (its server stops before it sent a request line)."""
        if self._transport is not None:
            self._transport.close()

    def _serve(self) -> asyncio.Protocol | None:
        """Give the connection to aiohttp's protocol, with the bytes read so far."""
        if self._pending is not None:
            self._pending.discard(self)
        transport = self._transport
        if transport is None or transport.is_closing():
            return None
        handler = self._server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        buf, self._buf = self._buf, b""
        if buf:
            handler.data_received(buf)
        return handler

    def _move(self, owner: int) -> bool:
        """Send the connection, and what was read of it, to worker ``owner``."""
        transport = self._transport
        handoff = self._handoff
        if transport is None or handoff is None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        transport.pause_reading()
        fd = os.dup(sock.fileno())
        try:
            sent = handoff.send(owner, fd, {HTTP_STATE: self._buf})
        finally:
            os.close(fd)  # the datagram holds its own reference until it is received
        if not sent:
            # (its queue is full, or its worker is starting) answered here: the
            # request is then forwarded, as a request of a connection that stays
            transport.resume_reading()
            return False
        log.debug("HTTP: moved a connection to worker %d", owner)
        if self._pending is not None:
            self._pending.discard(self)
        self._buf = b""
        self._transport = None
        # only this process's descriptor closes: the socket lives on at the owner
        transport.close()
        return True


class FirstRequestSite(web.SockSite):
    """aiohttp's site on a bound socket, whose connections start with
    :class:`FirstRequest`."""

    __slots__ = ("_decide", "_handoff", "_pending")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        decide: Decide,
        handoff: Handoff,
        backlog: int,
    ) -> None:
        super().__init__(runner, sock, backlog=backlog)
        self._decide = decide
        self._handoff = handoff
        self._pending: set[FirstRequest] = set()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        decide, handoff, pending = self._decide, self._handoff, self._pending
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FirstRequest(server, decide, handoff, pending=pending),
            sock=self._sock,
            backlog=self._backlog,
        )

    async def stop(self) -> None:
        # aiohttp closes the connections it was given; these it was not, yet
        await super().stop()
        for conn in list(self._pending):
            conn.close()
