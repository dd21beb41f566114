"""PartitionProducer: publishes through nsqlookupd to the nsqd that serves each partition.

It looks a topic up (``/lookup?topic=&access=w&metainfo=true``), picks the partition
(from a key with go-nsq's function, :func:`~nsqx.client.sharding.partition_for_key`,
or as given, or round-robin) and publishes on a pipelined :class:`Producer` per nsqd.

When the partition's nsqd says it is not (or no longer) its leader, that it cannot write,
or that the topic does not exist there (E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE,
E_TOPIC_NOT_EXIST), or the connection is lost, the topic is looked up again and the
publish retried, ``pub_max_retry`` times, after ``pub_retry_delay`` (doubling): what
Youzan's client guide asks, since nothing tells clients that a leader changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from nsqx.client import codec
from nsqx.client.config import Config
from nsqx.client.discovery import LookupdPoller, LookupResult
from nsqx.client.errors import (
    ConfigError,
    ConnectionClosedError,
    PartitionUnavailableError,
    PublishError,
)
from nsqx.client.producer import Body, Producer
from nsqx.client.sharding import ShardKey, partition_for_key
from nsqx.client.youzan import TraceResult
from nsqx.wire.errors import E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST
from nsqx.wire.names import is_valid_name

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("nsqx.client")

T = TypeVar("T")

#: errors after which the topic is looked up again and the publish retried
RETRY_CODES = frozenset({E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST})
_MAX_RETRY_DELAY = 2.0


class _Route:
    """A topic's last lookup and when it was made."""

    __slots__ = ("at", "result")

    def __init__(self, result: LookupResult, at: float) -> None:
        self.result = result
        self.at = at


class PartitionProducer:
    """Publishes to partitioned topics through nsqlookupd (Youzan's, or nsqx's).

    ``key=`` sends a message to the key's partition (the same as youzan/go-nsq's
    producer with murmur3), so that messages of one key keep their order;
    ``partition=`` names one; with neither, partitions take turns (an ordered topic
    refuses that: its messages need a key or a partition). A topic whose lookup has no
    partitions (NSQ 1.3's nsqlookupd) is published to its nsqd in turn, without one.

    Options are :class:`Config`'s (``pub_max_retry``, ``pub_retry_delay``,
    ``lookupd_poll_interval`` (a topic is looked up again after this long),
    ``lookupd_poll_timeout``, and the connection options of :class:`Producer`).
    Retries after a lost connection may publish a message twice (at least once, as
    everywhere in NSQ).
    """

    def __init__(
        self,
        lookupd_http_addresses: str | Iterable[str],
        *,
        config: Config | None = None,
        **options: Any,
    ) -> None:
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        if not self.lookupd_http_addresses:
            raise ConfigError("give at least one nsqlookupd HTTP address")
        self.config = (config or Config()).with_options(**options)
        for name in ("snappy", "deflate"):
            if getattr(self.config, name):
                codec.codec_factory(name)
        self._producers: dict[str, Producer] = {}
        self._routes: dict[str, _Route] = {}
        self._lookups: dict[str, asyncio.Task[LookupResult | None]] = {}
        self._pollers: dict[str, LookupdPoller] = {}
        self._turn: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<PartitionProducer nsqd={sorted(self._producers)}>"

    async def __aenter__(self) -> PartitionProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Wait for outstanding publishes, then close every connection."""
        self._closed = True
        for task in self._lookups.values():
            task.cancel()
        await asyncio.gather(*self._lookups.values(), return_exceptions=True)
        await asyncio.gather(*(p.close() for p in self._producers.values()))
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- publishing ---------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        body: Body,
        *,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> None:
        """PUB one message to the partition of ``key`` (or ``partition``)."""
        await self._publish(topic, key, partition, lambda p, pid: p.publish(topic, body, pid))

    async def multi_publish(
        self,
        topic: str,
        bodies: Iterable[Body],
        *,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> None:
        """MPUB several messages, atomically, to one partition."""
        datas = list(bodies)
        await self._publish(
            topic, key, partition, lambda p, pid: p.multi_publish(topic, datas, pid)
        )

    async def publish_trace(
        self,
        topic: str,
        body: Body,
        trace_id: int,
        *,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> TraceResult:
        """PUB_TRACE: the answer has the message's id, trace id, offset and raw size."""
        return await self._publish(
            topic, key, partition, lambda p, pid: p.publish_trace(topic, body, trace_id, pid)
        )

    async def multi_publish_trace(
        self,
        topic: str,
        bodies: Iterable[Body],
        trace_ids: Iterable[int],
        *,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> TraceResult:
        """MPUB_TRACE: the first message's id and offset, the batch's raw size."""
        datas, traces = list(bodies), list(trace_ids)
        return await self._publish(
            topic,
            key,
            partition,
            lambda p, pid: p.multi_publish_trace(topic, datas, traces, pid),
        )

    async def publish_ext(
        self,
        topic: str,
        body: Body,
        ext: Mapping[str, Any] | None = None,
        *,
        tag: str | None = None,
        trace_id: int | None = None,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> TraceResult | None:
        """PUB_EXT with a JSON ext header (see :meth:`Producer.publish_ext`)."""
        return await self._publish(
            topic,
            key,
            partition,
            lambda p, pid: p.publish_ext(
                topic, body, ext, tag=tag, trace_id=trace_id, partition=pid
            ),
        )

    async def multi_publish_ext(
        self,
        topic: str,
        bodies: Iterable[Body],
        exts: Iterable[Mapping[str, Any] | None],
        *,
        key: ShardKey | None = None,
        partition: int | None = None,
    ) -> None:
        """MPUB_EXT: several messages with an ext header each, to one partition."""
        datas, headers = list(bodies), list(exts)
        await self._publish(
            topic,
            key,
            partition,
            lambda p, pid: p.multi_publish_ext(topic, datas, headers, pid),
        )

    pub = publish
    mpub = multi_publish

    async def _publish(
        self,
        topic: str,
        key: ShardKey | None,
        partition: int | None,
        send: Callable[[Producer, int | None], Awaitable[T]],
    ) -> T:
        if not is_valid_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if self._closed:
            raise ConnectionClosedError("the producer is closed")
        cfg = self.config
        delay = cfg.pub_retry_delay
        attempt = 0
        while True:
            try:
                route = await self.lookup(topic)
                address, pid = self._pick(topic, route, key, partition)
                return await send(self._producer(address), pid)
            except PublishError as err:
                if err.code not in RETRY_CODES or attempt >= cfg.pub_max_retry:
                    raise
                why: Exception = err
            except (ConnectionClosedError, PartitionUnavailableError) as err:
                if attempt >= cfg.pub_max_retry or self._closed:
                    raise
                why = err
            attempt += 1
            log.info(
                "publish to %s failed (%s): looking it up again, retry %d of %d in %.3gs",
                topic,
                why,
                attempt,
                cfg.pub_max_retry,
                delay,
            )
            self._routes.pop(topic, None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_DELAY)

    def _pick(
        self, topic: str, route: LookupResult, key: ShardKey | None, partition: int | None
    ) -> tuple[str, int | None]:
        """The nsqd and partition of one publish."""
        if not route.partitions:
            # NSQ 1.3's answer: any nsqd that has the topic, without a partition
            if partition:
                raise PartitionUnavailableError(
                    f"nsqlookupd lists no partitions of {topic!r} (asked for {partition})"
                )
            producers = sorted(route.producers)
            if not producers:
                raise PartitionUnavailableError(f"no nsqd has topic {topic!r} (create it first)")
            turn = self._turn.get(topic, 0)
            self._turn[topic] = turn + 1
            return producers[turn % len(producers)], None
        n = route.partition_num
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise ValueError(f"a partition is an int >= 0 (got {partition!r})")
            if partition >= n:
                raise ValueError(f"topic {topic!r} has {n} partitions (asked for {partition})")
            pid = partition
        elif key is not None:
            pid = partition_for_key(key, n)
        elif route.meta is not None and route.meta.ordered:
            raise ValueError(f"topic {topic!r} is ordered: publish with key= or partition=")
        else:
            pids = sorted(route.partitions)
            turn = self._turn.get(topic, 0)
            self._turn[topic] = turn + 1
            pid = pids[turn % len(pids)]
        address = route.partitions.get(pid)
        if address is None:
            # never another partition instead: that would break the key's order
            raise PartitionUnavailableError(f"no nsqd serves partition {pid} of {topic!r}")
        return address, pid

    def _producer(self, address: str) -> Producer:
        producer = self._producers.get(address)
        if producer is None:
            producer = self._producers[address] = Producer(address, config=self.config)
        return producer

    # -- lookup -------------------------------------------------------------------------

    async def lookup(self, topic: str) -> LookupResult:
        """What nsqlookupd says of ``topic`` (cached; looked up again after an error,
        and in the background once ``lookupd_poll_interval`` has passed)."""
        loop = asyncio.get_running_loop()
        route = self._routes.get(topic)
        if route is not None:
            if loop.time() - route.at > self.config.lookupd_poll_interval:
                self._start_lookup(topic)  # refresh; meanwhile the old answer serves
            return route.result
        result = await asyncio.shield(self._start_lookup(topic))
        if result is None:
            raise PartitionUnavailableError(f"no nsqlookupd answered for topic {topic!r}")
        return result

    def _start_lookup(self, topic: str) -> asyncio.Task[LookupResult | None]:
        task = self._lookups.get(topic)
        if task is None:
            task = self._lookups[topic] = asyncio.ensure_future(self._lookup(topic))
        return task

    async def _lookup(self, topic: str) -> LookupResult | None:
        try:
            poller = self._pollers.get(topic)
            if poller is None:
                if self._session is None:
                    import aiohttp

                    self._session = aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=self.config.lookupd_poll_timeout)
                    )
                poller = self._pollers[topic] = LookupdPoller(
                    self.lookupd_http_addresses,
                    topic,
                    timeout=self.config.lookupd_poll_timeout,
                    access="w",
                    session=self._session,
                    auth_secret=self.config.auth_secret,
                )
            result = await poller.lookup()
            if result is not None:
                self._routes[topic] = _Route(result, asyncio.get_running_loop().time())
            else:
                # nobody answered: an older answer is better than none
                old = self._routes.get(topic)
                result = old.result if old is not None else None
            return result
        finally:
            self._lookups.pop(topic, None)
