"""A real etcd (Debian's etcd-server: the ``etcd`` binary) on free loopback ports, as
users run it, for the tests of nsqlookupd's etcd backend."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

#: The etcd binary, if installed (apt-get install etcd-server).
ETCD = shutil.which("etcd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdProcess:
    """One etcd member with its data directory; :meth:`stop` and :meth:`start` again
    keep the data and the ports."""

    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 20) -> None:
        assert ETCD is not None
        client = self.endpoint
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir.with_suffix(".log"), "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name=t",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=t={peer}",
                # a single member elects itself at once with short timeouts
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.data_dir.with_suffix('.log').read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not become healthy")
            time.sleep(0.05)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


def start_etcd(tmp: Path) -> EtcdProcess:
    """A running etcd whose data lives under ``tmp`` (a port taken meanwhile by someone
    else makes etcd exit: it is tried again on other ports)."""
    for attempt in range(3):
        etcd = EtcdProcess(tmp / f"etcd{attempt}")
        try:
            etcd.start()
            return etcd
        except RuntimeError:
            etcd.stop()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")
