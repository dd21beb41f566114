"""gnsq 1.0.2 (gevent): Producer.publish / multipublish (blocking); a Consumer whose
on_message handler returns (gnsq FINs it)."""

from __future__ import annotations

import logging
import os

import _drivercommon as c
import gevent
import gnsq
from gevent.event import Event


def main(args: c.Args) -> None:
    timer = c.Timer()
    if args.mode in ("pub", "mpub"):
        producer = gnsq.Producer([args.address])
        producer.start()
        if args.mode == "pub":
            bodies = args.bodies()
            timer.start()
            for body in bodies:
                if producer.publish(args.topic, body) != b"OK":
                    c.fail("PUB not acknowledged")
        else:
            batches = args.batches()
            timer.start()
            for batch in batches:
                if producer.multipublish(args.topic, batch) != b"OK":
                    c.fail("MPUB not acknowledged")
        timer.stop()
        c.report("gnsq", args, timer)
        producer.close()
        return
    checker = c.Checker(args.count, args.size)
    done = Event()
    consumer = gnsq.Consumer(
        args.topic, c.CHANNEL, [args.address], max_in_flight=args.max_in_flight
    )

    @consumer.on_message.connect
    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        if checker.check(message.body) and not done.is_set():
            timer.stop()
            done.set()

    timer.start()
    consumer.start(block=False)
    done.wait()
    c.report("gnsq", args, timer, bad=checker.bad, dups=checker.dups)
    consumer.close()
    gevent.sleep(0)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    c.watchdog()
    main(c.parse_args())
    os._exit(0)
