"""Drive nsqd with pynsq 0.9.1 (Tornado 6): ``pynsq_driver.py HOST:PORT TOPIC PHASE``.

Uses only pynsq's public API: ``nsq.Writer`` (pub/mpub/dpub with a response callback) and
``nsq.Reader`` (message_handler; ``Message.finish/requeue/touch/enable_async``). Tornado 6
runs on asyncio, so the whole driver is one ``asyncio.run`` and every wait is bounded by
``asyncio.wait_for``. See _common.py for the phases and the summary.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any

import _common as c
import nsq

CLIENT = "pynsq"


async def wait_until(
    pred: Callable[[], bool], what: str | Callable[[], str], timeout: float = c.STEP_TIMEOUT
) -> None:
    """Bounded wait for a condition the library's callbacks make true."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise c.DriverError(f"timed out after {timeout}s waiting for {c.text(what)}")
        await asyncio.sleep(0.005)


def conn_options(args: c.Args) -> dict[str, Any]:
    """AsyncConn keyword arguments for --tls-ca / --compression."""
    opts: dict[str, Any] = {}
    if args.tls_ca:
        # pynsq passes these to Tornado's start_tls (server_hostname = the nsqd host)
        opts["tls_v1"] = True
        opts["tls_options"] = {"ca_certs": args.tls_ca, "cert_reqs": ssl.CERT_REQUIRED}
    if args.compression:
        opts[args.compression] = True
    return opts


async def connect_writer(args: c.Args) -> nsq.Writer:
    writer = nsq.Writer([args.address], **conn_options(args))
    await wait_until(
        lambda: any(conn.connected() for conn in writer.conns.values()),
        "the Writer to connect and IDENTIFY",
    )
    return writer


async def publish(writer: nsq.Writer, method: str, *args: Any) -> str:
    """Call Writer.pub/mpub/dpub and wait for nsqd's response to reach the callback."""
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def callback(conn: Any, data: Any) -> None:
        if not fut.done():
            fut.set_result(data)

    getattr(writer, method)(*args, callback=callback)
    try:
        data = await asyncio.wait_for(fut, c.STEP_TIMEOUT)
    except TimeoutError:
        raise c.DriverError(f"no response to {method.upper()} within {c.STEP_TIMEOUT}s") from None
    return data.decode() if isinstance(data, bytes) else f"error: {data!r}"


def make_reader(args: c.Args, handler: Callable[[Any], Any], **conn_kwargs: Any) -> nsq.Reader:
    return nsq.Reader(
        topic=args.topic,
        channel=c.CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=[args.address],
        max_in_flight=c.MAX_IN_FLIGHT,
        **conn_options(args),
        **conn_kwargs,
    )


def close(*clients: Any) -> None:
    for client in clients:
        for conn in list(client.conns.values()):
            conn.close()


async def pubsub(args: c.Args, summary: dict[str, Any]) -> None:
    plan = c.PublishPlan()
    tally = c.Tally(plan)
    summary["tally"] = tally
    writer = await connect_writer(args)
    for body in plan.pub:
        tally.acked("pub", await publish(writer, "pub", args.topic, body))
    for batch in plan.mpub:
        tally.acked("mpub", await publish(writer, "mpub", args.topic, batch))
    for body, delay_ms in plan.dpub:
        tally.acked("dpub", await publish(writer, "dpub", args.topic, delay_ms, body), body)

    def handler(message: nsq.Message) -> None:
        tally.record(message.body, message.attempts)
        message.finish()

    reader = make_reader(args, handler)
    await wait_until(lambda: tally.complete, lambda: f"all messages ({tally.progress()})")
    summary["consumer_connected"] = bool(reader.conns)
    c.teardown()
    reader.close()
    close(writer)


async def requeue(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.RequeueScenario()
    summary["scenario"] = scen
    writer = await connect_writer(args)
    for body in c.REQUEUE_DELAYS_MS:
        c.check_ack("PUB", await publish(writer, "pub", args.topic, body))

    def handler(message: nsq.Message) -> None:
        delay_ms = scen.on_message(message.body, message.attempts)
        if delay_ms is None:
            message.finish()
        else:
            # pynsq's documented `delay` is whole seconds; `time_ms` is the keyword it turns
            # that into (Message.requeue -> AsyncConn._on_message_requeue), the only way to
            # ask for 100 ms. backoff=False keeps the Reader from pausing RDY.
            message.requeue(backoff=False, time_ms=delay_ms)

    reader = make_reader(args, handler)
    await wait_until(lambda: scen.requeues_done, "both requeued messages to come back and FIN")
    c.check_ack("PUB", await publish(writer, "pub", args.topic, c.REQUEUE_SENTINEL))
    await wait_until(lambda: scen.sentinel_seen, "the sentinel message")
    summary["consumer_connected"] = bool(reader.conns)
    c.teardown()
    reader.close()
    close(writer)


async def touch(args: c.Args, summary: dict[str, Any]) -> None:
    scen = c.TouchScenario()
    summary["scenario"] = scen
    identify: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def hold_touching(message: nsq.Message) -> None:
        try:
            deadline = time.monotonic() + c.TOUCH_HOLD_S
            while time.monotonic() < deadline:
                await asyncio.sleep(c.TOUCH_EVERY_S)
                message.touch()
                scen.touched()
            message.finish()
            scen.fin_sent(message.body)
        except Exception as exc:
            c.error(f"holding the touched message: {exc!r}")
            raise

    def handler(message: nsq.Message) -> None:
        action = scen.on_message(message.body, message.attempts)
        if action == "fin":
            message.finish()
            scen.fin_sent(message.body)
            return
        # answered later (hold) or never (ignore): tell the Reader not to auto-respond
        message.enable_async()
        if action == "hold":
            task = asyncio.ensure_future(hold_touching(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    class Reader(nsq.Reader):  # type: ignore[misc]
        def connect_to_nsqd(self, host: str, port: int) -> Any:
            # public hook: see the IDENTIFY response the connection receives
            conn = super().connect_to_nsqd(host, port)
            if conn is not None:
                conn.on("identify_response", lambda conn, data: identify.append(data))
            return conn

    writer = await connect_writer(args)
    for body in (c.TOUCH_BODY, c.CONTROL_BODY):
        c.check_ack("PUB", await publish(writer, "pub", args.topic, body))
    # msg_timeout is in seconds for pynsq; it sends IDENTIFY msg_timeout in ms
    reader = Reader(
        topic=args.topic,
        channel=c.CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=[args.address],
        max_in_flight=c.MAX_IN_FLIGHT,
        msg_timeout=c.MSG_TIMEOUT_MS / 1000,
        **conn_options(args),
    )
    await wait_until(
        lambda: scen.held_done,
        "the touched message to be FINed and the untouched one redelivered",
        timeout=c.TOUCH_HOLD_S + c.STEP_TIMEOUT,
    )
    c.check_ack("PUB", await publish(writer, "pub", args.topic, c.TOUCH_SENTINEL))
    await wait_until(lambda: scen.sentinel_seen, "the sentinel message")
    summary["identify_msg_timeout"] = identify[0].get("msg_timeout") if identify else None
    summary["consumer_connected"] = bool(reader.conns)
    c.teardown()
    reader.close()
    close(writer)


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
