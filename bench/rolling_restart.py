"""A rolling restart under load: lost and redelivered messages (docs/drain.md).

Starts one ``nsqx nsqlookupd`` and ``--nodes`` ``nsqx nsqd`` (free loopback ports, data
in a temporary directory, ``--drain-timeout`` as given), publishes to every live node
(MPUB batches at ``--rate`` messages/s, nsqx.client Producers) and consumes the topic
through nsqlookupd with one nsqx.client Consumer (a coroutine handler that works
``--handler-ms`` per message, ``--max-in-flight``). After a warm-up it restarts each
node in turn: SIGTERM, wait for the exit, start it again on the same port and data,
wait until the consumer is connected to it again, load for ``--load-s``. Then it stops
publishing, waits until every acknowledged message was delivered (or nothing arrives
for ``--quiet-s``), and prints:

- published: messages whose publish was acknowledged (OK);
- lost: acknowledged and never delivered;
- redelivered: deliveries of a message delivered before (attempts > 1);
- unacknowledged: publishes cut off by a restart (no OK: may or may not be stored,
  not counted as lost);
- each node's drain: seconds from SIGTERM to exit.

    python bench/rolling_restart.py                       # drain (default 5s)
    python bench/rolling_restart.py --drain-timeout 0     # NSQ 1.3's shutdown
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from nsqx.client import Consumer, Message, Producer

_LISTEN = re.compile(r"(TCP|HTTP): listening on [\d.]+:(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A server process and its log lines (stderr)."""

    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.log: list[str] = []
        self.tcp_port = self.http_port = 0
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            m = _LISTEN.search(line)
            if m:
                if m.group(1) == "TCP":
                    self.tcp_port = int(m.group(2))
                else:
                    self.http_port = int(m.group(2))
                if self.tcp_port and self.http_port:
                    self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 30) -> None:
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError(f"{self.cmd[3]} did not start:\n" + "".join(self.log[-20:]))


def nsqd_cmd(data: Path, port: int, http_port: int, lookupd: str, drain: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nsqx",
        "nsqd",
        f"--tcp-address=127.0.0.1:{port}",
        f"--http-address=127.0.0.1:{http_port}",
        "--https-address=",
        "--broadcast-address=127.0.0.1",
        f"--lookupd-tcp-address={lookupd}",
        f"--data-path={data}",
        f"--drain-timeout={drain}",
    ]


def lookup(http: str, topic: str) -> set[int]:
    """The TCP ports nsqlookupd lists for ``topic``."""
    req = urllib.request.Request(
        f"http://{http}/lookup?topic={topic}",
        headers={"Accept": "application/vnd.nsq; version=1.0"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = json.loads(resp.read())
    except OSError:
        return set()
    return {p["tcp_port"] for p in body.get("producers", [])}


class Load:
    """Publishes to the live nodes at ``rate`` messages/s, in batches of 10."""

    def __init__(self, live: dict[int, bool], topic: str, rate: float) -> None:
        self.live = live
        self.topic = topic
        self.rate = rate
        self.acked: set[bytes] = set()
        self.unacked = 0
        self.seq = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        producers = {
            port: Producer(
                f"127.0.0.1:{port}", reconnect_delay=0.05, read_timeout=2.0, heartbeat_interval=1.0
            )
            for port in self.live
        }
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        try:
            while True:
                ports = [p for p, up in self.live.items() if up]
                if not ports:
                    await asyncio.sleep(0.01)
                    continue
                port = random.choice(ports)
                bodies = [b"m-%d" % (self.seq + i) for i in range(10)]
                self.seq += 10
                try:
                    await producers[port].multi_publish(self.topic, bodies)
                    self.acked.update(bodies)
                except Exception:
                    self.unacked += len(bodies)
                sent += len(bodies)
                ahead = sent / self.rate - (loop.time() - start)
                await asyncio.sleep(max(ahead, 0))
        finally:
            for p in producers.values():
                with contextlib.suppress(Exception):
                    await p.close()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    lookupd = Proc(
        [
            sys.executable,
            "-m",
            "nsqx",
            "nsqlookupd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
        ]
    )
    lookupd.wait_ready()
    lk_tcp = f"127.0.0.1:{lookupd.tcp_port}"
    lk_http = f"127.0.0.1:{lookupd.http_port}"
    ports = [(free_port(), free_port()) for _ in range(args.nodes)]
    nodes: dict[int, Proc] = {}
    for i, (port, http_port) in enumerate(ports):
        nodes[port] = Proc(
            nsqd_cmd(tmp / f"n{i}", port, http_port, lk_tcp, str(args.drain_timeout))
        )
    for node in nodes.values():
        node.wait_ready()
    topic = "rolling"
    live = {port: True for port, _ in ports}
    deliveries: dict[bytes, list[int]] = defaultdict(list)
    handler_s = args.handler_ms / 1000

    async def handler(msg: Message) -> None:
        deliveries[msg.body].append(msg.attempts)
        await asyncio.sleep(random.uniform(0, 2 * handler_s))

    load = Load(live, topic, args.rate)
    consumer = Consumer(
        topic,
        "bench",
        handler,
        lookupd_http_addresses=[lk_http],
        max_in_flight=args.max_in_flight,
        lookupd_poll_interval=args.lookupd_poll,
    )
    drains: list[float] = []
    async with consumer:
        await until(lambda: len(consumer.connections) == args.nodes, 30, "every node")
        await asyncio.sleep(args.load_s)
        for i, (port, http_port) in enumerate(ports):
            node = nodes[port]
            t0 = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            await until(lambda n=node: n.proc.poll() is not None, 120, f"node {i} to exit")
            drains.append(time.monotonic() - t0)
            live[port] = False
            nodes[port] = Proc(
                nsqd_cmd(tmp / f"n{i}", port, http_port, lk_tcp, str(args.drain_timeout))
            )
            nodes[port].wait_ready()
            live[port] = True
            key = f"127.0.0.1:{port}"
            await until(lambda k=key: k in consumer.connections, 60, f"node {i} consumed again")
            await asyncio.sleep(args.load_s)
        await load.stop()
        last, quiet_since = -1, time.monotonic()
        while not load.acked <= set(deliveries):
            count = sum(map(len, deliveries.values()))
            if count != last:
                last, quiet_since = count, time.monotonic()
            elif time.monotonic() - quiet_since > args.quiet_s:
                break
            await asyncio.sleep(0.1)
    for node in nodes.values():
        node.proc.send_signal(signal.SIGTERM)
    for node in nodes.values():
        node.proc.wait(60)
    lookupd.proc.send_signal(signal.SIGTERM)
    lookupd.proc.wait(30)
    delivered = set(deliveries)
    return {
        "nodes": args.nodes,
        "drain_timeout": args.drain_timeout,
        "rate": args.rate,
        "handler_ms": args.handler_ms,
        "max_in_flight": args.max_in_flight,
        "published": len(load.acked),
        "unacknowledged": load.unacked,
        "delivered": len(delivered),
        "lost": len(load.acked - delivered),
        "redelivered": sum(len(a) - 1 for a in deliveries.values()),
        "attempts_above_1": sum(1 for a in deliveries.values() for x in a if x > 1),
        "drain_s": [round(d, 2) for d in drains],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--drain-timeout", default="5s", help="nsqd's --drain-timeout")
    parser.add_argument("--rate", type=float, default=2000, help="messages/s published")
    parser.add_argument("--handler-ms", type=float, default=2.0, help="mean work per message")
    parser.add_argument("--max-in-flight", type=int, default=60)
    parser.add_argument("--load-s", type=float, default=3.0, help="load before each restart")
    parser.add_argument("--lookupd-poll", type=float, default=0.25)
    parser.add_argument("--quiet-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for _ in range(args.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="nsqx-rolling-"))
        try:
            result = asyncio.run(bench(args, tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"drain-timeout {args.drain_timeout}: published {result['published']}, "
            f"lost {result['lost']}, redelivered {result['redelivered']}, "
            f"unacknowledged {result['unacknowledged']}, drains {result['drain_s']} s"
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
