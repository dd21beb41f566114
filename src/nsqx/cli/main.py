"""``nsqx``: the command-line entry point and its subcommands."""

from __future__ import annotations

import importlib
import sys

USAGE = """usage: nsqx <command> [flags]   (nsqx <command> --help for its flags and examples)

daemons:
  nsqd        the NSQ daemon (flags as Go nsqd's)
  nsqlookupd  the discovery daemon (flags as Go nsqlookupd's)
  nsqadmin    the web admin (flags as Go nsqadmin's)
  up          a local cluster on loopback: nsqlookupd, nsqd and nsqadmin (make up)

tools (flags as NSQ's Go tools):
  tail        print a topic's messages (nsq_tail)
  pub         publish lines from stdin or a file (to_nsq)
  to-file     archive topics to rotating files (nsq_to_file)
  to-http     send messages to HTTP endpoints (nsq_to_http)
  to-nsq      relay topics to another nsqd (nsq_to_nsq)
  stat        a channel's numbers every interval (nsq_stat)
  bench       throughput benchmark of an nsqd (bench_writer / bench_reader)
  replicas    replicated partitions: leader, ISR, lag; drain a node, move a leader
"""

#: command -> module of nsqx.cli with a TOOL; NSQ's Go names work too
TOOLS = {
    "tail": "tail",
    "nsq_tail": "tail",
    "pub": "pub",
    "to_nsq": "pub",
    "to-file": "to_file",
    "nsq_to_file": "to_file",
    "to-http": "to_http",
    "nsq_to_http": "to_http",
    "to-nsq": "to_nsq",
    "nsq_to_nsq": "to_nsq",
    "stat": "stat",
    "nsq_stat": "stat",
    "bench": "bench",
    "replicas": "replicas",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "nsqd":
        from nsqx.cli.nsqd_cmd import run_nsqd

        return run_nsqd(rest)
    if command == "nsqlookupd":
        from nsqx.cli.nsqlookupd_cmd import run_nsqlookupd

        return run_nsqlookupd(rest)
    if command == "nsqadmin":
        from nsqx.cli.nsqadmin_cmd import run_nsqadmin

        return run_nsqadmin(rest)
    if command == "up":
        from nsqx.cli.up import run_up

        return run_up(rest)
    if command in TOOLS:
        from nsqx.cli.toolbase import run_tool

        module = importlib.import_module(f"nsqx.cli.{TOOLS[command]}")
        return run_tool(module.TOOL, rest)
    print(f"nsqx: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
