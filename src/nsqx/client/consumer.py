"""Consumer: subscribes to a topic's channel on every nsqd that has it, and handles messages.

It connects to nsqd given by address (reconnecting with exponential backoff) or
found through nsqlookupd (polled at an interval, with jitter), keeps RDY within the
client guide's rules (:mod:`nsqx.client.rdy`), backs off after failures
(:mod:`nsqx.client.backoff`) and hands messages to a handler, or to ``async for``.

Speed: each read's frames are handled in one pass. A plain-function handler is called
inline (no Task per message) and the FINs and RDY of the read leave in one write. A
coroutine handler runs on a pool of worker tasks, at most ``concurrency`` at once.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nsqx.client import codec
from nsqx.client.backoff import Backoff, BackoffAction
from nsqx.client.config import Config
from nsqx.client.conn import Connection, Frames, split_address
from nsqx.client.discovery import LookupdPoller
from nsqx.client.errors import ConfigError, NSQError, NSQServerError
from nsqx.client.message import Message
from nsqx.client.rdy import ConnRdy, RdyController
from nsqx.wire import commands
from nsqx.wire.frames import CLOSE_WAIT, FRAME_MESSAGE
from nsqx.wire.names import is_valid_name

log = logging.getLogger("nsqx.client")

#: A handler takes a message; a plain function or a coroutine function.
#: Returning False requeues the message; anything else (or None) finishes it;
#: an exception requeues it (with backoff).
Handler = Callable[[Message], Any]
GivingUpHook = Callable[[Message], Any]

_CLS = commands.cls()

_SUCCESS, _FAILURE, _NEUTRAL = 0, 1, 2


@dataclass
class ConsumerStats:
    """Counters of one consumer."""

    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    connections: int = 0


class _Link(Connection):
    """A consumer's connection: what its messages answer through."""

    def __init__(self, consumer: Consumer, host: str, port: int) -> None:
        super().__init__(
            host,
            port,
            consumer.config,
            on_frames=consumer._on_frames,
            on_lost=consumer._on_conn_lost,
        )
        self.consumer = consumer
        self.state: ConnRdy[str] | None = None
        #: nsqd answered our CLS: it sends nothing more.
        self.close_wait = False

    def finish(self, msg: Message) -> None:
        self.consumer._answer(self, msg, _SUCCESS, None)

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
    ``on_giving_up``) and are then finished.
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
        if handler is not None and not callable(handler):
            raise ConfigError("handler must be callable")
        self._handler = handler
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
        self._discovered: set[str] = set()
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
        for addr in self.nsqd_tcp_addresses:
            first: asyncio.Future[None] = loop.create_future()
            firsts.append(first)
            self._spawn(self._maintain(addr, first))
        if self.lookupd_http_addresses:
            self._poller = LookupdPoller(
                self.lookupd_http_addresses,
                self.topic,
                timeout=self.config.lookupd_poll_timeout,
            )
            first = loop.create_future()
            firsts.append(first)
            self._spawn(self._discover(first))
        await asyncio.gather(*firsts)

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
        for timer in (self._redistribute_timer, self._backoff_timer):
            if timer is not None:
                timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        # not handed to anybody yet: straight back to nsqd
        for pending in (self._inbox, self._queue):
            while pending:
                msg = pending.popleft()
                if not msg._responded:
                    msg.requeue(0, backoff=False)
        self._wake_inbox()
        for conn in list(self._conns.values()):
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
        """Wait until :meth:`close` has finished (for services that run until stopped)."""
        if self._closed is None:
            raise RuntimeError("consumer not started")
        await asyncio.shield(self._closed)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._handler is not None:
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
        """Addresses of the subscribed connections."""
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
        log.warning(
            "giving up on message %s after %d attempts", msg.id.decode("ascii"), msg.attempts
        )

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

    async def _connect(self, addr: str) -> _Link | None:
        """One attempt: connect, IDENTIFY, SUB, then RDY 1. None when it failed."""
        if addr in self._conns or addr in self._connecting or self._closing:
            return None
        host, port = split_address(addr)
        conn = _Link(self, host, port)
        self._connecting.add(addr)
        try:
            await conn.connect(subscribe=(self.topic, self.channel))
        except (NSQError, OSError, TimeoutError) as exc:
            level = logging.ERROR if isinstance(exc, NSQServerError) else logging.WARNING
            log.log(level, "%s: cannot subscribe to %s/%s: %s", addr, self.topic, self.channel, exc)
            return None
        except Exception:
            # a bug or a very odd server: keep the retry loop alive, say what happened
            log.exception("%s: cannot subscribe to %s/%s", addr, self.topic, self.channel)
            return None
        finally:
            self._connecting.discard(addr)
        if self._closing:
            conn.close()
            return None
        self._conns[addr] = conn
        self.stats.connections = len(self._conns)
        decisions = self._rdy.add(addr, conn.max_rdy_count, self._now())
        conn.state = self._rdy.conns[addr]
        log.info("%s: subscribed to %s/%s", addr, self.topic, self.channel)
        self._send_rdy(decisions)
        conn.start_reading()
        return conn

    async def _maintain(self, addr: str, first: asyncio.Future[None]) -> None:
        """Keep a connection to an nsqd given by address: retry in 8 s, 16 s, 32 s, ..."""
        cfg = self.config
        failures = 0
        try:
            while not self._closing:
                conn = await self._connect(addr)
                if not first.done():
                    first.set_result(None)
                if conn is not None:
                    failures = 0
                    await conn.wait_closed()
                    if self._closing:
                        return
                delay = min(cfg.reconnect_delay * 2**failures, cfg.max_reconnect_delay)
                failures = min(failures + 1, 64)
                log.info("%s: reconnecting in %.3gs", addr, delay)
                await asyncio.sleep(delay)
        finally:
            if not first.done():
                first.set_result(None)

    async def _discover(self, first: asyncio.Future[None]) -> None:
        """Poll every lookupd now, then every lookupd_poll_interval (after a jitter)."""
        cfg = self.config
        poller = self._poller
        assert poller is not None
        try:
            await self._poll_once(poller)
            if not first.done():
                first.set_result(None)
            # spread the polls of consumers started together (thundering herd)
            jitter = self._rng.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
            await asyncio.sleep(jitter)
            while not self._closing:
                await asyncio.sleep(cfg.lookupd_poll_interval)
                await self._poll_once(poller)
        finally:
            if not first.done():
                first.set_result(None)

    async def _poll_once(self, poller: LookupdPoller) -> None:
        found = await poller.poll()
        if found is None:
            return  # no lookupd answered: forget nothing
        fixed = set(self.nsqd_tcp_addresses)
        vanished = self._discovered - found
        if vanished:
            log.info("lookupd no longer lists %s", ", ".join(sorted(vanished)))
        self._discovered = found
        new = [a for a in found - fixed if a not in self._conns and a not in self._connecting]
        if new:
            await asyncio.gather(*(self._connect(a) for a in sorted(new)))

    def _on_conn_lost(self, conn: Connection, exc: BaseException | None) -> None:
        addr = conn.key
        if self._conns.get(addr) is conn:
            del self._conns[addr]
        self.stats.connections = len(self._conns)
        if exc is not None and not self._closing:
            log.warning("%s: connection lost: %s", addr, exc)
        else:
            log.info("%s: connection closed", addr)
        self._send_rdy(self._rdy.remove(addr, self._now()))
        # Messages of this connection not handed out yet: nsqd requeues them itself.
        for pending in (self._queue, self._inbox):
            if any(m._link is conn for m in pending):
                kept = [m for m in pending if m._link is not conn]
                pending.clear()
                pending.extend(kept)

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
        # Every message of this read is in flight (nsqd's view too) until answered;
        # counted before the handlers run so that is_starved() is right inside them.
        state.in_flight += len(frames)
        if self._handler is None:
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
            if count is not None:
                conn.queue(commands.rdy(count))
        if self._closing and conn.close_wait and state.in_flight == 0:
            conn.close()
        else:
            conn.flush()

    def _control(self, conn: _Link, ftype: int, data: bytes) -> None:
        result = conn.handle_control(ftype, data)
        if result is None or isinstance(result, NSQServerError):
            return
        if result == CLOSE_WAIT:
            conn.close_wait = True
        else:
            log.warning("%s: unexpected response %r", conn.key, result[:100])

    def _batch_inline(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """A plain-function handler, called inline; FINs collected for one write."""
        handler = self._handler
        assert handler is not None
        fins = conn._fins
        max_attempts = self.config.max_attempts or 65536
        bk = self._backoff
        counting = bk.level > 0 and not bk.in_window
        n = fast = 0
        for ftype, data in frames:
            if ftype != FRAME_MESSAGE:
                self._control(conn, ftype, data)
                continue
            n += 1
            msg = Message(data, conn)
            if (data[8] << 8 | data[9]) > max_attempts:
                self._give_up(msg)
                continue
            try:
                result = handler(msg)
            except Exception:
                log.exception("handler failed on message %s", msg.id.decode("ascii"))
                if not msg._responded:
                    msg.requeue()
                continue
            if msg._responded or msg._async:
                continue
            if result is None or result is True:
                # the common case, inline: FIN without a method call
                msg._responded = True
                fins.append(data[10:26])
                fast += 1
                if counting:
                    self._signal(_SUCCESS)
                    counting = bk.level > 0 and not bk.in_window
            else:
                self._handle_result(msg, result)
        return n, fast

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
            log.exception("handler failed on message %s", msg.id.decode("ascii"))
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
        max_attempts = self.config.max_attempts or 65536
        admitted: list[Message] = []
        n = 0
        for ftype, data in frames:
            if ftype != FRAME_MESSAGE:
                self._control(conn, ftype, data)
                continue
            n += 1
            msg = Message(data, conn)
            if (data[8] << 8 | data[9]) > max_attempts:
                self._give_up(msg)
                continue
            admitted.append(msg)
        return admitted, n

    def _batch_workers(self, conn: _Link, frames: Frames) -> tuple[int, int]:
        """A coroutine handler: messages queue for the worker pool."""
        admitted, n = self._admit(conn, frames)
        self._queue.extend(admitted)
        if self._queue:
            self._wake_workers()
        return n, 0

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
            try:
                result = await handler(msg)
            except Exception:
                log.exception("handler failed on message %s", msg.id.decode("ascii"))
                if not msg._responded:
                    msg.requeue()
                continue
            if msg._responded or msg._async:
                continue
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
            log.exception("giving-up hook failed on message %s", msg.id.decode("ascii"))
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
            log.exception("giving-up hook failed on message %s", msg.id.decode("ascii"))
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
            cfg = self.config
            if delay is None:
                delay = cfg.requeue_delay(msg.attempts)
            delay_ms = int(min(max(delay, 0.0), cfg.max_requeue_delay) * 1000)
            conn.queue(commands.req(msg.id, delay_ms))
            self.stats.requeued += 1
        state = conn.state
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1
            if self._closing and conn.close_wait and state.in_flight == 0:
                conn.close()
        self._signal(kind)

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
