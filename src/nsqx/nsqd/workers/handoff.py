"""Handing a client's TCP connection to the worker that owns its topic (SCM_RIGHTS).

A connection lands on whichever worker the kernel picked (SO_REUSEPORT). Its publishes
to another worker's partition are forwarded and its subscription proxied: correct, but
each message then crosses a link (a write and a read on each side). A plain connection
(no TLS, no compression: their state lives in this process) is instead moved, once, to
the owner of what it uses, at a moment when nothing of it is in flight here: every
answer written, nothing read and not yet executed. The socket travels as a descriptor
over a datagram unix socket, with the connection's negotiated state (IDENTIFY's
settings, AUTH's answer, its counts) pickled beside it; the owner adopts it as if it had
accepted it. Bytes the client sent meanwhile wait in the socket's kernel buffer, so
nothing is lost or reordered; the client sees nothing of it.

Each worker has one address in the abstract namespace, like its link (nsqx.nsqd.workers
.links). A datagram must start with the node's secret token (any local user can send
to an abstract address); a wrong one is dropped, its descriptors closed, before
anything is unpickled.
"""

from __future__ import annotations

import array
import asyncio
import hmac
import logging
import os
import pickle
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nsqx.nsqd")

#: the largest datagram taken: a connection's state is a few hundred bytes (its pub
#: counts grow with the topics it published to)
MAX_STATE = 256 * 1024
#: what one datagram carries: one descriptor
_FDS_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)

#: called with the adopted socket and the state sent beside it
Adopt = Callable[[socket.socket, dict[str, Any]], None]


def handoff_address(prefix: str, index: int) -> str:
    """The abstract unix datagram address where worker ``index`` takes connections."""
    return f"\0{prefix}-h{index}"


class Handoff:
    """This worker's side of moving connections: sending them, and adopting them."""

    def __init__(self, prefix: str, index: int, token: str) -> None:
        self.prefix = prefix
        self.index = index
        self._token = token.encode()
        #: set by nsqd: makes a client of a received socket and state
        self.adopt: Adopt | None = None
        self._sock: socket.socket | None = None
        self._out: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: workers whose last send failed: said once, not at every retry of a wait
        self._failing: set[int] = set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(handoff_address(self.prefix, self.index))
        self._sock = sock
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._out is not None:
            self._out.close()
            self._out = None

    def send(self, peer: int, fd: int, state: dict[str, Any]) -> bool:
        """Send the connection on ``fd`` to worker ``peer`` (False: it could not go;
        the connection stays here). The caller still owns ``fd`` and closes it."""
        out = self._out
        if out is None:
            return False
        payload = self._token + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > MAX_STATE:
            return False
        fds = array.array("i", [fd])
        try:
            out.sendmsg(
                [payload],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())],
                0,
                handoff_address(self.prefix, peer),
            )
        except OSError as err:  # its queue is full (EAGAIN), it is gone (ECONNREFUSED)
            if peer not in self._failing:
                self._failing.add(peer)
                log.debug("WORKERS: could not hand a connection to worker %d: %s", peer, err)
            return False
        self._failing.discard(peer)
        return True

    def _readable(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(MAX_STATE, _FDS_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.error("WORKERS: handoff socket: %s", err)
                return
            fds: list[int] = []
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(cdata[: len(cdata) - len(cdata) % arr.itemsize])
                    fds.extend(arr)
            self._received(data, fds)

    def _received(self, data: bytes, fds: list[int]) -> None:
        token = self._token
        if len(fds) != 1 or not hmac.compare_digest(data[: len(token)], token):
            log.error("WORKERS: dropped a handoff datagram without the node's token")
            for fd in fds:
                os.close(fd)
            return
        try:
            state = pickle.loads(data[len(token) :])
            conn = socket.socket(fileno=fds[0])
        except Exception as err:  # a broken datagram: its connection closes
            log.error("WORKERS: could not adopt a connection: %s", err)
            os.close(fds[0])
            return
        conn.setblocking(False)
        if self.adopt is None:
            conn.close()
            return
        self.adopt(conn, state)
