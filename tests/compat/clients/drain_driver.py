"""An NSQ 1.3 client consuming from two nsqd while the first drains (docs/drain.md):
``drain_driver.py CLIENT ADDR_A ADDR_B TOPIC WORKDIR`` with CLIENT ``pynsq`` or ``gnsq``.

The consumer (max_in_flight 8) holds every ``a-*`` message (enable_async) and finishes
the others at once (gnsq keeps RDY 1 on a connection whose message is held: the test
publishes one such message). Once it holds it, it creates ``WORKDIR/holding``; the test
then drains A (SIGTERM) and, once A says it drains, creates ``WORKDIR/finish``: the
held messages are finished. The driver ends when it has seen the body ``b-late`` (which
the test publishes to B after A exited) and prints one JSON line: every delivery's
attempts by body, the errors the library reported (error frames, ERROR logs), and the
errors seen before the drain began (``early_errors``).

The test judges the summary: the unasked CLOSE_WAIT must break nothing (no exception,
no error frame, no redelivery, and consumption from B goes on).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

CHANNEL = "compat"
MAX_IN_FLIGHT = 8
HOLD = 1
STEP_TIMEOUT = 20.0
WATCHDOG_TIMEOUT = 60.0

deliveries: dict[str, list[int]] = defaultdict(list)
errors: list[str] = []
held: list[Any] = []


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        errors.append(f"{record.name}: {record.getMessage()}")


def record(message: Any) -> bool:
    """Note a delivery; True when the message is to be held."""
    body = message.body.decode()
    deliveries[body].append(message.attempts)
    return body.startswith("a-")


def summary(client: str, early: list[str], failed: str = "") -> None:
    out = {
        "client": client,
        "deliveries": deliveries,
        "errors": errors,
        "early_errors": early,
        "failed": failed,
    }
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()


def touch_file(path: str) -> None:
    with open(path, "w"):
        pass


def run_pynsq(addresses: list[str], topic: str, workdir: str) -> list[str]:
    import asyncio

    import nsq

    async def wait_until(pred: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waiting for {what}")
            await asyncio.sleep(0.005)

    def handler(message: Any) -> Any:
        if record(message):
            message.enable_async()
            held.append(message)
            return None
        return True  # finished

    async def main() -> list[str]:
        reader = nsq.Reader(
            topic=topic,
            channel=CHANNEL,
            message_handler=handler,
            nsqd_tcp_addresses=addresses,
            max_in_flight=MAX_IN_FLIGHT,
        )
        await wait_until(lambda: len(held) >= HOLD, "held messages")
        touch_file(os.path.join(workdir, "holding"))
        await wait_until(lambda: os.path.exists(os.path.join(workdir, "finish")), "finish")
        early = list(errors)
        for message in held:
            message.finish()
        await wait_until(lambda: "b-late" in deliveries, "b-late")
        reader.close()
        return early

    return asyncio.run(main())


def run_gnsq(addresses: list[str], topic: str, workdir: str) -> list[str]:
    import gevent
    import gnsq

    def wait_until(pred: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waiting for {what}")
            gevent.sleep(0.005)

    def handler(consumer: Any, message: Any) -> None:
        if record(message):
            message.enable_async()
            held.append(message)
        else:
            message.finish()

    def on_error(sender: Any, error: Exception) -> None:
        errors.append(f"consumer: {error!r}")

    consumer = gnsq.Consumer(
        topic,
        CHANNEL,
        addresses,
        message_handler=handler,
        max_in_flight=MAX_IN_FLIGHT,
    )
    consumer.on_error.connect(on_error, weak=False)
    consumer.start(block=False)
    wait_until(lambda: len(held) >= HOLD, "held messages")
    touch_file(os.path.join(workdir, "holding"))
    wait_until(lambda: os.path.exists(os.path.join(workdir, "finish")), "finish")
    early = list(errors)
    for message in held:
        message.finish()
    wait_until(lambda: "b-late" in deliveries, "b-late")
    consumer.close()
    consumer.join(timeout=2)
    return early


def main() -> None:
    client, addr_a, addr_b, topic, workdir = sys.argv[1:6]
    faulthandler.dump_traceback_later(WATCHDOG_TIMEOUT, exit=True)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(stream)
    root.addHandler(_Collect())
    run = run_pynsq if client == "pynsq" else run_gnsq
    try:
        early = run([addr_a, addr_b], topic, workdir)
    except Exception as exc:
        summary(client, [], f"{type(exc).__name__}: {exc}")
        sys.exit(2)
    summary(client, early)


if __name__ == "__main__":
    main()
