"""What every long-running ``nsqx`` command shares: logging, the event loop, signals."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

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


async def wait_for_termination() -> None:
    """Return on the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
