"""Drive nsqd with gnsq 1.0.2 (gevent): ``gnsq_driver.py HOST:PORT TOPIC PHASE``.

Uses only gnsq's public API: ``gnsq.Producer`` (publish / publish(defer=) / multipublish)
and ``gnsq.Consumer`` (message_handler, on_error; ``Message.finish/requeue/touch/
enable_async``). gnsq uses gevent sockets itself, so nothing is monkey-patched; every wait
is bounded (gevent timeouts, plus the faulthandler watchdog from _common).

gnsq cannot negotiate msg_timeout (its IDENTIFY has no such field): the touch phase needs
an nsqd started with --msg-timeout=1s, which the test provides.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any

import _common as c
import gevent
import gnsq
from gevent.event import Event
from gnsq.errors import NSQException

CLIENT = "gnsq"


def wait_until(
    pred: Callable[[], bool], what: str | Callable[[], str], timeout: float = c.STEP_TIMEOUT
) -> None:
    """Bounded wait for a condition the library's greenlets make true."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise c.DriverError(f"timed out after {timeout}s waiting for {c.text(what)}")
        gevent.sleep(0.005)


def error_recorder(who: str) -> Callable[..., None]:
    def on_error(sender: Any, error: Exception) -> None:
        c.error(f"{who}: {error!r}")

    return on_error


def conn_options(args: c.Args) -> dict[str, Any]:
    """NsqdTCPClient keyword arguments for --tls-ca / --compression."""
    opts: dict[str, Any] = {}
    if args.tls_ca:
        # passed to gevent's SSLSocket (TLS 1.2, as gnsq pins it)
        opts["tls_v1"] = True
        opts["tls_options"] = {"ca_certs": args.tls_ca, "cert_reqs": ssl.CERT_REQUIRED}
    if args.compression:
        opts[args.compression] = True
    return opts


class UpgradingProducer(gnsq.Producer):  # type: ignore[misc]
    """Works around a gnsq 1.0.2 bug, not an nsqd one: Producer.handle_response pops a
    pending publish for every OK, including the OK that follows a TLS/snappy/deflate
    upgrade inside IDENTIFY, before the connection has its response queue; that raises
    KeyError against any nsqd. OKs of a connection not registered yet are skipped."""

    def handle_response(self, conn: Any, response: Any) -> None:
        if conn not in self._response_queues:
            return
        super().handle_response(conn, response)


def start_producer(args: c.Args, summary: dict[str, Any]) -> gnsq.Producer:
    options = conn_options(args)
    cls = UpgradingProducer if options else gnsq.Producer
    producer = cls([args.address], **options)
    producer.on_error.connect(error_recorder("producer"), weak=False)
    producer.start()
    return producer


def publish(producer: gnsq.Producer, method: str, *args: Any, **kwargs: Any) -> str:
    """Producer.publish/multipublish, waiting (bounded) for nsqd's response."""
    try:
        result = getattr(producer, method)(
            *args, block=True, timeout=c.STEP_TIMEOUT, raise_error=False, **kwargs
        )
        data = result.get(timeout=c.STEP_TIMEOUT)
    except gevent.Timeout:
        raise c.DriverError(f"no response to {method} within {c.STEP_TIMEOUT}s") from None
    except NSQException as exc:
        return f"error: {exc!r}"
    return data.decode() if isinstance(data, bytes) else repr(data)


def start_consumer(
    args: c.Args, summary: dict[str, Any], handler: Callable[[Any, Any], None]
) -> gnsq.Consumer:
    consumer = gnsq.Consumer(
        args.topic,
        c.CHANNEL,
        [args.address],
        message_handler=handler,
        max_in_flight=c.MAX_IN_FLIGHT,
        **conn_options(args),
    )
    consumer.on_error.connect(error_recorder("consumer"), weak=False)
    consumer.start(block=False)
    return consumer


def stop(summary: dict[str, Any], consumer: gnsq.Consumer, producer: gnsq.Producer) -> None:
    # total_ready_count sums RDY over live connections: 0 once the connection is gone
    summary["consumer_connected"] = consumer.total_ready_count > 0
    c.teardown()
    consumer.close()
    producer.close()
    consumer.join(timeout=2)
    producer.join(timeout=2)


def pubsub(args: c.Args, summary: dict[str, Any]) -> None:
    plan = c.PublishPlan()
    tally = c.Tally(plan)
    summary["tally"] = tally
    producer = start_producer(args, summary)
    for body in plan.pub:
        tally.acked("pub", publish(producer, "publish", args.topic, body))
    for batch in plan.mpub:
        tally.acked("mpub", publish(producer, "multipublish", args.topic, batch))
    for body, delay_ms in plan.dpub:
        tally.acked("dpub", publish(producer, "publish", args.topic, body, defer=delay_ms), body)

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        tally.record(message.body, message.attempts)
        message.finish()

    consumer = start_consumer(args, summary, handler)
    wait_until(lambda: tally.complete, lambda: f"all messages ({tally.progress()})")
    stop(summary, consumer, producer)


def requeue(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.RequeueScenario()
    summary["scenario"] = scen
    producer = start_producer(args, summary)
    for body in c.REQUEUE_DELAYS_MS:
        c.check_ack("PUB", publish(producer, "publish", args.topic, body))

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        delay_ms = scen.on_message(message.body, message.attempts)
        if delay_ms is None:
            message.finish()
        else:
            # backoff=False: a requeue would otherwise pause this connection's RDY
            message.requeue(time_ms=delay_ms, backoff=False)

    consumer = start_consumer(args, summary, handler)
    wait_until(lambda: scen.requeues_done, "both requeued messages to come back and FIN")
    c.check_ack("PUB", publish(producer, "publish", args.topic, c.REQUEUE_SENTINEL))
    wait_until(lambda: scen.sentinel_seen, "the sentinel message")
    stop(summary, consumer, producer)


WARMUP = b"touch-warmup"


def touch(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.TouchScenario()
    summary["scenario"] = scen
    warmed = Event()

    def hold_touching(message: gnsq.Message) -> None:
        try:
            deadline = time.monotonic() + c.TOUCH_HOLD_S
            while time.monotonic() < deadline:
                gevent.sleep(c.TOUCH_EVERY_S)
                message.touch()
                scen.touched()
            message.finish()
            scen.fin_sent(message.body)
        except Exception as exc:
            c.error(f"holding the touched message: {exc!r}")
            raise

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        if message.body == WARMUP:
            message.finish()
            warmed.set()
            return
        action = scen.on_message(message.body, message.attempts)
        if action == "fin":
            message.finish()
            scen.fin_sent(message.body)
            return
        # answered later (hold) or never (ignore): the Consumer must not auto-FIN it, and
        # the hold runs in its own greenlet so this connection keeps reading
        message.enable_async()
        if action == "hold":
            gevent.spawn(hold_touching, message)

    producer = start_producer(args, summary)
    consumer = start_consumer(args, summary, handler)
    # gnsq quirk: a new connection stays at RDY 1 until its first message is FINed, and
    # both test messages must be in flight at once, so FIN one warm-up message first and
    # wait for the Consumer to raise RDY to max_in_flight.
    c.check_ack("PUB", publish(producer, "publish", args.topic, WARMUP))
    if not warmed.wait(c.STEP_TIMEOUT):
        raise c.DriverError("timed out waiting for the warm-up message")
    wait_until(lambda: consumer.total_ready_count == c.MAX_IN_FLIGHT, "RDY max_in_flight")
    scen.t0 = time.monotonic()
    for body in (c.TOUCH_BODY, c.CONTROL_BODY):
        c.check_ack("PUB", publish(producer, "publish", args.topic, body))
    wait_until(
        lambda: scen.held_done,
        "the touched message to be FINed and the untouched one redelivered",
        timeout=c.TOUCH_HOLD_S + c.STEP_TIMEOUT,
    )
    c.check_ack("PUB", publish(producer, "publish", args.topic, c.TOUCH_SENTINEL))
    wait_until(lambda: scen.sentinel_seen, "the sentinel message")
    stop(summary, consumer, producer)


def main() -> None:
    args, summary = c.setup(CLIENT)
    phase = {"pubsub": pubsub, "requeue": requeue, "touch": touch}[args.phase]
    try:
        phase(args, summary)
    except Exception as exc:
        c.fail(CLIENT, summary, exc)
    c.emit(summary)


if __name__ == "__main__":
    main()
