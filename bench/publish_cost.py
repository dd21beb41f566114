"""What nsqd's Python costs per publish, without sockets: CPU time, or instructions.

Fake connections feed ``ClientV2.data_received`` one PUB or one single-message MPUB
each (bench_writer's shape) per event-loop turn; the turn's end (the group commit,
the answers) runs as in nsqd. Sockets, the event loop's own I/O and the kernel are
left out, so the figure is nsqd's own work per publish: the part a change to the
Python (or to what mypyc compiles) moves.

    python bench/publish_cost.py --conns 2 --mode mpub           # µs per publish
    python bench/publish_cost.py --conns 2 --mode mpub --callgrind

``--callgrind`` runs the same under valgrind's callgrind (valgrind must be installed)
and counts the instructions of ``data_received`` and the turn's end, compiled build
only (it finds them by their C names): a count does not depend on what else the
machine does, so two builds can be compared on a busy machine, run after run. The log
is written to a temporary directory (under /dev/shm when it exists).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import uvloop

from nsqx.compiled import build_description, compiled_modules
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire import MAGIC_V2

#: the functions callgrind counts (mypyc's C names): every read, every turn's end
_TOGGLES = (
    "CPyDef_client_v2___ClientV2___data_received",
    "CPyDef_loopturn___LoopTurn____end",
)
_REPEATS = 5


class FakeTransport:
    """Just enough of an asyncio transport; ``write`` is a C-level list append, so that
    the transport's own cost stays out of the figure."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.write = self.sent.append

    def writelines(self, data: list[bytes]) -> None:
        self.sent.extend(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def command(mode: str, size: int, batch: int = 1) -> bytes:
    body = b"x" * size
    if mode == "mpub":
        one = struct.pack(">i", size) + body
        return b"MPUB bench\n" + struct.pack(">ii", 4 + batch * len(one), batch) + one * batch
    return b"PUB bench\n" + struct.pack(">i", size) + body


async def measure(conns: int, turns: int, mode: str, size: int, batch: int) -> tuple[float, int]:
    """(best µs of CPU per publish command over _REPEATS runs, commands answered)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data_path = tempfile.mkdtemp(prefix="nsqx-publish-cost-", dir=base)
    nsqd = NSQD(
        NsqdOptions(
            tcp_address="127.0.0.1:0", http_address="", https_address="", data_path=data_path
        )
    )
    try:
        await nsqd.start()
        frame = command(mode, size, batch)
        clients = []
        for _ in range(conns):
            client = ClientV2(nsqd)
            transport = FakeTransport()
            client.connection_made(transport)  # type: ignore[arg-type]
            client.data_received(MAGIC_V2 + frame)  # the first: the topic is made
            clients.append((client, transport))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        best = float("inf")
        for _ in range(_REPEATS):
            start = time.process_time()
            for _ in range(turns):
                for client, _t in clients:
                    client.data_received(frame)
                await asyncio.sleep(0)  # the loop turn ends: commit, answers
            best = min(best, (time.process_time() - start) / (turns * conns) * 1e6)
        answered = sum(len(t.sent) for _c, t in clients)
        return best, answered
    finally:
        await nsqd.close()
        shutil.rmtree(data_path, ignore_errors=True)


def run_callgrind(args: argparse.Namespace) -> int:
    if not shutil.which("valgrind"):
        print("valgrind is not installed", file=sys.stderr)
        return 2
    if "nsqx.nsqd.client_v2" not in compiled_modules():
        print(
            "--callgrind counts the compiled build's functions: not compiled here", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            *(f"--toggle-collect={name}" for name in _TOGGLES),
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            f"--conns={args.conns}",
            f"--turns={args.turns}",
            f"--mode={args.mode}",
            f"--size={args.size}",
            f"--batch={args.batch}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        m = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode or m is None:
            print(proc.stdout + proc.stderr[-2000:], file=sys.stderr)
            return 1
        # the first command of each connection was measured too (the topic's creation)
        publishes = _REPEATS * args.turns * args.conns + args.conns
        per = int(m.group(1)) / publishes
        print(
            f"{build_description()}: {args.mode} of {args.batch} x {args.size} B, "
            f"{args.conns} connections: "
            f"{per:,.0f} instructions per publish (callgrind; data_received and the turn's end)"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--conns", type=int, default=2, help="fake connections, one publish each per turn"
    )
    ap.add_argument("--turns", type=int, default=20000, help="loop turns per run (5 runs)")
    ap.add_argument("--mode", choices=("pub", "mpub"), default="mpub")
    ap.add_argument("--size", type=int, default=200, help="message bytes")
    ap.add_argument("--batch", type=int, default=1, help="messages per MPUB")
    ap.add_argument("--callgrind", action="store_true", help="count instructions instead")
    args = ap.parse_args()
    if args.callgrind:
        if args.turns == ap.get_default("turns"):
            args.turns = 2000  # callgrind runs some 50 times slower
        return run_callgrind(args)
    if args.batch != 1 and args.mode != "mpub":
        ap.error("--batch is for --mode mpub")
    best, answered = uvloop.run(measure(args.conns, args.turns, args.mode, args.size, args.batch))
    expected = (_REPEATS * args.turns + 1) * args.conns
    if answered != expected:
        print(f"answered {answered} of {expected} publishes", file=sys.stderr)
        return 1
    print(
        f"{build_description()}: {args.mode} of {args.batch} x {args.size} B, "
        f"{args.conns} connections: "
        f"{best:.2f} µs of CPU per publish (best of {_REPEATS})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
