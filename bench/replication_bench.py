"""Replication: ingest with replicator 1, 2 and 3 in one run, and leader-kill failovers.

Starts one nsqlookupd and three nsqd (``python -m nsqx``, free loopback ports, data in
a temporary directory), creates one single-partition topic per replicator setting, then:

``ingest``
    For ``--rounds`` rounds, each replicator in turn: one connection publishes MPUB
    batches of ``--batch`` messages of ``--size`` bytes to the partition's leader,
    ``--window`` outstanding, for ``--seconds``. Prints msgs/s and the CPU time of all
    three nsqd per message (utime + stime from /proc), and each ratio to replicator 1
    in the same round.
``failover``
    ``--kills`` times: SIGKILL the leader of the replicator-2 topic, publish one
    message at a time (looking the leader up again after each failure) and time the
    first acknowledged write; then restart the killed node and wait until the ISR is
    whole again. Prints every time, the median and the worst.

    python bench/replication_bench.py --rounds 3 --seconds 2 --kills 10
    python bench/replication_bench.py --replicators 1,3 --kills 0 --profile /tmp/prof
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_RESPONSE, FrameDecoder

_LISTEN = re.compile(r"(TCP|HTTP): listening on ([\d.]+):(\d+)")
#: py-spy is a dev dependency: next to this interpreter when not on PATH
PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


class Proc:
    """A server process and the ports it printed."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.tcp = self.http = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqx", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                m = _LISTEN.search(line)
                if m:
                    setattr(self, m.group(1).lower(), int(m.group(3)))
                    if self.tcp and self.http:
                        ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(30) or not (self.tcp and self.http):
            raise RuntimeError(f"{args[0]} did not start")

    def cpu(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def http(url: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers=V1)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def leader(lookupd: Proc, topic: str) -> int | None:
    status, body = http(f"http://127.0.0.1:{lookupd.http}/lookup?topic={topic}&access=w")
    if status != 200:
        return None
    info = json.loads(body).get("partitions", {}).get("0")
    return int(info["tcp_port"]) if info else None


def connect(port: int) -> tuple[socket.socket, FrameDecoder]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"  V2")
    return sock, FrameDecoder()


def responses(sock: socket.socket, dec: FrameDecoder, n: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while len(out) < n:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        out.extend(f for f in dec.feed(data) if f != (FRAME_RESPONSE, b"_heartbeat_"))
    return out


def ingest(lookupd: Proc, topic: str, args: argparse.Namespace) -> int:
    port = leader(lookupd, topic)
    assert port is not None
    sock, dec = connect(port)
    body = c.mpub(topic, [b"x" * args.size] * args.batch, 0)
    sent = 0
    outstanding = 0
    stop = time.monotonic() + args.seconds
    while True:
        while outstanding < args.window and time.monotonic() < stop:
            sock.sendall(body)
            outstanding += 1
        if not outstanding:
            break
        for ftype, data in responses(sock, dec, 1):
            if ftype != FRAME_RESPONSE or data != b"OK":
                raise RuntimeError(f"MPUB answered {data!r}")
            sent += args.batch
            outstanding -= 1
    sock.close()
    return sent


def publish_one(lookupd: Proc, topic: str) -> bool:
    port = leader(lookupd, topic)
    if port is None:
        return False
    try:
        sock, dec = connect(port)
        sock.settimeout(10)
        sock.sendall(c.pub(topic, b"after", 0))
        ok = responses(sock, dec, 1)[0] == (FRAME_RESPONSE, b"OK")
        sock.close()
        return ok
    except OSError:
        return False


def isr_size(node: Proc, topic: str) -> int:
    status, body = http(f"http://127.0.0.1:{node.http}/partition/state?topic={topic}&partition=0")
    if status != 200:
        return 0
    doc: dict[str, Any] = json.loads(body)
    return len(doc.get("isr", [])) if doc.get("role") == "leader" else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--replicators", default="1,2,3", help="the settings to ingest with, in turn")
    ap.add_argument(
        "--data-dir",
        default=None,
        help="where the three nsqd keep their data (default: a temporary directory;"
        " /dev/shm takes the shared disk out of the measurement)",
    )
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="record each nsqd with py-spy during the last round's ingests"
        " (DIR/r<replicator>-<node>.txt, collapsed stacks)",
    )
    ap.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        help="an extra flag for each nsqd (repeatable), e.g. --nsqd-arg=--busy-poll=0",
    )
    args = ap.parse_args()
    replicators = [int(r) for r in args.replicators.split(",")]
    base = tempfile.mkdtemp(prefix="nsqx-repl-bench-", dir=args.data_dir)
    lookupd = Proc(["nsqlookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])
    node_args = [
        f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp}",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--https-address=",
        "--broadcast-address=127.0.0.1",
        *args.nsqd_arg,
    ]
    nodes = [Proc(["nsqd", f"--data-path={base}/n{i}", *node_args]) for i in range(3)]
    try:
        while True:
            status, body = http(f"http://127.0.0.1:{lookupd.http}/nodes")
            if status == 200 and len(json.loads(body)["producers"]) == 3:
                break
            time.sleep(0.1)
        for r in (1, 2, 3):
            url = f"http://127.0.0.1:{lookupd.http}/topic/create?topic=r{r}&partition_num=1"
            status, body = http(f"{url}&replicator={r}", "POST")
            assert status == 200, body
        for r in (1, 2, 3):
            while not publish_one(lookupd, f"r{r}"):
                time.sleep(0.1)
        print(f"ingest: MPUB x{args.batch}, {args.size} B, window {args.window}, 3 nsqd")
        for rnd in range(args.rounds):
            rates: dict[int, float] = {}
            for r in replicators:
                spies = []
                if args.profile and rnd == args.rounds - 1:
                    os.makedirs(args.profile, exist_ok=True)
                    spies = [
                        subprocess.Popen(
                            [
                                *(shutil.which("py-spy") or PY_SPY, "record", "--nonblocking"),
                                *("--format", "raw", "-d", str(int(args.seconds))),
                                *("-p", str(n.proc.pid), "-o", f"{args.profile}/r{r}-{i}.txt"),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        for i, n in enumerate(nodes)
                    ]
                port = leader(lookupd, f"r{r}")
                cpu0 = [n.cpu() for n in nodes]
                own0 = time.process_time()
                t0 = time.monotonic()
                sent = ingest(lookupd, f"r{r}", args)
                for spy in spies:
                    spy.wait()
                elapsed = time.monotonic() - t0
                own = time.process_time() - own0
                used = [n.cpu() - c0 for n, c0 in zip(nodes, cpu0, strict=True)]
                cpu = sum(used)
                lead = sum(u for n, u in zip(nodes, used, strict=True) if n.tcp == port)
                rates[r] = sent / elapsed
                us = 1e6 / sent
                print(
                    f"  round {rnd + 1} replicator {r}: {rates[r]:,.0f} msgs/s, "
                    f"{cpu * us:.2f} us CPU/msg (all nsqd: leader {lead * us:.2f}, others "
                    f"{(cpu - lead) * us:.2f}; load generator {own * us:.2f})"
                    + (f", ratio to replicator 1: {rates[r] / rates[1]:.2f}" if 1 in rates else "")
                )
        times: list[float] = []
        print(f"failover: replicator 2, {args.kills} leader kills")
        for k in range(args.kills):
            port = leader(lookupd, "r2")
            victim = next(n for n in nodes if n.tcp == port)
            victim.kill()
            t0 = time.monotonic()
            while not publish_one(lookupd, "r2"):
                time.sleep(0.02)
            times.append(time.monotonic() - t0)
            print(f"  kill {k + 1}: writes resumed after {times[-1]:.2f} s")
            nodes[nodes.index(victim)] = Proc(victim.args)
            deadline = time.monotonic() + 60
            while not any(isr_size(n, "r2") == 2 for n in nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the ISR did not heal")
                time.sleep(0.1)
        if times:
            print(f"  median {statistics.median(times):.2f} s, worst {max(times):.2f} s")
    finally:
        for p in (*nodes, lookupd):
            if p.proc.poll() is None:
                p.kill()
        # the data can be gigabytes (in /dev/shm: memory): never leave it behind
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
