"""Instructions per publish of a whole nsqd process, counted by valgrind's callgrind.

Starts nsqd (``--python``: the interpreter whose nsqx to run, e.g. a compiled build)
under ``valgrind --tool=callgrind`` on free loopback ports, warms it up, zeroes the
counters, has ``--conns`` connections publish ``--count`` messages each one at a time
(a PUB, or bench_writer's MPUB of one, each waiting for its OK), dumps the counters and
prints the user-space instructions per publish: all that nsqd's process ran (the event
loop, the interpreter, the compiled modules, every thread), not the kernel's share.

    python bench/server_instructions.py --python .venv-compiled/bin/python --conns 4
    python bench/server_instructions.py ... --keep cg.out && callgrind_annotate --inclusive=yes cg.out

bench/publish_cost.py counts nsqd's own Python in-process; this counts what the real
server adds around it (uvloop's reads and writes, the answers' frames, the GIL's
hand-offs). Under valgrind nsqd runs some 50 times slower than the publishers, so a
loop iteration mostly finds several connections' next publishes waiting (3.3 publishes
per group commit at 4 connections, 1.7 at 2; on the real machine 2.2 at 4): the count
moves by about 1% from run to run, where timed rounds move by 10-20%. Compare builds on a machine that is not
otherwise busy: when the publishing threads fall behind, fewer publishes share a group
commit and the count grows (5% at 2 connections while the test suite ran beside it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from latency_bench import free_port

from nsqx.wire import commands
from nsqx.wire.frames import MAGIC_V2, OK, encode_response

_OK = encode_response(OK)


def publish(port: int, conns: int, count: int, command: bytes) -> None:
    """``conns`` connections, each sending ``command`` ``count`` times, one at a time;
    raises if an answer is not OK."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(MAGIC_V2)
                for _ in range(count):
                    s.sendall(command)
                    got = b""
                    while len(got) < len(_OK):
                        chunk = s.recv(len(_OK) - len(got))
                        if not chunk:
                            raise ConnectionError("nsqd closed the connection")
                        got += chunk
                    if got != _OK:
                        raise ValueError(f"answer {got!r}, not OK")
        except BaseException as err:  # (raised again by the caller, in its thread)
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"nsqd exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"nsqd not listening after {timeout:g} s") from None
            time.sleep(0.2)


def total_instructions(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="runs nsqd (-m nsqx nsqd)")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--count", type=int, default=1000, help="publishes per connection")
    ap.add_argument("--size", type=int, default=200, help="message body bytes")
    ap.add_argument("--mode", choices=("pub", "mpub"), default="mpub")
    ap.add_argument("--startup-timeout", type=float, default=120.0)
    ap.add_argument(
        "--keep", metavar="FILE", help="copy callgrind's dump here (callgrind_annotate)"
    )
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (apt-get install valgrind)")
    body = b"x" * args.size
    # (an MPUB of one is bench_writer --batch-size 1)
    command = (
        commands.pub("instructions", body)
        if args.mode == "pub"
        else commands.mpub("instructions", [body])
    )
    with tempfile.TemporaryDirectory(prefix="server-instructions-") as tmp:
        out = Path(tmp) / "callgrind.out"
        port, http = free_port(), free_port()
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            args.python,
            "-m",
            "nsqx",
            "nsqd",
            f"--tcp-address=127.0.0.1:{port}",
            f"--http-address=127.0.0.1:{http}",
            f"--data-path={tmp}",
        ]
        log = open(Path(tmp) / "nsqd.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            wait_listening(port, proc, args.startup_timeout)
            # warm up: the topic made, every path of a publish run once
            publish(port, args.conns, max(50, args.count // 10), command)
            control = ["callgrind_control"]
            subprocess.run([*control, "-z", str(proc.pid)], check=True, capture_output=True)
            publish(port, args.conns, args.count, command)
            subprocess.run([*control, "-d", str(proc.pid)], check=True, capture_output=True)
            dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=os.path.getmtime)
            if not dumps:
                raise SystemExit("callgrind wrote no dump")
            total = total_instructions(dumps[-1])
            if args.keep:
                shutil.copyfile(dumps[-1], args.keep)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    n = args.conns * args.count
    what = "PUB" if args.mode == "pub" else "MPUB of one"
    print(
        f"{what} of {args.size} B, {args.conns} connections, {n} publishes: "
        f"{total / n:,.0f} instructions per publish (user space, whole nsqd process)"
    )


if __name__ == "__main__":
    main()
