"""ansq 0.3.0 (asyncio, uvloop): writer.pub / mpub awaited one at a time; a reader's
messages() iterated, each message awaited fin(). ansq keeps RDY at 1 unless told, so
every connection is given RDY max_in_flight (as ansq's own docs do)."""

from __future__ import annotations

import logging
import os

import _drivercommon as c
import ansq
import uvloop


async def main(args: c.Args) -> None:
    timer = c.Timer()
    if args.mode in ("pub", "mpub"):
        writer = await ansq.create_writer(nsqd_tcp_addresses=[args.address])
        if args.mode == "pub":
            bodies = args.bodies()
            timer.start()
            for body in bodies:
                resp = await writer.pub(args.topic, body)
                if resp.is_error:
                    c.fail(f"PUB failed: {resp}")
        else:
            batches = args.batches()
            timer.start()
            for batch in batches:
                resp = await writer.mpub(args.topic, *batch)
                if resp.is_error:
                    c.fail(f"MPUB failed: {resp}")
        timer.stop()
        c.report("ansq", args, timer)
        await writer.close()
        return
    checker = c.Checker(args.count, args.size)
    timer.start()
    reader = await ansq.create_reader(
        topic=args.topic, channel=c.CHANNEL, nsqd_tcp_addresses=[args.address]
    )
    for conn in reader.connections:
        await conn.rdy(args.max_in_flight)
    async for message in reader.messages():
        complete = checker.check(message.body)
        await message.fin()
        if complete:
            break
    timer.stop()
    c.report("ansq", args, timer, bad=checker.bad, dups=checker.dups)
    await reader.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    c.watchdog()
    uvloop.run(main(c.parse_args()))
    os._exit(0)
