"""pynsq 0.9.1: a Reader that knows only nsqlookupd finds every nsqd and consumes from all.

``pynsq_lookupd_driver.py LOOKUPD_HTTP TOPIC N PREFIX...`` (see _lookupd_common.py).
Public API only: ``nsq.Reader(lookupd_http_addresses=..., lookupd_poll_interval=...)``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import _common as c
import _lookupd_common as lc
import nsq

CLIENT = "pynsq"


async def consume(args: lc.Args, summary: dict[str, Any]) -> None:
    expected = lc.Expected(args)
    summary["tally"] = expected

    def handler(message: nsq.Message) -> None:
        expected.record(message.body, message.attempts)
        message.finish()

    reader = nsq.Reader(
        topic=args.topic,
        channel=lc.CHANNEL,
        message_handler=handler,
        lookupd_http_addresses=[f"http://{args.lookupd_http}"],
        lookupd_poll_interval=lc.POLL_INTERVAL,
        max_in_flight=c.MAX_IN_FLIGHT,
    )
    deadline = time.monotonic() + c.STEP_TIMEOUT
    while not expected.complete:
        if time.monotonic() > deadline:
            raise c.DriverError(f"timed out: {expected.progress()}, nsqd {sorted(reader.conns)}")
        await asyncio.sleep(0.005)
    summary["nsqd_connections"] = sorted(reader.conns)
    c.teardown()
    reader.close()


def main() -> None:
    args, summary = lc.setup(CLIENT)
    try:
        asyncio.run(consume(args, summary))
    except Exception as exc:
        c.fail(CLIENT, summary, exc)
    c.emit(summary)


if __name__ == "__main__":
    main()
