"""Shared by the compat drivers: arguments, the scenarios' bookkeeping, deadlines, the summary.

Nothing here imports a client library: each driver talks to nsqd with its own library, and
only feeds what it sees (bodies, attempts, responses) into these trackers. The trackers
decide what the handler should do next and build the JSON summary the tests assert on.

Usage of every driver: ``<driver>.py HOST:PORT TOPIC PHASE`` with PHASE one of
``pubsub``, ``requeue``, ``touch``. Exit status 0 means the scenario ran to its end (the
test then judges the summary); 2 means it could not (a timeout, a refused publish, a lost
connection), with the reason on stderr and the partial summary on stdout.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("pubsub", "requeue", "touch")

# One step (connect, an acknowledgement, a wait for deliveries) may take this long.
STEP_TIMEOUT = 10.0
# Whole-process watchdog: dumps every thread's stack and exits 1 if a driver hangs anyway.
WATCHDOG_TIMEOUT = 40.0

CHANNEL = "compat"
MAX_IN_FLIGHT = 8

# msg_timeout negotiated via IDENTIFY where the library allows it: NSQ's minimum, 1 s.
MSG_TIMEOUT_MS = 1000
# The touched message is held this long (2.5 x msg_timeout), touched this often.
TOUCH_HOLD_S = 2.5
TOUCH_EVERY_S = 0.3


class DriverError(Exception):
    """The scenario could not run to its end."""


@dataclass
class Args:
    address: str
    host: str
    port: int
    topic: str
    phase: str
    #: CA file to verify nsqd with; when set, the client asks for TLS (tls_v1)
    tls_ca: str = ""
    #: "snappy" or "deflate": the compression the client asks for
    compression: str = ""


def parse_args(client: str) -> Args:
    parser = argparse.ArgumentParser(prog=f"{client}_driver")
    parser.add_argument("address", help="nsqd TCP address, host:port")
    parser.add_argument("topic")
    parser.add_argument("phase", choices=PHASES)
    parser.add_argument("--tls-ca", default="", help="negotiate TLS, verifying with this CA")
    parser.add_argument("--compression", default="", choices=["", "snappy", "deflate"])
    ns = parser.parse_args()
    host, _, port = ns.address.rpartition(":")
    return Args(ns.address, host, int(port), ns.topic, ns.phase, ns.tls_ca, ns.compression)


# Errors the library reported (error frames, logged errors) while the scenario ran, and
# those seen after teardown() - closing connections makes some libraries log errors.
ERRORS: list[str] = []
TEARDOWN_ERRORS: list[str] = []
_sink = ERRORS


def error(text: str) -> None:
    """Record an error the library reported (an error frame, a failed callback...)."""
    _sink.append(text)


def teardown() -> None:
    """The scenario is over: errors from now on are not its own (pynsq, for one, logs
    IntegrityError('failed to unpack size') for the read pending when we close it)."""
    global _sink
    _sink = TEARDOWN_ERRORS


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        error(f"{record.name}: {record.getMessage()}")


def setup(client: str) -> tuple[Args, dict[str, Any]]:
    """Parse argv, arm the watchdog, collect every ERROR the library logs into the summary."""
    args = parse_args(client)
    faulthandler.dump_traceback_later(WATCHDOG_TIMEOUT, exit=True)
    summary: dict[str, Any] = {"client": client, "phase": args.phase}
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    stream = logging.StreamHandler(sys.stderr)
    stream.setLevel(logging.WARNING)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(stream)
    root.addHandler(_Collect())
    return args, summary


def emit(summary: dict[str, Any]) -> None:
    """Print the summary (live trackers replaced by their own summaries) as one JSON line."""
    for key in ("tally", "scenario"):
        tracker = summary.pop(key, None)
        if tracker is not None:
            summary.update(tracker.summary())
    summary["errors"] = ERRORS
    summary["teardown_errors"] = TEARDOWN_ERRORS
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    sys.stdout.flush()


def fail(client: str, summary: dict[str, Any], exc: BaseException) -> None:
    """Report a scenario that could not finish and exit 2."""
    summary["failed"] = f"{type(exc).__name__}: {exc}"
    emit(summary)
    print(f"{client} driver: {summary['phase']}: {summary['failed']}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(2)


def show(body: bytes) -> str:
    """A body as JSON-safe text (latin-1 maps every byte to one code point)."""
    text = body.decode("latin-1")
    return text if len(text) <= 40 else f"{text[:32]}...({len(body)} bytes)"


def text(what: str | Callable[[], str]) -> str:
    """A wait's description, computed when the wait fails (so it shows progress)."""
    return what() if callable(what) else what


def check_ack(what: str, response: str) -> None:
    if response != "OK":
        raise DriverError(f"{what} was not acknowledged with OK: {response!r}")


# --------------------------------------------------------------------------- pubsub


def _body(tag: str, i: int, size: int = 0) -> bytes:
    # binary on purpose: NUL, 0xff, CR/LF and a length prefix-like run inside the body
    head = f"{tag}-{i:03d}|".encode() + b"\x00\xff\r\n\x00\x00\x00\x05"
    return head + bytes((i * 31 + k) % 256 for k in range(size))


@dataclass
class PublishPlan:
    """What the pubsub phase publishes: PUB singles, MPUB batches, DPUB deferred."""

    pub: list[bytes] = field(
        default_factory=lambda: (
            [_body("pub", i, 10 * i) for i in range(4)] + [_body("pub-big", 4, 256 * 1024)]
        )
    )
    mpub: list[list[bytes]] = field(
        default_factory=lambda: [
            [_body("mpub-a", i, i) for i in range(10)],
            # a 2-message batch: ansq would frame a 1-message MPUB as a bare PUB body
            [_body("mpub-b", 0, 64 * 1024), _body("mpub-b", 1)],
        ]
    )
    dpub: list[tuple[bytes, int]] = field(
        default_factory=lambda: [(_body("dpub", 0), 50), (_body("dpub", 1), 150)]
    )

    def all_bodies(self) -> list[bytes]:
        out = list(self.pub)
        for batch in self.mpub:
            out.extend(batch)
        out.extend(body for body, _ in self.dpub)
        return out


class Tally:
    """Deliveries of the pubsub phase: every published body exactly once, attempts 1."""

    def __init__(self, plan: PublishPlan) -> None:
        self.plan = plan
        self.expected = plan.all_bodies()
        self.expected_set = set(self.expected)
        self.count: dict[bytes, int] = defaultdict(int)
        self.attempts: set[int] = set()
        self.unexpected: list[bytes] = []
        self.acks: dict[str, list[str]] = {"pub": [], "mpub": [], "dpub": []}
        self.dpub_acked_at: dict[bytes, float] = {}
        self.dpub_latency_ms: dict[str, float] = {}

    def acked(self, kind: str, response: str, dpub_body: bytes | None = None) -> None:
        self.acks[kind].append(response)
        if dpub_body is not None:
            self.dpub_acked_at[dpub_body] = time.monotonic()
        check_ack(kind.upper(), response)

    def record(self, body: bytes, attempts: int) -> None:
        self.count[body] += 1
        self.attempts.add(attempts)
        if body not in self.expected_set:
            self.unexpected.append(body)
        if body in self.dpub_acked_at and self.count[body] == 1:
            ms = (time.monotonic() - self.dpub_acked_at[body]) * 1000
            self.dpub_latency_ms[show(body)] = round(ms, 1)

    @property
    def complete(self) -> bool:
        return all(self.count[b] for b in self.expected)

    def progress(self) -> str:
        got = sum(1 for b in self.expected if self.count[b])
        return f"{got}/{len(self.expected)} bodies received"

    def summary(self) -> dict[str, Any]:
        return {
            "acks": self.acks,
            "expected": len(self.expected),
            "received": sum(1 for b in self.expected if self.count[b]),
            "deliveries": sum(self.count.values()),
            "missing": [show(b) for b in self.expected if not self.count[b]],
            "duplicates": [show(b) for b, n in self.count.items() if n > 1],
            "unexpected": [show(b) for b in self.unexpected],
            "attempts": sorted(self.attempts),
            "dpub_delay_ms": {show(b): d for b, d in self.plan.dpub},
            "dpub_latency_ms": self.dpub_latency_ms,
        }


# --------------------------------------------------------------------------- requeue

REQUEUE_DELAYS_MS = {b"req-delay-0ms": 0, b"req-delay-100ms": 100}
REQUEUE_SENTINEL = b"req-sentinel"


class RequeueScenario:
    """Each REQUEUE_DELAYS_MS body is requeued once (attempts 1) and FINed on attempts 2.

    The sentinel is published once both are finished: when it has arrived, any stray
    redelivery published before it would have too.
    """

    def __init__(self) -> None:
        self.deliveries: dict[bytes, list[int]] = defaultdict(list)
        self.req_sent_at: dict[bytes, float] = {}
        self.redelivered_after_ms: dict[str, float] = {}
        self.finished: set[bytes] = set()

    def on_message(self, body: bytes, attempts: int) -> int | None:
        """Record a delivery; return the REQ delay (ms) to requeue with, or None to FIN."""
        self.deliveries[body].append(attempts)
        if body in self.req_sent_at and show(body) not in self.redelivered_after_ms:
            ms = (time.monotonic() - self.req_sent_at[body]) * 1000
            self.redelivered_after_ms[show(body)] = round(ms, 1)
        if body in REQUEUE_DELAYS_MS and attempts == 1 and body not in self.req_sent_at:
            self.req_sent_at[body] = time.monotonic()
            return REQUEUE_DELAYS_MS[body]
        self.finished.add(body)
        return None

    @property
    def requeues_done(self) -> bool:
        return all(b in self.finished for b in REQUEUE_DELAYS_MS)

    @property
    def sentinel_seen(self) -> bool:
        return REQUEUE_SENTINEL in self.finished

    def summary(self) -> dict[str, Any]:
        return {
            "deliveries": {show(b): a for b, a in self.deliveries.items()},
            "requeue_delay_ms": {show(b): d for b, d in REQUEUE_DELAYS_MS.items()},
            "redelivered_after_ms": self.redelivered_after_ms,
            "finished": sorted(show(b) for b in self.finished),
        }


# --------------------------------------------------------------------------- touch

TOUCH_BODY = b"touch-me"
CONTROL_BODY = b"timeout-control"
TOUCH_SENTINEL = b"touch-sentinel"


class TouchScenario:
    """TOUCH_BODY is held 2.5 x msg_timeout while touched, then FINed: one delivery.

    CONTROL_BODY is delivered at the same time and never answered: nsqd must time it out
    and redeliver it (attempts 2), which is FINed. It proves the short msg_timeout is in
    force, so that the touched message surviving is due to TOUCH.
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.deliveries: dict[bytes, list[int]] = defaultdict(list)
        self.events: dict[str, float] = {}
        self.touches = 0
        self.finished: set[bytes] = set()

    def _at(self, name: str) -> None:
        self.events.setdefault(name, round(time.monotonic() - self.t0, 3))

    def on_message(self, body: bytes, attempts: int) -> str:
        """Record a delivery; return "hold" (touch it), "ignore" (never answer) or "fin"."""
        self.deliveries[body].append(attempts)
        n = len(self.deliveries[body])
        if body == TOUCH_BODY and n == 1:
            self._at("touch_delivered")
            return "hold"
        if body == CONTROL_BODY and n == 1:
            self._at("control_delivered")
            return "ignore"
        if body == CONTROL_BODY and n == 2:
            self._at("control_redelivered")
        if body == TOUCH_BODY:
            self._at("touch_redelivered")
        return "fin"

    def touched(self) -> None:
        self.touches += 1

    def fin_sent(self, body: bytes) -> None:
        self.finished.add(body)
        if body == TOUCH_BODY:
            self._at("touch_finished")

    @property
    def held_done(self) -> bool:
        return TOUCH_BODY in self.finished and len(self.deliveries[CONTROL_BODY]) >= 2

    @property
    def sentinel_seen(self) -> bool:
        return TOUCH_SENTINEL in self.finished

    def summary(self) -> dict[str, Any]:
        return {
            "deliveries": {show(b): a for b, a in self.deliveries.items()},
            "events_s": self.events,
            "touches": self.touches,
            "hold_s": TOUCH_HOLD_S,
            "msg_timeout_ms": MSG_TIMEOUT_MS,
            "finished": sorted(show(b) for b in self.finished),
        }
