"""``nsqx nsqlookupd``: run the lookup daemon until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqlookupd_flags import (
    nsqlookupd_usage,
    parse_nsqlookupd_args,
    wants_help,
    wants_version,
)
from nsqx.cli.version import version_line
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions

log = logging.getLogger("nsqx.lookupd")


async def serve(options: LookupdOptions) -> int:
    """Run nsqlookupd until a termination signal; 1 if it cannot start."""
    lookupd = NSQLookupd(options)
    try:
        await lookupd.start()
    except (OSError, ValueError) as err:
        log.critical("failed to start: %s", err)
        return 1
    await wait_for_termination()
    log.info("LOOKUP: shutting down")
    await lookupd.close()
    return 0


def run_nsqlookupd(argv: list[str]) -> int:
    if wants_help(argv):
        print(nsqlookupd_usage())
        return 0
    if wants_version(argv):
        print(version_line("nsqlookupd"))
        return 0
    try:
        options = parse_nsqlookupd_args(argv)
    except FlagError as err:
        print(f"nsqlookupd: {err}\n(run `nsqx nsqlookupd --help` for the flags)", file=sys.stderr)
        return 2
    setup_logging(options.log_level, options.log_prefix)
    install_event_loop_policy()
    return asyncio.run(serve(options))
