"""Real `nsqx nsqd` processes on free loopback ports, for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_LISTEN_RE = re.compile(r"(TCP|HTTP): listening on ([\d.]+):(\d+)")
#: a worker's line in a node of workers (its supervisor's lines name the node's ports)
_WORKER_LINE_RE = re.compile(r"\] w\d+: ")


@dataclass
class NsqdProcess:
    """A running ``nsqx nsqd`` and the addresses it bound."""

    proc: subprocess.Popen[str]
    data_path: Path
    tcp_port: int = 0
    http_port: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def tcp_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.tcp_port)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None


def start_nsqd(
    data_path: Path, *args: str, timeout: float = 20, wall_shift_ns: int = 0
) -> NsqdProcess:
    """Start ``nsqx nsqd`` on port 0 and wait until it says where it listens.

    ``wall_shift_ns`` moves the node's wall clock (its workers' too) by that much
    (tests/clockshift): for data whose due times are absolute.

    ``NSQX_TEST_WORKERS=N`` in the environment runs every such nsqd with ``--workers=N``
    unless the test names its own (the compatibility suites run so against a node of
    several workers); ``NSQX_TEST_NSQD_ARGS`` adds its flags (space-separated) to every
    such nsqd, after the test's own (the suites run once more with --worker-shards)."""
    workers = os.environ.get("NSQX_TEST_WORKERS")
    if workers and not any(a.startswith(("--workers", "-workers")) for a in args):
        args = (*args, f"--workers={workers}")
    extra = os.environ.get("NSQX_TEST_NSQD_ARGS", "").split()
    if extra:
        args = (*args, *extra)
    cmd = [
        sys.executable,
        "-m",
        "nsqx",
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=",
        "--https-address=",  # never the fixed default port 4152 (tests may set one)
        f"--data-path={data_path}",
        *args,
    ]
    return start_process(cmd, data_path, args, timeout, wall_shift_ns)


#: Go's nsqd 1.3.0, for side-by-side tests (absent from a user's clone: skip then)
GO_NSQD = (
    Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "go-nsq-1.3.0" / "nsqd"
)


def start_go_nsqd(data_path: Path, *args: str, timeout: float = 20) -> NsqdProcess:
    """Start Go's nsqd 1.3.0 on port 0 (the caller skips when GO_NSQD is missing)."""
    cmd = [
        str(GO_NSQD),
        "--tcp-address=127.0.0.1:0",
        "--http-address=",
        "--https-address=",
        f"--data-path={data_path}",
        *args,
    ]
    return start_process(cmd, data_path, args, timeout)


def start_process(
    cmd: list[str], data_path: Path, args: tuple[str, ...], timeout: float, wall_shift_ns: int = 0
) -> NsqdProcess:
    """Run an nsqd command line and wait for its "listening on" lines."""
    data_path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if wall_shift_ns:
        shift = str(Path(__file__).parent / "clockshift")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (shift, env.get("PYTHONPATH")) if p)
        env["NSQX_TEST_WALL_SHIFT_NS"] = str(wall_shift_ns)
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    nsqd = NsqdProcess(proc, data_path)
    ready = threading.Event()
    # the last --http-address wins; when it is set, wait for the HTTP line as well
    http_args = [a for a in args if a.startswith(("--http-address=", "-http-address="))]
    want_http = bool(http_args) and not http_args[-1].endswith("=")

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            nsqd.log.append(line)
            m = _LISTEN_RE.search(line)
            if m and not _WORKER_LINE_RE.search(line):
                if m.group(1) == "TCP":
                    nsqd.tcp_port = int(m.group(3))
                else:
                    nsqd.http_port = int(m.group(3))
                if nsqd.tcp_port and (nsqd.http_port or not want_http):
                    ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.05):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("nsqd did not start:\n" + "".join(nsqd.log))
    if not nsqd.tcp_port:
        proc.kill()
        raise RuntimeError("nsqd exited:\n" + "".join(nsqd.log))
    return nsqd
