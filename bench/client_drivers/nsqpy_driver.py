"""nsq-py 0.1.12 (blocking sockets + select): Client.pub / mpub; a Reader iterated, each
message fin()'d. Its package is also called `nsq` (like pynsq's): it runs in a venv of its
own."""

from __future__ import annotations

import logging
import os

import _drivercommon as c
from nsq.client import Client
from nsq.reader import Reader


def main(args: c.Args) -> None:
    timer = c.Timer()
    topic = args.topic.encode()  # nsq-py joins bytes: names must be bytes
    if args.mode in ("pub", "mpub"):
        client = Client(nsqd_tcp_addresses=[args.address])
        if args.mode == "pub":
            bodies = args.bodies()
            timer.start()
            for body in bodies:
                for resp in client.pub(topic, body):
                    if resp.data != b"OK":
                        c.fail(f"PUB failed: {resp!r}")
        else:
            batches = args.batches()
            timer.start()
            for batch in batches:
                for resp in client.mpub(topic, *batch):
                    if resp.data != b"OK":
                        c.fail(f"MPUB failed: {resp!r}")
        timer.stop()
        c.report("nsq-py", args, timer)
        return
    checker = c.Checker(args.count, args.size)
    timer.start()
    reader = Reader(
        topic,
        c.CHANNEL.encode(),
        nsqd_tcp_addresses=[args.address],
        max_in_flight=args.max_in_flight,
    )
    for message in reader:
        complete = checker.check(message.body)
        message.fin()
        if complete:
            break
    # the FINs of the last read leave on the next select(): let them go
    reader.read()
    timer.stop()
    c.report("nsq-py", args, timer, bad=checker.bad, dups=checker.dups)


if __name__ == "__main__":
    logging.getLogger("nsq").setLevel(logging.WARNING)
    c.watchdog()
    main(c.parse_args())
    os._exit(0)
