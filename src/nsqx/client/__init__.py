"""nsqx.client: an asyncio NSQ client (consumer, producer), plus a blocking facade.

    from nsqx.client import Consumer, Producer

    async def handle(msg):          # a plain function works too (and is faster)
        print(msg.body)             # returning finishes the message; raising requeues it

    async with Producer("127.0.0.1:4150") as producer:
        await producer.publish("events", b"hello")

    async with Consumer("events", "archive", handle,
                        lookupd_http_addresses=["127.0.0.1:4161"], max_in_flight=100):
        ...

See docs/client.md.
"""

from nsqx.client.backoff import Backoff
from nsqx.client.codec import StreamCodec, register_codec
from nsqx.client.config import Config, parse_duration
from nsqx.client.consumer import Consumer, ConsumerStats, Handler
from nsqx.client.errors import (
    AuthError,
    CodecUnavailableError,
    ConfigError,
    ConnectionClosedError,
    HandshakeError,
    NSQError,
    NSQServerError,
    PublishError,
)
from nsqx.client.message import Message, MessageRespondedError
from nsqx.client.producer import HttpProducer, Producer
from nsqx.client.rdy import RdyController
from nsqx.client.sync import BlockingConsumer, BlockingMessage, BlockingProducer

__all__ = [
    "AuthError",
    "Backoff",
    "BlockingConsumer",
    "BlockingMessage",
    "BlockingProducer",
    "CodecUnavailableError",
    "Config",
    "ConfigError",
    "ConnectionClosedError",
    "Consumer",
    "ConsumerStats",
    "Handler",
    "HandshakeError",
    "HttpProducer",
    "Message",
    "MessageRespondedError",
    "NSQError",
    "NSQServerError",
    "Producer",
    "PublishError",
    "RdyController",
    "StreamCodec",
    "parse_duration",
    "register_codec",
]
