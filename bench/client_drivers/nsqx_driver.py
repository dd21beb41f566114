"""nsqx.client (this repository) on uvloop: Producer.publish / multi_publish awaited one
at a time; a Consumer with a plain-function handler (return = FIN)."""

from __future__ import annotations

import asyncio
import os

import _drivercommon as c
import uvloop

from nsqx.client import Consumer, Producer


async def main(args: c.Args) -> None:
    timer = c.Timer()
    if args.mode in ("pub", "mpub"):
        async with Producer(args.address) as p:
            await p.connect()
            if args.mode == "pub":
                bodies = args.bodies()
                timer.start()
                for body in bodies:
                    await p.publish(args.topic, body)
            else:
                batches = args.batches()
                timer.start()
                for batch in batches:
                    await p.multi_publish(args.topic, batch)
            timer.stop()
        c.report("nsqx", args, timer)
        return
    checker = c.Checker(args.count, args.size)
    done = asyncio.get_running_loop().create_future()

    def handler(msg: object) -> None:
        if checker.check(msg.body) and not done.done():  # type: ignore[attr-defined]
            timer.stop()
            done.set_result(None)

    timer.start()
    consumer = Consumer(
        args.topic,
        c.CHANNEL,
        handler,
        nsqd_tcp_addresses=[args.address],
        max_in_flight=args.max_in_flight,
    )
    await consumer.start()
    await done
    c.report("nsqx", args, timer, bad=checker.bad, dups=checker.dups)
    await consumer.close(timeout=5)


if __name__ == "__main__":
    c.watchdog()
    uvloop.run(main(c.parse_args()))
    os._exit(0)
