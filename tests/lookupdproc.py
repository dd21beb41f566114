"""Real `nsqx nsqlookupd` processes on free loopback ports, and small HTTP/TCP helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_LISTEN_RE = re.compile(r"(TCP|HTTP): listening on ([\d.]+):(\d+)")


@dataclass
class LookupdProcess:
    """A running ``nsqx nsqlookupd`` and the ports it bound."""

    proc: subprocess.Popen[str]
    tcp_port: int = 0
    http_port: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return http_request(f"http://{self.http_address}{path}", **kw)

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def post(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return self.get(path, method="POST")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def http_request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def start_lookupd(*args: str, timeout: float = 20) -> LookupdProcess:
    """Start ``nsqx nsqlookupd`` on port 0 and wait until it says where it listens."""
    cmd = [
        sys.executable,
        "-m",
        "nsqx",
        "nsqlookupd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        *args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    lookupd = LookupdProcess(proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lookupd.log.append(line)
            m = _LISTEN_RE.search(line)
            if m:
                if m.group(1) == "TCP":
                    lookupd.tcp_port = int(m.group(3))
                else:
                    lookupd.http_port = int(m.group(3))
                    ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not lookupd.http_port:
        proc.kill()
        raise RuntimeError("nsqlookupd did not start:\n" + "".join(lookupd.log))
    return lookupd


def wait_until(cond: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (tests wait on conditions)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class V1Conn:
    """A blocking lookupd V1 connection that speaks as Go's nsqd does."""

    def __init__(self, tcp_port: int, magic: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", tcp_port), timeout=10)
        if magic:
            self.sock.sendall(b"  V1")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> bytes:
        (size,) = struct.unpack(">i", self._read(4))
        return self._read(size)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {buf!r}")
            buf += chunk
        return buf

    def closed(self) -> bool:
        """True if the server closed the connection (after any pending bytes)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def identify(self, **fields: Any) -> dict[str, Any]:
        info = {
            "broadcast_address": "127.0.0.1",
            "hostname": "node",
            "http_port": 4151,
            "tcp_port": 4150,
            "version": "1.3.0",
        }
        info.update(fields)
        body = json.dumps(info).encode()
        self.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        return json.loads(self.reply())  # type: ignore[no-any-return]

    def command(self, line: str) -> bytes:
        self.send(line.encode() + b"\n")
        return self.reply()

    def close(self) -> None:
        self.sock.close()
