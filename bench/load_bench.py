"""Load: many connections, a consumer that never reads, a publisher flood.

    python bench/load_bench.py connections --n 10000 --active 20 --seconds 20
    python bench/load_bench.py connections --n 10000 --go      # Go's nsqd 1.3.0, the same load
    python bench/load_bench.py slow-consumer --messages 200000 --size 1024
    python bench/load_bench.py flood --megabytes 500

connections: N idle consumers (IDENTIFY with a heartbeat interval, SUB to one of 100
channels, RDY 0) that answer every heartbeat, plus ACTIVE publisher/consumer pairs moving
messages; after SECONDS, how many connections nsqd still has, the heartbeats each idle
one got, the messages moved, and nsqd's RSS before and after (so RSS per connection).

slow-consumer: one consumer with RDY 500 that never reads beside a normal one, while
MESSAGES are published: nsqd's RSS over time, when it drops the slow one, and whether
the normal one got every message.

flood: a publisher sends MPUBs as fast as its socket takes them and never reads the
answers: how far it gets before nsqd stops reading it (backpressure), nsqd's RSS; then
it reads every answer.

nsqd is started with its defaults on a temporary data directory (ours, or Go's with --go
when ../shared/reference/go-nsq-1.3.0 exists). The open-files limit is raised to its
hard limit first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from nsqx.wire.frames import FRAME_DATA_AT, MSG_BODY_AT, MSG_ID_AT, MSG_ID_END

MAGIC = b"  V2"
GO_NSQD = Path(__file__).resolve().parents[1].parent / "shared/reference/go-nsq-1.3.0/nsqd"
HEARTBEAT = b"_heartbeat_"


def raise_nofile() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    assert m is not None
    return int(m.group(1)) / 1024


class Nsqd:
    """nsqd (ours or Go's) as a process on free loopback ports."""

    def __init__(self, go: bool, *flags: str) -> None:
        self.data = tempfile.mkdtemp(prefix="nsqx-load-")
        cmd = [str(GO_NSQD)] if go else [sys.executable, "-m", "nsqx", "nsqd"]
        cmd += [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=",
            f"--data-path={self.data}",
            *flags,
        ]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.tcp = self.http = 0
        self.log: list[str] = []
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"(TCP|HTTP): listening on [\d.]+:(\d+)", line)
            if m:
                if m.group(1) == "TCP":
                    self.tcp = int(m.group(2))
                else:
                    self.http = int(m.group(2))
            if self.tcp and self.http:
                break
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stats(self) -> Any:
        url = f"http://127.0.0.1:{self.http}/stats?format=json"
        with urllib.request.urlopen(url, timeout=60) as resp:
            doc = json.loads(resp.read())
        return doc.get("data", doc)  # Go 1.3 answers the object itself

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.data, ignore_errors=True)


def frame_cmds(*cmds: bytes) -> bytes:
    return b"".join(cmds)


def identify(**fields: Any) -> bytes:
    body = json.dumps(fields).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">i", len(bodies)) + b"".join(
        struct.pack(">i", len(b)) + b for b in bodies
    )
    return f"MPUB {topic}\n".encode() + struct.pack(">i", len(payload)) + payload


class Conn(asyncio.Protocol):
    """A consumer connection: answers heartbeats, FINs messages if ``fin``."""

    def __init__(self, setup: bytes, fin: bool = False) -> None:
        self.setup = setup
        self.fin = fin
        self.buf = b""
        self.heartbeats = 0
        self.oks = 0
        self.messages = 0
        self.bodies: list[bytes] = []
        self.keep_bodies = False
        self.closed = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(MAGIC + self.setup)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        out = []
        while len(buf) - pos >= 8:
            size, ftype = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos - 4 < size:
                break
            payload = buf[pos + FRAME_DATA_AT : pos + 4 + size]
            pos += 4 + size
            if ftype == 0 and payload == b"OK":
                self.oks += 1
            elif ftype == 0 and payload == HEARTBEAT:
                self.heartbeats += 1
                out.append(b"NOP\n")
            elif ftype == 2:
                self.messages += 1
                if self.keep_bodies:
                    self.bodies.append(payload[MSG_BODY_AT:])
                if self.fin:
                    out.append(b"FIN " + payload[MSG_ID_AT:MSG_ID_END] + b"\n")
        self.buf = buf[pos:]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def connections(args: argparse.Namespace) -> None:
    nofile = raise_nofile()
    nsqd = Nsqd(args.go, f"--max-rdy-count={max(2500, args.n)}")
    loop = asyncio.get_running_loop()
    try:
        rss0 = nsqd.rss()
        idle: list[Conn] = []
        started = time.monotonic()
        hb = args.heartbeat_ms
        for i in range(args.n):
            setup = identify(heartbeat_interval=hb, client_id=f"idle{i}") + (
                f"SUB load idle{i % 100}\nRDY 0\n".encode()
            )
            _, proto = await loop.create_connection(lambda s=setup: Conn(s), "127.0.0.1", nsqd.tcp)
            idle.append(proto)
        connect_s = time.monotonic() - started
        active: list[tuple[Conn, asyncio.Transport]] = []
        for i in range(args.active):
            setup = identify(heartbeat_interval=hb) + f"SUB work c{i}\nRDY 200\n".encode()
            _, sub = await loop.create_connection(
                lambda s=setup: Conn(s, fin=True), "127.0.0.1", nsqd.tcp
            )
            tr, _ = await loop.create_connection(lambda: Conn(b""), "127.0.0.1", nsqd.tcp)
            active.append((sub, tr))
        rss_connected = nsqd.rss()
        t0 = time.monotonic()
        published = 0
        batch = [b"x" * 100] * 50
        while time.monotonic() - t0 < args.seconds:
            for _, tr in active:
                tr.write(mpub("work", batch))
                published += len(batch)
            await asyncio.sleep(0.05)
        moved = sum(s.messages for s, _ in active)
        rss_end = nsqd.rss()
        stats = nsqd.stats()
        clients = sum(len(ch.get("clients") or []) for t in stats["topics"] for ch in t["channels"])
        beats = sorted(c.heartbeats for c in idle)
        lost = sum(1 for c in idle if c.closed.done())
        print(
            json.dumps(
                {
                    "server": "go nsqd 1.3.0" if args.go else "nsqx",
                    "nofile": nofile,
                    "idle_connections": args.n,
                    "active_pairs": args.active,
                    "connect_seconds": round(connect_s, 1),
                    "seconds": args.seconds,
                    "heartbeat_ms": hb,
                    "subscribed_clients_in_stats": clients,
                    "idle_closed": lost,
                    "heartbeats_per_idle_min_median_max": [
                        beats[0],
                        beats[len(beats) // 2],
                        beats[-1],
                    ],
                    "published": published,
                    "consumed_per_channel": moved // max(args.active, 1),
                    "rss_mb_before": round(rss0, 1),
                    "rss_mb_connected": round(rss_connected, 1),
                    "rss_mb_end": round(rss_end, 1),
                    "rss_kb_per_connection": round((rss_connected - rss0) * 1024 / args.n, 1),
                },
                indent=1,
            )
        )
        for c in idle:
            if c.transport is not None:
                c.transport.close()
    finally:
        nsqd.stop()


async def slow_consumer(args: argparse.Namespace) -> None:
    nsqd = Nsqd(args.go)
    loop = asyncio.get_running_loop()
    try:
        hb = 1000
        setup = identify(heartbeat_interval=hb) + b"SUB t c\nRDY 500\n"
        # the slow one: a small receive buffer, and it never reads (nor answers heartbeats)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", nsqd.tcp))
        sock.sendall(MAGIC + setup)
        _, good = await loop.create_connection(lambda: Conn(setup, fin=True), "127.0.0.1", nsqd.tcp)
        good.keep_bodies = True
        pub_tr, _ = await loop.create_connection(lambda: Conn(b""), "127.0.0.1", nsqd.tcp)
        rss0 = nsqd.rss()
        body = b"y" * args.size
        sent = 0
        samples = []
        t0 = time.monotonic()
        dropped_at = None

        def clients() -> int:
            for t in nsqd.stats()["topics"]:
                for ch in t["channels"]:
                    return len(ch.get("clients") or [])
            return 0

        def note() -> None:
            nonlocal dropped_at
            samples.append((round(time.monotonic() - t0, 1), round(nsqd.rss(), 1)))
            if dropped_at is None and clients() < 2:
                dropped_at = round(time.monotonic() - t0, 1)

        got_before_drop = 0
        while sent < args.messages:
            n = min(100, args.messages - sent)
            pub_tr.write(mpub("t", [b"%09d" % (sent + k) + body[9:] for k in range(n)]))
            sent += n
            await asyncio.sleep(0.002)
            if sent % 10000 == 0:
                note()
                if dropped_at is None:
                    got_before_drop = good.messages
        deadline = time.monotonic() + 120
        while (good.messages < args.messages or dropped_at is None) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            note()
            if dropped_at is None:
                got_before_drop = good.messages
        sock.close()
        got = {b[:9] for b in good.bodies}
        print(
            json.dumps(
                {
                    "server": "go nsqd 1.3.0" if args.go else "nsqx",
                    "messages": args.messages,
                    "size": args.size,
                    "slow_consumer_dropped_after_s": dropped_at,
                    "good_consumer_got_while_slow_connected": got_before_drop,
                    "good_consumer_got_distinct": len(got),
                    "good_consumer_deliveries": good.messages,
                    "rss_mb_before": round(rss0, 1),
                    "rss_mb_samples_(s,mb)": " ".join(
                        f"{t}s:{m}" for t, m in samples[:: max(len(samples) // 12, 1)]
                    ),
                    "rss_mb_peak": max(m for _, m in samples),
                    "seconds_until_good_consumer_had_all": samples[-1][0],
                    "rss_mb_end": round(nsqd.rss(), 1),
                },
                indent=1,
            )
        )
    finally:
        nsqd.stop()


async def flood(args: argparse.Namespace) -> None:
    nsqd = Nsqd(args.go)
    loop = asyncio.get_running_loop()
    try:
        tr, proto = await loop.create_connection(lambda: Conn(b""), "127.0.0.1", nsqd.tcp)
        tr.pause_reading()  # never read the answers (yet)
        rss0 = nsqd.rss()
        if args.single:
            # PUBs of 100 bytes: 10 bytes of answer each, which the publisher leaves unread
            batch = b"".join(
                b"PUB flood\n" + struct.pack(">i", 100) + b"z" * 100 for _ in range(100)
            )
        else:
            batch = mpub("flood", [b"z" * 1000] * 100)
        sent = 0
        blocked = 0.0
        peak = rss0
        t0 = time.monotonic()
        limit = args.megabytes * 1024 * 1024
        while sent * len(batch) < limit:
            tr.write(batch)
            sent += 1
            if tr.get_write_buffer_size() > 4 * 1024 * 1024:
                # nsqd no longer takes our bytes as fast as we make them: wait
                w0 = time.monotonic()
                while tr.get_write_buffer_size() > 1024 * 1024:
                    await asyncio.sleep(0.01)
                    if time.monotonic() - w0 > 5:
                        break
                blocked += time.monotonic() - w0
                peak = max(peak, nsqd.rss())
                if time.monotonic() - w0 > 5:
                    break  # nsqd stopped reading us: backpressure held
        flood_s = time.monotonic() - t0
        peak = max(peak, nsqd.rss())
        # now read the answers: every publish nsqd took is answered OK
        per_write = 100 if args.single else 1
        tr.resume_reading()
        deadline = time.monotonic() + 120
        while proto.oks < sent * per_write and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        oks = proto.oks
        published = sum(t["message_count"] for t in nsqd.stats()["topics"])
        print(
            json.dumps(
                {
                    "server": "go nsqd 1.3.0" if args.go else "nsqx",
                    "mpubs_written": sent,
                    "megabytes_written": round(sent * len(batch) / 2**20, 1),
                    "seconds": round(flood_s, 1),
                    "seconds_waiting_for_nsqd": round(blocked, 1),
                    "stalled_more_than_5s": flood_s > 0 and blocked > 5,
                    "rss_mb_before": round(rss0, 1),
                    "rss_mb_peak": round(peak, 1),
                    "publishes_sent": sent * per_write,
                    "answered_ok": oks,
                    "messages_in_nsqd": published,
                },
                indent=1,
            )
        )
    finally:
        nsqd.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("connections")
    c.add_argument("--n", type=int, default=10000)
    c.add_argument("--active", type=int, default=20)
    c.add_argument("--seconds", type=float, default=20)
    c.add_argument("--heartbeat-ms", type=int, default=2000)
    s = sub.add_parser("slow-consumer")
    s.add_argument("--messages", type=int, default=200000)
    s.add_argument("--size", type=int, default=1024)
    f = sub.add_parser("flood")
    f.add_argument("--megabytes", type=int, default=500)
    f.add_argument("--single", action="store_true", help="PUBs of 100 bytes, not MPUBs")
    for p in (c, s, f):
        p.add_argument("--go", action="store_true", help="Go's nsqd 1.3.0 instead of nsqx")
    args = ap.parse_args()
    if getattr(args, "go", False) and not GO_NSQD.exists():
        sys.exit(f"no Go nsqd at {GO_NSQD}")
    run = {"connections": connections, "slow-consumer": slow_consumer, "flood": flood}[args.cmd]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
