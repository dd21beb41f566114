"""Run a peer client's driver (tests/compat/clients/<client>_driver.py) against our nsqd.

Each driver runs in its own interpreter (``sys.executable``) so that gevent's hub and
Tornado's IOLoop never touch pytest's process. A driver prints one JSON summary line on
stdout; the checks below say what every client must have seen.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lookupdproc import wait_until

CLIENTS_DIR = Path(__file__).parent / "clients"
# Upper bound for one driver process; the drivers bound every step themselves (10 s) and
# have a 40 s watchdog, so this only catches a driver that cannot even do that.
DRIVER_TIMEOUT = 60.0


class Compat:
    """Runs drivers and checks their summaries; failures show the summary and nsqd's log."""

    def __init__(self) -> None:
        self.context = ""

    def run(self, client: str, nsqd: Any, phase: str) -> dict[str, Any]:
        host, port = nsqd.tcp_address
        topic = f"compat_{client}_{phase}"
        cmd = [sys.executable, str(CLIENTS_DIR / f"{client}_driver.py"), f"{host}:{port}"]
        cmd += [topic, phase]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=DRIVER_TIMEOUT, env=env
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"{client} driver ({phase}) still running after {DRIVER_TIMEOUT}s\n"
                + self._tails(exc.stdout, exc.stderr, nsqd)
            )
        self.context = self._tails(proc.stdout, proc.stderr, nsqd)
        if proc.returncode != 0:
            pytest.fail(f"{client} driver ({phase}) exited with {proc.returncode}\n" + self.context)
        lines = proc.stdout.strip().splitlines()
        assert lines, f"{client} driver printed no summary\n{self.context}"
        summary: dict[str, Any] = json.loads(lines[-1])
        assert summary["client"] == client and summary["phase"] == phase
        return summary

    @staticmethod
    def _tails(stdout: Any, stderr: Any, nsqd: Any) -> str:
        def text(data: Any) -> str:
            if isinstance(data, bytes):
                return data.decode(errors="replace")
            return data or ""

        return (
            f"--- driver stdout (tail)\n{text(stdout)[-3000:]}\n"
            f"--- driver stderr (tail)\n{text(stderr)[-3000:]}\n"
            f"--- nsqd log (tail)\n{''.join(nsqd.log[-30:])}"
        )

    def fail_unless(self, ok: bool, what: str, summary: dict[str, Any]) -> None:
        if not ok:
            pytest.fail(f"{what}\nsummary: {json.dumps(summary, indent=1)}\n{self.context}")

    def check_healthy(self, s: dict[str, Any]) -> None:
        """No error frame, no error logged by the library, the consumer still connected."""
        self.fail_unless(s["errors"] == [], f"errors seen by the client: {s['errors']}", s)
        self.fail_unless(s["consumer_connected"] is True, "consumer lost its connection", s)

    def check_pubsub(self, s: dict[str, Any]) -> None:
        """PUB x5, MPUB x2 (12 bodies), DPUB x2 all answered OK; each body delivered once
        with attempts 1, binary-exact (NUL, 0xff, CR/LF, 64 KiB and 256 KiB bodies)."""
        expected_acks = {"pub": ["OK"] * 5, "mpub": ["OK"] * 2, "dpub": ["OK"] * 2}
        self.fail_unless(s["acks"] == expected_acks, f"publish responses: {s['acks']}", s)
        self.fail_unless(s["expected"] == 19, "the publish plan changed", s)
        self.fail_unless(not s["missing"], f"never delivered: {s['missing']}", s)
        self.fail_unless(not s["unexpected"], f"bodies nobody sent: {s['unexpected']}", s)
        self.fail_unless(not s["duplicates"], f"delivered twice: {s['duplicates']}", s)
        self.fail_unless(s["received"] == s["deliveries"] == 19, "delivery count", s)
        self.fail_unless(s["attempts"] == [1], f"attempts seen: {s['attempts']}", s)
        for body, delay in s["dpub_delay_ms"].items():
            # DPUB's delay runs from nsqd's receipt, which follows the client's send
            latency = s["dpub_latency_ms"].get(body)
            self.fail_unless(
                latency is not None and latency >= delay * 0.95,
                f"DPUB {body!r} (delay {delay} ms) delivered after {latency} ms",
                s,
            )
        self.check_healthy(s)

    def check_requeue(self, s: dict[str, Any]) -> None:
        """REQ with 0 ms and 100 ms: each message comes back once with attempts 2 (not
        before its delay), is FINed, and nothing is delivered again afterwards."""
        for body, delay in s["requeue_delay_ms"].items():
            self.fail_unless(
                s["deliveries"].get(body) == [1, 2],
                f"{body!r}: attempts per delivery {s['deliveries'].get(body)}, want [1, 2]",
                s,
            )
            after = s["redelivered_after_ms"][body]
            self.fail_unless(
                after >= delay * 0.95,
                f"{body!r} requeued with {delay} ms came back after {after} ms",
                s,
            )
        self.fail_unless(s["deliveries"].get("req-sentinel") == [1], "sentinel", s)
        self.fail_unless(
            sorted(s["finished"]) == sorted([*s["requeue_delay_ms"], "req-sentinel"]),
            f"FINed: {s['finished']}",
            s,
        )
        self.check_healthy(s)

    def check_touch(self, s: dict[str, Any], negotiated: bool) -> None:
        """With msg_timeout 1 s, a message touched every 0.3 s and held 2.5 s is FINed and
        never redelivered, while an untouched control message is redelivered (attempts 2)
        after >= 1 s, before the touched one is FINed: the timeout was live and TOUCH
        is what kept the touched message."""
        timeout_s = s["msg_timeout_ms"] / 1000
        ev = s["events_s"]
        self.fail_unless(
            s["deliveries"].get("touch-me") == [1],
            f"touched message: attempts per delivery {s['deliveries'].get('touch-me')}",
            s,
        )
        self.fail_unless(
            s["deliveries"].get("timeout-control") == [1, 2],
            "untouched control message: attempts per delivery "
            f"{s['deliveries'].get('timeout-control')}, want [1, 2] (timed out, redelivered)",
            s,
        )
        self.fail_unless(s["deliveries"].get("touch-sentinel") == [1], "sentinel", s)
        held = ev["touch_finished"] - ev["touch_delivered"]
        self.fail_unless(held >= s["hold_s"], f"held only {held}s", s)
        self.fail_unless(s["touches"] >= 6, f"only {s['touches']} TOUCHes sent", s)
        timed_out_after = ev["control_redelivered"] - ev["control_delivered"]
        self.fail_unless(
            timeout_s * 0.95 <= timed_out_after,
            f"control redelivered after {timed_out_after}s, before msg_timeout {timeout_s}s",
            s,
        )
        self.fail_unless(
            ev["control_redelivered"] < ev["touch_finished"],
            "the control message was not redelivered while the touched one was held: "
            "msg_timeout was not in force",
            s,
        )
        if negotiated:
            self.fail_unless(
                s["identify_msg_timeout"] == s["msg_timeout_ms"],
                f"IDENTIFY answered msg_timeout={s['identify_msg_timeout']}",
                s,
            )
        self.check_healthy(s)


@pytest.fixture
def compat() -> Iterator[Compat]:
    yield Compat()


# --- discovery through nsqlookupd -------------------------------------------------------


class LookupdCluster:
    """One nsqlookupd and two nsqd registered with it, each holding N messages of one
    topic, tagged with the nsqd they were published to."""

    COUNT = 10

    def __init__(self, lookupd: Any, nsqds: list[Any], topic: str) -> None:
        self.lookupd = lookupd
        self.nsqds = nsqds
        self.topic = topic
        self.prefixes = [f"nsqd{i}" for i in range(len(nsqds))]

    def publish(self) -> None:
        """PUB each nsqd's messages straight to it (the consumers will only know lookupd)."""
        from nsqx.wire import commands as wc

        for nsqd, prefix in zip(self.nsqds, self.prefixes, strict=True):
            with socket.create_connection(nsqd.tcp_address, timeout=10) as s:
                s.sendall(b"  V2")
                for i in range(self.COUNT):
                    s.sendall(wc.pub(self.topic, f"{prefix}-{i}".encode()))
                ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * self.COUNT
                got = b""
                while len(got) < len(ok):
                    chunk = s.recv(len(ok) - len(got))
                    assert chunk, f"nsqd closed after {got!r}"
                    got += chunk
                assert got == ok

    def run(self, compat: Compat, client: str) -> dict[str, Any]:
        cmd = [
            sys.executable,
            str(CLIENTS_DIR / f"{client}_lookupd_driver.py"),
            self.lookupd.http_address,
            self.topic,
            str(self.COUNT),
            *self.prefixes,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=DRIVER_TIMEOUT, env=env
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{client} lookupd driver still running\n{self._tails(exc)}")
        compat.context = self._tails(proc)
        if proc.returncode != 0:
            pytest.fail(f"{client} lookupd driver exited with {proc.returncode}\n{compat.context}")
        summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return summary

    def _tails(self, proc: Any) -> str:
        def text(data: Any) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""

        logs = "".join(
            f"--- nsqd{i} log (tail)\n{''.join(n.log[-15:])}" for i, n in enumerate(self.nsqds)
        )
        return (
            f"--- driver stdout (tail)\n{text(proc.stdout)[-3000:]}\n"
            f"--- driver stderr (tail)\n{text(proc.stderr)[-3000:]}\n"
            f"--- nsqlookupd log (tail)\n{''.join(self.lookupd.log[-20:])}{logs}"
        )


@pytest.fixture
def lookupd_cluster(lookupd_factory: Any, nsqd_factory: Any, request: Any) -> LookupdCluster:
    """nsqlookupd + two nsqd (--lookupd-tcp-address, --broadcast-address=127.0.0.1), the
    topic registered by both: /lookup lists both producers before the test starts."""
    lookupd = lookupd_factory()
    nsqds = [
        nsqd_factory(
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
            name=f"nsqd{i}-",
        )
        for i in range(2)
    ]
    cluster = LookupdCluster(lookupd, nsqds, f"discovery_{request.node.name[:40]}")
    cluster.publish()

    def both_listed() -> bool:
        status, _, body = lookupd.get(f"/lookup?topic={cluster.topic}")
        if status != 200:
            return False
        ports = {p["tcp_port"] for p in json.loads(body)["producers"]}
        return ports == {n.tcp_port for n in nsqds}

    wait_until(both_listed, what="both nsqd registered the topic with nsqlookupd")
    return cluster
