"""``nsqx up``: a local cluster on loopback, data in ./data, stopped with Ctrl-C.

nsqlookupd and one nsqd registered with it, in one process; the admin joins as it lands.
Ports default to NSQ's standard ones (it is for humans); 0 picks free ports.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions

HOST = "127.0.0.1"


def _examples(tcp: str, lookupd_http: str) -> str:
    """One line to publish, one to tail (both plain python3, protocol V2 by hand)."""
    host, port = tcp.rsplit(":", 1)
    conn = f"s=socket.create_connection(('{host}',{port}))"
    publish = (
        f"python3 -c \"import socket,struct;{conn};b=b'hello';"
        f"s.sendall(b'  V2PUB test\\n'+struct.pack('>i',len(b))+b);print(s.recv(64))\""
    )
    tail = (
        f'python3 -c "import socket,struct;{conn};'
        f"s.sendall(b'  V2SUB test tail#ephemeral\\nRDY 100\\n');r=s.makefile('rb').read;"
        f"[(print(d[26:].decode(errors='replace'),flush=True),s.sendall(b'FIN '+d[10:26]+b'\\n'))"
        f" if k==2 else d==b'_heartbeat_' and s.sendall(b'NOP\\n')"
        f" for n,k in iter(lambda:struct.unpack('>ii',r(8)),None) for d in [r(n-4)]]\""
    )
    lookup = f"curl 'http://{lookupd_http}/lookup?topic=test'"
    return f"publish: {publish}\ntail:    {tail}\nlookup:  {lookup}"


async def _run(args: argparse.Namespace) -> None:
    # lookupd keeps partitioned topics' settings and placements here across restarts
    lookupd_data = os.path.join(args.data_dir, "nsqlookupd")
    os.makedirs(lookupd_data, exist_ok=True)
    lookupd = NSQLookupd(
        LookupdOptions(
            tcp_address=f"{HOST}:{args.lookupd_tcp_port}",
            http_address=f"{HOST}:{args.lookupd_http_port}",
            broadcast_address=HOST,
            data_path=lookupd_data,
        )
    )
    await lookupd.start()
    lookupd_tcp = f"{HOST}:{lookupd.tcp_port}"
    lookupd_http = f"{HOST}:{lookupd.http_port}"
    options = NsqdOptions(
        tcp_address=f"{HOST}:{args.nsqd_tcp_port}",
        http_address=f"{HOST}:{args.nsqd_http_port}",
        broadcast_address=HOST,
        nsqlookupd_tcp_addresses=[lookupd_tcp],
        data_path=os.path.join(args.data_dir, "nsqd"),
    )
    os.makedirs(options.data_path, exist_ok=True)
    nsqd = NSQD(options)
    try:
        await nsqd.start()
    except BaseException:
        await lookupd.close()
        raise
    assert nsqd.tcp_address is not None
    nsqd_tcp = f"{HOST}:{nsqd.tcp_address[1]}"
    lines = [
        "nsqx local cluster is up (Ctrl-C stops it)",
        f"  nsqlookupd TCP   {lookupd_tcp}",
        f"  nsqlookupd HTTP  http://{lookupd_http}",
        f"  nsqd TCP         {nsqd_tcp}",
    ]
    # nsqd's HTTP API is shown once nsqd serves it (it then records the bound address)
    nsqd_http = getattr(nsqd, "http_address", None)
    if isinstance(nsqd_http, tuple):
        lines.append(f"  nsqd HTTP        http://{HOST}:{nsqd_http[1]}")
    lines.append(f"  data             {os.path.abspath(args.data_dir)}")
    print("\n".join(lines), flush=True)
    print(_examples(nsqd_tcp, lookupd_http), flush=True)
    await wait_for_termination()
    print("stopping...", file=sys.stderr, flush=True)
    await nsqd.close()
    await lookupd.close()
    print("stopped", file=sys.stderr, flush=True)


def run_up(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nsqx up", description=__doc__)
    parser.add_argument("--data-dir", default="data", help="where the cluster keeps its data")
    parser.add_argument("--nsqd-tcp-port", type=int, default=4150)
    parser.add_argument("--nsqd-http-port", type=int, default=4151)
    parser.add_argument("--lookupd-tcp-port", type=int, default=4160)
    parser.add_argument("--lookupd-http-port", type=int, default=4161)
    args = parser.parse_args(argv)
    setup_logging("info", "[nsqx] ")
    logging.getLogger("nsqx").setLevel(logging.WARNING)
    install_event_loop_policy()
    try:
        asyncio.run(_run(args))
    except OSError as err:
        print(f"nsqx up: {err}", file=sys.stderr)
        return 1
    return 0
