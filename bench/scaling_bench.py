"""Scaling across cores (issue 30): Go's nsqd against nsqx's nsqd with 1..N workers.

The load comes from Go's own bench tools, ``bench_writer`` and ``bench_reader``, found in
``--go-dir`` (default ``../shared/reference/go-nsq-1.3.0`` next to the repository, as
for bench/latency_bench.py), which also holds Go's ``nsqd``. Both tools open one
connection per GOMAXPROCS, so the bench sets GOMAXPROCS to the connection count; each
connection has one request in flight (a publish waits for its OK).

Targets (``--targets``; go, go-mem and nsqx by default), each started by the bench on
free loopback ports (found by binding port 0) with a fresh temporary data directory:

``go``         Go's nsqd at its defaults (mem-queue-size 10000: a backlog goes to disk)
``go-mem``     Go's nsqd with ``--mem-queue-size=100000000`` (everything in memory)
``nsqx-Nw``    ``nsqx nsqd --workers=N`` for each N of ``--workers`` (default ``1,2`` and
               os.cpu_count() when larger); for N=1 no flag is given, so it runs on an
               nsqd without ``--workers``. An nsqd that refuses the flag is skipped with
               a line saying so. ``--nsqd-python`` picks the interpreter (default: this
               one), ``--nsqd-arg`` adds flags.
``nsqx-sep``   for each N > 1 of ``--workers``, target ``nsqx-Np``: N separate ``nsqx nsqd``
               processes (no ``--workers``; each its own ports and data directory), the
               phase's connections shared out among them by hand and the rates summed:
               what N processes give when nothing is shared, the ceiling for N workers
               on the same machine. Not among the defaults.

Phases (``--phases``, in this order), all with ``--size`` (200) byte messages, each on a
fresh server:

``mpub``   ``bench_writer --batch-size=200`` over 16 connections for ``--seconds`` (5)
``sub``    a channel is created, ``bench_writer`` as in mpub fills it for
           ``--fill-seconds`` (default ``--seconds``; not timed), the bench waits until
           the channel holds every message, then ``bench_reader`` (16 connections,
           ``--rdy`` 2500, every message FINed) consumes for ``--seconds``. If the
           channel drains before that (its depth in /stats, polled every 50 ms, reaches
           0: every message sent), the phase ends there and the rate is the backlog
           over the time to drain it.
``pub16``  single publishes: ``bench_writer --batch-size=1`` (an MPUB of one message per
           round trip) over 16 connections for ``--seconds``
``pub64``  the same over 64 connections

With ``--topics K`` (1) each phase spreads its load over K topics: K generators, the
phase's connections shared out among them (at least one each), their rates summed; the
names are chosen so that nsqx's workers own equally many (K a multiple of N). One topic
is the hardest case for workers (its one owner takes every publish); K topics are a node
carrying many topics.

Each round (``--rounds``, 1) runs every phase on every target, the targets one after
the other per phase, their order rotated from round to round, so that the figures
compared were measured close together on the same machine.

For every phase and target it prints msgs/s (bench_writer's or bench_reader's own
figure; for a drained sub phase, the backlog over the drain time), the server's CPU use
in cores (utime + stime of the server process and all its descendants, workers
included, from /proc/<pid>/stat, the descendants from /proc/<pid>/task/*/children,
also cutime + cstime for reaped ones, sampled at the start and end of the timed window,
divided by its wall time) and the load generator's cores (its rusage over the same
window). At the end: a Markdown table (rows: targets; columns: phases; cells:
``msgs/s (server cores / generator cores)``, medians over the rounds) and the ratios of
each target's rate to Go in memory and to one nsqx process, nsqx-1w (median of the
per-round ratios), where those were measured. ``--json FILE``
writes every measurement. A generator near its own core count, or a machine whose
cores are all busy (server + generator), means the figure is a lower bound.

Without bench_writer the bench prints a skip line and measures nothing; without Go's
nsqd the Go targets are skipped with a line. The servers are stopped (their whole
process group) at the end, on an error and on Ctrl-C. Data directories go under
$TMPDIR: the sub phase's backlog can take gigabytes on a fast machine.

Run::

    PYTHONPATH=src .venv/bin/python bench/scaling_bench.py                  # all defaults
    .venv/bin/python bench/scaling_bench.py --workers 1,2,4,8,16 --rounds 3 --json out.json
    .venv/bin/python bench/scaling_bench.py --seconds 2 --workers 1 --phases mpub,pub16
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

PHASES = ("mpub", "sub", "pub16", "pub64")
TARGET_KINDS = ("go", "go-mem", "nsqx", "nsqx-sep")
DEFAULT_KINDS = ("go", "go-mem", "nsqx")
GO_MEM_QUEUE = 100_000_000
#: connections and messages per publish of each phase (sub fills as mpub does)
PHASE_LOAD = {"mpub": (16, None), "sub": (16, None), "pub16": (16, 1), "pub64": (64, 1)}
REPO = Path(__file__).resolve().parents[1]
CHANNEL = "scale"
POLL = 0.05
_OPS = re.compile(r"([0-9.]+)ops/s")
_DURATION = re.compile(r"duration: (\S+) -")
_GO_DURATION_PART = re.compile(r"([0-9.]+)(ns|us|µs|ms|s|m|h)")
_REFUSAL = re.compile(r"-workers|not defined|unrecogni[sz]ed")
_LATE = re.compile(r"sleeping until .*\((-[^)]*)\)")
_VERSION = re.compile(r"(nsqd v\S+ \(built w/[^)]*\))")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
CLK_TCK = os.sysconf("SC_CLK_TCK")
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _LIBC = None


class BenchError(Exception):
    """The bench cannot go on: the message says why."""


class Refused(Exception):
    """The server would not start with these flags (an nsqd without --workers)."""


# --- CPU from /proc ---------------------------------------------------------------------


def _ticks(pid: int) -> int | None:
    """utime + stime + cutime + cstime of one process (all its threads), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # field 3 (state) onwards
    return sum(int(x) for x in fields[11:15])  # fields 14..17


def _children_by_scan() -> dict[int, list[int]]:
    """ppid -> pids, from every /proc/<pid>/stat (no /proc/.../children here)."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            ppid = int(data[data.rindex(b")") + 2 :].split()[1])
            out.setdefault(ppid, []).append(int(entry.name))
    return out


_HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (those alive now)."""
    scan = None if _HAS_CHILDREN_FILES else _children_by_scan()
    pids, i = [pid], 0
    while i < len(pids):
        p = pids[i]
        i += 1
        if scan is not None:
            pids.extend(scan.get(p, ()))
            continue
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    pids.extend(int(x) for x in f.read().split())
            except OSError:
                continue
    return pids


def tree_cpu(pid: int) -> tuple[float, int]:
    """CPU seconds used so far by ``pid`` and its descendants, and how many there are."""
    pids = process_tree(pid)
    ticks = [t for t in map(_ticks, pids) if t is not None]
    return sum(ticks) / CLK_TCK, len(ticks)


# --- servers ----------------------------------------------------------------------------


def free_port() -> int:
    """A free loopback port (bind port 0); the server binds it right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, method: str = "GET", timeout: float = 5.0) -> bytes:
    data = b"" if method == "POST" else None
    req = urllib.request.Request(url, data=data, method=method)
    with _HTTP.open(req, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


def _die_with_parent() -> None:
    """In the server's child: SIGTERM it if the bench dies (PR_SET_PDEATHSIG)."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGTERM), 0, 0, 0)


@dataclass
class Target:
    """A server to start for every phase: Go's nsqd or nsqx's."""

    name: str
    argv: list[str]
    kind: str
    workers: int = 1
    #: separate server processes (nsqx-sep), the load shared out among them
    processes: int = 1
    skipped: str | None = None
    version: str = ""


class Server:
    """One running server of a target, on free ports, with a fresh data directory."""

    def __init__(self, target: Target, startup_timeout: float) -> None:
        self.target = target
        self.startup_timeout = startup_timeout
        self.tmp = tempfile.mkdtemp(prefix=f"scalebench-{target.name}-")
        self.tcp_port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(self.tmp, "server.log")
        self.data_path = os.path.join(self.tmp, "data")
        os.mkdir(self.data_path)

    @property
    def tcp(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        argv = [
            *self.target.argv,
            f"--tcp-address={self.tcp}",
            f"--http-address=127.0.0.1:{self.http_port}",
            f"--data-path={self.data_path}",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as one
                preexec_fn=_die_with_parent,  # the bench runs no threads
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers():
            if self.proc.poll() is not None:
                tail = self.tail()
                said = [x.strip() for x in tail.splitlines() if _REFUSAL.search(x)]
                if self.target.workers > 1 and said:
                    raise Refused(said[-1])
                raise BenchError(f"{self.target.name}: exited with {self.proc.returncode}{tail}")
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.target.name}: no answer to /ping within "
                    f"{self.startup_timeout:g} s{self.tail()}"
                )
            time.sleep(0.05)
        self._settle(deadline + 10)
        if not self.target.version:
            m = _VERSION.search(self.tail(200))
            self.target.version = m.group(1) if m else ""

    def _answers(self) -> bool:
        try:
            if http_get(self.http + "/ping", timeout=1.0).strip() != b"OK":
                return False
            socket.create_connection(("127.0.0.1", self.tcp_port), 1.0).close()
        except (OSError, urllib.error.URLError):
            return False
        return True

    def _settle(self, deadline: float) -> None:
        """Wait until the process tree is quiet: every worker started, none importing.

        Connections are spread over the workers that listen when they connect, so a
        phase must not start while some are still starting.
        """
        quiet = 0
        last = tree_cpu(self.pid)
        while quiet < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = tree_cpu(self.pid)
            busy = now[0] - last[0] > 0.04 or now[1] != last[1]  # > 20% of a core
            quiet = 0 if busy else quiet + 1
            last = now

    def tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode("utf-8", "replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n  " + "\n  ".join(text) if text else ""

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                f"{self.target.name}: exited with {self.proc.returncode} during the phase"
                + self.tail()
            )

    def stats(self, topic: str, channel: str) -> dict[str, int] | None:
        """Depths and counts of ``topic`` and its ``channel`` from /stats, or None."""
        url = (
            f"{self.http}/stats?format=json&topic={quote(topic)}&channel={quote(channel)}"
            "&include_clients=false&include_mem=false"
        )
        try:
            data = json.loads(http_get(url))
        except (OSError, urllib.error.URLError, ValueError):
            return None
        data = data.get("data", data)  # an old nsqd wraps its answer
        found: dict[str, int] | None = None
        # summed over the topic's entries: a partitioned or sharded topic (nsqx
        # --worker-shards) lists one per partition
        for t in data.get("topics") or ():
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or ():
                if c.get("channel_name") == channel:
                    part = {
                        "topic_depth": int(t.get("depth", 0)),
                        "topic_messages": int(t.get("message_count", 0)),
                        "depth": int(c.get("depth", 0)),
                        "in_flight": int(c.get("in_flight_count", 0)),
                        "deferred": int(c.get("deferred_count", 0)),
                    }
                    found = part if found is None else {k: found[k] + v for k, v in part.items()}
        return found

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after 10 s; remove the data."""
        proc = self.proc
        if proc is not None:
            pgid = proc.pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # workers may outlive their parent a bit
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)


# --- load generators --------------------------------------------------------------------


def go_seconds(text: str) -> float:
    """A Go duration as printed (``5.000123s``, ``1m2.5s``, ``812.3ms``) in seconds."""
    return sum(float(v) * _GO_UNITS[u] for v, u in _GO_DURATION_PART.findall(text))


class Generator:
    """A bench_writer or bench_reader run, started at a deadline to the millisecond.

    The tool opens its connections, then sleeps until ``--deadline`` (UTC: Go parses a
    time without a zone as UTC; a fraction of a second is accepted), so the timed window
    starts at a known instant, after the connections are made.
    """

    def __init__(self, argv: list[str], conns: int, tmp: str, start_wall: float) -> None:
        self.start_wall = start_wall
        self.start = time.monotonic() + (start_wall - time.time())
        stamp = datetime.datetime.fromtimestamp(self.start_wall, datetime.UTC)
        self.argv = [*argv, f"--deadline={stamp:%Y-%m-%d %H:%M:%S.%f}"]
        self.out_path = os.path.join(tmp, f"gen-{secrets.token_hex(3)}.log")
        self.cpu_s = 0.0
        self.returncode: int | None = None
        self.end = 0.0
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, GOMAXPROCS=str(conns)),
            )

    def wait_start(self) -> None:
        delay = self.start - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def poll(self) -> bool:
        """True once it exited (its CPU time collected from wait4's rusage)."""
        if self.returncode is not None:
            return True
        pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
        if not pid:
            return False
        self.end = time.monotonic()
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode
        self.cpu_s = ru.ru_utime + ru.ru_stime
        return True

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.poll():
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{Path(self.argv[0]).name} still running after {timeout:g} s")
            time.sleep(0.005)

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            deadline = time.monotonic() + 5
            while not self.poll() and time.monotonic() < deadline:
                time.sleep(0.01)

    def output(self) -> str:
        try:
            with open(self.out_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def late(self) -> str | None:
        """How late it started (its connections took longer than the lead), or None."""
        m = _LATE.search(self.output())
        return m.group(1).lstrip("-") if m else None

    def result(self) -> tuple[float, int]:
        """Its own figures: (msgs/s, messages), from its last line."""
        out = self.output()
        rate, dur = _OPS.search(out), _DURATION.search(out)
        if self.returncode != 0 or rate is None or dur is None:
            raise BenchError(
                f"{Path(self.argv[0]).name} failed (exit {self.returncode}): {out[-800:]}"
            )
        ops = float(rate.group(1))
        return ops, round(ops * go_seconds(dur.group(1)))


# --- the bench --------------------------------------------------------------------------


@dataclass
class Config:
    go_dir: Path
    targets: list[Target]
    phases: tuple[str, ...] = PHASES
    seconds: float = 5.0
    fill_seconds: float = 5.0
    rounds: int = 1
    size: int = 200
    batch: int = 200
    rdy: int = 2500
    startup_timeout: float = 30.0
    json_path: str | None = None
    topics: int = 1
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bench_writer(self) -> Path:
        return self.go_dir / "bench_writer"

    @property
    def bench_reader(self) -> Path:
        return self.go_dir / "bench_reader"


def executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def spread_topics(prefix: str, k: int) -> list[str]:
    """``k`` topic names whose crc32 leave every remainder mod ``k`` once.

    nsqx's workers own a topic by crc32 of its name mod N (nsqx.nsqd.workers.ownership),
    so for any N dividing ``k`` each worker owns ``k / N`` of them; Go's nsqd ignores it.
    """
    names: dict[int, str] = {}
    i = 0
    while len(names) < k:
        name = f"{prefix}-{i}"
        names.setdefault(zlib.crc32(name.encode()) % k, name)
        i += 1
    return [names[r] for r in range(k)]


class Bench:
    def __init__(self, cfg: Config, log: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.log = log
        self.servers: list[Server] = []
        self.gens: list[Generator] = []

    def topics(self, phase: str) -> list[str]:
        prefix = f"scale-{phase}-{secrets.token_hex(3)}"
        return [prefix] if self.cfg.topics == 1 else spread_topics(prefix, self.cfg.topics)

    def start(self, argvs: list[list[str]], conns: int, tmp: str) -> list[Generator]:
        """One generator per argv, ``conns`` connections shared out, one start instant."""
        each = max(1, conns // len(argvs))
        start = time.time() + 0.5 + 0.01 * max(conns, len(argvs))
        gens = [Generator(argv, each, tmp, start) for argv in argvs]
        self.gens.extend(gens)
        return gens

    def writers(
        self, servers: list[Server], topics: list[str], phase: str, seconds: float
    ) -> list[Generator]:
        """bench_writer for each topic on each server (nsqx-sep: several)."""
        conns, batch = PHASE_LOAD[phase]
        argvs = [
            [
                str(self.cfg.bench_writer),
                f"--nsqd-tcp-address={server.tcp}",
                f"--topic={topic}",
                f"--size={self.cfg.size}",
                f"--batch-size={batch or self.cfg.batch}",
                f"--runfor={seconds}s",
            ]
            for topic in topics
            for server in servers
        ]
        return self.start(argvs, conns, servers[0].tmp)

    @staticmethod
    def wait_all(gens: list[Generator], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for gen in gens:
            gen.wait(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def results(gens: list[Generator]) -> tuple[float, int]:
        """Summed (msgs/s, messages) of generators that ran over the same window."""
        figures = [gen.result() for gen in gens]
        return sum(r for r, _ in figures), sum(m for _, m in figures)

    @staticmethod
    def late(gens: list[Generator]) -> str | None:
        return next((x for x in (gen.late() for gen in gens) if x), None)

    @staticmethod
    def servers_cpu(servers: list[Server]) -> tuple[float, int]:
        """CPU seconds and processes of every server's tree, summed."""
        cpu = [tree_cpu(s.pid) for s in servers]
        return sum(c for c, _ in cpu), sum(n for _, n in cpu)

    def measure_pub(self, servers: list[Server], phase: str) -> dict[str, Any]:
        """mpub, pub16, pub64: bench_writer(s) for --seconds, their own rates summed."""
        cfg = self.cfg
        gens = self.writers(servers, self.topics(phase), phase, cfg.seconds)
        gens[0].wait_start()
        s0, _ = self.servers_cpu(servers)
        self.wait_all(gens, cfg.seconds + 60)
        s1, procs = self.servers_cpu(servers)
        rate, msgs = self.results(gens)
        wall = max(gen.end for gen in gens) - gens[0].start
        return {
            "msgs_per_s": rate,
            "msgs": msgs,
            "seconds": round(wall, 3),
            "server_cores": (s1 - s0) / wall,
            "generator_cores": sum(gen.cpu_s for gen in gens) / wall,
            "server_processes": procs,
            "generator_late": self.late(gens),
        }

    def sub_stats(self, servers: list[Server], topics: list[str]) -> dict[str, int] | None:
        """The topics' /stats figures summed over the servers (None while one of them is
        not listed)."""
        total: dict[str, int] = {}
        for server in servers:
            for topic in topics:
                st = server.stats(topic, CHANNEL)
                if st is None:
                    return None
                for key, value in st.items():
                    total[key] = total.get(key, 0) + value
        return total

    def measure_sub(self, servers: list[Server]) -> dict[str, Any]:
        """Fill a channel (untimed), then time bench_reader consuming it."""
        cfg = self.cfg
        topics = self.topics("sub")
        for server in servers:
            for topic in topics:
                for path in (
                    f"/topic/create?topic={topic}",
                    f"/channel/create?topic={topic}&channel={CHANNEL}",
                ):
                    http_get(server.http + path, "POST")
        fill = self.writers(servers, topics, "sub", cfg.fill_seconds)
        self.wait_all(fill, cfg.fill_seconds + 60)
        _, published = self.results(fill)
        # every message in the channel (the topic hands its queue over to it) before timing
        st = self.sub_stats(servers, topics)
        deadline = time.monotonic() + 60
        while st is not None and (st["topic_depth"] or st["depth"] < st["topic_messages"]):
            if time.monotonic() > deadline:
                self.log(
                    f"  warning: the channel holds {st['depth']:,} of {published:,} after 60 s"
                )
                break
            time.sleep(POLL)
            st = self.sub_stats(servers, topics)
        # a worker's partial view (fewer messages than were published) cannot tell a drain
        complete = st is not None and st["topic_messages"] >= 0.99 * published
        backlog = st["depth"] if st is not None and complete else published
        argvs = [
            [
                str(cfg.bench_reader),
                f"--nsqd-tcp-address={server.tcp}",
                f"--topic={topic}",
                f"--channel={CHANNEL}",
                f"--size={cfg.size}",
                f"--rdy={cfg.rdy}",
                f"--runfor={cfg.seconds}s",
            ]
            for topic in topics
            for server in servers
        ]
        gens = self.start(argvs, PHASE_LOAD["sub"][0], servers[0].tmp)
        gens[0].wait_start()
        s0, _ = self.servers_cpu(servers)
        drained_at: float | None = None
        limit = time.monotonic() + cfg.seconds + 60
        while not all([gen.poll() for gen in gens]):
            if complete:
                st = self.sub_stats(servers, topics)
                # every message sent: bench_reader keeps its last FINs in its write buffer
                # (up to --runfor), so in_flight_count does not go to 0 before it ends
                if st is not None and not (st["depth"] or st["deferred"]):
                    drained_at = time.monotonic()
                    break
            if time.monotonic() > limit:
                for gen in gens:
                    gen.kill()
                raise BenchError(f"bench_reader still running after {cfg.seconds + 60:g} s")
            time.sleep(POLL)
        end = drained_at if drained_at is not None else max(gen.end for gen in gens)
        s1, procs = self.servers_cpu(servers)
        wall = end - gens[0].start
        if drained_at is not None:
            for gen in gens:
                gen.kill()  # it would wait out --runfor on an empty channel
            rate, msgs = backlog / wall, backlog
        else:
            rate, msgs = self.results(gens)
        return {
            "msgs_per_s": rate,
            "msgs": msgs,
            "seconds": round(wall, 3),
            "server_cores": (s1 - s0) / wall,
            "generator_cores": sum(gen.cpu_s for gen in gens) / wall,
            "server_processes": procs,
            "backlog": backlog,
            "drained": drained_at is not None,
            "drain_visible": complete,
            "generator_late": self.late(gens),
        }

    def run_one(self, target: Target, phase: str, rnd: int) -> dict[str, Any] | None:
        servers = self.servers = [
            Server(target, self.cfg.startup_timeout) for _ in range(target.processes)
        ]
        try:
            try:
                for server in servers:
                    server.start()
            except Refused as why:
                target.skipped = f"this nsqd refuses --workers={target.workers} ({why})"
                self.log(f"skip {target.name}: {target.skipped}")
                return None
            load = os.getloadavg()[0]
            sub = phase == "sub"
            r = self.measure_sub(servers) if sub else self.measure_pub(servers, phase)
            for server in servers:
                server.check_alive()
        finally:
            for gen in self.gens:
                gen.kill()
            self.gens = []
            for server in servers:
                server.stop()
            self.servers = []
        r.update(round=rnd + 1, phase=phase, target=target.name, loadavg_1m=round(load, 2))
        return r

    def run(self) -> None:
        cfg = self.cfg
        live = [t for t in cfg.targets if t.skipped is None]
        for rnd in range(cfg.rounds):
            for phase in cfg.phases:
                k = rnd % len(live) if live else 0
                for target in live[k:] + live[:k]:
                    if target.skipped is not None:
                        continue
                    r = self.run_one(target, phase, rnd)
                    if r is None:
                        continue
                    cfg.results.append(r)
                    self.log(format_line(r, cfg.rounds))

    def close(self) -> None:
        for gen in self.gens:
            gen.kill()
        for server in self.servers:
            server.stop()


# --- reporting --------------------------------------------------------------------------


def format_line(r: dict[str, Any], rounds: int) -> str:
    extra = ""
    if r.get("drained"):
        extra = f", drained {r['backlog']:,} in {r['seconds']:.2f} s"
    elif r["phase"] == "sub" and not r.get("drain_visible", True):
        extra = ", /stats saw part of the messages: no drain detection"
    if r.get("generator_late"):
        extra += f", generator started {r['generator_late']} late"
    return (
        f"round {r['round']}/{rounds} {r['phase']:<5} {r['target']:<9} "
        f"{r['msgs_per_s']:>12,.0f} msgs/s  server {r['server_cores']:.2f} cores "
        f"({r['server_processes']} processes)  generator {r['generator_cores']:.2f} cores  "
        f"[{r['seconds']:.2f} s, load {r['loadavg_1m']}{extra}]"
    )


def _median(values: list[float]) -> float:
    return statistics.median(values)


def tables(cfg: Config) -> str:
    names = [t.name for t in cfg.targets if any(r["target"] == t.name for r in cfg.results)]
    phases = [p for p in cfg.phases if any(r["phase"] == p for r in cfg.results)]
    if not names:
        return "no figures"

    def rs(name: str, phase: str) -> list[dict[str, Any]]:
        return [r for r in cfg.results if r["target"] == name and r["phase"] == phase]

    def table(title: str, cell: Callable[[str, str], str]) -> list[str]:
        """A Markdown table under ``title``: a row per target, a column per phase."""
        rows = [
            "| " + " | ".join([name, *(cell(name, phase) for phase in phases)]) + " |"
            for name in names
        ]
        header = ["| target | " + " | ".join(phases) + " |", "|---|" + "---:|" * len(phases)]
        return [title, "", *header, *rows]

    def figures(name: str, phase: str) -> str:
        got = rs(name, phase)
        if not got:
            return "-"
        rate = _median([r["msgs_per_s"] for r in got])
        srv = _median([r["server_cores"] for r in got])
        gen = _median([r["generator_cores"] for r in got])
        return f"{rate:,.0f} ({srv:.1f} / {gen:.1f})"

    def ratio_to(base: str) -> Callable[[str, str], str]:
        def cell(name: str, phase: str) -> str:
            by_round = {r["round"]: r["msgs_per_s"] for r in rs(base, phase)}
            ratios = [
                r["msgs_per_s"] / by_round[r["round"]]
                for r in rs(name, phase)
                if by_round.get(r["round"])
            ]
            return f"{_median(ratios):.2f}" if ratios else "-"

        return cell

    how = "median of the rounds" if cfg.rounds > 1 else "one round"
    lines = table(
        f"msgs/s (server cores / load generator cores), {how}; {os.cpu_count()} CPUs", figures
    )
    # ratios to Go in memory (the reference) and to one nsqx process (what
    # workers, or separate processes, add on this machine)
    bases = [b for b in ("go-mem", "nsqx-1w") if b in names]
    if not bases:
        lines += ["", "no ratios: neither go-mem nor nsqx-1w was measured"]
    for base in bases:
        title = f"rate / {base}'s rate, median of the per-round ratios"
        lines += ["", *table(title, ratio_to(base))]
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------


def default_go_dir() -> Path:
    """../shared/reference/go-nsq-1.3.0 next to this repository, or next to its main
    checkout when this is a git worktree elsewhere."""
    rel = Path("shared") / "reference" / "go-nsq-1.3.0"
    here = REPO.parent / rel
    if here.exists():
        return here
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if common:
            main = Path(common).parent.parent / rel
            if main.exists():
                return main
    return here


def default_workers() -> list[int]:
    cpus = os.cpu_count() or 1
    return [1, 2, *([cpus] if cpus > 2 else [])]


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1: {text!r}")
    return sorted(set(out))


def make_targets(
    kinds: Sequence[str],
    go_dir: Path,
    workers: Sequence[int],
    python: str,
    nsqd_args: Sequence[str],
    log: Callable[[str], None],
) -> list[Target]:
    targets: list[Target] = []
    go_nsqd = go_dir / "nsqd"
    for kind in kinds:
        if kind in ("go", "go-mem"):
            extra = [f"--mem-queue-size={GO_MEM_QUEUE}"] if kind == "go-mem" else []
            t = Target(kind, [str(go_nsqd), *extra], "go")
            if not executable(go_nsqd):
                t.skipped = f"no Go nsqd at {go_nsqd} (give --go-dir)"
                log(f"skip {kind}: {t.skipped}")
            targets.append(t)
        elif kind == "nsqx-sep":
            argv = [python, "-m", "nsqx", "nsqd", *nsqd_args]
            for n in workers:
                if n > 1:
                    targets.append(Target(f"nsqx-{n}p", argv, "nsqx", 1, processes=n))
        else:
            for n in workers:
                flag = [f"--workers={n}"] if n > 1 else []
                argv = [python, "-m", "nsqx", "nsqd", *flag, *nsqd_args]
                targets.append(Target(f"nsqx-{n}w", argv, "nsqx", n))
    return targets


def parse_args(argv: Sequence[str] | None, log: Callable[[str], None]) -> Config:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See the module docstring (bench/scaling_bench.py) for what each phase does.",
    )
    p.add_argument("--go-dir", type=Path, help="bench_writer, bench_reader and Go's nsqd")
    p.add_argument(
        "--workers",
        type=_int_list,
        default=None,
        help="comma list of nsqx worker counts (default: 1,2 and the CPU count if larger)",
    )
    p.add_argument(
        "--targets",
        default=",".join(DEFAULT_KINDS),
        help="comma list among go,go-mem,nsqx,nsqx-sep (nsqx: one target per --workers N; "
        "nsqx-sep: N separate processes for each N > 1 of --workers)",
    )
    p.add_argument("--nsqd-python", default=sys.executable, metavar="PATH")
    p.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra flag for nsqx's nsqd, e.g. --nsqd-arg=--sync-every=1 (repeatable)",
    )
    p.add_argument(
        "--phases", default=",".join(PHASES), help="comma list among " + ",".join(PHASES)
    )
    p.add_argument("--seconds", type=float, default=5.0, help="timed length of each phase")
    p.add_argument("--fill-seconds", type=float, help="sub: how long to fill (default --seconds)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--size", type=int, default=200, help="message size in bytes")
    p.add_argument("--batch", type=int, default=200, help="messages per MPUB (mpub, sub's fill)")
    p.add_argument("--rdy", type=int, default=2500, help="bench_reader's RDY per connection")
    p.add_argument(
        "--topics",
        type=int,
        default=1,
        help="spread each phase over this many topics, one generator each, the phase's "
        "connections shared out (nsqx: topics chosen to spread evenly over the workers)",
    )
    p.add_argument("--startup-timeout", type=float, default=30.0)
    p.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    args = p.parse_args(argv)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not phases or set(phases) - set(PHASES):
        p.error(f"--phases: some of {','.join(PHASES)}, got {args.phases!r}")
    kinds = [x.strip() for x in args.targets.split(",") if x.strip()]
    if not kinds or set(kinds) - set(TARGET_KINDS):
        p.error(f"--targets: some of {','.join(TARGET_KINDS)}, got {args.targets!r}")
    if min(args.rounds, args.size, args.batch, args.rdy, args.topics) < 1 or args.seconds <= 0:
        p.error("--seconds, --rounds, --size, --batch, --rdy and --topics must be positive")
    go_dir = args.go_dir or default_go_dir()
    workers = args.workers or default_workers()
    return Config(
        go_dir=go_dir,
        targets=make_targets(
            [k for k in TARGET_KINDS if k in kinds],
            go_dir,
            workers,
            args.nsqd_python,
            args.nsqd_arg,
            log,
        ),
        phases=tuple(x for x in PHASES if x in phases),
        seconds=args.seconds,
        fill_seconds=args.fill_seconds or args.seconds,
        rounds=args.rounds,
        size=args.size,
        batch=args.batch,
        rdy=args.rdy,
        startup_timeout=args.startup_timeout,
        json_path=args.json,
        topics=args.topics,
    )


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    def log(line: str) -> None:
        print(line, flush=True)

    cfg = parse_args(argv, log)
    if not executable(cfg.bench_writer):
        log(f"skip: no bench_writer at {cfg.bench_writer} (give --go-dir): nothing to measure")
        return 0
    if "sub" in cfg.phases and not executable(cfg.bench_reader):
        log(f"skip sub: no bench_reader at {cfg.bench_reader}")
        cfg.phases = tuple(p for p in cfg.phases if p != "sub")
    signal.signal(signal.SIGTERM, _sigterm)
    load0 = os.getloadavg()[0]
    log(
        f"{os.cpu_count()} CPUs, {platform.machine()}, load average {load0:.2f}; phases "
        f"{','.join(cfg.phases)}, {cfg.seconds:g} s each, {cfg.rounds} round(s), "
        f"{cfg.topics} topic(s) per phase; "
        f"generators from {cfg.go_dir}"
    )
    for t in cfg.targets:
        if t.skipped is None:
            log(f"{t.name}: {' '.join(t.argv)}")
    bench = Bench(cfg, log)
    try:
        bench.run()
    except BenchError as err:
        print(f"scaling_bench: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scaling_bench: interrupted; servers stopped", file=sys.stderr)
        return 130
    finally:
        bench.close()
    for t in cfg.targets:
        if t.version:
            log(f"{t.name}: {t.version}")
    log("")
    log(tables(cfg))
    if cfg.json_path:
        report = {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "loadavg_1m_at_start": round(load0, 2),
            "config": {
                k: v
                for k, v in asdict(cfg).items()
                if k not in ("results", "targets", "json_path", "go_dir")
            },
            "go_dir": str(cfg.go_dir),
            "targets": [asdict(t) for t in cfg.targets],
            "results": cfg.results,
        }
        with open(cfg.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
