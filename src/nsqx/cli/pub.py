"""``nsqx pub``: publish lines from stdin or a file, as NSQ's ``to_nsq``.

The input is split on ``--delimiter`` (one byte, a newline by default); each non-empty
piece is one message, published to every ``--nsqd-tcp-address`` (as ``to_nsq``
does). Unlike ``to_nsq``, publishes are pipelined (many in flight on one connection,
each still acknowledged) and the last piece keeps its last byte when the input does not
end with the delimiter. ``--rate`` caps messages per second. A progress line and a
summary go to stderr.
"""

from __future__ import annotations

import asyncio
import collections
import os
import stat
import sys
import time
from collections.abc import AsyncIterator
from typing import IO, Any

from nsqx.cli.toolbase import (
    NSQD_TCP,
    PRODUCER_OPT,
    PROGRESS,
    VERSION,
    Kind,
    Progress,
    Tool,
    ToolError,
    check_name,
    check_nsqds,
    client_config,
    flag,
    user_agent,
)
from nsqx.client import ConnectionClosedError, Producer, PublishError

FLAGS = (
    VERSION,
    flag("topic", Kind.STR, "", "NSQ topic to publish to", "topic"),
    flag("delimiter", Kind.STR, "\n", "character to split input on", "char", default_text="\\n"),
    NSQD_TCP,
    PRODUCER_OPT,
    flag("rate", Kind.INT, 0, "throttle messages to n/second; 0 to disable"),
    flag("file", Kind.STR, "-", "[nsqx] read this file instead of stdin ('-': stdin)", "path"),
    PROGRESS,
)

EXAMPLES = """
  echo hello | nsqx pub --topic=events --nsqd-tcp-address=127.0.0.1:4150
  nsqx pub --topic=events --nsqd-tcp-address=127.0.0.1:4150 --file=events.jsonl
  seq 1000000 | nsqx pub --topic=numbers --nsqd-tcp-address=127.0.0.1:4150 --rate=5000
  printf 'a,b,c' | nsqx pub --topic=letters --delimiter=, --nsqd-tcp-address=127.0.0.1:4150
"""

#: publishes awaiting nsqd's OK, per connection, before reading more input
_WINDOW = 256
_CHUNK = 1 << 16


async def main(opts: dict[str, Any]) -> int:
    topic: str = opts["topic"]
    if not topic:
        raise ToolError("--topic required")
    check_name("topic", topic, "topic")
    delimiter = opts["delimiter"].encode("utf-8", "surrogateescape")
    if len(delimiter) != 1:
        raise ToolError("--delimiter must be a single byte")
    addresses: list[str] = opts["nsqd_tcp_address"]
    if not addresses:
        raise ToolError("--nsqd-tcp-address required")
    if opts["rate"] < 0:
        raise ToolError("--rate must be >= 0")
    config = client_config(opts["producer_opt"], "producer-opt", user_agent=user_agent("to_nsq"))
    source: IO[bytes]
    if opts["file"] == "-":
        source = sys.stdin.buffer
    else:
        try:
            source = open(opts["file"], "rb")  # noqa: SIM115 - closed below
        except OSError as err:
            raise ToolError(f"--file: cannot read {opts['file']}: {err.strerror}") from None
    await check_nsqds(addresses)
    producers = [Producer(a, config=config) for a in addresses]
    progress = Progress("nsqx pub", "published", opts["progress_interval"])
    pending: collections.deque[asyncio.Future[None]] = collections.deque()
    interval = 1.0 / opts["rate"] if opts["rate"] else 0.0
    next_at = time.monotonic()

    async def settle(keep: int) -> None:
        while len(pending) > keep:
            fut = pending.popleft()
            try:
                await fut
            except PublishError as err:
                raise ToolError(f"nsqd refused a message: {err}") from None
            except ConnectionClosedError as err:
                raise ToolError(f"lost the connection to nsqd: {err}") from None
            progress.add()

    async def publish(body: bytes) -> None:
        nonlocal next_at
        if interval:
            now = time.monotonic()
            if next_at > now:
                await asyncio.sleep(next_at - now)
            # at most one second of saved-up capacity, as to_nsq's token bucket
            next_at = max(next_at, time.monotonic() - 1.0) + interval
        for producer in producers:
            pending.append(producer.publish(topic, body))
        await settle(_WINDOW * len(producers))

    progress.start()
    try:
        rest = b""
        async for chunk in _chunks(source):
            pieces = (rest + chunk).split(delimiter)
            rest = pieces.pop()
            for piece in pieces:
                if piece:
                    await publish(piece)
        if rest:
            await publish(rest)
        await settle(0)
    finally:
        for producer in producers:
            await producer.close()
        if source is not sys.stdin.buffer:
            source.close()
        await progress.stop()
    per = progress.count // len(producers)
    print(
        f"nsqx pub: published {per:,} messages to {topic} on {len(producers)} nsqd",
        file=sys.stderr,
    )
    return 0


async def _chunks(source: IO[bytes]) -> AsyncIterator[bytes]:
    """The input in chunks as they come: a pipe or terminal through the event loop (so
    Ctrl-C is never stuck in a read), a regular file directly."""
    if stat.S_ISREG(os.fstat(source.fileno()).st_mode):
        while chunk := source.read(_CHUNK):
            yield chunk
            await asyncio.sleep(0)
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), source
    )
    try:
        while chunk := await reader.read(_CHUNK):
            yield chunk
    finally:
        transport.close()


TOOL = Tool(
    "pub",
    "to_nsq",
    FLAGS,
    "Publish lines from stdin or a file to a topic (NSQ's to_nsq).",
    EXAMPLES,
    main,
)
