"""A fake auth server (NSQ's protocol: ``GET /auth?remote_ip&tls&secret&common_name``) on a
free loopback port, in a thread of its own, so that daemons in the test's event loop and
daemons in processes can both ask it.

``answers`` maps a secret to what the server answers: a dict (200 with it as JSON), a
``(status, body)`` pair, or :data:`HOLD` (no answer until the test ends, or
``release`` is set). A secret it does not know gets 403, as NSQ's auth servers do.
Every query is recorded in ``queries``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: an answer that never comes (until ``release``): a slow or hung auth server
HOLD = object()


class AuthServer:
    """The server's state, shared with the test."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.queries: list[dict[str, str]] = []
        self.release = threading.Event()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def secrets_asked(self) -> list[str]:
        return [q.get("secret", "") for q in list(self.queries)]


def grant(*authorizations: dict[str, Any], ttl: int = 3600, identity: str = "") -> dict[str, Any]:
    """An answer that grants ``authorizations`` for ``ttl`` seconds."""
    return {"ttl": ttl, "identity": identity, "authorizations": list(authorizations)}


@contextmanager
def auth_server() -> Iterator[AuthServer]:
    """Serve until the block ends."""
    state = AuthServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
            state.queries.append(query)
            answer = state.answers.get(query.get("secret", ""))
            if answer is HOLD:
                state.release.wait(60)
                self._send(500, b"released")
                return
            if isinstance(answer, tuple):
                self._send(answer[0], answer[1])
            elif isinstance(answer, dict):
                self._send(200, json.dumps(answer).encode())
            else:
                self._send(403, b'{"message":"forbidden"}')

        def _send(self, status: int, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the asker gave up (its timeout)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
