"""``nsqx bench``: the throughput of an nsqd, as NSQ's ``bench_writer`` and ``bench_reader``.

``--mode=writer`` publishes ``--size``-byte messages in MPUB batches of
``--batch-size`` for ``--runfor``; ``--mode=reader`` consumes ``--topic`` on
``--channel`` with RDY ``--rdy`` for ``--runfor``; ``--mode=both`` runs the two at
once. Each prints the Go tools' line, ``duration: ... - N mb/s - N ops/s - N us/op``,
and a progress line (count and rate) every ``--progress-interval`` meanwhile. It uses
nsqx's client (pipelined MPUB, a Consumer), so it measures the server and this client
together; ``bench/server_bench.py`` in the repository is the leaner, more detailed
benchmark of a server alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from datetime import datetime
from typing import Any

from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
    VERSION,
    Kind,
    Progress,
    Tool,
    ToolError,
    auth_secret,
    check_name,
    check_nsqds,
    flag,
    retrieve,
    user_agent,
)
from nsqx.client import Config, Consumer, Message, Producer

FLAGS = (
    VERSION,
    flag("mode", Kind.STR, "writer", "writer (bench_writer), reader (bench_reader) or both"),
    flag("runfor", Kind.DURATION, 10.0, "duration of time to run"),
    flag("nsqd-tcp-address", Kind.STR, "127.0.0.1:4150", "<addr>:<port> to connect to nsqd"),
    flag("topic", Kind.STR, "sub_bench", "topic to publish to and receive messages on"),
    flag("channel", Kind.STR, "ch", "channel to receive messages on"),
    flag("size", Kind.INT, 200, "size of messages"),
    flag("batch-size", Kind.INT, 200, "batch size of messages"),
    flag("rdy", Kind.INT, 2500, "RDY count to use"),
    flag("deadline", Kind.STR, "", "deadline to start the benchmark run (YYYY-mm-dd HH:MM:SS)"),
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
)

EXAMPLES = """
  nsqx bench --mode=writer --nsqd-tcp-address=127.0.0.1:4150 --runfor=10s --size=200
  nsqx bench --mode=reader --nsqd-tcp-address=127.0.0.1:4150 --runfor=10s --rdy=2500
  nsqx bench --mode=both --nsqd-tcp-address=127.0.0.1:4150 --runfor=5s
"""

#: MPUBs awaiting their OK at once
_WINDOW = 16


def result_line(count: int, seconds: float, size: int) -> str:
    """bench_writer's and bench_reader's summary line."""
    seconds = max(seconds, 1e-9)
    mbs = count * size / seconds / 1024 / 1024
    us = seconds * 1e6 / count if count else 0.0
    return f"duration: {seconds:.3f}s - {mbs:.3f}mb/s - {count / seconds:.3f}ops/s - {us:.3f}us/op"


async def writer(opts: dict[str, Any], progress: Progress) -> tuple[int, float]:
    body = b"a" * opts["size"]
    batch = [body] * opts["batch_size"]
    pending: collections.deque[asyncio.Future[None]] = collections.deque()
    count = 0
    config = Config(user_agent=user_agent("bench_writer"), auth_secret=opts["auth_secret"] or None)
    async with Producer(opts["nsqd_tcp_address"], config=config) as producer:
        started = time.monotonic()
        stop_at = started + opts["runfor"]
        while time.monotonic() < stop_at:
            fut = producer.multi_publish(opts["topic"], batch)
            retrieve(fut)  # after a failure, the rest fail quietly
            pending.append(fut)
            if len(pending) >= _WINDOW:
                await pending.popleft()
                count += len(batch)
                progress.add(len(batch))
        while pending:
            await pending.popleft()
            count += len(batch)
            progress.add(len(batch))
        return count, time.monotonic() - started


async def reader(opts: dict[str, Any], progress: Progress) -> tuple[int, float]:
    count = 0
    last = time.monotonic()

    def handle(msg: Message) -> None:
        nonlocal count, last
        if len(msg.body) != opts["size"]:
            raise ToolError(f"got a {len(msg.body)}-byte message, expected --size={opts['size']}")
        count += 1
        last = time.monotonic()
        progress.add()

    consumer = Consumer(
        opts["topic"],
        opts["channel"],
        handle,
        nsqd_tcp_addresses=[opts["nsqd_tcp_address"]],
        max_in_flight=opts["rdy"],
        user_agent=user_agent("bench_reader"),
        auth_secret=opts["auth_secret"] or None,
    )
    started = time.monotonic()
    await consumer.start()
    try:
        await asyncio.sleep(opts["runfor"])
    finally:
        await consumer.close(timeout=5)
    # the rate counts up to the last message, as a drained topic ends the work early
    return count, (last if count else time.monotonic()) - started


async def main(opts: dict[str, Any]) -> int:
    mode = opts["mode"]
    if mode not in ("writer", "reader", "both"):
        raise ToolError(f"--mode must be writer, reader or both (got {mode!r})")
    check_name("topic", opts["topic"], "topic")
    check_name("channel", opts["channel"], "channel")
    if opts["size"] < 1 or opts["batch_size"] < 1 or opts["rdy"] < 1:
        raise ToolError("--size, --batch-size and --rdy must be >= 1")
    if opts["runfor"] <= 0:
        raise ToolError("--runfor must be positive")
    opts["auth_secret"] = auth_secret(opts)  # (from its file or $NSQX_AUTH_SECRET)
    if opts["deadline"]:
        try:
            deadline = datetime.strptime(opts["deadline"], "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise ToolError("--deadline: expected YYYY-mm-dd HH:MM:SS") from None
        wait = deadline.timestamp() - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
    await check_nsqds(
        [opts["nsqd_tcp_address"]], config=Config(auth_secret=opts["auth_secret"] or None)
    )
    progress = Progress(f"nsqx bench ({mode})", "messages", opts["progress_interval"])
    progress.start()
    try:
        if mode == "writer":
            results = [("writer", await writer(opts, progress))]
        elif mode == "reader":
            results = [("reader", await reader(opts, progress))]
        else:
            read_progress = Progress("nsqx bench (reader)", "messages", 0)
            w, r = await asyncio.gather(writer(opts, progress), reader(opts, read_progress))
            results = [("writer", w), ("reader", r)]
    finally:
        with contextlib.suppress(Exception):
            await progress.stop()
    for name, (count, seconds) in results:
        prefix = f"{name}: " if len(results) > 1 else ""
        print(prefix + result_line(count, seconds, opts["size"]), flush=True)
    return 0


TOOL = Tool(
    "bench",
    "nsqx bench",
    FLAGS,
    "Measure an nsqd's throughput, as NSQ's bench_writer and bench_reader.",
    EXAMPLES,
    main,
)
