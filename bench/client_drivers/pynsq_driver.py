"""pynsq 0.9.1 (Tornado 6 on asyncio, uvloop): Writer.pub / mpub with a callback, one at
a time; a Reader whose message_handler returns True (FIN)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import _drivercommon as c
import nsq
import uvloop


async def main(args: c.Args) -> None:
    timer = c.Timer()
    loop = asyncio.get_running_loop()
    if args.mode in ("pub", "mpub"):
        writer = nsq.Writer([args.address])
        while not any(conn.connected() for conn in writer.conns.values()):
            await asyncio.sleep(0.01)
        work: list[Any] = args.bodies() if args.mode == "pub" else args.batches()
        method = writer.pub if args.mode == "pub" else writer.mpub
        done = loop.create_future()
        it = iter(work)

        def send_next(conn: Any = None, data: Any = None) -> None:
            if data is not None and data != b"OK":
                done.set_exception(RuntimeError(f"publish failed: {data!r}"))
                return
            item = next(it, None)
            if item is None:
                timer.stop()
                done.set_result(None)
                return
            method(args.topic, item, callback=send_next)

        timer.start()
        send_next()
        await done
        c.report("pynsq", args, timer)
        return
    checker = c.Checker(args.count, args.size)
    done = loop.create_future()

    def handler(message: nsq.Message) -> bool:
        if checker.check(message.body) and not done.done():
            timer.stop()
            done.set_result(None)
        return True

    timer.start()
    reader = nsq.Reader(
        topic=args.topic,
        channel=c.CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=[args.address],
        max_in_flight=args.max_in_flight,
    )
    await done
    c.report("pynsq", args, timer, bad=checker.bad, dups=checker.dups)
    reader.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    c.watchdog()
    uvloop.install()
    asyncio.run(main(c.parse_args()))
    os._exit(0)
