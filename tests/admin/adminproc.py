"""A real `nsqx nsqadmin` process on a free loopback port, and a small cluster for it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lookupdproc import LookupdProcess, http_request, start_lookupd
from nsqdproc import NsqdProcess, start_nsqd

_LISTEN_RE = re.compile(r"HTTP: listening on ([\d.]+):(\d+)")


@dataclass
class AdminProcess:
    """A running ``nsqx nsqadmin`` and its address."""

    proc: subprocess.Popen[str]
    port: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON or text) of one request."""
        import urllib.error
        import urllib.request

        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path: str, **kw: Any) -> Any:
        status, data = self.request("GET", path, **kw)
        assert status == 200, (path, status, data)
        return data

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_admin(*args: str, timeout: float = 20, env: dict[str, str] | None = None) -> AdminProcess:
    """Start ``nsqx nsqadmin --http-address=127.0.0.1:0 <args>`` and wait for its port
    (``env``: variables added to this process's environment)."""
    cmd = [sys.executable, "-m", "nsqx", "nsqadmin", "--http-address=127.0.0.1:0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    admin = AdminProcess(proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            admin.log.append(line)
            m = _LISTEN_RE.search(line)
            if m:
                admin.port = int(m.group(2))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not admin.port:
        proc.kill()
        raise RuntimeError("nsqadmin did not start:\n" + "".join(admin.log))
    return admin


@dataclass
class Cluster:
    """nsqlookupd, two nsqd registered with it, and nsqadmin reading the lookupd."""

    lookupd: LookupdProcess
    nsqds: list[NsqdProcess]
    admin: AdminProcess

    def stop(self) -> None:
        self.admin.stop()
        for n in self.nsqds:
            n.stop(signal.SIGKILL)
        self.lookupd.stop(signal.SIGKILL)

    def stats(self, n: NsqdProcess, topic: str) -> list[dict[str, Any]]:
        status, _, body = http_request(f"{n.http_url}/stats?format=json&topic={topic}")
        assert status == 200
        return json.loads(body)["topics"] or []  # type: ignore[no-any-return]

    def nsqd_json(self, n: NsqdProcess, path: str) -> Any:
        """GET an nsqd's JSON (200 expected)."""
        status, _, body = http_request(f"{n.http_url}{path}")
        assert status == 200, body
        return json.loads(body)

    def pub(self, n: NsqdProcess, topic: str, *bodies: bytes) -> None:
        import urllib.request

        req = urllib.request.Request(
            f"{n.http_url}/mpub?topic={topic}", data=b"\n".join(bodies), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200

    def post_nsqd(self, n: NsqdProcess, path: str, data: bytes | None = None) -> int:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"{n.http_url}{path}", data=data or b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)


def start_cluster(base: Path, *admin_args: str, nodes: int = 2) -> Cluster:
    lookupd = start_lookupd()
    nsqds: list[NsqdProcess] = []
    try:
        for i in range(nodes):
            nsqds.append(
                start_nsqd(
                    base / f"nsqd{i}",
                    "--http-address=127.0.0.1:0",
                    f"--lookupd-tcp-address={lookupd.tcp_address}",
                    "--broadcast-address=127.0.0.1",
                    "--e2e-processing-latency-percentile=1.0,0.5",
                )
            )
        admin = start_admin(f"--lookupd-http-address={lookupd.http_address}", *admin_args)
    except BaseException:
        for n in nsqds:
            n.stop(signal.SIGKILL)
        lookupd.stop(signal.SIGKILL)
        raise
    cluster = Cluster(lookupd, nsqds, admin)
    deadline = time.monotonic() + 20
    while len(lookupd.json("/nodes")["producers"]) < nodes:
        if time.monotonic() > deadline:
            cluster.stop()
            raise RuntimeError("nsqd did not register with nsqlookupd")
        time.sleep(0.02)
    return cluster
