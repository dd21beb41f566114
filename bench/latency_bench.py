"""Latency and single-PUB benchmark of NSQ servers, run alternately in one run.

Servers (``--target NAME=SPEC``, repeatable; by default ``ours`` and, when the reference
binary is there, ``go``):

``ours``                  nsqx's nsqd from this interpreter (``python -m nsqx nsqd``)
``python:/path/python``   nsqx's nsqd from another install (e.g. a worktree's .venv)
``go`` / ``go:/path/nsqd`` Go's nsqd (default ../shared/reference/go-nsq-1.3.0/nsqd)
``tcp:HOST:PORT[:PID]``   a server that is already running (PID for its CPU figures)

The bench starts the servers it is given as commands (free loopback ports, a temporary
data directory each; ``--nsqd-arg`` adds flags to our servers) and runs every case on
each of them back to back, the order of the servers alternating from round to round,
``--rounds`` times: a ratio between two servers is only meaningful when both were
measured in the same run on the same (shared, noisy) machine.

Phases (``--phases``, in this order):

``latency``
    A pacing publisher (its own process, one connection) writes PUBs of ``--size``
    (200) bytes at a fixed offered rate (``--rates``) for ``--seconds`` (5): every
    millisecond it writes, in one write, the PUBs due since the start (pipelined: a PUB
    does not wait for the OK of the one before), each body starting with the time of
    that write (CLOCK_MONOTONIC ns, shared by the processes of a machine). One consumer
    on a fresh channel (RDY ``--rdy``, 2500) FINs every message (the FINs of one read in
    one write) and records its end-to-end latency: its arrival minus the time in its
    body. Percentiles p50, p99, p99.9 and the max over the messages written after
    ``--warmup`` (0.5 s) and before the last ``--cooldown`` (0.5 s: a server may keep
    the last messages of a stream in its output buffer until more come). A server that
    falls behind drains its backlog while the bench waits (as long as messages keep
    coming); a message of the measured window that never comes is reported as NOT
    DELIVERED. Each output buffering mode of ``--modes``, as the consumer
    asks for it in IDENTIFY: ``default`` (none asked: the server's 16 KiB / 250 ms),
    ``timeout-1`` (output_buffer_timeout -1), ``size-1`` (output_buffer_size -1),
    ``timeout-N`` / ``size-N`` (N ms / N bytes).
``oneloop``
    The latency phase's load in another shape, as an application embeds both clients:
    publisher and consumer in one process (a worker, uvloop) and one event loop, so
    that each stalls the other as a real service would. Every millisecond the
    publisher writes, in one write, the PUBs due so far (pipelined, ``--size`` bytes,
    each body stamped with the clock when it was built); the consumer (RDY ``--rdy``,
    the output buffering of the mode asked for in IDENTIFY) writes a FIN for each
    message as it arrives (one write per message). Same window, percentiles and modes
    as ``latency``.
``pub-rtt``
    Single-PUB round trips: ``--conns`` connections (1, 4, 16, 64) each publish one
    ``--size`` message and wait for its OK before the next, for ``--rtt-seconds`` (5);
    a fresh topic without channels. Generators (``--generators``): ``go``, Go's
    ``bench_writer --batch-size 1`` (an MPUB of one message per round trip), which opens
    one connection per GOMAXPROCS, so GOMAXPROCS is set to the connection count; ``py``,
    this script's own (PUB), its connections spread over ``--py-procs`` (2) processes.
``defer``
    Timers: ``--defer-messages`` DPUBs with delays spread over 100-1000 ms, and as many
    messages REQueued by the consumer with such a delay on their first delivery; how
    late each arrives after its time (arrival minus publish or REQ time minus delay),
    p50, p99, max. The consumer asks for output_buffer_size -1 so that buffering does
    not hide the timers. One deferred message goes first, unmeasured (Go's nsqd scans
    a new channel only from its next refresh of the channel list, up to 5 s later).

Every case reports the server's CPU (utime + stime of its process tree from /proc,
before and after). Run ``.venv/bin/python bench/latency_bench.py --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import secrets
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
from server_bench import (
    BenchConfig,
    BenchError,
    _check_failed,
    _Conn,
    connect,
    message_body,
    run_loop,
    server_cpu_seconds,
    until,
)

from nsqx.wire import commands
from nsqx.wire.frames import (
    FRAME_DATA_AT,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    FRAME_TYPE_AT,
    HEARTBEAT,
    MSG_ATTEMPTS_AT,
    MSG_BODY_AT,
    MSG_ID_AT,
    MSG_ID_END,
    OK,
)

PHASES = ("latency", "oneloop", "pub-rtt", "defer")
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "go-nsq-1.3.0"
GO_NSQD = REFERENCE / "nsqd"
GO_BENCH_WRITER = REFERENCE / "bench_writer"
CHANNEL = "lat"
_TS = struct.Struct(">q")
_DEFER = struct.Struct(">qi")
_OK_FRAME = struct.pack(">ii", len(OK) + 4, FRAME_RESPONSE) + OK
_OPS = re.compile(rb"([0-9.]+)ops/s")


# --- servers ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    """One server under test: started by the bench (``command``) or already running."""

    name: str
    spec: str
    command: list[str] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    #: the HTTP port of a server the bench started (for nsqx's event_loop figures)
    http_port: int = 0
    pid: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    tmp: str | None = None
    description: str = ""

    def start(self, timeout: float = 20.0) -> None:
        if self.command is None:
            return
        self.tmp = tempfile.mkdtemp(prefix=f"latbench-{self.name}-")
        self.port = free_port()
        http = self.http_port = free_port()
        argv = [
            *self.command,
            f"--tcp-address=127.0.0.1:{self.port}",
            f"--http-address=127.0.0.1:{http}",
            f"--data-path={self.tmp}",
        ]
        log = open(os.path.join(self.tmp, "server.log"), "wb")  # noqa: SIM115 - kept open
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.pid = self.proc.pid
        self.description = " ".join(argv)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name}: exited with {self.proc.returncode}{self.tail()}")
            try:
                socket.create_connection((self.host, self.port), 0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.name}: not listening after {timeout:g} s") from None
                time.sleep(0.05)

    def tail(self) -> str:
        if self.tmp is None:
            return ""
        try:
            with open(os.path.join(self.tmp, "server.log"), "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()[-20:]
        except OSError:
            return ""
        return "\n  " + "\n  ".join(lines) if lines else ""

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"{self.name}: exited with {self.proc.returncode}{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def parse_target(text: str, nsqd_args: Sequence[str]) -> Target:
    name, sep, spec = text.partition("=")
    if not sep:
        name, spec = text, text
    if spec == "ours":
        cmd = [sys.executable, "-m", "nsqx", "nsqd", *nsqd_args]
        return Target(name, spec, cmd)
    if spec.startswith("python:"):
        cmd = [spec[len("python:") :], "-m", "nsqx", "nsqd", *nsqd_args]
        return Target(name, spec, cmd)
    if spec == "go" or spec.startswith("go:"):
        binary = spec[3:] if spec.startswith("go:") else str(GO_NSQD)
        if not os.access(binary, os.X_OK):
            raise BenchError(f"{name}: no Go nsqd at {binary}")
        return Target(name, spec, [binary])
    if spec.startswith("tcp:"):
        parts = spec[4:].split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise BenchError(f"bad target {text!r}: expected tcp:HOST:PORT[:PID]")
        pid = int(parts[2]) if len(parts) == 3 else None
        t = Target(name, spec, None, parts[0], int(parts[1]), pid)
        t.description = f"running server at {parts[0]}:{parts[1]}"
        return t
    raise BenchError(f"bad target {text!r}: expected ours, python:PATH, go[:PATH], tcp:HOST:PORT")


# --- nsqx's own loop figures (its /stats event_loop) --------------------------------------


async def loop_figures(t: Target) -> dict[str, Any] | None:
    """nsqx's ``event_loop`` from /stats (None for a server without it, e.g. Go's)."""
    if not t.http_port:
        return None
    url = f"http://{t.host}:{t.http_port}/stats?format=json&include_clients=false"
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(5)) as r:
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    loop = body.get("event_loop") if isinstance(body, dict) else None
    return loop if isinstance(loop, dict) else None


def _delta_quantile(before: dict[str, Any], after: dict[str, Any], q: float) -> float | None:
    """Quantile ``q`` (the bucket's upper bound, us) of what a histogram counted between
    two /stats snapshots; None if nothing; +Inf buckets as the max."""
    old = {b: n for b, n in before.get("buckets", [])}
    counts = [(b, n - old.get(b, 0)) for b, n in after.get("buckets", [])]
    counts = [(b, n) for b, n in counts if n > 0]
    total = sum(n for _, n in counts)
    if not total:
        return None
    seen = 0
    for b, n in sorted(counts, key=lambda x: float("inf") if x[0] is None else x[0]):
        seen += n
        if seen >= q * total:
            return float(after["max_us"]) if b is None else float(b)
    return None


def loop_summary(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """What the server's loop did during a case: turns and timer lateness (p99.9 as a
    bucket's upper bound, the longest over the last 10-20 s), scan rounds, collections."""
    if before is None or after is None:
        return {}
    out: dict[str, Any] = {}
    keys = (
        ("turns", "turn"),
        ("timer_lateness", "late"),
        ("timer_lateness_running", "late_running"),
        ("scan", "scan"),
    )
    for key, name in keys:
        b, a = before.get(key, {}), after.get(key, {})
        out[f"loop_{name}s"] = a.get("count", 0) - b.get("count", 0)
        p = _delta_quantile(b, a, 0.999)
        out[f"loop_{name}_p999_ms"] = None if p is None else round(p / 1e3, 3)
        out[f"loop_{name}_max_ms"] = round(a.get("recent_max_us", 0) / 1e3, 2)
    wait = after.get("cpu_wait", {}).get("total_us", 0) - before.get("cpu_wait", {}).get(
        "total_us", 0
    )
    out["loop_cpu_wait_ms"] = round(wait / 1e3, 1)
    gcb, gca = before.get("gc", {}), after.get("gc", {})
    out["gc"] = [
        gca.get(g, {}).get("collections", 0) - gcb.get(g, {}).get("collections", 0)
        for g in ("gen0", "gen1", "gen2")
    ]
    out["gc_max_ms"] = round(max((v.get("max_us", 0) for v in gca.values()), default=0) / 1e3, 2)
    return out


# --- output buffering modes -------------------------------------------------------------


def mode_identify(mode: str) -> dict[str, int]:
    """The IDENTIFY fields of an output buffering mode."""
    if mode == "default":
        return {}
    m = re.fullmatch(r"(timeout|size)(-1|\d+)", mode)
    if not m:
        raise BenchError(f"unknown mode {mode!r}: default, timeout-1, size-1, timeout-N, size-N")
    key = "output_buffer_timeout" if m.group(1) == "timeout" else "output_buffer_size"
    return {key: int(m.group(2))}


# --- the publishers (in worker processes) -----------------------------------------------


class _Responses(asyncio.Protocol):
    """Counts OK responses; answers heartbeats; records an error frame."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.acked = 0
        self.error: str | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(b"  V2")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        n = len(buf)
        if n % 10 == 0 and buf == _OK_FRAME * (n // 10):  # the usual case: only OKs
            self.buf = b""
            self.on_ok(n // 10)
            return
        pos = oks = 0
        while pos + 8 <= n:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if pos + 4 + size > n:
                break
            ftype = int.from_bytes(buf[pos + FRAME_TYPE_AT : pos + FRAME_DATA_AT], "big")
            payload = buf[pos + FRAME_DATA_AT : pos + 4 + size]
            pos += 4 + size
            if ftype == FRAME_RESPONSE and payload == OK:
                oks += 1
            elif ftype == FRAME_RESPONSE and payload == HEARTBEAT:
                assert self.transport is not None
                self.transport.write(commands.nop())
            else:
                self.error = f"frame {ftype}: {payload[:200]!r}"
        self.buf = buf[pos:]
        if oks:
            self.on_ok(oks)

    def on_ok(self, n: int) -> None:
        self.acked += n


async def _open(factory: Any, host: str, port: int) -> Any:
    loop = asyncio.get_running_loop()
    try:
        _, proto = await asyncio.wait_for(loop.create_connection(factory, host, port), 10)
    except (OSError, TimeoutError) as err:
        raise BenchError(f"cannot connect to {host}:{port}: {err}") from None
    return proto


async def pace(req: dict[str, Any]) -> dict[str, Any]:
    """Publish ``rate`` msgs/s for ``seconds``: each millisecond, the PUBs due so far."""
    size, rate = req["size"], req["rate"]
    pub: _Responses = await _open(_Responses, req["host"], req["port"])
    prefix = b"PUB " + req["topic"].encode() + b"\n" + struct.pack(">i", size)
    pad = message_body(size - _TS.size)
    pack = _TS.pack
    await asyncio.sleep(max(0.0, req["at"] - time.monotonic()))
    t0 = int(req["at"] * 1e9)  # (the consumer knows it too: the measured window)
    end = t0 + int(req["seconds"] * 1e9)
    stop = req["stop_ns"]
    sent = 0
    sent_before_stop = 0
    max_gap = 0
    max_buffer = 0
    last = t0
    c0 = time.process_time()
    transport = pub.transport
    assert transport is not None
    while True:
        now = time.monotonic_ns()
        if now >= end or pub.error or pub.lost:
            break
        max_gap = max(max_gap, now - last)
        last = now
        due = (now - t0) * rate // 1_000_000_000 + 1 - sent
        if due > 0:
            transport.write((prefix + pack(now) + pad) * due)
            sent += due
            if now < stop:
                sent_before_stop += due
            max_buffer = max(max_buffer, transport.get_write_buffer_size())
        await asyncio.sleep(0.001)
    wait_until = time.monotonic() + 30
    while pub.acked < sent and not pub.error and not pub.lost and time.monotonic() < wait_until:
        await asyncio.sleep(0.005)
    cpu = time.process_time() - c0
    transport.close()
    if pub.error:
        raise BenchError(f"publisher: the server sent an error: {pub.error}")
    if pub.acked < sent:
        raise BenchError(f"publisher: {sent - pub.acked} of {sent} PUBs not acknowledged")
    return {
        "t0": t0,
        "sent": sent,
        "sent_before_stop": sent_before_stop,
        "max_tick_gap_ms": max_gap / 1e6,
        "max_write_buffer": max_buffer,
        "cpu_s": cpu,
    }


class _RoundTrips(_Responses):
    """PUB, wait for its OK, PUB again, until ``stop``."""

    def __init__(self, cmd: bytes) -> None:
        super().__init__()
        self.cmd = cmd
        self.stop = 0.0
        self.counted = 0

    def go(self, stop: float) -> None:
        self.stop = stop
        assert self.transport is not None
        self.transport.write(self.cmd)

    def on_ok(self, n: int) -> None:
        if time.monotonic() < self.stop:
            self.counted += n
            assert self.transport is not None
            self.transport.write(self.cmd)


async def round_trips(req: dict[str, Any]) -> dict[str, Any]:
    cmd = commands.pub(req["topic"], message_body(req["size"]))
    conns: list[_RoundTrips] = [
        await _open(lambda: _RoundTrips(cmd), req["host"], req["port"]) for _ in range(req["conns"])
    ]
    late = time.monotonic() - req["at"]
    if late > 0:
        raise BenchError(f"round trips: connecting took {late:.2f} s too long")
    await asyncio.sleep(req["at"] - time.monotonic())
    c0 = time.process_time()
    stop = req["at"] + req["seconds"]
    for c in conns:
        c.go(stop)
    await asyncio.sleep(max(0.0, stop - time.monotonic()) + 0.2)
    cpu = time.process_time() - c0
    for c in conns:
        if c.error:
            raise BenchError(f"round trips: the server sent an error: {c.error}")
        if c.lost:
            raise BenchError("round trips: the server closed a connection")
        assert c.transport is not None
        c.transport.close()
    return {"count": sum(c.counted for c in conns), "cpu_s": cpu}


class _OneLoopConsumer(_Conn):
    """The oneloop phase's consumer: a FIN written for each message as it arrives."""

    def __init__(self) -> None:
        super().__init__("oneloop-consumer")
        self.sent_at: array[int] = array("q")
        self.latency: array[int] = array("q")
        self.rdy = self.rdy_left = 0
        self.stop_ns = 1 << 62
        self.before_stop = 0
        self.last_at = 0.0

    def set_rdy(self, count: int) -> None:
        self.rdy = self.rdy_left = count
        self.write(commands.rdy(count))

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        now = time.monotonic_ns()
        transport = self.transport
        seen = 0
        for ftype, payload in frames:
            if ftype != FRAME_MESSAGE:
                self.on_control(ftype, payload)
                continue
            sent = _TS.unpack_from(payload, 26)[0]
            self.sent_at.append(sent)
            self.latency.append(now - sent)
            if sent < self.stop_ns:
                self.before_stop += 1
            if transport is not None and not self.closing:
                transport.write(b"FIN " + payload[10:26] + b"\n")  # one write per message
            seen += 1
        if seen:
            self.last_at = time.monotonic()
            self.rdy_left -= seen
            if self.rdy_left <= self.rdy // 2:
                self.write(commands.rdy(self.rdy))
                self.rdy_left = self.rdy


async def one_loop(req: dict[str, Any]) -> dict[str, Any]:
    """The oneloop phase in a worker: publisher and consumer on this process's one loop."""
    host, port, topic = req["host"], req["port"], req["topic"]
    size, rate = req["size"], req["rate"]
    cons = await connect(
        _OneLoopConsumer, host, port, "oneloop-consumer", BenchConfig(), req["identify"]
    )
    resp = await until(cons.request(commands.sub(topic, CHANNEL)), [cons], 10, "SUB")
    if resp != OK:
        raise BenchError(f"oneloop consumer: SUB answered {resp[:200]!r}")
    cons.set_rdy(min(req["rdy"], int(cons.settings.get("max_rdy_count", req["rdy"]))))
    pub: _Responses = await _open(_Responses, host, port)
    transport = pub.transport
    assert transport is not None
    prefix = b"PUB " + topic.encode() + b"\n" + struct.pack(">i", size)
    pad = message_body(size - _TS.size)
    pack = _TS.pack
    await asyncio.sleep(0.3)
    t0 = time.monotonic_ns()
    end = t0 + int(req["seconds"] * 1e9)
    stop = t0 + int((req["seconds"] - req["cooldown"]) * 1e9)
    cons.stop_ns = stop
    sent = sent_before_stop = max_gap = 0
    last = t0
    c0 = time.process_time()
    while True:
        now = time.monotonic_ns()
        if now >= end or pub.error or pub.lost or cons.failed.done():
            break
        max_gap = max(max_gap, now - last)
        last = now
        due = (now - t0) * rate // 1_000_000_000 + 1 - sent
        if due > 0:
            # each PUB stamped with the clock when it is built
            transport.write(
                b"".join([prefix + pack(time.monotonic_ns()) + pad for _ in range(due)])
            )
            sent += due
            if now < stop:
                sent_before_stop += due
        await asyncio.sleep(0.001)
    # the window's messages all come (a server that fell behind drains its backlog)
    deadline = time.monotonic() + 120
    while cons.before_stop < sent_before_stop and not cons.failed.done():
        now_s = time.monotonic()
        if now_s > deadline or now_s - max(cons.last_at, t0 / 1e9) > 5:
            break
        await asyncio.sleep(0.01)
    wait_until = time.monotonic() + 30
    while pub.acked < sent and not pub.error and not pub.lost and time.monotonic() < wait_until:
        await asyncio.sleep(0.005)
    cpu = time.process_time() - c0
    transport.close()
    cons.close()
    _check_failed([cons])
    if pub.error:
        raise BenchError(f"oneloop publisher: the server sent an error: {pub.error}")
    start = t0 + int(req["warmup"] * 1e9)
    lat = [v for s, v in zip(cons.sent_at, cons.latency, strict=True) if start <= s < stop]
    return {
        "msgs": sent,
        "undelivered": sent_before_stop - cons.before_stop,
        "measured": len(lat),
        **{k: round(v, 3) for k, v in percentiles(lat).items()},
        "pub_max_tick_gap_ms": round(max_gap / 1e6, 2),
        "client_cpu_pct": round(100 * cpu / req["seconds"], 1),
    }


def _worker(conn: multiprocessing.connection.Connection) -> None:
    """A publisher process: runs the requests it is sent until told to stop."""
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req.get("kind") == "stop":
            return
        try:
            run = {"pace": pace, "rtt": round_trips, "oneloop": one_loop}[req["kind"]]
            res = run_loop(run(req))
        except BaseException as err:  # reported to the parent
            res = {"error": str(err) or repr(err)}
        conn.send(res)


class Workers:
    """Publisher processes, spawned once for the whole run."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.procs = []
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), name=f"latbench-pub{i}", daemon=True)
            p.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(p)

    def send(self, i: int, req: dict[str, Any]) -> None:
        self.pipes[i].send(req)

    async def result(self, i: int, timeout: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        pipe = self.pipes[i]

        def wait() -> dict[str, Any]:
            if not pipe.poll(timeout):
                return {"error": f"no answer from publisher process {i} in {timeout:g} s"}
            try:
                return cast(dict[str, Any], pipe.recv())
            except (EOFError, OSError):
                return {"error": f"publisher process {i} exited"}

        res = await loop.run_in_executor(None, wait)
        if "error" in res:
            raise BenchError(res["error"])
        return res

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send({"kind": "stop"})
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()


# --- the consumer -----------------------------------------------------------------------


class LatencyConsumer(_Conn):
    """Records (time in the body, latency) of every message; FINs them per read."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.sent_at: array[int] = array("q")
        self.latency: array[int] = array("q")
        self.rdy = self.rdy_left = 0
        self.count = 0
        #: messages written before ``stop_ns`` (the end of the measured window) seen
        self.stop_ns = 1 << 62
        self.before_stop = 0
        self.last_at = 0.0

    def set_rdy(self, count: int) -> None:
        self.rdy = self.rdy_left = count
        self.write(commands.rdy(count))

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        now = time.monotonic_ns()
        self.last_at = time.monotonic()
        ids = []
        stamps = []
        for ftype, payload in frames:
            if ftype == FRAME_MESSAGE:
                ids.append(payload[MSG_ID_AT:MSG_ID_END])
                stamps.append(payload[MSG_BODY_AT : MSG_BODY_AT + 8])
            else:
                self.on_control(ftype, payload)
        if not ids:
            return
        sent = array("q", [int.from_bytes(s, "big") for s in stamps])
        self.before_stop += bisect_left(sent, self.stop_ns)  # (in publishing order)
        self.sent_at.extend(sent)
        self.latency.extend([now - s for s in sent])
        n = len(ids)
        self.count += n
        out = commands.fin_many(ids)
        self.rdy_left -= n
        if self.rdy_left <= self.rdy // 2:
            out += commands.rdy(self.rdy)
            self.rdy_left = self.rdy
        self.write(out)


async def open_consumer(
    factory: Any, target: Target, topic: str, identify: dict[str, int], name: str
) -> Any:
    conn = await connect(factory, target.host, target.port, name, BenchConfig(), identify)
    resp = await until(conn.request(commands.sub(topic, CHANNEL)), [conn], 10, "SUB")
    if resp != OK:
        raise BenchError(f"{name}: SUB answered {resp[:200]!r}")
    return conn


def percentiles(values: Sequence[int]) -> dict[str, float]:
    """p50, p99, p99.9 and max of nanosecond values, in ms."""
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "p999": float("nan"), "max": 0.0}
    s = sorted(values)
    n = len(s)

    def at(q: float) -> float:
        return s[min(n - 1, int(q * n))] / 1e6

    return {"p50": at(0.50), "p99": at(0.99), "p999": at(0.999), "max": s[-1] / 1e6}


# --- the phases -------------------------------------------------------------------------


@dataclass
class Config:
    targets: list[Target]
    phases: tuple[str, ...] = PHASES
    rates: tuple[int, ...] = (1000, 10000, 50000, 100000)
    modes: tuple[str, ...] = ("default", "timeout-1", "size-1")
    seconds: float = 5.0
    warmup: float = 0.5
    cooldown: float = 0.5
    size: int = 200
    rdy: int = 2500
    conns: tuple[int, ...] = (1, 4, 16, 64)
    generators: tuple[str, ...] = ("go", "py")
    rtt_seconds: float = 5.0
    py_procs: int = 2
    defer_messages: int = 300
    rounds: int = 3
    bench_writer: str = str(GO_BENCH_WRITER)
    results: list[dict[str, Any]] = field(default_factory=list)


class Bench:
    def __init__(self, cfg: Config, workers: Workers) -> None:
        self.cfg = cfg
        self.workers = workers

    def cases(self) -> list[tuple[str, dict[str, Any]]]:
        cfg = self.cfg
        out: list[tuple[str, dict[str, Any]]] = []
        if "latency" in cfg.phases:
            out += [("latency", {"mode": m, "rate": r}) for m in cfg.modes for r in cfg.rates]
        if "oneloop" in cfg.phases:
            out += [("oneloop", {"mode": m, "rate": r}) for m in cfg.modes for r in cfg.rates]
        if "pub-rtt" in cfg.phases:
            for g in cfg.generators:
                out += [("pub-rtt", {"generator": g, "conns": c}) for c in cfg.conns]
        if "defer" in cfg.phases:
            out.append(("defer", {}))
        return out

    async def run(self, log: Any) -> None:
        cfg = self.cfg
        for rnd in range(cfg.rounds):
            order = cfg.targets if rnd % 2 == 0 else cfg.targets[::-1]
            for phase, case in self.cases():
                for t in order:
                    t.check_alive()
                    load = os.getloadavg()[0]
                    timed_loop = phase in ("latency", "oneloop")
                    loop0 = await loop_figures(t) if timed_loop else None
                    cpu0 = server_cpu_seconds(t.pid)
                    w0 = time.monotonic()
                    if phase == "latency":
                        res = await self.latency(t, **case)
                    elif phase == "oneloop":
                        res = await self.one_loop(t, **case)
                    elif phase == "pub-rtt":
                        res = await self.pub_rtt(t, **case)
                    else:
                        res = await self.defer(t)
                    wall = time.monotonic() - w0
                    cpu1 = server_cpu_seconds(t.pid)
                    if loop0 is not None:
                        res.update(loop_summary(loop0, await loop_figures(t)))
                    res.update(phase=phase, target=t.name, round=rnd + 1, load1=round(load, 2))
                    res.update(case)
                    if cpu0 is not None and cpu1 is not None:
                        res["server_cpu_pct"] = round(100 * (cpu1 - cpu0) / wall, 1)
                        msgs = res.get("msgs")
                        if msgs:
                            res["server_us_per_msg"] = round((cpu1 - cpu0) * 1e6 / msgs, 2)
                    cfg.results.append(res)
                    log(format_result(res))

    async def latency(self, t: Target, mode: str, rate: int) -> dict[str, Any]:
        cfg = self.cfg
        topic = f"lat-{secrets.token_hex(4)}"
        cons: LatencyConsumer = await open_consumer(
            lambda: LatencyConsumer("consumer"), t, topic, mode_identify(mode), "latency-consumer"
        )
        try:
            rdy = min(cfg.rdy, int(cons.settings.get("max_rdy_count", cfg.rdy)))
            cons.set_rdy(rdy)
            at = time.monotonic() + 0.3
            stop = int(at * 1e9) + int((cfg.seconds - cfg.cooldown) * 1e9)
            cons.stop_ns = stop
            req = {
                "kind": "pace",
                "host": t.host,
                "port": t.port,
                "topic": topic,
                "rate": rate,
                "seconds": cfg.seconds,
                "size": cfg.size,
                "at": at,
                "stop_ns": stop,
            }
            self.workers.send(0, req)
            pub = await until(
                self.workers.result(0, cfg.seconds + 60), [cons], cfg.seconds + 70, "publisher"
            )
            # Every message of the measured window must arrive (a server that fell
            # behind drains its backlog: waited for while messages keep coming). The
            # last ones, of the cooldown, may stay in an output buffer until more come
            # (Go's nsqd with output_buffer_timeout -1): they are not waited for.
            deadline = time.monotonic() + 120
            while cons.before_stop < pub["sent_before_stop"]:
                now = time.monotonic()
                if now > deadline or now - max(cons.last_at, at) > 5:
                    break
                await until(asyncio.sleep(0.01), [cons], 1, "messages")
        finally:
            cons.close()
        start = pub["t0"] + int(cfg.warmup * 1e9)
        lat = [v for s, v in zip(cons.sent_at, cons.latency, strict=True) if start <= s < stop]
        return {
            "msgs": pub["sent"],
            "undelivered": pub["sent_before_stop"] - cons.before_stop,
            "measured": len(lat),
            **{k: round(v, 3) for k, v in percentiles(lat).items()},
            "pub_max_tick_gap_ms": round(pub["max_tick_gap_ms"], 2),
            "pub_cpu_pct": round(100 * pub["cpu_s"] / cfg.seconds, 1),
        }

    async def one_loop(self, t: Target, mode: str, rate: int) -> dict[str, Any]:
        cfg = self.cfg
        req = {
            "kind": "oneloop",
            "host": t.host,
            "port": t.port,
            "topic": f"one-{secrets.token_hex(4)}",
            "identify": mode_identify(mode),
            "rdy": cfg.rdy,
            "rate": rate,
            "seconds": cfg.seconds,
            "warmup": cfg.warmup,
            "cooldown": cfg.cooldown,
            "size": cfg.size,
        }
        self.workers.send(0, req)
        return await self.workers.result(0, cfg.seconds + 200)

    async def pub_rtt(self, t: Target, generator: str, conns: int) -> dict[str, Any]:
        cfg = self.cfg
        topic = f"rtt-{secrets.token_hex(4)}"
        if generator == "go":
            if not os.access(cfg.bench_writer, os.X_OK):
                raise BenchError(f"no bench_writer at {cfg.bench_writer}")
            argv = [
                cfg.bench_writer,
                f"--nsqd-tcp-address={t.host}:{t.port}",
                f"--runfor={cfg.rtt_seconds}s",
                f"--size={cfg.size}",
                "--batch-size=1",
                f"--topic={topic}",
            ]
            env = dict(os.environ, GOMAXPROCS=str(conns))
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            out, _ = await asyncio.wait_for(proc.communicate(), cfg.rtt_seconds + 60)
            m = _OPS.search(out)
            if proc.returncode or not m:
                raise BenchError(f"bench_writer failed ({proc.returncode}): {out[-500:]!r}")
            rate = float(m.group(1))
            return {"msgs": int(rate * cfg.rtt_seconds), "msgs_per_s": round(rate)}
        procs = max(1, min(cfg.py_procs, conns))
        at = time.monotonic() + 1.0 + conns * 0.01
        share = [conns // procs + (i < conns % procs) for i in range(procs)]
        for i, n in enumerate(share):
            self.workers.send(
                i,
                {
                    "kind": "rtt",
                    "host": t.host,
                    "port": t.port,
                    "topic": topic,
                    "conns": n,
                    "seconds": cfg.rtt_seconds,
                    "size": cfg.size,
                    "at": at,
                },
            )
        results = [await self.workers.result(i, cfg.rtt_seconds + 60) for i in range(procs)]
        count = sum(r["count"] for r in results)
        return {
            "msgs": count,
            "msgs_per_s": round(count / cfg.rtt_seconds),
            "client_cpu_pct": round(100 * sum(r["cpu_s"] for r in results) / cfg.rtt_seconds, 1),
        }

    async def defer(self, t: Target) -> dict[str, Any]:
        cfg = self.cfg
        topic = f"defer-{secrets.token_hex(4)}"
        cons: DeferConsumer = await open_consumer(
            DeferConsumer, t, topic, {"output_buffer_size": -1}, "defer-consumer"
        )
        n = cfg.defer_messages
        pub: _AckCounter = await connect(
            lambda: _AckCounter("defer-publisher"), t.host, t.port, "defer-pub", BenchConfig()
        )
        try:
            cons.set_rdy(min(cfg.rdy, int(cons.settings.get("max_rdy_count", cfg.rdy))))
            pad = message_body(cfg.size - _DEFER.size)
            # Go's nsqd scans a channel made after its start only from its next refresh
            # of the channel list (every 5 s): one deferred message first, so that the
            # figures are those of a channel in use
            pub.write(commands.dpub(topic, 10, _DEFER.pack(time.monotonic_ns(), 10) + pad))
            deadline = time.monotonic() + 15
            while not cons.dpub and time.monotonic() < deadline:
                await until(asyncio.sleep(0.01), [cons, pub], 1, "the first deferred message")
            cons.dpub.clear()
            rng = random.Random(n)
            # spread over about 2 s: DPUBs (due after their delay) and PUBs (REQueued by
            # the consumer with the delay in their body)
            for k in range(n):
                delay = rng.randrange(100, 1000)
                dbody = _DEFER.pack(time.monotonic_ns(), delay) + pad
                pub.write(commands.dpub(topic, delay, dbody))
                rbody = _DEFER.pack(-1, delay) + pad
                pub.write(commands.pub(topic, rbody))
                if k % 10 == 9:
                    await asyncio.sleep(0.07)
            deadline = time.monotonic() + 15
            while len(cons.dpub) + len(cons.req) < 2 * n and time.monotonic() < deadline:
                await until(asyncio.sleep(0.01), [cons, pub], 1, "deferred messages")
        finally:
            cons.close()
            pub.close()
        if len(cons.dpub) < n or len(cons.req) < n:
            raise BenchError(
                f"{t.name}: {len(cons.dpub)} of {n} DPUBs and {len(cons.req)} of {n} REQs came back"
            )
        d = percentiles(cons.dpub)
        r = percentiles(cons.req)
        return {
            "msgs": 2 * n,
            "dpub_p50": round(d["p50"], 2),
            "dpub_p99": round(d["p99"], 2),
            "dpub_max": round(d["max"], 2),
            "dpub_early": sum(1 for v in cons.dpub if v < 0),
            "req_p50": round(r["p50"], 2),
            "req_p99": round(r["p99"], 2),
            "req_max": round(r["max"], 2),
            "req_early": sum(1 for v in cons.req if v < 0),
        }


class _AckCounter(_Conn):
    """A publisher's connection: counts the OKs of its publishes."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.acked = 0

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        for ftype, payload in frames:
            if ftype == FRAME_RESPONSE and payload == OK and not self.waiters:
                self.acked += 1
            else:
                self.on_control(ftype, payload)


class DeferConsumer(_Conn):
    """DPUBed messages: lateness after publish time + delay. PUBed ones: REQ with their
    delay on the first delivery, lateness after REQ time + delay on the second."""

    def __init__(self) -> None:
        super().__init__("defer-consumer")
        self.dpub: list[int] = []
        self.req: list[int] = []
        self.req_at: dict[bytes, int] = {}

    def set_rdy(self, count: int) -> None:
        self.write(commands.rdy(count))

    def on_frames(self, frames: list[tuple[int, bytes]]) -> None:
        now = time.monotonic_ns()
        out = []
        for ftype, payload in frames:
            if ftype != FRAME_MESSAGE:
                self.on_control(ftype, payload)
                continue
            mid = payload[MSG_ID_AT:MSG_ID_END]
            attempts = int.from_bytes(payload[MSG_ATTEMPTS_AT:MSG_ID_AT], "big")
            sent, delay = _DEFER.unpack_from(payload, MSG_BODY_AT)
            if sent >= 0:
                self.dpub.append(now - sent - delay * 1_000_000)
            elif attempts == 1:
                self.req_at[mid] = now
                out.append(commands.req(mid, delay))
                continue
            else:
                self.req.append(now - self.req_at.pop(mid) - delay * 1_000_000)
            out.append(commands.fin(mid))
        if out:
            self.write(b"".join(out))


# --- reporting --------------------------------------------------------------------------


def case_label(r: dict[str, Any]) -> str:
    if r["phase"] in ("latency", "oneloop"):
        return f"{r['phase']:<7} {r['mode']:>9} {r['rate']:>7,} msgs/s"
    if r["phase"] == "pub-rtt":
        return f"pub-rtt {r['generator']:>3} {r['conns']:>3} conns"
    return "defer"


def format_result(r: dict[str, Any]) -> str:
    head = f"[round {r['round']}] {case_label(r)} {r['target']:>8}:"
    cpu = f"server {r.get('server_cpu_pct', float('nan')):.0f}%"
    if r["phase"] in ("latency", "oneloop"):
        lost = f"; {r['undelivered']:,} NOT DELIVERED" if r.get("undelivered") else ""
        return (
            f"{head} p50 {r['p50']:.2f} p99 {r['p99']:.2f} p99.9 {r['p999']:.2f} "
            f"max {r['max']:.2f} ms ({r['measured']:,} msgs{lost}; {cpu}; publisher tick "
            f"gap max {r['pub_max_tick_gap_ms']:.1f} ms; load {r['load1']})" + loop_line(r)
        )
    if r["phase"] == "pub-rtt":
        per = r.get("server_us_per_msg")
        return (
            f"{head} {r['msgs_per_s']:>8,} msgs/s ({cpu}"
            + (f", {per:.1f} us/msg" if per else "")
            + f"; load {r['load1']})"
        )
    return (
        f"{head} DPUB late p50 {r['dpub_p50']:.1f} p99 {r['dpub_p99']:.1f} max "
        f"{r['dpub_max']:.1f} ms (early {r['dpub_early']}); REQ late p50 {r['req_p50']:.1f} "
        f"p99 {r['req_p99']:.1f} max {r['req_max']:.1f} ms (early {r['req_early']})"
    )


def loop_line(r: dict[str, Any]) -> str:
    """The server's own loop figures for a case (nsqx only), on a line of their own."""
    if "loop_turns" not in r:
        return ""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    return (
        f"\n    {r['target']} loop: {r['loop_turns']:,} reading turns, p99.9 <= "
        f"{ms(r['loop_turn_p999_ms'])} max {ms(r['loop_turn_max_ms'])} ms; timers late "
        f"p99.9 <= {ms(r['loop_late_p999_ms'])} max {ms(r['loop_late_max_ms'])} ms, less "
        f"the {r['loop_cpu_wait_ms']:g} ms it waited for a CPU p99.9 <= "
        f"{ms(r['loop_late_running_p999_ms'])} max {ms(r['loop_late_running_max_ms'])} ms; scan "
        f"rounds max {ms(r['loop_scan_max_ms'])} ms; gc {'/'.join(map(str, r['gc']))} "
        f"(max {r['gc_max_ms']:g} ms)"
    )


def _range(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def latency_table(results: list[dict[str, Any]], names: list[str]) -> str:
    """A Markdown table of the latency and oneloop cases: per target, the ranges over
    the rounds of p50 / p99 / p99.9 / max (ms), then the loop figures of nsqx targets."""
    by_case: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in results:
        if r["phase"] in ("latency", "oneloop"):
            by_case.setdefault(case_label(r), {}).setdefault(r["target"], []).append(r)
    if not by_case:
        return ""

    def cell(rs: list[dict[str, Any]]) -> str:
        return " / ".join(
            _range([x[k] for x in rs if x.get(k) is not None], f)
            for k, f in (("p50", ".2f"), ("p99", ".1f"), ("p999", ".1f"), ("max", ".1f"))
        )

    lines = [
        "| case | " + " | ".join(f"{n} p50 / p99 / p99.9 / max (ms)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, per in by_case.items():
        lines.append(
            f"| {' '.join(label.split())} | "
            + " | ".join(cell(per.get(n, [])) for n in names)
            + " |"
        )
    return "\n".join(lines)


def summary(cfg: Config) -> str:
    """Ranges per case and target, and per-round ratios of each target to the first."""
    names = [t.name for t in cfg.targets]
    base = names[0]
    by_case: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in cfg.results:
        by_case.setdefault(case_label(r), {}).setdefault(r["target"], []).append(r)
    lines = []
    for label, per in by_case.items():
        lines.append(label)
        phase = next(iter(per.values()))[0]["phase"]
        keys = {
            "latency": [("p50", ".2f"), ("p99", ".2f"), ("p999", ".2f"), ("max", ".1f")],
            "oneloop": [("p50", ".2f"), ("p99", ".2f"), ("p999", ".2f"), ("max", ".1f")],
            "pub-rtt": [("msgs_per_s", ",.0f"), ("server_us_per_msg", ".1f")],
            "defer": [
                ("dpub_p50", ".1f"),
                ("dpub_p99", ".1f"),
                ("dpub_max", ".1f"),
                ("req_p50", ".1f"),
                ("req_p99", ".1f"),
                ("req_max", ".1f"),
            ],
        }[phase]
        for name in names:
            rs = per.get(name, [])
            cells = [
                f"{k} {_range([x[k] for x in rs if x.get(k) is not None], f)}" for k, f in keys
            ]
            lines.append(f"  {name:>8}: " + "; ".join(cells))
        for name in names[1:]:
            ratios = []
            compared = {"latency": keys, "oneloop": keys, "pub-rtt": keys[:1]}.get(phase, keys[:3])
            for k, _ in compared:
                pairs = [
                    (a[k], b[k])
                    for a in per.get(base, [])
                    for b in per.get(name, [])
                    if a["round"] == b["round"] and b[k]
                ]
                if pairs:
                    rr = [a / b for a, b in pairs]
                    ratios.append(
                        f"{k} {', '.join(f'{x:.2f}' for x in rr)} "
                        f"(median {statistics.median(rr):.2f})"
                    )
            if ratios:
                lines.append(f"  {base}/{name} per round: " + "; ".join(ratios))
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x.replace("k", "000")) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="ours | python:PATH | go[:PATH] | tcp:HOST:PORT[:PID] (default: ours=ours, go=go)",
    )
    p.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        help="an extra flag for our servers, e.g. --nsqd-arg=--sync-every=1",
    )
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--rates", default="1000,10000,50000,100000", help="msgs/s (latency)")
    p.add_argument("--modes", default="default,timeout-1,size-1", help="output buffering")
    p.add_argument("--seconds", type=float, default=5.0, help="per rate (latency)")
    p.add_argument("--warmup", type=float, default=0.5, help="not measured (latency)")
    p.add_argument(
        "--cooldown", type=float, default=0.5, help="published last, not measured (latency)"
    )
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--rdy", type=int, default=2500)
    p.add_argument("--conns", default="1,4,16,64", help="connections (pub-rtt)")
    p.add_argument("--generators", default="go,py", help="go (bench_writer), py (pub-rtt)")
    p.add_argument("--rtt-seconds", type=float, default=5.0)
    p.add_argument("--py-procs", type=int, default=2, help="processes of the py generator")
    p.add_argument("--defer-messages", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bench-writer", default=str(GO_BENCH_WRITER))
    p.add_argument("--json-out", metavar="FILE", help="write every result as JSON")
    args = p.parse_args(argv)
    specs = args.target or (["ours=ours"] + (["go=go"] if os.access(GO_NSQD, os.X_OK) else []))
    targets = [parse_target(s, args.nsqd_arg) for s in specs]
    if len({t.name for t in targets}) != len(targets):
        p.error("target names must differ")
    phases = tuple(x for x in args.phases.split(",") if x)
    if set(phases) - set(PHASES):
        p.error(f"--phases: among {','.join(PHASES)}")
    if args.size < 16:
        p.error("--size: at least 16 bytes (the body carries a timestamp)")
    modes = tuple(x for x in args.modes.split(",") if x)
    for m in modes:
        mode_identify(m)
    cfg = Config(
        targets=targets,
        phases=phases,
        rates=_ints(args.rates),
        modes=modes,
        seconds=args.seconds,
        warmup=args.warmup,
        cooldown=args.cooldown,
        size=args.size,
        rdy=args.rdy,
        conns=_ints(args.conns),
        generators=tuple(x for x in args.generators.split(",") if x),
        rtt_seconds=args.rtt_seconds,
        py_procs=args.py_procs,
        defer_messages=args.defer_messages,
        rounds=args.rounds,
        bench_writer=args.bench_writer,
    )
    return cfg, args


def run(cfg: Config, log: Any = print) -> list[dict[str, Any]]:
    """Start the servers, run every case on each, alternately; returns the results."""
    workers = Workers(max(1, cfg.py_procs))
    try:
        for t in cfg.targets:
            t.start()
            log(f"{t.name}: {t.description or t.spec} (pid {t.pid})")
        log(f"load average at start: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
        run_loop(Bench(cfg, workers).run(log))
    finally:
        workers.close()
        for t in cfg.targets:
            t.stop()
    return cfg.results


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, args = parse_args(argv)
        run(cfg, lambda s: print(s, flush=True))
    except BenchError as err:
        print(f"latency_bench: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("latency_bench: interrupted", file=sys.stderr)
        return 130
    print()
    print(summary(cfg))
    table = latency_table(cfg.results, [t.name for t in cfg.targets])
    if table:
        print()
        print(table)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(cfg.results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
