"""``nsqx tail``: print a topic's messages to stdout, as NSQ's ``nsq_tail``.

It subscribes to each ``--topic`` on a channel (by default a fresh
``tail<6 digits>#ephemeral`` one, which nsqd deletes when the tail goes away), prints
each body followed by a newline (``topic | body`` with ``--print-topic``) and finishes
it. ``--n`` stops after that many messages. When stdout is not a terminal, a progress
line (count and rate) goes to stderr every ``--progress-interval``, and a summary at the
end, however the tail stops (``--n``, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from typing import Any

from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONSUMER_OPT,
    LOOKUPD_HTTP,
    MAX_IN_FLIGHT,
    NSQD_TCP,
    PROGRESS,
    VERSION,
    Kind,
    Progress,
    Tool,
    ToolError,
    auth_secret,
    check_lookupds,
    check_name,
    check_nsqds,
    check_one_source,
    client_config,
    flag,
    user_agent,
)
from nsqx.client import Consumer, Message

FLAGS = (
    VERSION,
    flag("topic", Kind.STR_LIST, [], "NSQ topic", "topic"),
    flag("channel", Kind.STR, "", "NSQ channel", "channel", default_text="tail<random>#ephemeral"),
    MAX_IN_FLIGHT,
    flag("n", Kind.INT, 0, "total messages to show (will wait if starved)"),
    flag("print-topic", Kind.BOOL, False, "print topic name where message was received"),
    NSQD_TCP,
    LOOKUPD_HTTP,
    CONSUMER_OPT,
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
)

EXAMPLES = """
  nsqx tail --topic=events --lookupd-http-address=127.0.0.1:4161
  nsqx tail --topic=events --nsqd-tcp-address=127.0.0.1:4150 --n=10
  nsqx tail --topic=a --topic=b --print-topic --lookupd-http-address=127.0.0.1:4161
  nsqx tail --topic=events --channel=debug --consumer-opt=max_attempts,3 --nsqd-tcp-address=127.0.0.1:4150
"""


async def main(opts: dict[str, Any]) -> int:
    topics: list[str] = opts["topic"]
    if not topics:
        raise ToolError("--topic required")
    check_one_source(opts)
    for topic in topics:
        check_name("topic", topic, "topic")
    channel = opts["channel"] or f"tail{random.randrange(999999):06d}#ephemeral"
    check_name("channel", channel, "channel")
    total = opts["n"]
    if total < 0:
        raise ToolError("--n must be >= 0")
    max_in_flight = opts["max_in_flight"]
    if total and total < max_in_flight:
        max_in_flight = total  # don't ask for more messages than we want
    secret = auth_secret(opts)
    config = client_config(
        opts["consumer_opt"],
        "consumer-opt",
        secret,
        user_agent=user_agent("nsq_tail"),
        max_in_flight=max_in_flight,
    )
    if opts["nsqd_tcp_address"]:
        await check_nsqds(opts["nsqd_tcp_address"], config=config)
    else:
        found = await check_lookupds(opts["lookupd_http_address"], secret=secret, topics=topics)
        await check_nsqds(found, config=config, secret_only=True)

    out = sys.stdout.buffer
    done = asyncio.Event()
    shown = 0
    flush_pending = False
    #: stdout's reader went away (``nsqx tail | head -1``): stop, quietly
    out_closed = False
    loop = asyncio.get_running_loop()
    # progress and the summary only where they cannot mix with the messages
    quiet = sys.stdout.isatty()
    progress = Progress("nsqx tail", "messages", 0 if quiet else opts["progress_interval"])

    def stop() -> None:
        done.set()
        for consumer in consumers:
            consumer.set_max_in_flight(0)  # RDY 0: no more deliveries

    def closed() -> None:
        nonlocal out_closed
        out_closed = True
        stop()

    def flush() -> None:
        nonlocal flush_pending
        flush_pending = False
        if out_closed:
            return
        try:
            out.flush()
        except BrokenPipeError:
            closed()

    def handler_for(topic: str) -> Any:
        prefix = topic.encode() + b" | " if opts["print_topic"] else b""

        def handle(msg: Message) -> None:
            nonlocal shown, flush_pending
            if out_closed or (total and shown >= total):
                # more arrived than asked for (or nobody reads): give them back without
                # a backoff
                msg.requeue(0, backoff=False)
                return
            try:
                out.write(prefix + msg.body + b"\n")
            except BrokenPipeError:
                closed()
                msg.requeue(0, backoff=False)
                return
            shown += 1
            progress.add()
            if not flush_pending:
                # one flush per batch of messages, so a pipe sees them promptly
                flush_pending = True
                loop.call_soon(flush)
            if total and shown >= total:
                stop()

        return handle

    consumers = [
        Consumer(
            topic,
            channel,
            handler_for(topic),
            nsqd_tcp_addresses=opts["nsqd_tcp_address"],
            lookupd_http_addresses=opts["lookupd_http_address"],
            config=config,
        )
        for topic in topics
    ]
    progress.start()
    try:
        for consumer in consumers:
            print(f"Adding consumer for topic: {consumer.topic}", file=sys.stderr)
            await consumer.start()
        await done.wait()
    finally:
        # however it ends (--n, Ctrl-C, SIGTERM): close, write out, then the summary
        try:
            for consumer in consumers:
                with contextlib.suppress(Exception):
                    await consumer.close(timeout=5)
            flush()
        finally:
            await progress.stop("" if quiet else "nsqx tail: {count} messages in {seconds:.1f}s")
    if out_closed:
        raise BrokenPipeError  # nsqx's main ends quietly
    return 0


TOOL = Tool(
    "tail",
    "nsq_tail",
    FLAGS,
    "Print a topic's messages to stdout (NSQ's nsq_tail).",
    EXAMPLES,
    main,
)
