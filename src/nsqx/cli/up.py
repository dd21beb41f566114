"""``nsqx up``: a local cluster on loopback, data in ./data, stopped with Ctrl-C.

Today the cluster is one nsqd; nsqlookupd and the admin join it as they land.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from nsqx.cli.nsqd_cmd import install_event_loop_policy, setup_logging
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions


async def _run(data_dir: str, tcp_port: int, http_port: int = 4151) -> None:
    options = NsqdOptions(
        tcp_address=f"127.0.0.1:{tcp_port}",
        http_address=f"127.0.0.1:{http_port}",
        broadcast_address="127.0.0.1",
        data_path=os.path.join(data_dir, "nsqd"),
    )
    os.makedirs(options.data_path, exist_ok=True)
    nsqd = NSQD(options)
    await nsqd.start()
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    print(
        f"nsqx local cluster is up (Ctrl-C stops it)\n"
        f"  nsqd TCP  {host}:{port}\n"
        f"  data      {os.path.abspath(data_dir)}\n"
        f"try: python -c \"import socket,struct;s=socket.create_connection(('{host}',{port}));"
        f"b=b'hello';s.sendall(b'  V2PUB test\\n'+struct.pack('>i',len(b))+b);print(s.recv(64))\"",
        flush=True,
    )
    if nsqd.http_address is not None:
        h, p = nsqd.http_address
        print(f"  nsqd HTTP {h}:{p}  (curl -d hello 'http://{h}:{p}/pub?topic=test')", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stopping...", file=sys.stderr)
    await nsqd.close()


def run_up(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nsqx up", description=__doc__)
    parser.add_argument("--data-dir", default="data", help="where the cluster keeps its data")
    parser.add_argument("--nsqd-tcp-port", type=int, default=4150)
    parser.add_argument("--nsqd-http-port", type=int, default=4151)
    args = parser.parse_args(argv)
    setup_logging("info", "[nsqd] ")
    logging.getLogger("nsqx").setLevel(logging.WARNING)
    install_event_loop_policy()
    asyncio.run(_run(args.data_dir, args.nsqd_tcp_port, args.nsqd_http_port))
    return 0
