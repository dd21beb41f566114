"""``nsqx``: the command-line entry point and its subcommands."""

from __future__ import annotations

import sys

USAGE = """usage: nsqx <command> [flags]

commands:
  nsqd      run the NSQ daemon (flags as Go nsqd's: nsqx nsqd --help)
  nsqlookupd
            run the discovery daemon (flags as Go nsqlookupd's)
  up        start a local cluster on loopback (make up)
"""


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
    if command == "up":
        from nsqx.cli.up import run_up

        return run_up(rest)
    print(f"nsqx: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
