"""``nsqx up``: a local cluster on loopback, data in ./data, stopped with Ctrl-C.

nsqlookupd, one nsqd registered with it, and nsqadmin reading the lookupd, in one
process. Ports default to NSQ's standard ones (it is for humans); 0 picks free ports.
It prints what to try next, as lines that do what they say when pasted in order: the
topic ``test`` is made with the two channels the lines read (``tail`` and ``archive``),
so each gets every message published to ``test``, whichever line runs first.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import shutil
import sys

import aiohttp

from nsqx.admin import AdminOptions, NSQAdmin
from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.cli.version import version_line
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions

HOST = "127.0.0.1"


def nsqx_command() -> str:
    """How to type ``nsqx`` in the shell that started this one: ``nsqx`` when the PATH
    finds this installation's script, else the script beside this interpreter
    (``.venv/bin/nsqx`` after ``make up``, relative to the current directory when it is
    under it; make does not put .venv/bin on the PATH)."""
    script = os.path.join(os.path.dirname(sys.executable), "nsqx")
    if not os.path.isfile(script):
        return "nsqx"
    found = shutil.which("nsqx")
    if found and os.path.samefile(found, script):
        return "nsqx"
    relative = os.path.relpath(script)
    if relative.startswith(os.pardir):
        return shlex.quote(script)
    return shlex.quote(relative if os.sep in relative else os.path.join(os.curdir, relative))


#: the topic the printed lines use, and the channels made for them on it
TOPIC = "test"
CHANNELS = ("tail", "archive")


def _examples(nsqx: str, nsqd_tcp: str, nsqd_http: str, lookupd_http: str, archive: str) -> str:
    """What to try next, with the tools (each has --help), as lines to paste in order:
    ``nsqx`` is how this shell finds the command (nsqx_command). A line that runs until
    Ctrl-C says so in a shell comment (pasted, the comment does nothing)."""
    header = "try, in another terminal, in this order:"
    activate = os.path.join(os.path.dirname(shlex.split(nsqx)[0]), "activate")
    if nsqx != "nsqx" and os.path.isfile(activate):
        header = (
            "try, in another terminal, in this order (or run "
            f"`source {shlex.quote(activate)}` first: then nsqx is on the PATH):"
        )
    lookupd = f"--lookupd-http-address={lookupd_http}"
    until = "runs until Ctrl-C"
    return "\n".join(
        [
            header,
            f"  publish:  echo hello | {nsqx} pub --topic={TOPIC} --nsqd-tcp-address={nsqd_tcp}",
            f"  tail:     {nsqx} tail --topic={TOPIC} --channel=tail {lookupd}"
            f"  # prints hello, then what comes; {until}",
            f"  stats:    {nsqx} stat --topic={TOPIC} --channel=tail {lookupd}"
            f"  # the channel's numbers every 2s; {until}",
            f"  archive:  {nsqx} to-file --topic={TOPIC} --channel=archive {lookupd}"
            f" --output-dir={shlex.quote(archive)}  # writes hello, then what comes, to"
            f" {archive}/{TOPIC}.*.log; {until}",
            f"  http:     curl -d world 'http://{nsqd_http}/pub?topic={TOPIC}'"
            "  # a tail or archive still running shows it",
            f"  lookup:   curl 'http://{lookupd_http}/lookup?topic={TOPIC}'",
            f"(topic {TOPIC} was made with the channels {' and '.join(CHANNELS)}: each keeps"
            f" every message published to {TOPIC} until its line reads it)",
        ]
    )


async def _make_demo_topic(nsqd_http: str) -> None:
    """The topic of the printed lines, with their channels, through nsqd's own HTTP API
    (as a user would make them; it is a no-op when they are there already)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        paths = [f"/topic/create?topic={TOPIC}"]
        paths += [f"/channel/create?topic={TOPIC}&channel={c}" for c in CHANNELS]
        for path in paths:
            async with session.post(f"http://{nsqd_http}{path}") as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise OSError(f"POST {path}: {resp.status} {text}")


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
    try:
        await _make_demo_topic(nsqd_http)
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        # the cluster works without it: the lines' topic is then made by the first publish
        print(f"nsqx up: cannot make the topic {TOPIC} for the lines below: {err}", flush=True)
    print("\n".join(lines), flush=True)
    # the archive goes beside the cluster's data (./data is ignored by git), not into
    # the directory nsqx up was started in
    archive = os.path.join(args.data_dir, "archive")
    print(_examples(nsqx_command(), nsqd_tcp, nsqd_http, lookupd_http, archive), flush=True)
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
    parser.add_argument("--version", action="version", version=version_line("nsqx up"))
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, a bad flag: argparse's exit status
        return done.code if isinstance(done.code, int) else 2
    setup_logging("info", "[nsqx] ")
    logging.getLogger("nsqx").setLevel(logging.WARNING)
    install_event_loop_policy()
    try:
        asyncio.run(_run(args))
    except OSError as err:
        print(f"nsqx up: {err}", file=sys.stderr)
        return 1
    return 0
