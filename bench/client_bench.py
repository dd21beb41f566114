"""Client benchmark: our nsqx.client against pynsq, gnsq, ansq and nsq-py, same nsqd.

For every client, three figures, each from a process of its own running that client's
public API (bench/client_drivers/<client>_driver.py), one after the other against the
same nsqd:

``pub``   PUB round trips: ``--pub-count`` messages, each publish awaited (or blocking)
          before the next; every one must be acknowledged OK.
``mpub``  MPUB round trips of ``--batch`` (200) messages, ``--count`` messages in all.
``sub``   consume ``--count`` messages (published beforehand by this harness) with
          max_in_flight ``--max-in-flight`` (2500); every body is checked (size, content,
          index) and every message FINed; the time runs until all were seen.

Messages are ``--size`` (200) bytes. The publishing phases write to ``#ephemeral``
topics (no channel: nsqd keeps at most mem-queue-size of them), the consuming phase
reads a topic filled by this harness just before. Rates are msgs/s of wall time; the
client's CPU per message (user + system time of the driver process during the phase)
and the server's (from /proc) are reported too: on a shared machine they are steadier.

pynsq and nsq-py both install a module named ``nsq``: every peer client runs from a
venv of its own, created under a temporary directory (``--venv-dir`` keeps and reuses
them), unless this interpreter already has the right library (pynsq, gnsq and ansq are
dev dependencies of nsqx). asyncnsq needs Python >= 3.12 and is not benchmarked.

Run: ``.venv/bin/python bench/client_bench.py`` (all clients, one round), or e.g.
``--clients nsqx,nsq-py --count 50000 --rounds 3``. Without ``--nsqd-tcp-address`` it
starts our nsqd (like bench/server_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from server_bench import BenchError, OwnServer, parse_address, server_cpu_seconds

from nsqx.client import Producer

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "client_drivers"
MODES = ("pub", "mpub", "sub")
TITLES = {"pub": "PUB round trips", "mpub": "MPUB x{batch}", "sub": "consume + FIN"}


@dataclass(frozen=True)
class ClientSpec:
    name: str
    driver: str
    #: Python code that succeeds only where the right library is importable
    probe: str
    requirements: tuple[str, ...]
    #: never use this interpreter (a conflicting module of the same name is here)
    own_venv: bool = False


CLIENTS = {
    "nsqx": ClientSpec("nsqx", "nsqx_driver.py", "import nsqx.client, uvloop", ()),
    "pynsq": ClientSpec(
        "pynsq",
        "pynsq_driver.py",
        "import nsq, tornado, uvloop; nsq.Writer",
        ("pynsq==0.9.1", "tornado>=6.1", "uvloop"),
    ),
    "gnsq": ClientSpec("gnsq", "gnsq_driver.py", "import gnsq", ("gnsq==1.0.2",)),
    "ansq": ClientSpec("ansq", "ansq_driver.py", "import ansq, uvloop", ("ansq==0.3.0", "uvloop")),
    "nsq-py": ClientSpec(
        "nsq-py",
        "nsqpy_driver.py",
        "import nsq.sockets; from nsq.client import Client; from nsq.reader import Reader",
        ("nsq-py==0.1.12",),
        own_venv=True,
    ),
}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _probe(python: str, code: str) -> bool:
    return (
        subprocess.run(
            [python, "-c", code], capture_output=True, env=_env(), timeout=120
        ).returncode
        == 0
    )


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return env


def interpreter(spec: ClientSpec, venv_root: Path) -> str:
    """The Python that runs this client's driver (a venv made for it if need be)."""
    if not spec.own_venv and _probe(sys.executable, spec.probe):
        return sys.executable
    venv = venv_root / spec.name
    python = str(venv / "bin" / "python")
    if Path(python).exists() and _probe(python, spec.probe):
        return python
    log(f"[{spec.name}] creating a venv in {venv} ({' '.join(spec.requirements)})")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", *spec.requirements],
        check=True,
        env=_env(),
        timeout=900,
    )
    if not _probe(python, spec.probe):
        raise BenchError(f"{spec.name}: installed, but `{spec.probe}` still fails")
    return python


async def _fill(address: str, topic: str, count: int, size: int, batch: int) -> None:
    """Publish the messages a consuming phase will read (pipelined MPUBs)."""
    sys.path.insert(0, str(DRIVERS))
    import _drivercommon as dc

    fill = dc.filler(size)
    async with Producer(address) as p:
        pending = []
        for start in range(0, count, batch):
            bodies = [dc.make_body(i, size, fill) for i in range(start, min(start + batch, count))]
            pending.append(p.multi_publish(topic, bodies))
            if len(pending) >= 16:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)


def run_driver(
    python: str, spec: ClientSpec, mode: str, args: argparse.Namespace, address: str, topic: str
) -> dict[str, Any]:
    count = args.pub_count if mode == "pub" else args.count
    cmd = [
        python,
        str(DRIVERS / spec.driver),
        mode,
        address,
        topic,
        str(count),
        str(args.size),
        str(args.max_in_flight),
        str(args.batch),
    ]
    env = _env()
    env["BENCH_DRIVER_TIMEOUT"] = str(args.timeout)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout + 30)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not result or "error" in result:
        raise BenchError(
            f"{spec.name} {mode}: exit {proc.returncode}, {result.get('error', 'no result')}\n"
            f"stderr: {proc.stderr[-2000:]}"
        )
    if result.get("bad") or result.get("dups"):
        log(f"[{spec.name}] {mode}: {result['bad']} bad and {result['dups']} duplicate messages")
    result["rate"] = count / result["seconds"] if result["seconds"] else 0.0
    result["client_us"] = result["cpu"] / count * 1e6
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [n for n in names if n not in CLIENTS]
    if unknown:
        raise BenchError(f"unknown clients {unknown}; known: {', '.join(CLIENTS)}")
    venv_root = Path(args.venv_dir) if args.venv_dir else Path(tempfile.mkdtemp(prefix="nsqx-cb-"))
    server: OwnServer | None = None
    try:
        pythons = {n: interpreter(CLIENTS[n], venv_root) for n in names}
        if args.nsqd_tcp_address:
            host, port = parse_address(args.nsqd_tcp_address)
            pid = args.server_pid
        else:
            server = OwnServer(startup_timeout=30)
            host, port = server.start()
            pid = server.pid
        address = f"{host}:{port}"
        log(f"nsqd at {address}; clients {', '.join(names)}; {args.rounds} round(s)")
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            n: {m: [] for m in MODES} for n in names
        }
        for rnd in range(args.rounds):
            for name in names:
                spec = CLIENTS[name]
                for mode in args.modes.split(","):
                    tag = secrets.token_hex(3)
                    topic = f"cb-{name}-{mode}-{tag}"
                    if mode == "sub":
                        uvloop.run(_fill(address, topic, args.count, args.size, args.batch))
                    else:
                        topic += "#ephemeral"
                    s0 = server_cpu_seconds(pid)
                    result = run_driver(pythons[name], spec, mode, args, address, topic)
                    s1 = server_cpu_seconds(pid)
                    n = args.pub_count if mode == "pub" else args.count
                    result["server_us"] = (s1 - s0) / n * 1e6 if s0 is not None and s1 else None
                    runs[name][mode].append(result)
                    log(
                        f"[round {rnd + 1}] {name:7s} {mode:5s} {result['rate']:>12,.0f} msgs/s"
                        f"  client {result['client_us']:.2f} us/msg"
                    )
                    if server is not None:
                        server.check_alive(f"after {name} {mode}")
        report: dict[str, Any] = {
            "nsqd": address,
            "own_server": server is not None,
            "count": args.count,
            "pub_count": args.pub_count,
            "size": args.size,
            "batch": args.batch,
            "max_in_flight": args.max_in_flight,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "clients": {},
        }
        for name in names:
            report["clients"][name] = {}
            for mode, results in runs[name].items():
                if not results:
                    continue
                report["clients"][name][mode] = {
                    "rate": statistics.median(r["rate"] for r in results),
                    "client_us": statistics.median(r["client_us"] for r in results),
                    "server_us": _median_or_none([r["server_us"] for r in results]),
                    "rates": [round(r["rate"]) for r in results],
                }
        return report
    finally:
        if server is not None:
            complaint = server.stop()
            if complaint:
                log(complaint)
        if not args.venv_dir:
            shutil.rmtree(venv_root, ignore_errors=True)


def _median_or_none(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def format_report(report: dict[str, Any]) -> str:
    modes = [m for m in MODES if any(m in c for c in report["clients"].values())]
    head = ["client"] + [TITLES[m].format(batch=report["batch"]) for m in modes]
    lines = [
        f"nsqd {'(ours, started by the bench)' if report['own_server'] else report['nsqd']}, "
        f"{report['size']} B messages, {report['count']:,} per MPUB/consume phase, "
        f"{report['pub_count']:,} PUB round trips, max_in_flight {report['max_in_flight']}, "
        f"median of {report['rounds']} round(s), {report['cpus']} CPUs",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for name, figures in report["clients"].items():
        cells = [name]
        for m in modes:
            f = figures.get(m)
            cells.append(f"{f['rate']:,.0f} ({f['client_us']:.2f} µs)" if f else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("msgs/s (client CPU per message). Server CPU per message, µs:")
    for name, figures in report["clients"].items():
        parts = [
            f"{m} {figures[m]['server_us']:.2f}"
            for m in modes
            if m in figures and figures[m]["server_us"] is not None
        ]
        lines.append(f"  {name}: {', '.join(parts) if parts else 'n/a'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated (%(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated (%(default)s)")
    p.add_argument("--count", type=int, default=200_000, help="messages per MPUB and consume phase")
    p.add_argument("--pub-count", type=int, default=None, help="PUB round trips (default --count)")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--max-in-flight", type=int, default=2500)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600, help="seconds per driver run")
    p.add_argument("--venv-dir", help="keep the peer clients' venvs here (and reuse them)")
    p.add_argument("--nsqd-tcp-address", help="benchmark against this nsqd instead of ours")
    p.add_argument("--server-pid", type=int, help="its pid, for the server CPU figures")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.pub_count is None:
        args.pub_count = args.count
    if args.size < 9:
        p.error("--size must be at least 9 (an 8-digit index and some filler)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        report = run(args)
    except (BenchError, subprocess.SubprocessError, OSError) as exc:
        log(f"client bench failed: {exc}")
        return 1
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    log(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
