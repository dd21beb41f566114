"""gnsq 1.0.2: a Consumer that knows only nsqlookupd finds every nsqd and consumes from all.

``gnsq_lookupd_driver.py LOOKUPD_HTTP TOPIC N PREFIX...`` (see _lookupd_common.py).
Public API only: ``gnsq.Consumer(lookupd_http_addresses=..., lookupd_poll_interval=...)``;
gnsq's LookupdClient sends ``Accept: application/vnd.nsq version=1.0`` and reads the
JSON only when the Content-Type says application/json.
"""

from __future__ import annotations

import time
from typing import Any

import _common as c
import _lookupd_common as lc
import gevent
import gnsq

CLIENT = "gnsq"


def consume(args: lc.Args, summary: dict[str, Any]) -> None:
    expected = lc.Expected(args)
    summary["tally"] = expected

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        expected.record(message.body, message.attempts)
        message.finish()

    def on_error(sender: Any, error: Exception) -> None:
        c.error(f"consumer: {error!r}")

    consumer = gnsq.Consumer(
        args.topic,
        lc.CHANNEL,
        lookupd_http_addresses=[f"http://{args.lookupd_http}"],
        lookupd_poll_interval=lc.POLL_INTERVAL,
        message_handler=handler,
        max_in_flight=c.MAX_IN_FLIGHT,
    )
    consumer.on_error.connect(on_error, weak=False)
    consumer.start(block=False)
    deadline = time.monotonic() + c.STEP_TIMEOUT
    while not expected.complete:
        if time.monotonic() > deadline:
            raise c.DriverError(f"timed out: {expected.progress()}")
        gevent.sleep(0.005)
    c.teardown()
    consumer.close()
    consumer.join(timeout=2)


def main() -> None:
    args, summary = lc.setup(CLIENT)
    try:
        consume(args, summary)
    except Exception as exc:
        c.fail(CLIENT, summary, exc)
    c.emit(summary)


if __name__ == "__main__":
    main()
