"""Replication: ingest with replicator 1, 2 and 3 in one run, and leader-kill failovers.

Starts one nsqlookupd and three nsqd (``python -m nsqx``, free loopback ports, data in
a temporary directory), creates one single-partition topic per replicator setting, then:

``ingest``
    For ``--rounds`` rounds, each replicator in turn: one connection publishes MPUB
    batches of ``--batch`` messages of ``--size`` bytes to the partition's leader,
    ``--window`` outstanding, for ``--seconds``. Prints msgs/s and the CPU time of all
    three nsqd per message (utime + stime from /proc), and each ratio to replicator 1
    in the same round.
    Replicated topics are acknowledged as ``--acks`` says, each in turn in every round:
    ``durable`` (the default of nsqd's --replication-ack: a write quorum fsynced it),
    ``written`` (the topic's replication_ack=written: the ISR wrote it), printed with
    the ratio of durable to written in the same round. ``--go PATH`` also runs the same
    ingest against Go's nsqd 1.3 (unreplicated, its defaults) in every round, with the
    ratio of each setting to it.
``latency``
    With ``--latency-rate`` (msgs/s): for each ack of ``--acks``, one connection
    publishes PUBs of ``--size`` bytes at that rate to the replicator-3 topic (every
    millisecond the PUBs due so far in one write, pipelined), for ``--seconds``; each
    PUB's round trip (its write to its OK) after a 0.5 s warm-up: p50, p99, p99.9, max.
    The disk's fsync time is measured in the same run (4 KiB appended and fsynced in
    the nodes' data directory, ``--fsync-probes`` times) and printed beside.
``failover``
    ``--kills`` times: SIGKILL the leader of the replicator-2 topic, publish one
    message at a time (looking the leader up again after each failure) and time the
    first acknowledged write; then restart the killed node and wait until the ISR is
    whole again. Prints every time, the median and the worst.

    python bench/replication_bench.py --rounds 3 --seconds 2 --kills 10
    python bench/replication_bench.py --replicators 1,3 --kills 0 --profile /tmp/prof
    python bench/replication_bench.py --replicators 3 --acks durable,written --kills 0 \
        --go ../shared/reference/go-nsq-1.3.0/nsqd --latency-rate 50000
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
    """A server process and the ports it printed (nsqx's, or ``command``'s)."""

    def __init__(self, args: list[str], command: list[str] | None = None) -> None:
        self.args = args
        self.tcp = self.http = 0
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "nsqx"]), *args],
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


def ingest(lookupd: Proc, topic: str, args: argparse.Namespace, port: int | None = None) -> int:
    """Messages acknowledged by the partition's leader (or the server at ``port``: Go's
    nsqd, which takes no partition in MPUB) in ``--seconds``."""
    partition: int | None = None
    if port is None:
        port = leader(lookupd, topic)
        partition = 0
    assert port is not None
    sock, dec = connect(port)
    body = c.mpub(topic, [b"x" * args.size] * args.batch, partition)
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


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def fsync_times(directory: str, probes: int) -> list[float]:
    """Seconds each of ``probes`` fsyncs took, each after 4 KiB appended to a file in
    ``directory`` (the disk the nodes write to), sorted."""
    path = os.path.join(directory, "fsync-probe")
    out = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        block = b"x" * 4096
        for _ in range(probes):
            os.write(fd, block)
            t0 = time.perf_counter()
            os.fsync(fd)
            out.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.remove(path)
    return sorted(out)


def publish_rtts(lookupd: Proc, topic: str, rate: int, size: int, seconds: float) -> list[float]:
    """Round trips (s) of PUBs written at ``rate`` msgs/s (each millisecond, the PUBs due
    so far in one write, pipelined), after a 0.5 s warm-up; sorted."""
    port = leader(lookupd, topic)
    assert port is not None
    sock, dec = connect(port)
    sock.setblocking(False)
    pub = c.pub(topic, b"x" * size, 0)
    sent: list[float] = []  # write time of each PUB not answered yet, in order
    head = 0
    rtts: list[float] = []
    start = time.perf_counter()
    stop = start + seconds
    warm = start + 0.5
    written = 0
    while True:
        now = time.perf_counter()
        if now < stop:
            due = int((now - start) * rate) - written
            if due > 0:
                sock.sendall(pub * due)  # (a blocking send of a small burst)
                sent.extend([now] * due)
                written += due
        elif head == len(sent):
            break
        elif now > stop + 30:
            raise RuntimeError(f"{len(sent) - head} PUBs unanswered after 30 s")
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            time.sleep(0.0002)
            continue
        if not data:
            raise ConnectionError("closed")
        got = time.perf_counter()
        for ftype, frame in dec.feed(data):
            if ftype != FRAME_RESPONSE or frame != b"OK":
                if frame == b"_heartbeat_":
                    continue
                raise RuntimeError(f"PUB answered {frame!r}")
            at = sent[head]
            head += 1
            if at >= warm:
                rtts.append(got - at)
    sock.close()
    return sorted(rtts)


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
        "--acks",
        default="durable",
        help="how replicated topics are acknowledged, each in turn: durable, written",
    )
    ap.add_argument(
        "--go",
        default=None,
        metavar="NSQD",
        help="Go's nsqd binary: its unreplicated ingest in every round, for the ratios",
    )
    ap.add_argument(
        "--latency-rate",
        type=int,
        default=0,
        help="msgs/s of single PUBs for the round-trip phase (0: no such phase)",
    )
    ap.add_argument("--fsync-probes", type=int, default=200)
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
        " (DIR/<topic>-<node>.txt, collapsed stacks: r3, r3-written ...)",
    )
    ap.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        help="an extra flag for each nsqd (repeatable), e.g. --nsqd-arg=--busy-poll=0",
    )
    args = ap.parse_args()
    replicators = [int(r) for r in args.replicators.split(",")]
    acks = args.acks.split(",")
    # (name, replicator, ack) of every topic ingested in each round
    settings = [
        (f"r{r}" + ("" if ack == "durable" else "-" + ack), r, ack)
        for r in replicators
        for ack in (acks if r > 1 else ["durable"])
    ]
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
    nodes: list[Proc] = []
    go: Proc | None = None
    try:
        nodes.extend(Proc(["nsqd", f"--data-path={base}/n{i}", *node_args]) for i in range(3))
        if args.go:
            os.makedirs(f"{base}/go")  # (Go's nsqd does not make it)
            go = Proc(
                [
                    f"--data-path={base}/go",
                    "--tcp-address=127.0.0.1:0",
                    "--http-address=127.0.0.1:0",
                    "--https-address=",
                ],
                command=[args.go],
            )
        while True:
            status, body = http(f"http://127.0.0.1:{lookupd.http}/nodes")
            if status == 200 and len(json.loads(body)["producers"]) == 3:
                break
            time.sleep(0.1)
        topics = {(f"r{r}", r, "durable") for r in (1, 2, 3)} | set(settings)
        for name, r, ack in sorted(topics):
            url = f"http://127.0.0.1:{lookupd.http}/topic/create?topic={name}&partition_num=1"
            extra = "" if ack == "durable" else f"&replication_ack={ack}"
            status, body = http(f"{url}&replicator={r}{extra}", "POST")
            assert status == 200, body
        for name, _, _ in sorted(topics):
            while not publish_one(lookupd, name):
                time.sleep(0.1)
        print(f"ingest: MPUB x{args.batch}, {args.size} B, window {args.window}, 3 nsqd")
        if args.rounds and args.go and go is not None:
            print(f"  (and Go's nsqd: {args.go}, unreplicated, its defaults)")
        for rnd in range(args.rounds):
            rates: dict[str, float] = {}
            if go is not None:
                t0 = time.monotonic()
                go_cpu0 = go.cpu()
                sent = ingest(lookupd, "go", args, go.tcp)
                elapsed = time.monotonic() - t0
                rates["go"] = sent / elapsed
                print(
                    f"  round {rnd + 1} Go nsqd: {rates['go']:,.0f} msgs/s, "
                    f"{(go.cpu() - go_cpu0) * 1e6 / sent:.2f} us CPU/msg"
                )
            for name, r, ack in settings:
                spies = []
                if args.profile and rnd == args.rounds - 1:
                    os.makedirs(args.profile, exist_ok=True)
                    spies = [
                        subprocess.Popen(
                            [
                                *(shutil.which("py-spy") or PY_SPY, "record", "--nonblocking"),
                                *("--format", "raw", "-d", str(int(args.seconds))),
                                *("-p", str(n.proc.pid), "-o", f"{args.profile}/{name}-{i}.txt"),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        for i, n in enumerate(nodes)
                    ]
                port = leader(lookupd, name)
                cpu0 = [n.cpu() for n in nodes]
                own0 = time.process_time()
                t0 = time.monotonic()
                sent = ingest(lookupd, name, args)
                for spy in spies:
                    spy.wait()
                elapsed = time.monotonic() - t0
                own = time.process_time() - own0
                used = [n.cpu() - c0 for n, c0 in zip(nodes, cpu0, strict=True)]
                cpu = sum(used)
                lead = sum(u for n, u in zip(nodes, used, strict=True) if n.tcp == port)
                rates[name] = sent / elapsed
                us = 1e6 / sent
                ratios = []
                if "r1" in rates and r > 1:
                    ratios.append(f"to replicator 1: {rates[name] / rates['r1']:.2f}")
                written = f"r{r}-written"
                if ack != "written" and written in rates:
                    ratios.append(f"to written: {rates[name] / rates[written]:.2f}")
                if ack == "written" and f"r{r}" in rates:
                    ratios.append(f"durable to written: {rates[f'r{r}'] / rates[name]:.2f}")
                if "go" in rates:
                    ratios.append(f"to Go: {rates[name] / rates['go']:.2f}")
                label = f"replicator {r}" + (f" {ack}" if r > 1 else "")
                print(
                    f"  round {rnd + 1} {label}: {rates[name]:,.0f} msgs/s, "
                    f"{cpu * us:.2f} us CPU/msg (all nsqd: leader {lead * us:.2f}, others "
                    f"{(cpu - lead) * us:.2f}; load generator {own * us:.2f})"
                    + (", ratio " + ", ".join(ratios) if ratios else "")
                )
        if args.latency_rate:
            print(
                f"latency: PUB round trips at {args.latency_rate:,} msgs/s, {args.size} B,"
                " replicator 3"
            )
            for ack in acks:
                name = "r3" + ("" if ack == "durable" else "-" + ack)
                probe = fsync_times(base, args.fsync_probes)
                rtts = publish_rtts(lookupd, name, args.latency_rate, args.size, args.seconds)
                ms = [percentile(rtts, q) * 1e3 for q in (0.5, 0.99, 0.999)]
                fs = [percentile(probe, q) * 1e3 for q in (0.5, 0.99)]
                print(
                    f"  {ack}: {len(rtts):,} PUBs, p50 {ms[0]:.2f} ms, p99 {ms[1]:.2f} ms, "
                    f"p99.9 {ms[2]:.2f} ms, max {rtts[-1] * 1e3:.2f} ms; the disk's fsync "
                    f"(4 KiB) p50 {fs[0]:.2f} ms, p99 {fs[1]:.2f} ms"
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
        for p in (*nodes, lookupd, *([go] if go is not None else [])):
            if p.proc.poll() is None:
                p.kill()
        # the data can be gigabytes (in /dev/shm: memory): never leave it behind
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
