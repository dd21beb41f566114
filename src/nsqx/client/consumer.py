"""Consumer: subscribes to a topic's channel on every nsqd that has it, and handles messages.

It connects to nsqd given by address (reconnecting with exponential backoff) or
found through nsqlookupd (polled at an interval, with jitter), keeps RDY within the
client guide's rules (:mod:`nsqx.client.rdy`), backs off after failures
(:mod:`nsqx.client.backoff`) and hands messages to a handler, or to ``async for``.

Speed: each read's frames are handled in one pass. A plain-function handler is called
inline (no Task per message) and the FINs and RDY of the read leave in one write. A
coroutine handler runs on a pool of worker tasks, at most ``concurrency`` at once.

Partitions (Youzan's extension): when nsqlookupd lists the topic's partitions, there is
one connection per partition (``SUB <t> <c> <p>``), each reconnected on its own; an
ordered consumer subscribes with SUB_ORDERED (one message in flight per partition, one
handler call at a time per partition, offsets checked to grow); a start position
subscribes with SUB_ADVANCED. A topic without partitions is consumed as NSQ 1.3 does.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nsqx.client import codec
from nsqx.client.backoff import Backoff, BackoffAction
from nsqx.client.config import Config
from nsqx.client.conn import Connection, Frames, split_address
from nsqx.client.discovery import LookupdPoller, LookupResult
from nsqx.client.errors import ConfigError, NSQError, NSQServerError, OrderError
from nsqx.client.message import Message, message_class
from nsqx.client.rdy import ConnRdy, RdyController
from nsqx.wire import commands
from nsqx.wire.commands import ConsumeStart
from nsqx.wire.errors import (
    E_FAILED_ON_NOT_LEADER,
    E_FAILED_ON_NOT_WRITABLE,
    E_SUB_EXTEND_FORBIDDON,
    E_SUB_EXTEND_NEED,
    E_TOPIC_NOT_EXIST,
)
from nsqx.wire.frames import CLOSE_WAIT, FRAME_MESSAGE, MSG_ATTEMPTS_AT, MSG_ID_AT, MSG_ID_END
from nsqx.wire.names import is_valid_name

log = logging.getLogger("nsqx.client")

#: A handler takes a message; a plain function or a coroutine function.
#: Returning False requeues the message; anything else (or None) finishes it;
#: an exception requeues it (with backoff).
Handler = Callable[[Message], Any]
GivingUpHook = Callable[[Message], Any]


class Answers(Protocol):
    """The connection that messages given to a frames handler came on, and must be
    answered on (by id: ``data[MSG_ID_AT:MSG_ID_END]`` of a message's frame data, in every layout)."""

    @property
    def closed(self) -> bool:
        """The connection is gone: nsqd has requeued what it held in flight."""
        ...

    def finish_many(self, msg_ids: list[bytes]) -> None:
        """FIN each id (one write with whatever else this loop iteration sends)."""
        ...

    def requeue_many(self, msg_ids: list[bytes], delay: float) -> None:
        """REQ each id, to be delivered again after ``delay`` seconds."""
        ...

    def touch_many(self, msg_ids: list[bytes]) -> None:
        """TOUCH each id: nsqd restarts its timeout."""
        ...


#: A frames handler takes each read's messages at once, as their frames' data (the
#: subscription's layout: see :mod:`nsqx.client.message`), and the connection to
#: answer them on. For consumers that keep messages as bytes and answer them in bulk
#: (the Spark source's mode=channel): no :class:`Message` object per message.
FramesHandler = Callable[[Answers, list[bytes]], None]

_CLS = commands.cls()

_SUCCESS, _FAILURE, _NEUTRAL = 0, 1, 2

#: An nsqd address and the partition subscribed there (None: NSQ 1.3's SUB t c).
Target = tuple[str, int | None]
#: A lost partition connection, or one that failed, asks nsqlookupd again this soon
#: (go-nsq waits a second too): the partition may have a new leader.
_RECHECK_DELAY = 1.0
#: errors that mean "look the partition up again"
_MOVED_CODES = frozenset({E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST})


def target_key(target: Target) -> str:
    """A connection's name: ``host:port``, or ``host:port/partition``."""
    address, partition = target
    return address if partition is None else f"{address}/{partition}"


@dataclass
class ConsumerStats:
    """Counters of one consumer."""

    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    connections: int = 0


class _Link(Connection):
    """A consumer's connection (to one partition, or NSQ 1.3's topic on one nsqd): what
    its messages answer through."""

    def __init__(
        self, consumer: Consumer, host: str, port: int, target: Target | None = None
    ) -> None:
        super().__init__(
            host,
            port,
            consumer.config,
            on_frames=consumer._on_frames,
            on_lost=consumer._on_conn_lost,
        )
        self.consumer = consumer
        self.state: ConnRdy[str] | None = None
        #: nsqd sent CLOSE_WAIT (the answer to our CLS, or its drain): it sends
        #: nothing more; the connection closes once nothing is in flight on it.
        self.close_wait = False
        #: nsqd drains (a CLOSE_WAIT we did not ask for): out of the RDY rotation
        self.draining = False
        #: the partition subscribed to (None: NSQ 1.3's SUB t c)
        self.partition = target[1] if target is not None else None
        if target is not None:
            self.key = target_key(target)  # the consumer's name for it, as in _conns
        #: subscribed with SUB_ORDERED
        self.ordered = False
        #: the class of this subscription's messages (their frame layout)
        self.msg_cls: type[Message] = Message
        #: found through nsqlookupd (not given by address)
        self.discovered = False
        #: deliveries after which a message goes to the giving-up hook (0: never): the
        #: config's, unless nsqd says the channel's policy has max_attempts: then the
        #: channel decides (it makes a dead letter of the message), the consumer never
        self.max_attempts = consumer.config.max_attempts

    def channel_policy(self, max_attempts: int) -> None:
        self.max_attempts = 0 if max_attempts else self.consumer.config.max_attempts
        log.debug("%s: the channel's max_attempts: %d", self.key, max_attempts)

    def finish(self, msg: Message) -> None:
        self.consumer._answer(self, msg, _SUCCESS, None)

    def finish_many(self, msg_ids: list[bytes]) -> None:
        self.consumer._finish_many(self, msg_ids)

    def requeue_many(self, msg_ids: list[bytes], delay: float) -> None:
        self.consumer._requeue_many(self, msg_ids, delay)

    def touch_many(self, msg_ids: list[bytes]) -> None:
        if not self.closed:
            touch = commands.touch
            for msg_id in msg_ids:
                self.queue(touch(msg_id))

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        self.consumer._answer(self, msg, _FAILURE if backoff else _NEUTRAL, delay)

    def touch(self, msg: Message) -> None:
        if not self.closed:
            self.queue(commands.touch(msg.id))


class Consumer:
    """Consumes ``topic``/``channel`` from nsqd, given by address or through nsqlookupd.

    With a ``handler`` (plain function or coroutine function), each message goes to it:
    its return finishes the message, ``False`` or an exception requeues it, and it
    may answer itself (``msg.finish()``, ``msg.requeue()``) or call
    ``msg.enable_async()`` to answer later. Without a handler, iterate::

        async with Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
                            max_in_flight=100) as consumer:
            async for msg in consumer:
                ...
                msg.finish()

    Options are :class:`Config`'s (``max_in_flight=...``); pass ``config=`` to share one.
    Messages delivered more than ``max_attempts`` times go to :meth:`giving_up` (or
    ``on_giving_up``) and are then finished; on a channel whose policy has max_attempts
    (nsqx's nsqd says so), the channel decides instead: the consumer gives up on
    nothing, and a message that fails that often becomes a dead letter.

    Partitioned topics (Youzan's): found through nsqlookupd, every partition gets a
    connection; ``partitions=`` keeps some of them, or, with ``nsqd_tcp_addresses``,
    names the partitions to subscribe to on those nsqd. ``enable_ordered=True``
    consumes in order (SUB_ORDERED). ``start=`` (a :class:`ConsumeStart`, see
    :func:`~nsqx.client.youzan.start_at_time` and its siblings, or a dict of them by
    partition) subscribes with SUB_ADVANCED from that position; nsqd applies it only
    when this is the channel's first client on the partition, and this consumer sends
    it once per partition (reconnections go on from where the channel is).

    ``frames_handler=`` (instead of a handler) takes each read's messages at once as
    frame data, with the connection to answer them on (:data:`FramesHandler`); they
    stay in flight until answered through it.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        nsqd_tcp_addresses: Iterable[str] | str = (),
        lookupd_http_addresses: Iterable[str] | str = (),
        config: Config | None = None,
        concurrency: int | None = None,
        on_giving_up: GivingUpHook | None = None,
        frames_handler: FramesHandler | None = None,
        partitions: int | Iterable[int] | None = None,
        start: ConsumeStart | Mapping[int, ConsumeStart] | None = None,
        **options: Any,
    ) -> None:
        if not is_valid_name(topic):
            raise ConfigError(f"invalid topic name {topic!r}")
        if not is_valid_name(channel):
            raise ConfigError(f"invalid channel name {channel!r}")
        self.topic = topic
        self.channel = channel
        self.config = (config or Config()).with_options(**options)
        cfg = self.config
        for name in ("snappy", "deflate"):
            if getattr(cfg, name):
                codec.codec_factory(name)  # raises CodecUnavailableError now, not later
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        self.nsqd_tcp_addresses = [self._norm(a) for a in nsqd_tcp_addresses]
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        if isinstance(partitions, int):
            partitions = [partitions]
        self.partitions = None if partitions is None else sorted(set(partitions))
        if self.partitions is not None and any(p < 0 for p in self.partitions):
            raise ConfigError(f"partitions are >= 0 (got {self.partitions})")
        self._start_all: ConsumeStart | None = None
        self._starts: dict[int, ConsumeStart] = {}
        if isinstance(start, ConsumeStart):
            self._start_all = start
        elif start is not None:
            self._starts = dict(start)
            for pid, position in self._starts.items():
                if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
                    raise ConfigError(f"start: {pid!r} is not a partition")
                if not isinstance(position, ConsumeStart):
                    raise ConfigError(f"start: {position!r} is not a ConsumeStart")
        self._start_given = start is not None
        #: partitions whose start position was sent (once is enough: see the class doc)
        self._started_partitions: set[int] = set()
        if self._start_given and cfg.enable_ordered:
            # nsqd refuses SUB_ADVANCED on an ordered topic (E_SUB_ORDER_IS_MUST)
            raise ConfigError(
                "start= and enable_ordered exclude each other: move the channel with "
                "set_channel_offset() (nsqd's /channel/setoffset), then consume in order"
            )
        if (
            self.nsqd_tcp_addresses
            and self.partitions is None
            and (cfg.enable_ordered or self._start_given)
        ):
            raise ConfigError(
                "ordered consumption and start positions need partitions: give partitions= "
                "with nsqd_tcp_addresses, or use lookupd_http_addresses"
            )
        if handler is not None and not callable(handler):
            raise ConfigError("handler must be callable")
        if frames_handler is not None and (handler is not None or not callable(frames_handler)):
            raise ConfigError("frames_handler is a callable, given instead of a handler")
        self._handler = handler
        self._frames_handler = frames_handler
        self._coro_handler = handler is not None and _is_coroutine_function(handler)
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1 (got {concurrency})")
        self.concurrency = concurrency
        self._on_giving_up = on_giving_up
        self.stats = ConsumerStats()
        self._rng = random.Random()
        self._rdy: RdyController[str] = RdyController(
            cfg.max_in_flight,
            low_rdy_idle_timeout=cfg.low_rdy_idle_timeout,
            low_rdy_timeout=cfg.low_rdy_timeout,
            rng=self._rng,
        )
        self._backoff = Backoff(
            strategy=cfg.backoff_strategy,
            multiplier=cfg.backoff_multiplier,
            max_duration=cfg.max_backoff_duration,
            rng=self._rng,
        )
        self._conns: dict[str, _Link] = {}
        self._connecting: set[str] = set()
        self._discovered: set[Target] = set()
        #: the topic has ext headers: IDENTIFY with extend_support (from lookupd's meta,
        #: or learnt from nsqd's E_SUB_EXTEND_NEED)
        self._ext = False
        #: ordered consumption: the last (offset, id) seen on each partition
        self._positions: dict[int, tuple[int, int]] = {}
        #: coroutine handlers of ordered partitions: one queue and one task each
        self._ordered_queues: dict[int, collections.deque[Message]] = {}
        self._ordered_busy: set[int] = set()
        self._failure: BaseException | None = None
        self._fail_task: asyncio.Task[None] | None = None
        self._repoll: asyncio.Event | None = None
        self._repoll_handle: asyncio.TimerHandle | None = None
        self._warned_no_partitions = False
        self._warned_rdy = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: handler and hook tasks: never cancelled, awaited on close
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closing = False
        self._closed: asyncio.Future[None] | None = None
        self._redistribute_timer: asyncio.TimerHandle | None = None
        self._backoff_timer: asyncio.TimerHandle | None = None
        self._poller: LookupdPoller | None = None
        # coroutine handlers: a queue and a pool of workers
        self._queue: collections.deque[Message] = collections.deque()
        self._idle: list[asyncio.Future[None]] = []
        self._workers: set[asyncio.Task[None]] = set()
        # iteration
        self._inbox: collections.deque[Message] = collections.deque()
        self._inbox_waiter: asyncio.Future[None] | None = None

    @staticmethod
    def _norm(address: str) -> str:
        host, port = split_address(address)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def __repr__(self) -> str:
        return f"<Consumer {self.topic}/{self.channel} conns={len(self._conns)}>"

    # -- public API ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (or start discovery) and wait for the first round of attempts.

        Connections that fail are retried in the background, so this returns even if
        no nsqd is reachable yet.
        """
        if self._started:
            return
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ConfigError("give nsqd_tcp_addresses or lookupd_http_addresses")
        self._started = True
        self._loop = loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._redistribute_timer = loop.call_later(
            self.config.rdy_redistribute_interval, self._redistribute_tick
        )
        firsts: list[asyncio.Future[None]] = []
        for target in self._fixed_targets():
            first: asyncio.Future[None] = loop.create_future()
            firsts.append(first)
            self._spawn(self._maintain(target, first))
        if self.lookupd_http_addresses:
            self._poller = LookupdPoller(
                self.lookupd_http_addresses,
                self.topic,
                timeout=self.config.lookupd_poll_timeout,
                access="r",
                auth_secret=self.config.auth_secret,
            )
            self._repoll = asyncio.Event()
            first = loop.create_future()
            firsts.append(first)
            self._spawn(self._discover(first))
        await asyncio.gather(*firsts)

    def _fixed_targets(self) -> list[Target]:
        """What nsqd_tcp_addresses name: each nsqd, or each partition asked for on it."""
        if self.partitions is None:
            return [(a, None) for a in self.nsqd_tcp_addresses]
        return [(a, p) for a in self.nsqd_tcp_addresses for p in self.partitions]

    async def close(self, timeout: float = 30.0) -> None:
        """Stop gracefully: CLS, wait for messages in flight to be answered, close.

        Messages not handed out yet (queued for workers or for ``async for``) are
        requeued at once. After ``timeout`` seconds the connections are closed anyway
        (nsqd then requeues what is left).
        """
        if not self._started:
            self._closing = True
            return
        assert self._loop is not None and self._closed is not None
        if self._closing:
            await asyncio.shield(self._closed)
            return
        self._closing = True
        for timer in (self._redistribute_timer, self._backoff_timer, self._repoll_handle):
            if timer is not None:
                timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        # not handed to anybody yet: straight back to nsqd
        for pending in (self._inbox, self._queue, *self._ordered_queues.values()):
            while pending:
                msg = pending.popleft()
                if not msg._responded:
                    msg.requeue(0, backoff=False)
        self._wake_inbox()
        for conn in list(self._conns.values()):
            if not conn.close_wait:  # (nsqd already said CLOSE_WAIT: it is draining)
                conn.queue(_CLS)
        conns = list(self._conns.values())
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _, pending_waits = await asyncio.wait(waits, timeout=timeout)
            for w in pending_waits:
                w.cancel()
            for c in conns:
                if not c.closed:
                    log.warning("%s: messages still in flight after %.1fs; closing", c, timeout)
                    c.close()
            await asyncio.gather(*(c.wait_closed() for c in conns))
        # workers whose handlers still run are left to finish; idle ones stop now
        for fut in self._idle:
            if not fut.done():
                fut.set_result(None)
        self._idle.clear()
        busy = [*self._workers, *self._handler_tasks]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._poller is not None:
            await self._poller.close()
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` has finished (for services that run until stopped).

        Raises :class:`OrderError` when ``ordered_check="raise"`` stopped the consumer.
        """
        if self._closed is None:
            raise RuntimeError("consumer not started")
        await asyncio.shield(self._closed)
        if self._failure is not None:
            raise self._failure

    def _fail(self, error: BaseException) -> None:
        """Stop the consumer because of ``error`` (raised by wait_closed and async for)."""
        if self._failure is None:
            self._failure = error
        if not self._closing and self._fail_task is None:
            # the close outlives this call: keep a reference to its task
            self._fail_task = asyncio.ensure_future(self.close())

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._handler is not None or self._frames_handler is not None:
            raise TypeError("this consumer has a handler; iterate only a consumer without one")
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        inbox = self._inbox
        loop = asyncio.get_running_loop()
        while True:
            while inbox:
                msg = inbox.popleft()
                link = msg._link
                if link is not None and link.closed:
                    continue  # nsqd has requeued it already
                yield msg
            if self._closing or (self._closed is not None and self._closed.done()):
                if self._failure is not None:
                    raise self._failure
                return
            waiter = self._inbox_waiter = loop.create_future()
            await waiter

    def is_starved(self) -> bool:
        """True when some connection has (almost) as many messages in flight as its RDY.

        A batching handler (``msg.enable_async()``) should process its batch then:
        nsqd will not send more until some are answered.
        """
        return self._rdy.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time (0 pauses the consumer)."""
        if max_in_flight < 0:
            raise ConfigError(f"max_in_flight must be >= 0 (got {max_in_flight})")
        self._send_rdy(self._rdy.set_max_in_flight(max_in_flight, self._now()))

    @property
    def max_in_flight(self) -> int:
        return self._rdy.max_in_flight

    @property
    def connections(self) -> list[str]:
        """The subscribed connections: ``host:port`` (NSQ 1.3's SUB), or
        ``host:port/partition``."""
        return list(self._conns)

    @property
    def rdy(self) -> RdyController[str]:
        """The RDY state (read-only use: for monitoring and tests)."""
        return self._rdy

    @property
    def backoff(self) -> Backoff:
        """The backoff state (read-only use: for monitoring and tests)."""
        return self._backoff

    def giving_up(self, msg: Message) -> Any:
        """Called for a message delivered more than ``max_attempts`` times.

        Override it (or pass ``on_giving_up``) to save such messages somewhere; it may
        be a coroutine. The message is finished afterwards unless the hook answered it.
        If the hook raises, the message is requeued instead.
        """
        log.warning("giving up on message %s after %d attempts", msg.hex_id.decode(), msg.attempts)

    # -- connections ----------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spawn_handler(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    async def _connect(self, target: Target, *, discovered: bool = False) -> _Link | None:
        """One attempt: connect, IDENTIFY, SUB, then RDY 1. None when it failed."""
        key = target_key(target)
        if key in self._conns or key in self._connecting or self._closing:
            return None
        self._connecting.add(key)
        try:
            conn = await self._subscribe(target)
        finally:
            self._connecting.discard(key)
        if conn is None:
            if discovered and target[1] is not None:
                self._request_poll()  # the partition may have moved: ask again soon
            return None
        if self._closing:
            conn.close()
            return None
        conn.discovered = discovered
        self._conns[key] = conn
        self.stats.connections = len(self._conns)
        if conn.ordered:
            # nsqd sends an ordered partition's messages one at a time: RDY 1 is all it
            # can use, and a larger RDY makes it hold each message for its output
            # buffer's timeout (it waits for more that cannot come)
            conn.max_rdy_count = 1
            ordered = 1 + sum(c.ordered for c in self._conns.values())
            if ordered > self._rdy.max_in_flight > 0 and not self._warned_rdy:
                self._warned_rdy = True
                log.warning(
                    "%s/%s: max_in_flight %d < %d ordered partitions: they take turns; "
                    "give max_in_flight >= the number of partitions",
                    self.topic,
                    self.channel,
                    self._rdy.max_in_flight,
                    ordered,
                )
        decisions = self._rdy.add(key, conn.max_rdy_count, self._now())
        conn.state = self._rdy.conns[key]
        log.info("%s: subscribed to %s/%s", key, self.topic, self.channel)
        self._send_rdy(decisions)
        conn.start_reading()
        return conn

    async def _subscribe(self, target: Target) -> _Link | None:
        """Connect and subscribe; an ext mismatch (nsqd's E_SUB_EXTEND_NEED or
        E_SUB_EXTEND_FORBIDDON) is corrected and tried again at once."""
        addr, partition = target
        key = target_key(target)
        host, port = split_address(addr)
        for _ in range(2):
            conn = self._new_link(host, port, target)
            try:
                await conn.connect(
                    subscribe=self._sub_command(partition),
                    # (channel_policy: nsqx's nsqd tells the channel's max_attempts)
                    identify={"channel_policy": True, "extend_support": True}
                    if self._ext
                    else {"channel_policy": True},
                )
            except NSQServerError as exc:
                if exc.code in (E_SUB_EXTEND_NEED, E_SUB_EXTEND_FORBIDDON):
                    log.info("%s: %s: subscribing again", key, exc)
                    self._ext = exc.code == E_SUB_EXTEND_NEED
                    continue
                level = logging.WARNING if exc.code in _MOVED_CODES else logging.ERROR
                log.log(
                    level, "%s: cannot subscribe to %s/%s: %s", key, self.topic, self.channel, exc
                )
                return None
            except (NSQError, OSError, TimeoutError) as exc:
                log.warning("%s: cannot subscribe to %s/%s: %s", key, self.topic, self.channel, exc)
                return None
            except Exception:
                # a bug or a very odd server: keep the retry loop alive, say what happened
                log.exception("%s: cannot subscribe to %s/%s", key, self.topic, self.channel)
                return None
            if partition is not None and self._start_for(partition) is not None:
                self._started_partitions.add(partition)
            return conn
        return None

    def _new_link(self, host: str, port: int, target: Target) -> _Link:
        """A connection, its subscription mode and its messages' layout."""
        cfg = self.config
        partition = target[1]
        conn = _Link(self, host, port, target)
        detail = partition is not None and (
            cfg.enable_ordered or cfg.enable_trace or self._start_given
        )
        # nsqd sends Youzan's binary ids to a client that subscribes to a partition or
        # that IDENTIFYs with one of Youzan's keys
        youzan = (
            partition is not None
            or self._ext
            or bool(cfg.desired_tag)
            or cfg.ext_filter is not None
        )
        conn.ordered = partition is not None and cfg.enable_ordered
        conn.msg_cls = message_class(youzan, self._ext, detail)
        return conn

    def _start_for(self, partition: int) -> ConsumeStart | None:
        """The start position still to send for a partition (None: none, or sent)."""
        if partition in self._started_partitions:
            return None
        return self._starts.get(partition, self._start_all)

    def _sub_command(self, partition: int | None) -> bytes:
        cfg = self.config
        topic, channel = self.topic, self.channel
        if partition is None:
            return commands.sub(topic, channel)
        if cfg.enable_ordered:
            return commands.sub_ordered(topic, channel, partition)
        if self._start_given or cfg.enable_trace:
            # after the start position was sent once, the same kind of subscription
            # without one: messages keep their layout (offset and raw size)
            return commands.sub_advanced(topic, channel, partition, self._start_for(partition))
        return commands.sub(topic, channel, partition)

    async def _maintain(self, target: Target, first: asyncio.Future[None]) -> None:
        """Keep a connection to an nsqd given by address: retry in 8 s, 16 s, 32 s, ..."""
        cfg = self.config
        failures = 0
        key = target_key(target)
        try:
            while not self._closing:
                conn = await self._connect(target)
                if not first.done():
                    first.set_result(None)
                if conn is not None:
                    failures = 0
                    await conn.wait_closed()
                    if self._closing:
                        return
                delay = min(cfg.reconnect_delay * 2**failures, cfg.max_reconnect_delay)
                failures = min(failures + 1, 64)
                log.info("%s: reconnecting in %.3gs", key, delay)
                await asyncio.sleep(delay)
        finally:
            if not first.done():
                first.set_result(None)

    async def _discover(self, first: asyncio.Future[None]) -> None:
        """Poll every lookupd now, then every lookupd_poll_interval (after a jitter), or
        sooner when a partition's connection was lost."""
        cfg = self.config
        poller = self._poller
        repoll = self._repoll
        assert poller is not None and repoll is not None
        try:
            await self._poll_once(poller)
            if not first.done():
                first.set_result(None)
            # spread the polls of consumers started together (thundering herd)
            jitter = self._rng.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
            loop = asyncio.get_running_loop()
            next_at = loop.time() + jitter + cfg.lookupd_poll_interval
            while not self._closing:
                await self._wait_poll(repoll, next_at - loop.time())
                await self._poll_once(poller)
                next_at = loop.time() + cfg.lookupd_poll_interval
        finally:
            if not first.done():
                first.set_result(None)

    @staticmethod
    async def _wait_poll(repoll: asyncio.Event, timeout: float) -> None:
        """Sleep ``timeout`` seconds, or less if a poll was requested."""
        if not repoll.is_set() and timeout > 0:
            try:
                await asyncio.wait_for(repoll.wait(), timeout)
            except TimeoutError:
                pass
        repoll.clear()

    def _request_poll(self) -> None:
        """Ask nsqlookupd again soon (a partition's connection was lost or refused)."""
        if self._repoll is None or self._repoll_handle is not None or self._closing:
            return
        assert self._loop is not None
        delay = min(_RECHECK_DELAY, self.config.lookupd_poll_interval)
        self._repoll_handle = self._loop.call_later(delay, self._repoll_now)

    def _repoll_now(self) -> None:
        self._repoll_handle = None
        if self._repoll is not None:
            self._repoll.set()

    async def _poll_once(self, poller: LookupdPoller) -> None:
        result = await poller.lookup()
        if result is None:
            return  # no lookupd answered: forget nothing
        if result.meta is not None and result.meta.ext:
            self._ext = True  # as go-nsq: the topic's meta turns extend_support on
        found = self._targets(result)
        fixed = set(self._fixed_targets())
        vanished = self._discovered - found
        if vanished:
            log.info("lookupd no longer lists %s", ", ".join(sorted(map(target_key, vanished))))
            # a partition served by another nsqd now: its old connection is stale
            moved = {p for _, p in found if p is not None}
            for target in vanished:
                conn = self._conns.get(target_key(target))
                if target[1] in moved and conn is not None and target not in fixed:
                    log.info("%s: partition %d moved; closing", conn.key, target[1])
                    conn.close()
        self._discovered = found
        new = [
            t
            for t in found - fixed
            if target_key(t) not in self._conns and target_key(t) not in self._connecting
        ]
        if new:
            new.sort(key=target_key)
            await asyncio.gather(*(self._connect(t, discovered=True) for t in new))

    def _targets(self, result: LookupResult) -> set[Target]:
        """The connections a lookup answer asks for.

        A partitioned topic (several partitions, ordered, or ext), or a consumer that
        needs partitions (ordered, start positions, positions, ``partitions=``): one per
        partition, on the nsqd that serves it, plus NSQ 1.3's SUB on nsqd that list the
        topic without a partition (as go-nsq does). Otherwise NSQ 1.3's SUB on every nsqd.
        """
        cfg = self.config
        wanted = self.partitions
        needs = cfg.enable_ordered or cfg.enable_trace or self._start_given or wanted is not None
        if not result.partitions:
            if needs and result.producers and not self._warned_no_partitions:
                self._warned_no_partitions = True
                log.error(
                    "nsqlookupd lists no partitions of %s: cannot subscribe to partitions "
                    "(ordered, start position, partitions=)",
                    self.topic,
                )
            return set() if needs else {(a, None) for a in result.producers}
        if not (result.partitioned or needs):
            return {(a, None) for a in result.producers | set(result.partitions.values())}
        found: set[Target] = {
            (addr, pid)
            for pid, addr in result.partitions.items()
            if wanted is None or pid in wanted
        }
        if not needs:
            serving = set(result.partitions.values())
            found |= {(a, None) for a in result.producers if a not in serving}
        return found

    def _on_conn_lost(self, conn: Connection, exc: BaseException | None) -> None:
        assert isinstance(conn, _Link)
        key = conn.key
        if self._conns.get(key) is conn:
            del self._conns[key]
        self.stats.connections = len(self._conns)
        if exc is not None and not self._closing:
            log.warning("%s: connection lost: %s", key, exc)
        else:
            log.info("%s: connection closed", key)
        self._send_rdy(self._rdy.remove(key, self._now()))
        state = conn.state
        if conn.draining and state is not None and state.in_flight:
            # closed before all were answered (nsqd's drain timeout): no longer held
            self._send_rdy(self._rdy.release(state.in_flight, self._now()))
            state.in_flight = 0
        # Messages of this connection not handed out yet: nsqd requeues them itself.
        for pending in (self._queue, self._inbox, *self._ordered_queues.values()):
            if any(m._link is conn for m in pending):
                kept = [m for m in pending if m._link is not conn]
                pending.clear()
                pending.extend(kept)
        if conn.discovered and conn.partition is not None and not self._closing:
            self._request_poll()  # a new leader, perhaps: look it up now, not in a minute

    def _send_rdy(self, decisions: list[tuple[str, int]]) -> None:
        rdy = commands.rdy
        for addr, count in decisions:
            conn = self._conns.get(addr)
            if conn is not None and not conn.closed:
                conn.queue(rdy(count))

    def _redistribute_tick(self) -> None:
        assert self._loop is not None
        if self._closing:
            return
        self._send_rdy(self._rdy.redistribute(self._now()))
        self._redistribute_timer = self._loop.call_later(
            self.config.rdy_redistribute_interval, self._redistribute_tick
        )

    # -- frames -------------------------------------------------------------------------

    def _on_frames(self, conn: Connection, frames: Frames) -> None:
        assert isinstance(conn, _Link)
        state = conn.state
        if state is None:
            return
        if conn.ordered and self.config.ordered_check != "off":
            frames = self._check_order(conn, frames)
        # Every message of this read is in flight (nsqd's view too) until answered;
        # counted before the handlers run so that is_starved() is right inside them.
        state.in_flight += len(frames)
        if self._frames_handler is not None:
            n, fast = self._batch_frames(conn, frames)
        elif self._handler is None:
            n, fast = self._batch_inbox(conn, frames)
        elif self._coro_handler:
            n, fast = self._batch_workers(conn, frames)
        else:
            n, fast = self._batch_inline(conn, frames)
        state.in_flight -= len(frames) - n + fast
        if state.in_flight < 0:
            state.in_flight = 0
        if n:
            now = self._now()
            self.stats.received += n
            self.stats.finished += fast
            state.remaining -= n
            state.received += n
            state.last_msg_at = now
            count = self._rdy.maybe_update(conn.key, now)
            if count is not None and not conn.close_wait:
                conn.queue(commands.rdy(count))
        if conn.close_wait and not conn.draining and not self._closing:
            self._nsqd_drains(conn, state)
        if conn.close_wait and state.in_flight == 0:
            conn.close()
        else:
            conn.flush()

    def _nsqd_drains(self, conn: _Link, state: ConnRdy[str]) -> None:
        """nsqd said CLOSE_WAIT unasked: it drains (a restart, a node leaving). Its
        connection leaves the RDY rotation at once (the others get its share; what is
        still in flight on it keeps its part of max_in_flight until answered), the
        messages it holds are answered on it as usual, and it closes once none is left.
        A new connection follows when nsqd is back (by address: reconnect_delay; found
        through nsqlookupd: once listed again)."""
        conn.draining = True
        log.info(
            "%s: nsqd is draining: %d messages in flight to answer, then closing",
            conn.key,
            state.in_flight,
        )
        self._send_rdy(self._rdy.remove(conn.key, self._now(), hold=state.in_flight))

    def _check_order(self, conn: _Link, frames: Frames) -> Frames:
        """Each partition's messages must come with growing offsets and ids; the same
        message again (a REQ, a timeout) is fine. Anything else is logged, or stops the
        consumer (``ordered_check="raise"``; the message is requeued, not handled)."""
        partition = conn.partition
        assert partition is not None
        positions = self._positions
        make = conn.msg_cls
        kept: Frames = []
        for frame in frames:
            if frame[0] != FRAME_MESSAGE:
                kept.append(frame)
                continue
            msg = make(frame[1])
            now = (msg.offset, msg.internal_id)
            last = positions.get(partition)
            positions[partition] = now
            if last is None or last == now or (now[0] > last[0] and now[1] > last[1]):
                kept.append(frame)
                continue
            error = OrderError(
                f"{self.topic}/{self.channel} partition {partition}: message {now[1]} at "
                f"offset {now[0]} after message {last[1]} at offset {last[0]} (from {conn.key})"
            )
            if self.config.ordered_check == "raise":
                log.error("%s; stopping the consumer", error)
                conn.queue(commands.req(msg.id, 0))
                self._fail(error)
                continue
            log.error("out of order: %s", error)
            kept.append(frame)
        return kept

    def _control(self, conn: _Link, ftype: int, data: bytes) -> None:
        result = conn.handle_control(ftype, data)
        if result is None or isinstance(result, NSQServerError):
            return
        if result == CLOSE_WAIT:
            # ours answered (we closed), or nsqd drains: _on_frames acts on it once the
            # read's messages are counted
            conn.close_wait = True
        else:
            log.warning("%s: unexpected response %r", conn.key, result[:100])

    def _batch_inline(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """A plain-function handler, called inline; FINs collected for one write."""
        handler = self._handler
        assert handler is not None
        fins = conn._fins
        max_attempts = conn.max_attempts or 65536
        bk = self._backoff
        counting = bk.level > 0 and not bk.in_window
        make = conn.msg_cls
        n = fast = 0
        for ftype, data in frames:
            if ftype != FRAME_MESSAGE:
                self._control(conn, ftype, data)
                max_attempts = conn.max_attempts or 65536  # (a policy notice)
                continue
            n += 1
            msg = make(data, conn)
            if (data[MSG_ATTEMPTS_AT] << 8 | data[MSG_ATTEMPTS_AT + 1]) > max_attempts:
                self._give_up(msg)
                continue
            try:
                result = handler(msg)
            except Exception:
                log.exception("handler failed on message %s", msg.hex_id.decode())
                if not msg._responded:
                    msg.requeue()
                continue
            if msg._responded or msg._async:
                continue
            if result is None or result is True:
                # the common case, inline: FIN without a method call
                msg._responded = True
                fins.append(data[MSG_ID_AT:MSG_ID_END])
                fast += 1
                if counting:
                    self._signal(_SUCCESS)
                    counting = bk.level > 0 and not bk.in_window
            else:
                self._handle_result(msg, result)
        return n, fast

    def _batch_frames(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """A frames handler: the read's messages in one call, as bytes."""
        handler = self._frames_handler
        assert handler is not None
        datas = [data for ftype, data in frames if ftype == FRAME_MESSAGE]
        if len(datas) != len(frames):
            for ftype, data in frames:
                if ftype != FRAME_MESSAGE:
                    self._control(conn, ftype, data)
        n = len(datas)
        max_attempts = conn.max_attempts
        if max_attempts and any(
            (d[MSG_ATTEMPTS_AT] << 8 | d[MSG_ATTEMPTS_AT + 1]) > max_attempts for d in datas
        ):
            for d in datas:
                if (d[MSG_ATTEMPTS_AT] << 8 | d[MSG_ATTEMPTS_AT + 1]) > max_attempts:
                    self._give_up(conn.msg_cls(d, conn))
            datas = [
                d
                for d in datas
                if (d[MSG_ATTEMPTS_AT] << 8 | d[MSG_ATTEMPTS_AT + 1]) <= max_attempts
            ]
        if not datas:
            return n, 0
        if self._closing:
            conn.requeue_many([d[MSG_ID_AT:MSG_ID_END] for d in datas], 0)
            return n, 0
        try:
            handler(conn, datas)
        except Exception:
            log.exception("frames handler failed on %d messages; requeued", len(datas))
            conn.requeue_many([d[MSG_ID_AT:MSG_ID_END] for d in datas], 0)
        return n, 0

    def _handle_result(self, msg: Message, result: Any) -> None:
        if result is False:
            msg.requeue()
        elif inspect.isawaitable(result):
            # a plain function that returned an awaitable: finish when it completes
            self._spawn_handler(self._await_result(msg, result))
        else:
            msg.finish()

    async def _await_result(self, msg: Message, aw: Awaitable[Any]) -> None:
        try:
            result = await aw
        except Exception:
            log.exception("handler failed on message %s", msg.hex_id.decode())
            if not msg._responded:
                msg.requeue()
            return
        if not msg._responded and not msg._async:
            if result is False:
                msg.requeue()
            else:
                msg.finish()

    def _admit(self, conn: _Link, frames: Frames) -> tuple[list[Message], int]:
        """The messages of a read within max_attempts (the others go to giving_up), and
        how many messages the read held; control frames are handled on the way."""
        max_attempts = conn.max_attempts or 65536
        make = conn.msg_cls
        admitted: list[Message] = []
        n = 0
        for ftype, data in frames:
            if ftype != FRAME_MESSAGE:
                self._control(conn, ftype, data)
                max_attempts = conn.max_attempts or 65536  # (a policy notice)
                continue
            n += 1
            msg = make(data, conn)
            if (data[MSG_ATTEMPTS_AT] << 8 | data[MSG_ATTEMPTS_AT + 1]) > max_attempts:
                self._give_up(msg)
                continue
            admitted.append(msg)
        return admitted, n

    def _batch_workers(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """A coroutine handler: messages queue for the worker pool (or, from an ordered
        partition, for that partition's own task: one handler call at a time)."""
        admitted, n = self._admit(conn, frames)
        if conn.ordered and admitted:
            partition = conn.partition
            assert partition is not None
            queue = self._ordered_queues.get(partition)
            if queue is None:
                queue = self._ordered_queues[partition] = collections.deque()
            queue.extend(admitted)
            if partition not in self._ordered_busy:
                self._ordered_busy.add(partition)
                self._spawn_handler(self._ordered_worker(partition, queue))
            return n, 0
        self._queue.extend(admitted)
        if self._queue:
            self._wake_workers()
        return n, 0

    async def _ordered_worker(self, partition: int, queue: collections.deque[Message]) -> None:
        """Runs one ordered partition's messages through the handler, one by one."""
        try:
            while queue:
                msg = queue.popleft()
                link = msg._link
                if link is not None and link.closed:
                    continue  # nsqd redelivers it
                await self._run_handler(msg)
        finally:
            self._ordered_busy.discard(partition)

    def _batch_inbox(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """No handler: messages wait for ``async for``."""
        admitted, n = self._admit(conn, frames)
        if self._closing:
            for msg in admitted:
                msg.requeue(0, backoff=False)
            admitted = []
        self._inbox.extend(admitted)
        if self._inbox:
            self._wake_inbox()
        return n, 0

    def _wake_inbox(self) -> None:
        waiter = self._inbox_waiter
        if waiter is not None:
            self._inbox_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- coroutine handlers -----------------------------------------------------------

    def _wake_workers(self) -> None:
        limit = self.concurrency or max(1, self._rdy.max_in_flight)
        waiting = len(self._queue)
        while waiting and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                fut.set_result(None)
                waiting -= 1
        while waiting and len(self._workers) < limit:
            task = asyncio.ensure_future(self._worker())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)
            waiting -= 1

    async def _worker(self) -> None:
        queue = self._queue
        handler = self._handler
        assert handler is not None
        loop = asyncio.get_running_loop()
        while True:
            if not queue:
                if self._closing:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._idle.append(fut)
                await fut
                continue
            msg = queue.popleft()
            link = msg._link
            if link is not None and link.closed:
                continue
            # _run_handler's body, inline: one coroutine frame less per message
            try:
                result = await handler(msg)
            except Exception:
                log.exception("handler failed on message %s", msg.hex_id.decode())
                if not msg._responded:
                    msg.requeue()
                continue
            if msg._responded or msg._async:
                continue
            if result is False:
                msg.requeue()
            else:
                msg.finish()

    async def _run_handler(self, msg: Message) -> None:
        """A coroutine handler on one message, and the answer its outcome means."""
        handler = self._handler
        assert handler is not None
        try:
            result = await handler(msg)
        except Exception:
            log.exception("handler failed on message %s", msg.hex_id.decode())
            if not msg._responded:
                msg.requeue()
            return
        if msg._responded or msg._async:
            return
        if result is False:
            msg.requeue()
        else:
            msg.finish()

    # -- answers ------------------------------------------------------------------------

    def _give_up(self, msg: Message) -> None:
        """Over max_attempts: the giving-up hook, then FIN (REQ if the hook failed)."""
        self.stats.given_up += 1
        hook = self._on_giving_up or self.giving_up
        try:
            result = hook(msg)
        except Exception:
            log.exception("giving-up hook failed on message %s", msg.hex_id.decode())
            if not msg._responded:
                msg.requeue()
            return
        if inspect.isawaitable(result):
            self._spawn_handler(self._await_hook(msg, result))
        elif not msg._responded and not msg._async:
            msg.finish()

    async def _await_hook(self, msg: Message, aw: Awaitable[Any]) -> None:
        try:
            await aw
        except Exception:
            log.exception("giving-up hook failed on message %s", msg.hex_id.decode())
            if not msg._responded:
                msg.requeue()
            return
        if not msg._responded and not msg._async:
            msg.finish()

    def _answer(self, conn: _Link, msg: Message, kind: int, delay: float | None) -> None:
        """FIN (kind _SUCCESS) or REQ of one message, and what follows from it."""
        if conn.closed:
            log.debug("%s: message %r answered after its connection closed", conn.key, msg.id)
            return
        if kind == _SUCCESS:
            conn.queue_fin(msg.id)
            self.stats.finished += 1
        else:
            if delay is None and not conn.ordered:
                delay = self.config.requeue_delay(msg.attempts)
            conn.queue(commands.req(msg.id, self._req_delay_ms(conn, delay or 0.0)))
            self.stats.requeued += 1
        state = conn.state
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1
            if conn.draining:
                self._send_rdy(self._rdy.release(1, self._now()))
            if conn.close_wait and state.in_flight == 0:
                conn.close()
        self._signal(kind)

    def _finish_many(self, conn: _Link, msg_ids: list[bytes]) -> None:
        """FIN of many messages of one connection (see nsqx.client.message.finish_all):
        what _answer does for one, once for all of them (one success for the backoff)."""
        if conn.closed:
            log.debug(
                "%s: %d messages answered after their connection closed", conn.key, len(msg_ids)
            )
            return
        conn.queue_fins(msg_ids)
        self.stats.finished += len(msg_ids)
        self._answered_many(conn, len(msg_ids))
        self._signal(_SUCCESS)

    def _requeue_many(self, conn: _Link, msg_ids: list[bytes], delay: float) -> None:
        """REQ of many messages of one connection, without backoff (see _finish_many)."""
        if conn.closed:
            return
        delay_ms = self._req_delay_ms(conn, delay)
        req = commands.req
        for msg_id in msg_ids:
            conn.queue(req(msg_id, delay_ms))
        self.stats.requeued += len(msg_ids)
        self._answered_many(conn, len(msg_ids))
        self._signal(_NEUTRAL)

    def _req_delay_ms(self, conn: _Link, delay: float) -> int:
        """A REQ's delay in ms: ``delay`` within 0 and max_requeue_delay, or 0 on an
        ordered channel (nsqd ignores the delay there and the message would come back
        only after msg_timeout: ask for it now; backoff paces the retries)."""
        if conn.ordered:
            return 0
        return int(min(max(delay, 0.0), self.config.max_requeue_delay) * 1000)

    def _answered_many(self, conn: _Link, n: int) -> None:
        state = conn.state
        if state is not None and state.in_flight > 0:
            answered = min(n, state.in_flight)
            state.in_flight -= answered
            if conn.draining:
                self._send_rdy(self._rdy.release(answered, self._now()))
            if conn.close_wait and state.in_flight == 0:
                conn.close()

    def _signal(self, kind: int) -> None:
        bk = self._backoff
        if kind == _SUCCESS:
            if bk.level == 0 or bk.in_window:
                return
            action = bk.success()
        elif kind == _FAILURE:
            action = bk.failure()
        else:
            action = bk.neutral()
        if action is not None:
            self._apply_backoff(action)

    def _apply_backoff(self, action: BackoffAction) -> None:
        now = self._now()
        if action.resume:
            log.info("backoff over: back to full speed")
            self._send_rdy(self._rdy.resume(now))
            return
        log.warning(
            "backing off for %.3gs (level %d): RDY 0 everywhere",
            action.duration,
            self._backoff.level,
        )
        self._send_rdy(self._rdy.pause(now))
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
        assert self._loop is not None
        self._backoff_timer = self._loop.call_later(action.duration, self._backoff_window_over)

    def _backoff_window_over(self) -> None:
        self._backoff_timer = None
        self._backoff.window_ended()
        if self._closing:
            return
        # test the waters: RDY 1 on one connection; the next result decides
        self._send_rdy(self._rdy.test_waters(self._now()))


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
