"""A blocking facade for scripts, threads and Spark executors.

Each object runs its own event loop (uvloop when installed) in a daemon thread; its
methods block the calling thread and may be called from any thread.

    with BlockingProducer("127.0.0.1:4150") as producer:
        producer.publish("events", b"hello")

    with BlockingConsumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
                          max_in_flight=100) as consumer:
        for msg in consumer.messages(timeout=5):
            print(msg.body)
            msg.finish()
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from nsqx.client.config import Config
from nsqx.client.consumer import Consumer
from nsqx.client.message import Message, MessageRespondedError
from nsqx.client.producer import Body, Producer
from nsqx.client.youzan import TraceResult

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed, asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self, name: str = "nsqx-client") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking call from the client's own loop thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop, soon; do not wait."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class BlockingProducer:
    """:class:`Producer` for blocking code: each publish returns once nsqd acknowledged."""

    def __init__(
        self,
        nsqd_tcp_addresses: str | Iterable[str],
        *,
        config: Config | None = None,
        timeout: float | None = 60.0,
        **options: Any,
    ) -> None:
        self.timeout = timeout
        self._producer = Producer(nsqd_tcp_addresses, config=config, **options)
        self._thread = LoopThread("nsqx-producer")

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(self, topic: str, body: Body, partition: int | None = None) -> None:
        """PUB one message; raises :class:`~nsqx.client.errors.PublishError` if refused."""
        self._thread.run(self._wait(self._producer.publish, topic, body, partition), self.timeout)

    def multi_publish(
        self, topic: str, bodies: Iterable[Body], partition: int | None = None
    ) -> None:
        """MPUB several messages at once."""
        self._thread.run(
            self._wait(self._producer.multi_publish, topic, list(bodies), partition),
            self.timeout,
        )

    def publish_trace(
        self, topic: str, body: Body, trace_id: int, partition: int | None = None
    ) -> TraceResult:
        """PUB_TRACE: the message's id, trace id, offset and raw size."""
        return self._thread.run(
            self._result(self._producer.publish_trace, topic, body, trace_id, partition),
            self.timeout,
        )

    def publish_ext(
        self,
        topic: str,
        body: Body,
        ext: Mapping[str, Any] | None = None,
        *,
        tag: str | None = None,
        trace_id: int | None = None,
        partition: int | None = None,
    ) -> TraceResult | None:
        """PUB_EXT with a JSON ext header (see :meth:`Producer.publish_ext`)."""

        def send() -> Awaitable[TraceResult | None]:
            return self._producer.publish_ext(
                topic, body, ext, tag=tag, trace_id=trace_id, partition=partition
            )

        return self._thread.run(self._result(send), self.timeout)

    def deferred_publish(self, topic: str, body: Body, delay: float) -> None:
        """DPUB: deliver after ``delay`` seconds."""
        self._thread.run(
            self._wait(self._producer.deferred_publish, topic, body, delay), self.timeout
        )

    pub = publish
    mpub = multi_publish
    dpub = deferred_publish

    @staticmethod
    async def _wait(fn: Callable[..., Any], *args: Any) -> None:
        await fn(*args)

    @staticmethod
    async def _result(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await fn(*args)

    def close(self) -> None:
        """Wait for outstanding publishes, close the connection and stop the thread."""
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._producer.close(), self.timeout)
        finally:
            self._thread.stop()


class BlockingMessage:
    """A message handed to a thread; its answers go to the consumer's loop."""

    __slots__ = ("_call", "_msg", "_responded")

    def __init__(self, msg: Message, call: Callable[..., None]) -> None:
        self._msg = msg
        self._call = call
        self._responded = False

    @property
    def id(self) -> bytes:
        return self._msg.id

    @property
    def body(self) -> bytes:
        return self._msg.body

    @property
    def attempts(self) -> int:
        return self._msg.attempts

    @property
    def timestamp(self) -> int:
        return self._msg.timestamp

    @property
    def hex_id(self) -> bytes:
        return self._msg.hex_id

    @property
    def internal_id(self) -> int:
        return self._msg.internal_id

    @property
    def trace_id(self) -> int:
        return self._msg.trace_id

    @property
    def offset(self) -> int:
        return self._msg.offset

    @property
    def raw_size(self) -> int:
        return self._msg.raw_size

    @property
    def partition(self) -> int | None:
        return self._msg.partition

    @property
    def ext(self) -> bytes:
        return self._msg.ext

    @property
    def ext_header(self) -> dict[str, Any]:
        return self._msg.ext_header

    @property
    def tag(self) -> str:
        return self._msg.tag

    def __repr__(self) -> str:
        return repr(self._msg)

    @property
    def has_responded(self) -> bool:
        return self._responded

    def _take(self, what: str) -> None:
        if self._responded:
            raise MessageRespondedError(f"{what}: message {self.id!r} was already answered")
        self._responded = True

    def finish(self) -> None:
        """FIN."""
        self._take("finish")
        self._call(self._msg.finish)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ (see :meth:`Message.requeue`)."""
        self._take("requeue")
        self._call(self._msg.requeue, delay, backoff)

    def touch(self) -> None:
        """TOUCH: ask nsqd for more time."""
        if self._responded:
            raise MessageRespondedError(f"touch: message {self.id!r} was already answered")
        self._call(self._msg.touch)


class BlockingConsumer:
    """:class:`Consumer` for blocking code: take messages with :meth:`get` or iterate.

    Every message must be answered (``finish()`` / ``requeue()``), from any thread.
    Messages not taken when the consumer closes are requeued at once.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: Iterable[str] | str = (),
        lookupd_http_addresses: Iterable[str] | str = (),
        config: Config | None = None,
        **options: Any,
    ) -> None:
        self._inbox: queue.SimpleQueue[BlockingMessage] = queue.SimpleQueue()
        self._consumer = Consumer(
            topic,
            channel,
            self._on_message,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            config=config,
            **options,
        )
        self._thread = LoopThread("nsqx-consumer")
        self._call = self._thread.call
        self._closed = False
        #: set on the loop thread when close() begins
        self._closing = False
        try:
            self._thread.run(self._consumer.start())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def consumer(self) -> Consumer:
        """The asyncio consumer underneath (use it only on its loop)."""
        return self._consumer

    def _on_message(self, msg: Message) -> None:
        # on the loop thread: hand the message over, the thread answers later
        if self._closing:
            # nobody will take it any more: straight back to nsqd
            msg.requeue(0, backoff=False)
            return
        msg.enable_async()
        self._inbox.put(BlockingMessage(msg, self._call))

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, timeout: float | None = None) -> BlockingMessage | None:
        """The next message; None after ``timeout`` seconds without one."""
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def messages(self, timeout: float | None = None) -> Iterator[BlockingMessage]:
        """Messages as they come; stops after ``timeout`` seconds without one."""
        while not self._closed:
            msg = self.get(timeout)
            if msg is None:
                return
            yield msg

    def __iter__(self) -> Iterator[BlockingMessage]:
        return self.messages()

    def is_starved(self) -> bool:
        """See :meth:`Consumer.is_starved`."""
        return self._consumer.is_starved()

    def close(self, timeout: float = 30.0) -> None:
        """Requeue messages not taken, wait for the others to be answered, then close."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            self._closing = True
            while True:
                try:
                    m = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if not m.has_responded:
                    m._responded = True
                    m._msg.requeue(0, backoff=False)
            await self._consumer.close(timeout)

        try:
            self._thread.run(shutdown(), timeout + 10)
        finally:
            self._thread.stop()
