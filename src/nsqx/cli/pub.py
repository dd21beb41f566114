"""``nsqx pub``: publish lines from stdin or a file, as NSQ's ``to_nsq``.

The input is split on ``--delimiter`` (one byte, a newline by default); each non-empty
piece is one message, published to every ``--nsqd-tcp-address`` (as ``to_nsq``
does). Unlike ``to_nsq``, publishes are pipelined (many in flight on one connection,
each still acknowledged) and the last piece keeps its last byte when the input does not
end with the delimiter. ``--rate`` caps messages per second. A progress line (with
each nsqd's count when there are several, and any that stopped answering) and a summary
go to stderr. As ``to_nsq``, the first failure stops it: an nsqd that refuses a message,
goes away, or leaves publishes unanswered for the producer's ``read_timeout``; the
summary then says what each nsqd acknowledged, and the reason is the last line.
"""

from __future__ import annotations

import asyncio
import collections
import os
import stat
import sys
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator
from typing import IO, Any

from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    NSQD_TCP,
    PRODUCER_OPT,
    PROGRESS,
    VERSION,
    Kind,
    Progress,
    Tool,
    ToolError,
    auth_secret,
    check_name,
    check_nsqds,
    client_config,
    flag,
    one_line,
    retrieve,
    user_agent,
)
from nsqx.client import ConnectionClosedError, Producer, PublishError
from nsqx.client.conn import split_address

FLAGS = (
    VERSION,
    flag("topic", Kind.STR, "", "NSQ topic to publish to", "topic"),
    flag("delimiter", Kind.STR, "\n", "character to split input on", "char", default_text="\\n"),
    NSQD_TCP,
    PRODUCER_OPT,
    AUTH_SECRET,
    AUTH_SECRET_FILE,
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
#: a progress line names an nsqd that has not answered for this long
_STALL = 2.0


class _Target:
    """One ``--nsqd-tcp-address``: its producer, its publishes in flight (answered in
    order: one connection) and what it answered."""

    def __init__(self, address: str, producer: Producer) -> None:
        self.address = address
        self.producer = producer
        self.inflight: collections.deque[asyncio.Future[None]] = collections.deque()
        self.acked = 0
        self.answered = 0
        #: the watchdog's view: answers at its last look, and since when none came
        self.seen = 0
        self.quiet_since = time.monotonic()
        #: left publishes unanswered for too long: not waited for when closing
        self.stalled = False
        host, port = split_address(address)
        self._names = (f"{host}:{port}: ", "cannot connect to any nsqd: ")

    def harvest(self) -> BaseException | None:
        """Count the answers that came (in order); the first error among them."""
        inflight = self.inflight
        error: BaseException | None = None
        while inflight and inflight[0].done():
            fut = inflight.popleft()
            self.answered += 1
            if fut.cancelled():
                error = error or ConnectionClosedError("no answer (stopped waiting)")
                continue
            exc = fut.exception()  # retrieved: never "Future exception was never retrieved"
            if exc is None:
                self.acked += 1
            else:
                error = error or exc
        return error

    def reason(self, err: BaseException) -> str:
        """The client's error without the address and wrapping it repeats."""
        text = one_line(err)
        for name in self._names:
            text = text.replace(name, "")
        return text

    def quiet_for(self, now: float) -> float:
        """Seconds this nsqd has left publishes unanswered (0: it answers)."""
        if self.inflight and self.answered == self.seen:
            return now - self.quiet_since
        return 0.0


class _Publisher:
    """Each message to every nsqd, pipelined: at most ``_WINDOW`` unanswered per nsqd.

    Answers are counted per nsqd as they come (so progress is true whatever nsqd is
    slow), and the first failure stops everything: no more publishes, and the outcome
    of those still in flight is collected quietly.
    """

    def __init__(self, topic: str, targets: list[_Target]) -> None:
        self.topic = topic
        self.targets = targets
        self.failure: ToolError | None = None
        #: done when a failure is known (wakes a wait for room)
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def published(self) -> int:
        """Messages acknowledged by every nsqd."""
        self.harvest()
        return min(t.acked for t in self.targets)

    def harvest(self) -> None:
        for target in self.targets:
            err = target.harvest()
            if err is not None:
                why = target.reason(err)
                if isinstance(err, PublishError):
                    self._fail(ToolError(f"nsqd at {target.address} refused a message: {why}"))
                else:
                    self._fail(ToolError(f"lost the connection to nsqd at {target.address}: {why}"))

    def _fail(self, failure: ToolError) -> None:
        if self.failure is None:
            self.failure = failure
            self._failed.set_result(None)

    async def connect(self) -> None:
        """Connect to every nsqd (at once); ToolError naming each that failed."""
        results = await asyncio.gather(
            *(t.producer.connect() for t in self.targets), return_exceptions=True
        )
        failures = [
            f"{t.address}: {t.reason(r)}"
            for t, r in zip(self.targets, results, strict=True)
            if isinstance(r, BaseException)
        ]
        if failures:
            raise ToolError("cannot connect to nsqd at " + "; ".join(failures))

    async def publish(self, body: bytes) -> None:
        """Send ``body`` to every nsqd; wait when one has a full window unanswered
        (then until half of it is); ToolError once anything failed."""
        for target in self.targets:
            if not target.producer.connected:
                # lost, or connecting again (the publish does, as go-nsq's): what was
                # in flight failed with it, or the new connection failed? then stop, as
                # to_nsq does, rather than try again for every message that follows
                self.harvest()
        if self.failure is not None:
            raise self.failure
        for target in self.targets:
            target.inflight.append(target.producer.publish(self.topic, body))
        for target in self.targets:
            if len(target.inflight) > _WINDOW:
                # answers come in order: the one half a window back answered means all
                # before it did
                oldest_kept = target.inflight[-(_WINDOW // 2)]
                if not oldest_kept.done():
                    await asyncio.wait((oldest_kept, self._failed), return_when=FIRST_COMPLETED)
                self.harvest()
        if self.failure is not None:
            raise self.failure

    async def drain(self) -> None:
        """Wait for every answer; ToolError if anything failed."""
        for target in self.targets:
            if target.inflight and self.failure is None:
                last = target.inflight[-1]
                await asyncio.wait((last, self._failed), return_when=FIRST_COMPLETED)
        self.harvest()
        if self.failure is not None:
            raise self.failure

    def forget(self) -> None:
        """Count what is answered; let what is not fail quietly when it does."""
        self.harvest()
        for target in self.targets:
            for fut in target.inflight:
                retrieve(fut)

    async def watch(self, limit: float) -> None:
        """Fail when an nsqd leaves publishes unanswered for ``limit`` seconds (the
        producer's read_timeout, as go-nsq's read deadline): a stopped or hung nsqd
        keeps its connection open and would stall the tool."""
        while self.failure is None:
            await asyncio.sleep(min(1.0, limit / 4))
            self.harvest()
            now = time.monotonic()
            for t in self.targets:
                if t.quiet_for(now) >= limit:
                    t.stalled = True
                    self._fail(
                        ToolError(
                            f"no answer from nsqd at {t.address} for {limit:g}s "
                            "(is it stopped or hung?)"
                        )
                    )
                elif t.answered != t.seen or not t.inflight:
                    t.seen, t.quiet_since = t.answered, now

    def detail(self) -> str:
        """For the progress line: each nsqd's count when there are several, and any
        nsqd that has not answered for a while."""
        self.harvest()
        now = time.monotonic()
        parts = []
        for t in self.targets:
            quiet = t.quiet_for(now)
            wait = f" (no answer for {quiet:.0f}s)" if quiet >= _STALL else ""
            if len(self.targets) > 1:
                parts.append(f"{t.address}: {t.acked:,}{wait}")
            elif wait:
                parts.append(f"{t.address}{wait}")
        return ", ".join(parts)

    def summary(self) -> str:
        published = self.published
        counts = {t.acked for t in self.targets}
        line = f"published {published:,} messages to {self.topic} on {len(self.targets)} nsqd"
        if len(counts) > 1:
            line += " (" + ", ".join(f"{t.acked:,} on {t.address}" for t in self.targets) + ")"
        return line


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
    config = client_config(
        opts["producer_opt"], "producer-opt", auth_secret(opts), user_agent=user_agent("to_nsq")
    )
    source: IO[bytes]
    if opts["file"] == "-":
        source = sys.stdin.buffer
    else:
        try:
            source = open(opts["file"], "rb")  # noqa: SIM115 - closed below
        except OSError as err:
            raise ToolError(f"--file: cannot read {opts['file']}: {err.strerror}") from None
    await check_nsqds(addresses, config=config)
    pub = _Publisher(topic, [_Target(a, Producer(a, config=config)) for a in addresses])
    progress = Progress(
        "nsqx pub",
        "published",
        opts["progress_interval"],
        detail=pub.detail,
        counter=lambda: pub.published,
    )
    interval = 1.0 / opts["rate"] if opts["rate"] else 0.0
    next_at = time.monotonic()

    async def publish(body: bytes) -> None:
        nonlocal next_at
        if interval:
            now = time.monotonic()
            if next_at > now:
                await asyncio.sleep(next_at - now)
            # at most one second of saved-up capacity, as to_nsq's token bucket
            next_at = max(next_at, time.monotonic() - 1.0) + interval
        await pub.publish(body)

    progress.start()
    watchdog = asyncio.ensure_future(pub.watch(config.read_timeout))
    try:
        await pub.connect()
        rest = b""
        async for chunk in _chunks(source):
            pieces = (rest + chunk).split(delimiter)
            rest = pieces.pop()
            for piece in pieces:
                if piece:
                    await publish(piece)
        if rest:
            await publish(rest)
        await pub.drain()
    finally:
        watchdog.cancel()
        pub.forget()
        try:
            await _close(pub.targets)
        finally:
            if source is not sys.stdin.buffer:
                source.close()
            await progress.stop()
            # what was published, however it ended (done, failed or interrupted)
            print(f"nsqx pub: {pub.summary()}", file=sys.stderr)
    return 0


async def _close(targets: list[_Target]) -> None:
    """Close the producers: answers still in flight are waited for, a while (not from
    an nsqd that already left them unanswered too long)."""
    closing = [asyncio.ensure_future(t.producer.close()) for t in targets]
    for task in closing:
        retrieve(task)  # a failure to close: the failure that matters is reported already
    waited = [task for t, task in zip(targets, closing, strict=True) if not t.stalled]
    if waited:
        await asyncio.wait(waited, timeout=_CLOSE_WAIT)
    else:
        await asyncio.sleep(0)  # let the closes start
    for task in closing:
        task.cancel()


#: seconds to wait for nsqd's answers to what is in flight when stopping
_CLOSE_WAIT = 5.0


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
