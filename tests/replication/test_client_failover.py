"""nsqx's own client through a failover: a PartitionProducer and a Consumer found
through nsqlookupd, the leader SIGKILLed while both run. Every acknowledged publish
arrives; the client follows the new leader by itself (E_FAILED_ON_NOT_LEADER,
NOT_WRITABLE or a lost connection: look up again)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from cluster import create_replicated, leader_port, start_cluster

from nsqx.client import Consumer, Message, PartitionProducer


def test_nsqx_client_follows_the_new_leader(lookupd_factory: Any, tmp_path: Path) -> None:
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path)
    create_replicated(lookupd, "cl", 2)

    async def body_() -> tuple[set[bytes], set[bytes]]:
        acked: set[bytes] = set()
        got: set[bytes] = set()
        all_in = asyncio.Event()

        def handle(msg: Message) -> None:
            got.add(msg.body)
            if len(got) >= 400 and acked <= got:
                all_in.set()

        consumer = Consumer(
            "cl",
            "c",
            handle,
            lookupd_http_addresses=[lookupd.http_address],
            lookupd_poll_interval=1.0,
        )
        await consumer.start()
        async with PartitionProducer(
            lookupd.http_address, pub_max_retry=50, pub_retry_delay=0.05
        ) as producer:
            for i in range(200):
                await producer.publish("cl", b"m%d" % i, partition=0)
                acked.add(b"m%d" % i)
            victim = next(n for n in nodes if n.tcp_port == leader_port(lookupd, "cl"))
            victim.stop(signal.SIGKILL)
            for i in range(200, 400):
                await producer.publish("cl", b"m%d" % i, partition=0)
                acked.add(b"m%d" % i)
        await asyncio.wait_for(all_in.wait(), 60)
        await consumer.close()
        return acked, got

    acked, got = asyncio.run(body_())
    assert len(acked) == 400 and acked <= got
    for n in nodes:
        n.stop(signal.SIGKILL)
