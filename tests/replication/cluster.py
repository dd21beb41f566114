"""A replicated cluster of real processes for the failover tests: one nsqlookupd and
three nsqd, and a blocking publisher and consumer that follow the partition's leader
through /lookup the way a client does (E_FAILED_ON_NOT_LEADER / NOT_WRITABLE, or a
closed connection: look up again, retry)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsqx.wire import commands as c
from nsqx.wire.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    FrameDecoder,
    decode_message,
)

from lookupdproc import LookupdProcess, http_request
from nsqdproc import NsqdProcess, start_nsqd

V1 = {"Accept": "application/vnd.nsq; version=1.0"}

#: every nsqd a test started (tests/replication/conftest.py kills them after each test,
#: also when it fails half-way)
STARTED: list[NsqdProcess] = []


def start_node(data_path: Path, *args: str) -> NsqdProcess:
    """``start_nsqd``, and remembered so that the test's end stops it whatever happens."""
    node = start_nsqd(data_path, *args)
    STARTED.append(node)
    return node


HEARTBEAT = b"_heartbeat_"


def start_cluster(
    lookupd_factory: Callable[..., LookupdProcess],
    tmp_path: Path,
    *extra: str,
    count: int = 3,
    lag_timeout: str | None = "1s",
) -> tuple[LookupdProcess, list[NsqdProcess], list[str]]:
    """One nsqlookupd and ``count`` nsqd registered with it (``extra`` flags for each;
    ``lag_timeout`` is --replication-lag-timeout, None for the default); returns them
    and the nsqd's flags, to start another node or restart one."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    args = [
        *extra,
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ]
    if lag_timeout is not None:
        args.append(f"--replication-lag-timeout={lag_timeout}")
    nodes = [start_node(tmp_path / f"nsqd{i}", *args) for i in range(count)]
    until(
        lambda: len(lookupd.json("/nodes")["producers"]) == count,
        what=f"{count} nsqd registered",
    )
    return lookupd, nodes, args


def create_replicated(lookupd: LookupdProcess, topic: str, replicator: int) -> int:
    """Create a one-partition topic with ``replicator`` replicas through nsqlookupd;
    the TCP port of its leader once /lookup lists one."""
    status, _, body = lookupd.post(
        f"/topic/create?topic={topic}&partition_num=1&replicator={replicator}"
    )
    assert status == 200, body
    port: int = until(lambda: leader_port(lookupd, topic), what="a leader in /lookup")
    return port


def until(cond: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def leader_port(lookupd: LookupdProcess, topic: str, pid: int = 0) -> int | None:
    """The TCP port of the partition's leader as /lookup says, or None."""
    status, _, body = lookupd.get(f"/lookup?topic={topic}&access=w", headers=V1)
    if status != 200:
        return None
    info = json.loads(body).get("partitions", {}).get(str(pid))
    return int(info["tcp_port"]) if info else None


def partition_state(node: NsqdProcess, topic: str, pid: int = 0) -> dict[str, Any] | None:
    status, _, body = http_request(f"{node.http_url}/partition/state?topic={topic}&partition={pid}")
    return json.loads(body) if status == 200 else None


class Conn:
    """A blocking V2 connection."""

    def __init__(self, port: int, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(b"  V2")
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, bytes]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> tuple[int, bytes]:
        while not self.frames:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Publisher:
    """Publishes numbered messages to the partition's leader, one PUB at a time,
    retrying each until it is acknowledged."""

    lookupd: LookupdProcess
    topic: str
    pid: int = 0
    acked: list[int] = field(default_factory=list)
    conn: Conn | None = None
    #: seconds from a message's first attempt to its acknowledgement, when over 0.2 s
    #: (the time writes were held up: retries, or an answer that waited for the ISR)
    outages: list[float] = field(default_factory=list)
    #: seconds an attempt waits for its answer (a stopped leader answers nothing)
    timeout: float = 15

    def publish(self, n: int, deadline: float = 60) -> None:
        stop = time.monotonic() + deadline
        for _ in range(n):
            number = len(self.acked)
            began = time.monotonic()
            while True:
                if time.monotonic() > stop:
                    raise AssertionError(f"message {number} not acknowledged in {deadline} s")
                if self._try(number):
                    took = time.monotonic() - began
                    if took > 0.2:
                        self.outages.append(took)
                    self.acked.append(number)
                    break
                time.sleep(0.05)

    def _try(self, number: int) -> bool:
        try:
            if self.conn is None:
                port = leader_port(self.lookupd, self.topic, self.pid)
                if port is None:
                    return False
                self.conn = Conn(port, timeout=self.timeout)
            self.conn.send(c.pub(self.topic, b"m%d" % number, self.pid))
            while True:
                ftype, data = self.conn.frame()
                if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                    self.conn.send(c.nop())
                    continue
                if ftype == FRAME_RESPONSE and data == b"OK":
                    return True
                break  # an error frame: look up again
        except OSError:
            pass
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        return False


@dataclass
class Consumer:
    """Reads a channel from the partition's leader, FINs each message, follows the
    leader when its connection closes."""

    lookupd: LookupdProcess
    topic: str
    channel: str
    pid: int = 0
    received: list[int] = field(default_factory=list)
    conn: Conn | None = None

    def _connect(self) -> bool:
        port = leader_port(self.lookupd, self.topic, self.pid)
        if port is None:
            return False
        try:
            conn = Conn(port)
            conn.send(c.sub(self.topic, self.channel, self.pid))
            ftype, data = conn.frame()
            if ftype != FRAME_RESPONSE or data != b"OK":
                conn.close()
                return False
            conn.send(c.rdy(100))
        except OSError:
            return False
        self.conn = conn
        return True

    def read_until(self, cond: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"consumer: got {len(set(self.received))} in {timeout} s")
            if self.conn is None and not self._connect():
                time.sleep(0.1)
                continue
            assert self.conn is not None
            try:
                self.conn.sock.settimeout(0.5)
                ftype, data = self.conn.frame()
                if ftype == FRAME_MESSAGE:
                    msg = decode_message(data)
                    self.received.append(int(msg.body[1:]))
                    self.conn.send(c.fin(msg.id))
                elif ftype == FRAME_RESPONSE and data == HEARTBEAT:
                    self.conn.send(c.nop())
                elif ftype == FRAME_ERROR:
                    raise ConnectionError(data.decode(errors="replace"))
            except TimeoutError:
                continue
            except OSError:
                self.conn.close()
                self.conn = None


def report(name: str, pub: Publisher, con: Consumer) -> tuple[int, int]:
    """Print the counts the issue asks for; (lost, duplicates)."""
    acked = set(pub.acked)
    got = set(con.received)
    lost = len(acked - got)
    dups = len(con.received) - len(got)
    resume = max(pub.outages, default=0.0)
    print(
        f"\n[{name}] acknowledged {len(acked)}, received {len(got)}, lost {lost}, "
        f"duplicates {dups}, writes resumed after {resume:.2f} s"
    )
    return lost, dups
