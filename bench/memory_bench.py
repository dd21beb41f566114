"""Memory benchmark: nsqd's RSS while a topic holds many queued messages.

Starts `nsqx nsqd` on a temporary data directory, creates a channel that does not
consume (so every message stays queued), publishes N messages of SIZE bytes with MPUB
batches, and prints the server's RSS (VmRSS and VmHWM from /proc) along the way. Then it
restarts nsqd on the same data and prints the RSS after recovery, and the time it took.

    python bench/memory_bench.py --messages 10000000 --size 200
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = b"  V2"


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    return rss, hwm


def start(data: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqx",
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={data}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"TCP: listening on [\d.]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    raise RuntimeError("nsqd did not start")


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 8:
        head += sock.recv(8 - len(head))
    size, ftype = struct.unpack(">ii", head)
    data = b""
    while len(data) < size - 4:
        data += sock.recv(size - 4 - len(data))
    return ftype, data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=16, help="MPUBs outstanding at most")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="nsqx-membench-")
    try:
        proc, port = start(data)
        sub = socket.create_connection(("127.0.0.1", port))
        sub.sendall(MAGIC + b"SUB held ch\n")  # a channel that never sends RDY
        assert read_frame(sub) == (0, b"OK")
        pub = socket.create_connection(("127.0.0.1", port))
        pub.sendall(MAGIC)
        body = (
            struct.pack(">i", args.batch)
            + (struct.pack(">i", args.size) + b"x" * args.size) * args.batch
        )
        mpub = b"MPUB held\n" + struct.pack(">i", len(body)) + body
        batches = args.messages // args.batch
        sent = acked = 0
        t0 = time.monotonic()
        report_every = max(batches // 10, 1)
        while acked < batches:
            while sent < batches and sent - acked < args.window:
                pub.sendall(mpub)
                sent += 1
            ftype, payload = read_frame(pub)
            if (ftype, payload) != (0, b"OK"):
                print(f"error from nsqd: {payload!r}", file=sys.stderr)
                return 1
            acked += 1
            if acked % report_every == 0:
                rss, hwm = rss_kb(proc.pid)
                print(
                    f"{acked * args.batch:>11,} queued  RSS {rss / 1024:7.1f} MB  peak {hwm / 1024:7.1f} MB"
                )
        elapsed = time.monotonic() - t0
        rss, hwm = rss_kb(proc.pid)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
        print(
            f"published {acked * args.batch:,} in {elapsed:.1f}s ({acked * args.batch / elapsed:,.0f} msgs/s); "
            f"RSS {rss / 1024:.1f} MB, peak {hwm / 1024:.1f} MB; {disk / 2**30:.2f} GiB on disk"
        )
        sub.close()
        pub.close()
        proc.terminate()
        proc.wait(60)
        t1 = time.monotonic()
        proc, port = start(data)
        ready = time.monotonic() - t1
        rss, hwm = rss_kb(proc.pid)
        print(
            f"restart: listening after {ready:.1f}s; RSS {rss / 1024:.1f} MB, peak {hwm / 1024:.1f} MB"
        )
        proc.terminate()
        proc.wait(60)
        return 0
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
