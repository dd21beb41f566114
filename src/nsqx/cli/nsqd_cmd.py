"""``nsqx nsqd``: run the daemon until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqd_flags import nsqd_usage, parse_nsqd_args, wants_help, wants_version
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.stats import version_string


async def serve(options: NsqdOptions) -> int:
    """Run nsqd until a termination signal; 1 if it cannot start."""
    nsqd = NSQD(options)
    try:
        await nsqd.start()
    except (OSError, RuntimeError, ValueError) as err:
        logging.getLogger("nsqx.nsqd").critical("failed to start: %s", err)
        return 1
    await wait_for_termination()
    logging.getLogger("nsqx.nsqd").info("NSQ: shutting down")
    await nsqd.close()
    return 0


def run_nsqd(argv: list[str]) -> int:
    if wants_help(argv):
        print(nsqd_usage())
        return 0
    if wants_version(argv):
        print(version_string("nsqd"))
        return 0
    try:
        options = parse_nsqd_args(argv)
    except FlagError as err:
        print(f"nsqd: {err}\n(run `nsqx nsqd --help` for the flags)", file=sys.stderr)
        return 2
    setup_logging(options.log_level, options.log_prefix)
    install_event_loop_policy()
    return asyncio.run(serve(options))
