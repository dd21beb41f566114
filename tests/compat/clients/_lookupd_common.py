"""Shared by the lookupd-discovery drivers: ``<client>_lookupd_driver.py LOOKUPD_HTTP TOPIC
N PREFIX...``.

The test published N messages ``<PREFIX>-<i>`` to each nsqd (one PREFIX per nsqd) before
starting the driver; the driver knows no nsqd address, only nsqlookupd's HTTP address,
and must find every nsqd through ``/lookup`` and receive every message exactly once.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import _common as c

CHANNEL = "discovery"
PHASE = "lookupd"
# pynsq wants an int; one poll a second finds a late registration quickly
POLL_INTERVAL = 1


@dataclass
class Args:
    lookupd_http: str
    topic: str
    count: int
    prefixes: list[str]


class Expected:
    """Which bodies must arrive; what arrived, how often, with which attempts."""

    def __init__(self, args: Args) -> None:
        self.want = {f"{p}-{i}".encode() for p in args.prefixes for i in range(args.count)}
        self.got: Counter[bytes] = Counter()
        self.attempts: set[int] = set()

    def record(self, body: bytes, attempts: int) -> None:
        self.got[body] += 1
        self.attempts.add(attempts)

    @property
    def complete(self) -> bool:
        return self.want <= set(self.got)

    def progress(self) -> str:
        return f"{len(set(self.got) & self.want)}/{len(self.want)} received"

    def summary(self) -> dict[str, Any]:
        return {
            "expected": len(self.want),
            "received": sum(self.got.values()),
            "missing": sorted(c.show(b) for b in self.want - set(self.got)),
            "unexpected": sorted(c.show(b) for b in set(self.got) - self.want),
            "duplicates": sorted(c.show(b) for b, n in self.got.items() if n > 1),
            "attempts": sorted(self.attempts),
        }


def setup(client: str) -> tuple[Args, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog=f"{client}_lookupd_driver")
    parser.add_argument("lookupd_http", help="nsqlookupd HTTP address, host:port")
    parser.add_argument("topic")
    parser.add_argument("count", type=int)
    parser.add_argument("prefixes", nargs="+")
    ns = parser.parse_args()
    faulthandler.dump_traceback_later(c.WATCHDOG_TIMEOUT, exit=True)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(stream)
    root.addHandler(c._Collect())
    args = Args(ns.lookupd_http, ns.topic, ns.count, ns.prefixes)
    return args, {"client": client, "phase": PHASE}
