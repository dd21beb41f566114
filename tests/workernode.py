"""A node of several workers in tests: its workers' pids, topics spread over them, and
an nsqlookupd of either implementation (Go's 1.3 where its binary is at hand)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqx.nsqd.workers.ownership import owner_of

from lookupdproc import http_request, wait_until
from nsqdproc import GO_NSQD, NsqdProcess, start_nsqd
from rawnsq import Raw

GO_NSQLOOKUPD = GO_NSQD.parent / "nsqlookupd"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}

_WORKER_RE = re.compile(r"WORKERS: worker (\d+) started \(pid (\d+)\)")


def worker_pids(node: NsqdProcess) -> dict[int, int]:
    """The latest pid of each worker, from the supervisor's log."""
    pids: dict[int, int] = {}
    for line in list(node.log):
        m = _WORKER_RE.search(line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    return pids


def start_workers(data_path: Path, *args: str, workers: int = 2) -> NsqdProcess:
    """``nsqx nsqd --workers=N ARGS`` on free ports, returned once every worker said it
    started, its listeners and its handoff socket bound (the node killed if they do
    not): a connection that lands on one worker before another is up cannot move there,
    and a test of moving would see it stay."""
    node = start_nsqd(data_path, f"--workers={workers}", *args)
    said = f"WORKERS: {workers} workers started"
    try:
        wait_for(lambda: any(said in line for line in list(node.log)), 30.0, f"{workers} workers")
    except BaseException:
        node.stop(signal.SIGKILL)
        raise
    return node


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Wait (polling) until ``cond()`` is true."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def topics_spread(n: int, workers: int, prefix: str = "wt") -> list[str]:
    """n topic names, at least one owned by each worker."""
    names = [f"{prefix}{i}" for i in range(n)]
    assert {owner_of(t, 0, workers) for t in names} == set(range(workers))
    return names


def _answers(http: str) -> bool:
    try:
        return http_request(f"http://{http}/ping")[0] == 200
    except OSError:
        return False


class Lookupd:
    """An nsqlookupd's HTTP API, whichever implementation runs it."""

    def __init__(self, tcp: str, http: str, stop: Callable[[], None]) -> None:
        self.tcp_address = tcp
        self.http_address = http
        self.stop = stop

    def json(self, path: str) -> Any:
        status, _, body = http_request(f"http://{self.http_address}{path}", headers=V1)
        if status != 200:
            return None
        return json.loads(body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def go_lookupd() -> Iterator[Lookupd]:
    """Go's nsqlookupd 1.3 on free ports (the test is skipped where it is absent)."""
    if not GO_NSQLOOKUPD.exists():
        pytest.skip("Go's nsqlookupd 1.3 is not at hand")
    tcp, http = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    go = subprocess.Popen(
        [
            str(GO_NSQLOOKUPD),
            f"-tcp-address={tcp}",
            f"-http-address={http}",
            "-broadcast-address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _answers(http), what="Go's nsqlookupd")
        yield Lookupd(tcp, http, go.kill)
    finally:
        go.kill()
        go.wait()


def socket_holder(pids: dict[int, int], server_port: int, client_port: int) -> int | None:
    """The worker whose process alone holds the node's end of the TCP connection from
    ``client_port`` (None: not found, or held by more than one, while it moves)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                local, remote = parts[1].split(":")[-1], parts[2].split(":")[-1]
                if int(local, 16) == server_port and int(remote, 16) == client_port:
                    inode = parts[9]
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    holders = []
    for index, pid in pids.items():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        holders.append(index)
                        break
    return holders[0] if len(holders) == 1 else None


def worker_of(node: NsqdProcess, client_port: int) -> int:
    """The index of the worker that holds the connection from ``client_port`` (waits
    until one alone does)."""
    found: list[int] = []

    def look() -> bool:
        w = socket_holder(worker_pids(node), node.tcp_port, client_port)
        if w is not None:
            found.append(w)
        return w is not None

    wait_for(look, 10, "the worker that holds a connection")
    return found[0]


async def raw_on(node: NsqdProcess, worker: int) -> Raw:
    """A raw connection that landed on ``worker`` (others are opened and closed)."""
    for _ in range(200):  # each lands on some worker: (1 - 1/N)**200 to miss
        raw = await Raw.connect(node.tcp_address)
        port = raw.writer.get_extra_info("sockname")[1]
        landed = await asyncio.to_thread(worker_of, node, port)
        if landed == worker:
            return raw
        await raw.close()
    raise AssertionError(f"no connection landed on worker {worker}")
