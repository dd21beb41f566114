"""The first bytes of an HTTP connection decide where it is served
(nsqx.nsqd.workers.http_handoff.FirstRequest), whatever pieces they come in.

In process, with a stand-in for aiohttp's protocol and for the handoff (a real socket
pair gives the descriptor that moves): what aiohttp is given here, or what goes to the
owner, is every byte read, in order, exactly once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any, cast

import pytest
from aiohttp import web

from nsqx.nsqd.workers.handoff import Handoff
from nsqx.nsqd.workers.http_handoff import FIRST_LINE_LIMIT, HTTP_STATE, FirstRequest

LINE = b"POST /pub?topic=t HTTP/1.1"
REQUEST = LINE + b"\r\nHost: n\r\nContent-Length: 2\r\n\r\nhi"


class Handler(asyncio.Protocol):
    """What aiohttp's protocol was given."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool | None:
        self.eof = True
        return None


class Transport(asyncio.Transport):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.protocol: asyncio.BaseProtocol | None = None
        self.reading = True
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class Moves:
    """The handoff's send: records what went to which worker."""

    def __init__(self, takes: bool = True) -> None:
        self.takes = takes
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def send(self, peer: int, fd: int, state: dict[str, Any]) -> bool:
        assert fd >= 0
        self.sent.append((peer, state))
        return self.takes


class Server:
    """aiohttp's web.Server as FirstRequest calls it: a factory of its protocol."""

    def __init__(self) -> None:
        self.made: list[Handler] = []

    def __call__(self) -> Handler:
        self.made.append(Handler())
        return self.made[-1]


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    a, b = socket.socketpair()
    yield a
    a.close()
    b.close()


def connect(
    sock: socket.socket, owner: int, moves: Moves | None = None
) -> tuple[FirstRequest, Transport, Server, list[bytes]]:
    lines: list[bytes] = []

    def decide(line: bytes) -> int:
        lines.append(line)
        return owner

    server = Server()
    proto = FirstRequest(
        cast(web.Server, server), decide, cast(Handoff, moves or Moves()), first=b""
    )
    transport = Transport(sock)
    proto.connection_made(transport)
    return proto, transport, server, lines


@pytest.mark.parametrize("cut", [1, 8, len(LINE), len(LINE) + 1, len(REQUEST)])
def test_a_request_line_in_pieces_is_decided_once_whole(sock: socket.socket, cut: int) -> None:
    proto, transport, server, lines = connect(sock, owner=-1)
    proto.data_received(REQUEST[:cut])
    if cut <= len(LINE) + 1:
        assert (lines, server.made) == ([], [])  # no CRLF yet: nothing decided
    # (as the transport does: to its protocol of the moment)
    now = cast(asyncio.Protocol, transport.protocol or proto)
    now.data_received(REQUEST[cut:] + b"GET /ping HTTP/1.1\r\n\r\n")
    assert lines == [LINE]
    (handler,) = server.made
    assert transport.protocol is handler and handler.transport is transport
    assert handler.data == REQUEST + b"GET /ping HTTP/1.1\r\n\r\n"
    assert not transport.closed


def test_a_publish_to_another_worker_moves_with_what_was_read(sock: socket.socket) -> None:
    moves = Moves()
    proto, transport, server, lines = connect(sock, owner=1, moves=moves)
    proto.data_received(REQUEST[:5])
    proto.data_received(REQUEST[5:])
    assert lines == [LINE] and server.made == []
    assert moves.sent == [(1, {HTTP_STATE: REQUEST})]
    assert transport.closed and not transport.reading
    proto.connection_lost(None)


def test_a_refused_move_is_answered_here(sock: socket.socket) -> None:
    moves = Moves(takes=False)
    proto, transport, server, _ = connect(sock, owner=1, moves=moves)
    proto.data_received(REQUEST)
    assert len(moves.sent) == 1
    (handler,) = server.made
    assert handler.data == REQUEST and transport.reading and not transport.closed


def test_a_line_past_the_limit_is_answered_here_undecided(sock: socket.socket) -> None:
    proto, _, server, lines = connect(sock, owner=1)
    junk = b"POST /pub?topic=" + b"x" * FIRST_LINE_LIMIT
    proto.data_received(junk[:100])
    proto.data_received(junk[100:])
    assert lines == []  # aiohttp refuses it (400), as in a single process
    (handler,) = server.made
    assert handler.data == junk


def test_an_end_before_a_whole_line_goes_to_aiohttp(sock: socket.socket) -> None:
    proto, _, server, lines = connect(sock, owner=1)
    proto.data_received(b"POST /pu")
    proto.eof_received()
    (handler,) = server.made
    assert (lines, handler.data, handler.eof) == ([], b"POST /pu", True)


def test_a_connection_lost_before_its_first_line_makes_nothing(sock: socket.socket) -> None:
    proto, _, server, _ = connect(sock, owner=1)
    proto.data_received(b"POST")
    proto.connection_lost(ConnectionResetError())
    proto.eof_received()
    assert server.made == []


def test_a_moved_connection_is_served_at_once_with_its_first_bytes(sock: socket.socket) -> None:
    server = Server()
    proto = FirstRequest(cast(web.Server, server), None, None, first=REQUEST)
    transport = Transport(sock)
    proto.connection_made(transport)
    (handler,) = server.made
    assert transport.protocol is handler and handler.data == REQUEST


def test_connections_before_their_first_line_are_known_to_their_site(
    sock: socket.socket,
) -> None:
    """The site closes, when it stops, the connections aiohttp was not given yet."""
    pending: set[FirstRequest] = set()
    server = Server()
    conns = []
    for _ in range(3):
        proto = FirstRequest(
            cast(web.Server, server), lambda line: -1, cast(Handoff, Moves()), pending=pending
        )
        transport = Transport(sock)
        proto.connection_made(transport)
        conns.append((proto, transport))
    assert pending == {p for p, _ in conns}
    conns[0][0].data_received(REQUEST)  # served: aiohttp's now
    conns[1][0].connection_lost(None)
    assert pending == {conns[2][0]}
    conns[2][0].close()
    assert conns[2][1].closed and not conns[0][1].closed


@pytest.mark.parametrize("first", [b"GET /stats", b"\x16\x03\x01\x02\x00\x01", b"POSTX"])
def test_what_cannot_start_a_publish_goes_to_aiohttp_at_once(
    sock: socket.socket, first: bytes
) -> None:
    """No wait for a whole line: a TLS hello on the plain port gets aiohttp's 400 now."""
    proto, _, server, lines = connect(sock, owner=1)
    proto.data_received(first)
    (handler,) = server.made
    assert (lines, handler.data) == ([], first)
