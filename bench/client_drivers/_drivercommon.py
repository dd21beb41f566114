"""Shared by every client driver: bodies, checks, timing and the JSON result line.

Standard library only: drivers run in venvs that hold nothing but one client library.
A driver is ``<client>_driver.py MODE HOST:PORT TOPIC COUNT SIZE MAX_IN_FLIGHT BATCH``
with MODE pub (PUB round trips), mpub (MPUB round trips of BATCH) or sub (consume COUNT
messages published beforehand, FIN each); it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CHANNEL = "bench"
#: a driver that is still running after this many seconds kills itself
WATCHDOG_SECONDS = float(os.environ.get("BENCH_DRIVER_TIMEOUT", "300"))


def filler(size: int) -> bytes:
    return (b"nsqx client benchmark " * (size // 20 + 2))[: max(size - 8, 0)]


def make_body(i: int, size: int, fill: bytes) -> bytes:
    """Message ``i``: an 8-digit index then a fixed filler (checked by consumers)."""
    return b"%08d" % i + fill


@dataclass
class Args:
    mode: str
    address: str
    topic: str
    count: int
    size: int
    max_in_flight: int
    batch: int

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def bodies(self) -> list[bytes]:
        fill = filler(self.size)
        return [make_body(i, self.size, fill) for i in range(self.count)]

    def batches(self) -> list[list[bytes]]:
        bodies = self.bodies()
        return [bodies[i : i + self.batch] for i in range(0, len(bodies), self.batch)]


def parse_args() -> Args:
    a = sys.argv[1:]
    if len(a) != 7:
        sys.exit(f"usage: {sys.argv[0]} MODE HOST:PORT TOPIC COUNT SIZE MAX_IN_FLIGHT BATCH")
    return Args(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]))


@dataclass
class Checker:
    """Checks every consumed body: size, filler, index in range; counts duplicates."""

    count: int
    size: int
    fill: bytes = b""
    seen: bytearray = field(default_factory=bytearray)
    distinct: int = 0
    received: int = 0
    bad: int = 0
    dups: int = 0

    def __post_init__(self) -> None:
        self.fill = filler(self.size)
        self.seen = bytearray(self.count)

    def check(self, body: bytes) -> bool:
        """True once every message was seen."""
        self.received += 1
        if len(body) != self.size or body[8:] != self.fill:
            self.bad += 1
            return False
        i = int(body[:8])
        if i >= self.count:
            self.bad += 1
        elif self.seen[i]:
            self.dups += 1
        else:
            self.seen[i] = 1
            self.distinct += 1
        return self.distinct == self.count


class Timer:
    def __init__(self) -> None:
        self.t0 = self.c0 = 0.0
        self.seconds = self.cpu = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0


def watchdog() -> None:
    def fire() -> None:
        print(json.dumps({"error": f"driver still running after {WATCHDOG_SECONDS}s"}), flush=True)
        os._exit(3)

    t = threading.Timer(WATCHDOG_SECONDS, fire)
    t.daemon = True
    t.start()


def report(client: str, args: Args, timer: Timer, **extra: Any) -> None:
    out = {
        "client": client,
        "mode": args.mode,
        "count": args.count,
        "seconds": timer.seconds,
        "cpu": timer.cpu,
        **extra,
    }
    print(json.dumps(out), flush=True)


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    os._exit(2)
