"""Drive nsqd with ansq 0.3.0 (asyncio): ``ansq_driver.py HOST:PORT TOPIC PHASE``.

Uses only ansq's public API: ``create_writer`` (pub/mpub/dpub), ``create_reader``
(``messages()``; ``NSQMessage.fin/req/touch``), ``ConnectionOptions``/``ConnectionFeatures``
(msg_timeout is negotiated in IDENTIFY) and ``NSQConnection.rdy``. Every wait is bounded by
asyncio timeouts (plus the faulthandler watchdog from _common).

ansq quirks worked around here:
- its Reader keeps every connection at RDY 1; we raise it with ``connection.rdy(n)``.
- ``mpub`` with a single message sends it unframed (as a PUB body): batches have >= 2.
- auto_reconnect is off so a dropped connection ends the run instead of hiding.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _common as c
import ansq
from ansq import ConnectionFeatures, ConnectionOptions
from ansq.tcp.connection import NSQConnection
from ansq.tcp.types import NSQMessage

CLIENT = "ansq"


def options(summary: dict[str, Any], **features: Any) -> ConnectionOptions:
    def on_exception(exc: Exception) -> None:
        c.error(f"on_exception: {exc!r}")

    return ConnectionOptions(
        auto_reconnect=False,
        on_exception=on_exception,
        features=ConnectionFeatures(**features),
    )


async def wait_until(
    pred: Callable[[], bool],
    what: str | Callable[[], str],
    consumer: asyncio.Task[None] | None = None,
    timeout: float = c.STEP_TIMEOUT,
) -> None:
    """Bounded wait for a condition; fails at once if the consuming task has stopped."""
    deadline = time.monotonic() + timeout
    while not pred():
        if consumer is not None and consumer.done():
            exc = None if consumer.cancelled() else consumer.exception()
            raise c.DriverError(f"consumer stopped ({exc!r}) while waiting for {c.text(what)}")
        if time.monotonic() > deadline:
            raise c.DriverError(f"timed out after {timeout}s waiting for {c.text(what)}")
        await asyncio.sleep(0.005)


async def bounded(aw: Awaitable[Any], what: str) -> Any:
    try:
        return await asyncio.wait_for(aw, c.STEP_TIMEOUT)
    except TimeoutError:
        raise c.DriverError(f"timed out after {c.STEP_TIMEOUT}s: {what}") from None


async def publish(aw: Awaitable[Any], what: str) -> str:
    response = await bounded(aw, f"no response to {what}")
    if response.is_error:
        return f"error: {response.text}"
    return response.body.decode("latin-1")


async def start_writer(args: c.Args, summary: dict[str, Any]) -> Any:
    return await bounded(
        ansq.create_writer([args.address], connection_options=options(summary)),
        "connect the writer",
    )


async def start_reader(
    args: c.Args,
    summary: dict[str, Any],
    handle: Callable[[NSQMessage], Awaitable[None]],
    **features: Any,
) -> tuple[Any, asyncio.Task[None]]:
    reader = await bounded(
        ansq.create_reader(
            args.topic,
            c.CHANNEL,
            nsqd_tcp_addresses=[args.address],
            connection_options=options(summary, **features),
        ),
        "connect and subscribe the reader",
    )
    for conn in reader.connections:
        await conn.rdy(c.MAX_IN_FLIGHT)

    async def consume() -> None:
        async for message in reader.messages():
            await handle(message)
        # the generator ends when a connection closes (auto_reconnect is off)

    return reader, asyncio.ensure_future(consume())


async def stop(summary: dict[str, Any], reader: Any, task: asyncio.Task[None], writer: Any) -> None:
    summary["consumer_connected"] = not task.done() and all(
        conn.is_connected for conn in reader.connections
    )
    c.teardown()
    await reader.close()
    await writer.close()
    task.cancel()


async def pubsub(args: c.Args, summary: dict[str, Any]) -> None:
    plan = c.PublishPlan()
    tally = c.Tally(plan)
    summary["tally"] = tally
    writer = await start_writer(args, summary)
    for body in plan.pub:
        tally.acked("pub", await publish(writer.pub(args.topic, body), "PUB"))
    for batch in plan.mpub:
        tally.acked("mpub", await publish(writer.mpub(args.topic, *batch), "MPUB"))
    for body, delay_ms in plan.dpub:
        ack = await publish(writer.dpub(args.topic, body, delay_ms), "DPUB")
        tally.acked("dpub", ack, body)

    async def handle(message: NSQMessage) -> None:
        tally.record(message.body, message.attempts)
        await message.fin()

    reader, task = await start_reader(args, summary, handle)
    await wait_until(lambda: tally.complete, lambda: f"all messages ({tally.progress()})", task)
    await stop(summary, reader, task, writer)


async def requeue(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.RequeueScenario()
    summary["scenario"] = scen
    writer = await start_writer(args, summary)
    for body in c.REQUEUE_DELAYS_MS:
        c.check_ack("PUB", await publish(writer.pub(args.topic, body), "PUB"))

    async def handle(message: NSQMessage) -> None:
        delay_ms = scen.on_message(message.body, message.attempts)
        if delay_ms is None:
            await message.fin()
        else:
            await message.req(timeout=delay_ms)

    reader, task = await start_reader(args, summary, handle)
    await wait_until(lambda: scen.requeues_done, "both requeued messages to FIN", task)
    c.check_ack("PUB", await publish(writer.pub(args.topic, c.REQUEUE_SENTINEL), "PUB"))
    await wait_until(lambda: scen.sentinel_seen, "the sentinel message", task)
    await stop(summary, reader, task, writer)


async def identify_msg_timeout(args: c.Args, summary: dict[str, Any]) -> Any:
    """What nsqd answers to ansq's IDENTIFY with msg_timeout, on a connection of its own."""
    conn = NSQConnection(
        args.host, args.port, connection_options=options(summary, msg_timeout=c.MSG_TIMEOUT_MS)
    )
    await bounded(conn.connect(), "connect")
    response = await bounded(conn.identify(), "IDENTIFY")
    await conn.close()
    if response.is_error:
        return f"error: {response.text}"
    return json.loads(response.body).get("msg_timeout")


async def touch(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.TouchScenario()
    summary["scenario"] = scen
    summary["identify_msg_timeout"] = await identify_msg_timeout(args, summary)
    holders: set[asyncio.Task[None]] = set()

    async def hold_touching(message: NSQMessage) -> None:
        try:
            deadline = time.monotonic() + c.TOUCH_HOLD_S
            while time.monotonic() < deadline:
                await asyncio.sleep(c.TOUCH_EVERY_S)
                await message.touch()
                scen.touched()
            await message.fin()
            scen.fin_sent(message.body)
        except Exception as exc:
            c.error(f"holding the touched message: {exc!r}")
            raise

    async def handle(message: NSQMessage) -> None:
        action = scen.on_message(message.body, message.attempts)
        if action == "fin":
            await message.fin()
            scen.fin_sent(message.body)
        elif action == "hold":
            holder = asyncio.ensure_future(hold_touching(message))
            holders.add(holder)
            holder.add_done_callback(holders.discard)
        # "ignore": never answered, nsqd has to time it out

    writer = await start_writer(args, summary)
    for body in (c.TOUCH_BODY, c.CONTROL_BODY):
        c.check_ack("PUB", await publish(writer.pub(args.topic, body), "PUB"))
    reader, task = await start_reader(args, summary, handle, msg_timeout=c.MSG_TIMEOUT_MS)
    await wait_until(
        lambda: scen.held_done,
        "the touched message to be FINed and the untouched one redelivered",
        task,
        timeout=c.TOUCH_HOLD_S + c.STEP_TIMEOUT,
    )
    c.check_ack("PUB", await publish(writer.pub(args.topic, c.TOUCH_SENTINEL), "PUB"))
    await wait_until(lambda: scen.sentinel_seen, "the sentinel message", task)
    await stop(summary, reader, task, writer)


def main() -> None:
    args, summary = c.setup(CLIENT)
    phase = {"pubsub": pubsub, "requeue": requeue, "touch": touch}[args.phase]
    try:
        asyncio.run(phase(args, summary))
    except Exception as exc:
        c.fail(CLIENT, summary, exc)
    c.emit(summary)


if __name__ == "__main__":
    main()
