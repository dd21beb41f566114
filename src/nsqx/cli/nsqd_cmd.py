"""``nsqx nsqd``: run the daemon until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from nsqx import NSQ_VERSION
from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqd_flags import nsqd_usage, parse_nsqd_args, wants_help, wants_version
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def setup_logging(level: str, prefix: str) -> None:
    """Log lines as nsqd writes them: prefix, time, level, message; on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"{prefix}%(asctime)s %(levelname)s: %(message)s", datefmt="%Y/%m/%d %H:%M:%S"
        )
    )
    root = logging.getLogger("nsqx")
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    root.propagate = False


def install_event_loop_policy() -> None:
    """uvloop when available: a faster event loop for the same asyncio code."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(options: NsqdOptions) -> int:
    """Run nsqd until a termination signal; 1 if it cannot start."""
    nsqd = NSQD(options)
    try:
        await nsqd.start()
    except (OSError, RuntimeError, ValueError) as err:
        logging.getLogger("nsqx.nsqd").critical("failed to start: %s", err)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("nsqx.nsqd").info("NSQ: shutting down")
    await nsqd.close()
    return 0


def run_nsqd(argv: list[str]) -> int:
    if wants_help(argv):
        print(nsqd_usage())
        return 0
    if wants_version(argv):
        print(f"nsqd v{NSQ_VERSION} (nsqx)")
        return 0
    try:
        options = parse_nsqd_args(argv)
    except FlagError as err:
        print(f"nsqd: {err}\n(run `nsqx nsqd --help` for the flags)", file=sys.stderr)
        return 2
    setup_logging(options.log_level, options.log_prefix)
    install_event_loop_policy()
    return asyncio.run(serve(options))
