"""The soak: publishers and consumers against one nsqd for a long time, checking that
nothing is lost and that memory stays flat.

    python bench/soak.py --duration 3600 --rate 5000            # the hour-long soak
    python bench/soak.py --duration 600 --rate 2000 --interval 30
    python bench/soak.py --duration 600 --go                     # Go's nsqd 1.3.0, same load

PUBLISHERS connections publish RATE messages/s in all (MPUB batches of BATCH and single
PUBs, some DPUBs), each body naming its publisher and sequence; CONSUMERS connections on
channel "all" FIN everything; on channel "retry" one consumer requeues one message in
ten (REQ 0 or REQ 100 ms) before finishing it. Every INTERVAL seconds a line: nsqd's RSS,
publish and consume rates, depth, in flight. At the end (publishing stops, consumers
drain) the check: every acknowledged message was consumed on both channels, nothing
unknown arrived, and how many were delivered more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_bench import MAGIC, Nsqd, identify, mpub

from nsqx.wire.frames import FRAME_DATA_AT, MSG_ATTEMPTS_AT, MSG_BODY_AT, MSG_ID_AT, MSG_ID_END


def pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body


def dpub(topic: str, ms: int, body: bytes) -> bytes:
    return f"DPUB {topic} {ms}\n".encode() + struct.pack(">i", len(body)) + body


class Publisher(asyncio.Protocol):
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seq = 0
        self.pending: list[list[bytes]] = []  # bodies of each unanswered publish, in order
        self.acked = 0
        self.acked_ids: set[bytes] = set()
        self.buf = b""
        self.errors: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(MAGIC)

    def send(self, n: int, size: int) -> None:
        bodies = []
        for _ in range(n):
            key = b"%03d:%010d" % (self.pid, self.seq)
            self.seq += 1
            bodies.append(key + b":" + b"s" * max(size - len(key) - 1, 0))
        assert self.transport is not None
        kind = random.random()
        if n == 1 and kind < 0.1:
            self.transport.write(dpub("soak", 200, bodies[0]))
        elif n == 1:
            self.transport.write(pub("soak", bodies[0]))
        else:
            self.transport.write(mpub("soak", bodies))
        self.pending.append([b[:14] for b in bodies])

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        while len(buf) - pos >= 8:
            size, ftype = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos - 4 < size:
                break
            payload = buf[pos + FRAME_DATA_AT : pos + 4 + size]
            pos += 4 + size
            if ftype == 0 and payload == b"_heartbeat_":
                assert self.transport is not None
                self.transport.write(b"NOP\n")
                continue
            keys = self.pending.pop(0)
            if ftype == 0 and payload == b"OK":
                self.acked += len(keys)
                self.acked_ids.update(keys)
            else:
                self.errors.append(payload)
        self.buf = buf[pos:]


class Consumer(asyncio.Protocol):
    def __init__(self, channel: str, requeue: bool) -> None:
        self.channel = channel
        self.requeue = requeue
        self.buf = b""
        self.seen: dict[bytes, int] = {}
        self.deliveries = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(
            MAGIC
            + identify(heartbeat_interval=5000, msg_timeout=10000)
            + f"SUB soak {self.channel}\nRDY 500\n".encode()
        )

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
            if ftype == 0 and payload == b"_heartbeat_":
                out.append(b"NOP\n")
            elif ftype == 2:
                mid, body = payload[MSG_ID_AT:MSG_ID_END], payload[MSG_BODY_AT:]
                attempts = struct.unpack_from(">H", payload, MSG_ATTEMPTS_AT)[0]
                self.deliveries += 1
                if self.requeue and attempts == 1 and random.random() < 0.1:
                    out.append(b"REQ " + mid + (b" 0\n" if random.random() < 0.5 else b" 100\n"))
                    continue
                key = body[:14]
                self.seen[key] = self.seen.get(key, 0) + 1
                out.append(b"FIN " + mid + b"\n")
        self.buf = buf[pos:]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def soak(args: argparse.Namespace) -> dict[str, object]:
    nsqd = Nsqd(args.go, "--mem-queue-size=10000", "--max-bytes-per-file=67108864")
    loop = asyncio.get_running_loop()
    try:
        pubs = []
        for i in range(args.publishers):
            _, p = await loop.create_connection(lambda i=i: Publisher(i), "127.0.0.1", nsqd.tcp)
            pubs.append(p)
        cons = []
        for _ in range(args.consumers):
            _, c = await loop.create_connection(
                lambda: Consumer("all", False), "127.0.0.1", nsqd.tcp
            )
            cons.append(c)
        _, retry = await loop.create_connection(
            lambda: Consumer("retry", True), "127.0.0.1", nsqd.tcp
        )
        # both channels exist before the first publish (a new channel starts at the end)
        for _ in range(100):
            names = {ch["channel_name"] for t in nsqd.stats()["topics"] for ch in t["channels"]}
            if {"all", "retry"} <= names:
                break
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        next_sample = t0
        last = (t0, 0, 0)
        samples = []
        tick = 0.02
        owed = 0.0
        print(
            "| t (s) | RSS (MB) | published/s | consumed/s | depth all | depth retry | in flight |"
        )
        print("|---|---|---|---|---|---|---|", flush=True)
        while time.monotonic() - t0 < args.duration:
            owed += args.rate * tick
            while owed >= 1:
                p = random.choice(pubs)
                n = min(int(owed), args.batch) if random.random() < 0.7 else 1
                p.send(n, args.size)
                owed -= n
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now >= next_sample:
                next_sample += args.interval
                acked = sum(p.acked for p in pubs)
                consumed = sum(len(c.seen) for c in cons)
                stats = nsqd.stats()
                depth = {ch["channel_name"]: ch for t in stats["topics"] for ch in t["channels"]}
                rate_p = (acked - last[1]) / max(now - last[0], 1e-9)
                rate_c = (consumed - last[2]) / max(now - last[0], 1e-9)
                last = (now, acked, consumed)
                row = {
                    "t": round(now - t0),
                    "rss_mb": round(nsqd.rss(), 1),
                    "published_per_s": round(rate_p),
                    "consumed_per_s": round(rate_c),
                    "depth_all": depth.get("all", {}).get("depth", 0),
                    "depth_retry": depth.get("retry", {}).get("depth", 0),
                    "in_flight": sum(ch.get("in_flight_count", 0) for ch in depth.values()),
                }
                samples.append(row)
                print(
                    f"| {row['t']} | {row['rss_mb']} | {row['published_per_s']} | "
                    f"{row['consumed_per_s']} | {row['depth_all']} | {row['depth_retry']} | "
                    f"{row['in_flight']} |",
                    flush=True,
                )
        # drain: every acknowledged message must arrive on both channels
        for _ in range(600):
            if all(not p.pending for p in pubs):
                break
            await asyncio.sleep(0.1)
        acked_ids = set().union(*(p.acked_ids for p in pubs))
        deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < deadline:
            seen_all = set().union(*(c.seen for c in cons))
            if acked_ids <= seen_all and acked_ids <= set(retry.seen):
                break
            await asyncio.sleep(0.5)
        seen_all = {}
        for c in cons:
            for k, v in c.seen.items():
                seen_all[k] = seen_all.get(k, 0) + v
        rss = [s["rss_mb"] for s in samples]
        end_stats = {
            ch["channel_name"]: {
                k: ch.get(k)
                for k in (
                    "depth",
                    "in_flight_count",
                    "deferred_count",
                    "requeue_count",
                    "timeout_count",
                )
            }
            for t in nsqd.stats()["topics"]
            for ch in t["channels"]
        }
        summary = {
            "server": "go nsqd 1.3.0" if args.go else "nsqx",
            "duration_s": args.duration,
            "target_rate": args.rate,
            "published_acked": len(acked_ids),
            "publish_errors": sum(len(p.errors) for p in pubs),
            "lost_on_all": len(acked_ids - set(seen_all)),
            "lost_on_retry": len(acked_ids - set(retry.seen)),
            "unknown_arrived": len(set(seen_all) - acked_ids),
            "finished_twice_on_all": sum(1 for v in seen_all.values() if v > 1),
            "retry_deliveries": retry.deliveries,
            "rss_mb_first_last_max": [rss[0], rss[-1], max(rss)] if rss else [],
            "channels_at_end": end_stats,
        }
        print(json.dumps(summary, indent=1), flush=True)
        return summary
    finally:
        nsqd.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--rate", type=int, default=5000, help="messages/s, all publishers")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--interval", type=float, default=60)
    ap.add_argument("--go", action="store_true")
    ap.add_argument("--drain-timeout", type=float, default=300)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    summary = asyncio.run(soak(args))
    ok = not (summary["lost_on_all"] or summary["lost_on_retry"] or summary["unknown_arrived"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
