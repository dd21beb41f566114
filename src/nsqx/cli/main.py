"""``nsqx``: the command-line entry point and its subcommands."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

USAGE = """usage: nsqx <command> [flags]   (nsqx <command> --help for its flags and examples)
       nsqx --version             (nsqx <command> --version: the Go program's line)

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
    """``nsqx``'s entry point: the command's exit status.

    A closed stdout (``nsqx nsqd --help | head``, ``nsqx tail ... | head -1``) ends any
    command quietly with status 0, as the reader asked for no more, and never with a
    traceback: what is still buffered is flushed here, where the error can be caught,
    rather than at the interpreter's exit, where it cannot.
    """
    try:
        status = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_output()
        return 0
    return status


def _discard_output() -> None:
    """Point stdout and stderr at /dev/null: the interpreter's last flush of what they
    still buffer then goes nowhere instead of failing on the closed pipe again (Python's
    documented way, "Note on SIGPIPE" in the signal module)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        # (io.UnsupportedOperation: a stream that is no file, as pytest's capture)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


def _run(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("--version", "-version", "version"):
        from nsqx.cli.version import nsqx_version_line

        print(nsqx_version_line())
        return 0
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
