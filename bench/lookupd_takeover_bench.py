"""Several nsqlookupd over etcd: how long until another one leads when the leader goes.

Starts one etcd (Debian's ``etcd`` binary, free loopback ports, data in a temporary
directory) and, ``--rounds`` times for each case, two ``nsqx nsqlookupd
--etcd-endpoints`` processes (a cluster id per round); waits until both name the same
leader in ``/listlookup``, stops the leader, and times until the other one names itself.
Cases: SIGKILL with ``--etcd-lease-ttl`` 2 s and 5 s (the lease must expire), and
SIGTERM with 5 s (the leader revokes its lease on the way out). Prints each case's
median and range.

    python bench/lookupd_takeover_bench.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> Any:
    req = urllib.request.Request(url, headers=V1)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def start_etcd(etcd: str, data: str) -> tuple[subprocess.Popen[bytes], str]:
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            etcd,
            "--name=b",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=b={peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        try:
            if get(f"{client}/health").get("health") == "true":
                return proc, client
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("etcd did not start")


def start_lookupd(endpoint: str, cluster: str, ttl: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqx",
            "nsqlookupd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
            f"--etcd-endpoints={endpoint}",
            f"--cluster-id={cluster}",
            f"--etcd-lease-ttl={ttl}s",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    stderr = proc.stderr
    assert stderr is not None
    for line in stderr:
        m = re.search(r"HTTP: listening on [\d.]+:(\d+)", line)
        if m:
            # keep reading its log, so that a full pipe never stalls it
            threading.Thread(target=stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    raise SystemExit("nsqlookupd did not start")


def leader_port(http_port: int) -> str:
    try:
        return str(get(f"http://127.0.0.1:{http_port}/listlookup")["lookupdleader"]["HttpPort"])
    except OSError:
        return ""


def takeover(endpoint: str, cluster: str, ttl: int, sig: int) -> float:
    procs = [start_lookupd(endpoint, cluster, ttl) for _ in range(2)]
    try:
        while True:
            ports = {leader_port(p) for _, p in procs}
            if len(ports) == 1 and "" not in ports:
                break
            time.sleep(0.01)
        leader = next(x for x in procs if str(x[1]) == ports.pop())
        other = next(x for x in procs if x is not leader)
        began = time.monotonic()
        leader[0].send_signal(sig)
        while leader_port(other[1]) != str(other[1]):
            time.sleep(0.01)
        return time.monotonic() - began
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    etcd = shutil.which("etcd")
    if etcd is None:
        raise SystemExit("no etcd binary (apt-get install etcd-server)")
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint = start_etcd(etcd, tmp)
        try:
            cases = ((2, signal.SIGKILL, "SIGKILL"), (5, signal.SIGKILL, "SIGKILL"))
            for n, (ttl, sig, name) in enumerate((*cases, (5, signal.SIGTERM, "SIGTERM"))):
                times = [takeover(endpoint, f"bench{n}-{r}", ttl, sig) for r in range(args.rounds)]
                print(
                    f"lease ttl {ttl}s, leader {name}: another leads after median "
                    f"{statistics.median(times):.2f}s (range {min(times):.2f}-{max(times):.2f}s,"
                    f" {len(times)} rounds)"
                )
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
