"""``nsqx nsqd``: run the daemon until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqd_flags import nsqd_usage, parse_nsqd_args, wants_help, wants_version
from nsqx.cli.version import version_line
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.supervisor import Supervisor, worker_spec_from_env
from nsqx.nsqd.workers.spec import WorkerSpec


async def serve(options: NsqdOptions, worker: WorkerSpec | None = None) -> int:
    """Run nsqd until a termination signal; 1 if it cannot start."""
    nsqd = NSQD(options, worker)
    try:
        await nsqd.start()
    except (OSError, RuntimeError, ValueError) as err:
        logging.getLogger("nsqx.nsqd").critical("failed to start: %s", err)
        return 1
    if worker is not None and worker.ready_fd >= 0:
        os.write(worker.ready_fd, b"1")  # (its supervisor waits for it)
        os.close(worker.ready_fd)
    await wait_for_termination()
    logging.getLogger("nsqx.nsqd").info("NSQ: shutting down")
    if options.drain_timeout > 0:
        await drain_unless_signalled(nsqd, options.drain_timeout)
    await nsqd.close()
    return 0


async def drain_unless_signalled(nsqd: NSQD, timeout: float) -> None:
    """Drain for at most ``timeout`` seconds (docs/drain.md); a second SIGINT/SIGTERM
    cuts it short."""
    # (the second signal's handler first: it is in place before any client is told)
    again = asyncio.ensure_future(wait_for_termination())
    drained = asyncio.ensure_future(nsqd.drain(timeout))
    await asyncio.wait({drained, again}, return_when=asyncio.FIRST_COMPLETED)
    if not drained.done():
        logging.getLogger("nsqx.nsqd").warning("NSQ: signalled again: closing without draining")
    for task in (drained, again):
        task.cancel()
    await asyncio.gather(drained, again, return_exceptions=True)


def run_nsqd(argv: list[str]) -> int:
    if wants_help(argv):
        print(nsqd_usage())
        return 0
    if wants_version(argv):
        print(version_line("nsqd"))
        return 0
    try:
        options = parse_nsqd_args(argv)
    except FlagError as err:
        print(f"nsqd: {err}\n(run `nsqx nsqd --help` for the flags)", file=sys.stderr)
        return 2
    worker = worker_spec_from_env()
    if worker is not None:
        setup_logging(options.log_level, f"{options.log_prefix}w{worker.index}: ")
        install_event_loop_policy()
        return asyncio.run(serve(options, worker))
    setup_logging(options.log_level, options.log_prefix)
    install_event_loop_policy()
    if options.workers > 1:
        return asyncio.run(supervise(options, argv))
    return asyncio.run(serve(options))


async def supervise(options: NsqdOptions, argv: list[str]) -> int:
    """Run the node as --workers processes until a termination signal."""
    supervisor = Supervisor(options, argv)
    try:
        supervisor.start()
    except (OSError, RuntimeError, ValueError) as err:
        logging.getLogger("nsqx.nsqd").critical("failed to start: %s", err)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = await supervisor.run(stop)
    logging.getLogger("nsqx.nsqd").info("NSQ: shutting down")
    return code
