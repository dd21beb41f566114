"""Partitioned topics: ordered consumption by partition count, plain PUB/SUB by partitions.

Two phases, against our own nsqd (started here, as bench/server_bench.py starts it), or
another nsqd (``--nsqd-tcp-address`` with ``--nsqd-http-address``), or a cluster behind
an nsqlookupd, ours or Youzan's (``--lookupd-http-address``: topics are created and
placed through it, multipart, and each partition is used on its leader; give each
nsqd's ``--server-pid`` for CPU figures). Every topic is created before anything is
measured (a Youzan cluster's new partitions take writes only after a minute or two):

``ordered``
    For each count in ``--partitions`` (1,4,16), a topic created with that many
    partitions and ``orderedmulti``; every partition is filled with
    ``--ordered-messages`` / P messages (MPUB), then one SUB_ORDERED connection per
    partition consumes, FINing each message at once, until all arrive. Ordered
    consumption has one message in flight per partition, so its rate is a round trip
    per message per partition: it grows with partitions until the server's core is
    busy. Every partition's messages are checked to arrive in order, once.
``plain``
    For each count in ``--plain-partitions`` (1,4), a plain topic with that many
    partitions: one connection publishes MPUB batches of ``--batch`` round-robin over
    the partitions (``--window`` outstanding) for ``--plain-seconds``; then one
    connection per partition (SUB t c p, RDY 2500) drains the backlog.

For each run: msgs/s, and the server's CPU time per message (utime + stime of the
server process and its children from /proc, before and after), as server_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import struct
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from server_bench import BenchError, OwnServer, message_body, run_loop, server_cpu_seconds

from nsqx.wire import commands
from nsqx.wire.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    MSG_ID_AT,
    MSG_ID_END,
    FrameDecoder,
)

_U64 = struct.Struct(">Q")


@dataclass
class Config:
    nsqd_tcp_address: str | None = None
    nsqd_http_address: str | None = None
    #: a cluster behind nsqlookupd (ours or Youzan's): topics are created through it
    lookupd_http_address: str | None = None
    server_pids: tuple[int, ...] = ()
    partitions: tuple[int, ...] = (1, 4, 16)
    plain_partitions: tuple[int, ...] = (1, 4)
    ordered_messages: int = 20_000
    plain_seconds: float = 5.0
    size: int = 200
    batch: int = 200
    window: int = 16
    phases: tuple[str, ...] = ("ordered", "plain")


class Conn(asyncio.Protocol):
    """One connection: responses to awaited requests, messages to a callback."""

    def __init__(self, on_message: Any = None) -> None:
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.waiters: list[asyncio.Future[bytes]] = []
        self.on_message = on_message
        self.error: BaseException | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(MAGIC_V2)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        for w in self.waiters:
            if not w.done():
                w.set_exception(BenchError("connection closed"))

    def data_received(self, data: bytes) -> None:
        for ftype, payload in self.decoder.feed(data):
            if ftype == FRAME_MESSAGE and self.on_message is not None:
                self.on_message(self, payload)
            elif ftype == FRAME_RESPONSE and payload == HEARTBEAT:
                self.write(commands.nop())
            elif ftype == FRAME_ERROR:
                err = BenchError(f"error frame: {payload[:200]!r}")
                self.error = err
                for w in self.waiters:
                    if not w.done():
                        w.set_exception(err)
                self.waiters.clear()
            elif self.waiters:
                self.waiters.pop(0).set_result(payload)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        self.write(data)
        return fut

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(addr: tuple[str, int], on_message: Any = None) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: Conn(on_message), *addr)
    return conn


def http_post(base: str, path: str) -> None:
    req = urllib.request.Request(base + path, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def http_json(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


#: where each partition of a topic is served (its leader): partition -> TCP address
Layout = dict[int, tuple[str, int]]


def create_on_node(addr: tuple[str, int], base: str, topic: str, n: int, ordered: bool) -> Layout:
    """Every partition on one nsqd, made through its HTTP API."""
    extra = "&orderedmulti=true" if ordered else ""
    for p in range(n):
        http_post(base, f"/topic/create?topic={topic}&partition={p}&partition_num={n}{extra}")
    for p in range(n):
        http_post(base, f"/channel/create?topic={topic}&channel=bench&partition={p}")
    return dict.fromkeys(range(n), addr)


def create_in_cluster(lookupd: str, topic: str, n: int, ordered: bool) -> None:
    """Ask nsqlookupd to create and place the topic (several partitions per node)."""
    extra = "&orderedmulti=true" if ordered else ""
    http_post(
        f"http://{lookupd}",
        f"/topic/create?topic={topic}&partition_num={n}&replicator=1&multipart=true{extra}",
    )


def cluster_layout(lookupd: str, topic: str, n: int, timeout: float = 300) -> Layout:
    """Wait until every partition has a leader that takes a channel (Youzan's nodes need
    their leader sessions first: up to a couple of minutes), then the layout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            # access=r: Youzan's lookupd answers 404 to writers until a channel exists
            data = http_json(f"http://{lookupd}/lookup?topic={topic}&access=r&metainfo=true")
            parts = data.get("partitions") or {}
            if len(parts) == n:
                layout = {}
                for p, info in parts.items():
                    host = info["broadcast_address"]
                    http_post(
                        f"http://{host}:{info['http_port']}",
                        f"/channel/create?topic={topic}&channel=bench&partition={p}",
                    )
                    layout[int(p)] = (host, int(info["tcp_port"]))
                return layout
        except (OSError, ValueError, KeyError):
            pass  # not yet: refused while the partition has no leader session
        if time.monotonic() > deadline:
            raise BenchError(f"{topic}: partitions not writable after {timeout:.0f} s")
        time.sleep(0.5)


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU seconds of all the servers (and their children) so far."""
    total = 0.0
    for pid in pids:
        used = server_cpu_seconds(pid)
        if used is None:
            return None
        total += used
    return total if pids else None


async def fill(layout: Layout, topic: str, total: int, cfg: Config) -> None:
    """MPUB ``total`` messages spread evenly over the partitions (bodies carry a sequence),
    each to its partition's node."""
    conns = {addr: await connect(addr) for addr in set(layout.values())}
    pad = message_body(max(cfg.size - 8, 0))
    per = total // len(layout)
    pending: list[asyncio.Future[bytes]] = []
    for p, addr in sorted(layout.items()):
        pub = conns[addr]
        for first in range(0, per, cfg.batch):
            n = min(cfg.batch, per - first)
            bodies = [_U64.pack(first + k) + pad for k in range(n)]
            pending.append(pub.request(commands.mpub(topic, bodies, p)))
            if len(pending) >= cfg.window:
                await pending.pop(0)
    await asyncio.gather(*pending)
    for conn in conns.values():
        conn.close()


async def ordered_run(topic: str, layout: Layout, cfg: Config) -> dict[str, Any]:
    partitions = len(layout)
    per = cfg.ordered_messages // partitions
    await fill(layout, topic, per * partitions, cfg)
    total = per * partitions
    done = asyncio.get_running_loop().create_future()
    expected = dict.fromkeys(range(partitions), 0)
    received = 0

    conns = []
    for p in range(partitions):

        def handler(conn: Conn, data: bytes, p: int = p) -> None:
            nonlocal received
            # Youzan layout: ts(8) attempts(2) id(8) trace(8) offset(8) raw size(4) body
            seq = _U64.unpack_from(data, 38)[0]
            if seq != expected[p]:
                if seq < expected[p]:
                    return  # a redelivery (a timeout): allowed, not counted
                conn.error = BenchError(f"partition {p}: got {seq} where {expected[p]} was due")
                if not done.done():
                    done.set_exception(conn.error)
                return
            expected[p] += 1
            received += 1
            conn.write(commands.fin(data[MSG_ID_AT:MSG_ID_END]))
            if received == total and not done.done():
                done.set_result(None)

        conn = await connect(layout[p], handler)
        await conn.request(commands.identify({"feature_negotiation": True, "desired_tag": ""}))
        await conn.request(commands.sub_ordered(topic, "bench", p))
        conns.append(conn)
    cpu0 = cpu_seconds(cfg.server_pids)
    t0 = time.perf_counter()
    for conn in conns:
        conn.write(commands.rdy(10))
    await asyncio.wait_for(done, 300)
    elapsed = time.perf_counter() - t0
    cpu1 = cpu_seconds(cfg.server_pids)
    for conn in conns:
        conn.close()
    return _figures(total, elapsed, cpu0, cpu1)


async def plain_run(topic: str, layout: Layout, cfg: Config) -> dict[str, Any]:
    partitions = len(layout)
    body = message_body(cfg.size)
    pubs = {addr: await connect(addr) for addr in set(layout.values())}
    mpubs = [
        (pubs[layout[p]], commands.mpub(topic, [body] * cfg.batch, p)) for p in range(partitions)
    ]
    pending: list[asyncio.Future[bytes]] = []
    published = 0
    cpu0 = cpu_seconds(cfg.server_pids)
    t0 = time.perf_counter()
    deadline = t0 + cfg.plain_seconds
    k = 0
    while time.perf_counter() < deadline:
        pub, mpub = mpubs[k % partitions]
        pending.append(pub.request(mpub))
        k += 1
        if len(pending) >= cfg.window:
            await pending.pop(0)
            published += cfg.batch
    await asyncio.gather(*pending)
    published += len(pending) * cfg.batch
    pub_elapsed = time.perf_counter() - t0
    cpu1 = cpu_seconds(cfg.server_pids)
    for pub in pubs.values():
        pub.close()
    got = 0
    done = asyncio.get_running_loop().create_future()

    def handler(conn: Conn, data: bytes) -> None:
        nonlocal got
        got += 1
        conn.fins.append(data[MSG_ID_AT:MSG_ID_END])  # type: ignore[attr-defined]
        if got == published and not done.done():
            done.set_result(None)

    conns = []
    for p in range(partitions):
        conn = await connect(layout[p], handler)
        conn.fins = []  # type: ignore[attr-defined]
        await conn.request(commands.identify({"feature_negotiation": True, "desired_tag": ""}))
        await conn.request(commands.sub(topic, "bench", p))
        conns.append(conn)

    async def flush_fins() -> None:
        # FINs of what arrived, one write per connection per tick, and RDY again
        while not done.done():
            for conn in conns:
                fins = conn.fins  # type: ignore[attr-defined]
                if fins:
                    conn.fins = []  # type: ignore[attr-defined]
                    conn.write(b"".join(commands.fin(i) for i in fins))
            await asyncio.sleep(0.001)

    cpu2 = cpu_seconds(cfg.server_pids)
    t1 = time.perf_counter()
    for conn in conns:
        conn.write(commands.rdy(2500))
    flusher = asyncio.ensure_future(flush_fins())
    await asyncio.wait_for(done, 300)
    sub_elapsed = time.perf_counter() - t1
    cpu3 = cpu_seconds(cfg.server_pids)
    flusher.cancel()
    for conn in conns:
        conn.close()
    return {
        "pub": _figures(published, pub_elapsed, cpu0, cpu1),
        "sub": _figures(published, sub_elapsed, cpu2, cpu3),
    }


def _figures(n: int, seconds: float, cpu0: float | None, cpu1: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": n, "seconds": round(seconds, 3), "rate": n / seconds}
    if cpu0 is not None and cpu1 is not None:
        out["server_cpu_us_per_msg"] = (cpu1 - cpu0) / n * 1e6
        out["server_cpu_share"] = (cpu1 - cpu0) / seconds
    return out


def make_topics(cfg: Config, addr: tuple[str, int], base: str) -> dict[str, tuple[str, Layout]]:
    """Every topic of the run, created before anything is measured (a cluster's new
    partitions may need minutes to take writes): run key -> (topic, layout)."""
    wanted = []
    if "ordered" in cfg.phases:
        wanted += [(f"ordered {p}", p, True) for p in cfg.partitions]
    if "plain" in cfg.phases:
        wanted += [(f"plain {p}", p, False) for p in cfg.plain_partitions]
    tag = secrets.token_hex(3)
    names = {key: f"bench_{key.replace(' ', '_')}_{tag}" for key, _, _ in wanted}
    if cfg.lookupd_http_address is None:
        return {
            key: (names[key], create_on_node(addr, base, names[key], n, o)) for key, n, o in wanted
        }
    for key, n, o in wanted:
        create_in_cluster(cfg.lookupd_http_address, names[key], n, o)
    return {
        key: (names[key], cluster_layout(cfg.lookupd_http_address, names[key], n))
        for key, n, _ in wanted
    }


async def run(cfg: Config, topics: dict[str, tuple[str, Layout]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if "ordered" in cfg.phases:
        report["ordered"] = {
            str(p): await ordered_run(*topics[f"ordered {p}"], cfg) for p in cfg.partitions
        }
    if "plain" in cfg.phases:
        report["plain"] = {
            str(p): await plain_run(*topics[f"plain {p}"], cfg) for p in cfg.plain_partitions
        }
    return report


def _fmt(f: dict[str, Any]) -> str:
    cpu = f.get("server_cpu_us_per_msg")
    extra = f", server {cpu:.2f} us/msg ({f['server_cpu_share']:.0%} of a core)" if cpu else ""
    return f"{f['rate']:>10,.0f} msgs/s ({f['messages']:,} in {f['seconds']:.2f} s{extra})"


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for p, f in report.get("ordered", {}).items():
        lines.append(f"ordered  {p:>2} partitions: {_fmt(f)}")
    for p, f in report.get("plain", {}).items():
        lines.append(f"plain pub {p:>2} partitions: {_fmt(f['pub'])}")
        lines.append(f"plain sub {p:>2} partitions: {_fmt(f['sub'])}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nsqd-tcp-address", help="bench this server instead of our own nsqd")
    ap.add_argument("--nsqd-http-address", help="its HTTP API (to create the topics)")
    ap.add_argument(
        "--lookupd-http-address",
        help="a cluster behind this nsqlookupd (ours or Youzan's): topics are created and "
        "placed through it, each partition used on its leader",
    )
    ap.add_argument("--server-pid", type=int, action="append", help="a server's pid (repeat)")
    ap.add_argument("--partitions", default="1,4,16", help="ordered phase partition counts")
    ap.add_argument("--plain-partitions", default="1,4", help="plain phase partition counts")
    ap.add_argument("--ordered-messages", type=int, default=20_000)
    ap.add_argument("--plain-seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--phases", default="ordered,plain")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    cfg = Config(
        nsqd_tcp_address=a.nsqd_tcp_address,
        nsqd_http_address=a.nsqd_http_address,
        lookupd_http_address=a.lookupd_http_address,
        server_pids=tuple(a.server_pid or ()),
        partitions=_ints(a.partitions),
        plain_partitions=_ints(a.plain_partitions),
        ordered_messages=a.ordered_messages,
        plain_seconds=a.plain_seconds,
        size=a.size,
        batch=a.batch,
        window=a.window,
        phases=tuple(a.phases.split(",")),
    )
    server: OwnServer | None = None
    try:
        if cfg.lookupd_http_address:
            addr, base = ("", 0), ""
        elif cfg.nsqd_tcp_address:
            if not cfg.nsqd_http_address:
                raise BenchError("--nsqd-tcp-address needs --nsqd-http-address")
            host, _, port = cfg.nsqd_tcp_address.rpartition(":")
            addr = (host, int(port))
            base = f"http://{cfg.nsqd_http_address}"
        else:
            server = OwnServer(20.0)
            addr = server.start()
            assert server.http_address is not None
            base = f"http://{server.http_address[0]}:{server.http_address[1]}"
            cfg.server_pids = (server.pid,) if server.pid else ()
        topics = make_topics(cfg, addr, base)
        report = run_loop(run(cfg, topics))
    except BenchError as err:
        print(f"bench failed: {err}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(report, indent=1) if a.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
