"""``nsqx up``: a local cluster on loopback, data in ./data, stopped with Ctrl-C.

nsqlookupd, one nsqd registered with it, and nsqadmin reading the lookupd, in one
process. Ports default to NSQ's standard ones (it is for humans); 0 picks free ports.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from nsqx.admin import AdminOptions, NSQAdmin
from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions

HOST = "127.0.0.1"


def _examples(nsqd_tcp: str, nsqd_http: str, lookupd_http: str) -> str:
    """What to try next, with the tools (each has --help)."""
    return "\n".join(
        [
            "try:",
            f"  publish:  echo hello | nsqx pub --topic=test --nsqd-tcp-address={nsqd_tcp}",
            f"  tail:     nsqx tail --topic=test --lookupd-http-address={lookupd_http}",
            f"  stats:    nsqx stat --topic=test --channel=tail"
            f" --lookupd-http-address={lookupd_http}",
            f"  archive:  nsqx to-file --topic=test --lookupd-http-address={lookupd_http}"
            " --output-dir=./archive",
            f"  http:     curl -d hello 'http://{nsqd_http}/pub?topic=test'",
            f"  lookup:   curl 'http://{lookupd_http}/lookup?topic=test'",
        ]
    )


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
    admin = NSQAdmin(
        AdminOptions(
            http_address=f"{HOST}:{args.admin_http_port}",
            nsqlookupd_http_addresses=[lookupd_http],
        )
    )
    try:
        await admin.start()
    except BaseException:
        await nsqd.close()
        await lookupd.close()
        raise
    lines = [
        "nsqx local cluster is up (Ctrl-C stops it)",
        f"  nsqadmin         http://{HOST}:{admin.http_port}/",
        f"  nsqlookupd TCP   {lookupd_tcp}",
        f"  nsqlookupd HTTP  http://{lookupd_http}",
        f"  nsqd TCP         {nsqd_tcp}",
    ]
    # nsqd's HTTP API is shown once nsqd serves it (it then records the bound address)
    nsqd_http = f"{HOST}:{args.nsqd_http_port}"
    bound = getattr(nsqd, "http_address", None)
    if isinstance(bound, tuple):
        nsqd_http = f"{HOST}:{bound[1]}"
        lines.append(f"  nsqd HTTP        http://{nsqd_http}")
    lines.append(f"  data             {os.path.abspath(args.data_dir)}")
    print("\n".join(lines), flush=True)
    print(_examples(nsqd_tcp, nsqd_http, lookupd_http), flush=True)
    await wait_for_termination()
    print("stopping...", file=sys.stderr, flush=True)
    await admin.close()
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
    parser.add_argument("--admin-http-port", type=int, default=4171)
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
