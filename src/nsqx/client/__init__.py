"""nsqx.client: an asyncio NSQ client (consumer, producer), plus a blocking facade.

    from nsqx.client import Consumer, Producer

    async def handle(msg):          # a plain function works too (and is faster)
        print(msg.body)             # returning finishes the message; raising requeues it

    async with Producer("127.0.0.1:4150") as producer:
        await producer.publish("events", b"hello")

    async with Consumer("events", "archive", handle,
                        lookupd_http_addresses=["127.0.0.1:4161"], max_in_flight=100):
        ...

Youzan's extensions (partitioned topics, ordered consumption, replay, tracing, ext
headers): :class:`PartitionProducer` publishes by key through nsqlookupd; a
:class:`Consumer` subscribes to every partition, in order with ``enable_ordered=True``,
from a position with ``start=``; :class:`Message` has ``trace_id``, ``offset``,
``raw_size``, ``ext_header``, ``partition``.

See docs/client.md.
"""

from nsqx.client.backoff import Backoff
from nsqx.client.codec import StreamCodec, register_codec
from nsqx.client.config import Config, parse_duration
from nsqx.client.consumer import Answers, Consumer, ConsumerStats, FramesHandler, Handler
from nsqx.client.discovery import LookupResult
from nsqx.client.errors import (
    AuthError,
    CodecUnavailableError,
    ConfigError,
    ConnectionClosedError,
    HandshakeError,
    NSQError,
    NSQServerError,
    OrderError,
    PartitionUnavailableError,
    PublishError,
)
from nsqx.client.message import Message, MessageRespondedError, finish_all
from nsqx.client.partition_producer import PartitionProducer
from nsqx.client.producer import HttpProducer, Producer
from nsqx.client.rdy import RdyController
from nsqx.client.sharding import murmur3_32, partition_for_key
from nsqx.client.sync import BlockingConsumer, BlockingMessage, BlockingProducer
from nsqx.client.youzan import (
    ConsumeStart,
    TraceResult,
    ext_header,
    set_channel_offset,
    start_at_count,
    start_at_end,
    start_at_offset,
    start_at_time,
)
from nsqx.wire.topic_meta import TopicMeta

__all__ = [
    "Answers",
    "AuthError",
    "Backoff",
    "BlockingConsumer",
    "BlockingMessage",
    "BlockingProducer",
    "CodecUnavailableError",
    "Config",
    "ConfigError",
    "ConnectionClosedError",
    "ConsumeStart",
    "Consumer",
    "ConsumerStats",
    "FramesHandler",
    "Handler",
    "HandshakeError",
    "HttpProducer",
    "LookupResult",
    "Message",
    "MessageRespondedError",
    "NSQError",
    "NSQServerError",
    "OrderError",
    "PartitionProducer",
    "PartitionUnavailableError",
    "Producer",
    "PublishError",
    "RdyController",
    "StreamCodec",
    "TopicMeta",
    "TraceResult",
    "ext_header",
    "finish_all",
    "murmur3_32",
    "parse_duration",
    "partition_for_key",
    "register_codec",
    "set_channel_offset",
    "start_at_count",
    "start_at_end",
    "start_at_offset",
    "start_at_time",
]
