"""Replication on nodes of several workers (``--workers``): the node's one lease.

Only the lead worker PINGs nsqlookupd and is granted the node's lease; it passes every
grant (and the lookupds' addresses and node timeout) to the other workers over their
links (nsqx.nsqd.workers.topology), whose replication managers take them as their own.
A worker that cannot hear the lead holds no lease.

The first tests run two workers of one node in this process (NSQD objects with their
WorkerSpec, linked as the supervisor's workers are) against a real nsqlookupd, to see
each worker's lease. The last runs three real nodes of two workers each.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster import Consumer, Publisher, leader_port, start_cluster
from cluster import until as wait
from tests.nsqd.test_workers_lookup import Lookupd, go_lookupd

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.workers.spec import WorkerSpec

from lookupdproc import LookupdProcess

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers need fork/exec")


def worker(tmp_path: Path, lookupd: LookupdProcess | Lookupd, index: int, prefix: str) -> NSQD:
    options = NsqdOptions(
        # (nothing listens: the port is what IDENTIFY announces)
        tcp_address="127.0.0.1:4150",
        http_address="",
        https_address="",
        data_path=str(tmp_path),
        broadcast_address="127.0.0.1",
        nsqlookupd_tcp_addresses=[lookupd.tcp_address],
    )
    return NSQD(options, WorkerSpec(index, 2, prefix))


async def until(cond: Callable[[], Any], timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def holds_lease(nsqd: NSQD) -> bool:
    lease = nsqd.replication.lease
    return lease.required and lease.valid(time.monotonic())


def test_every_worker_holds_the_leads_lease_and_loses_it_with_the_lead(
    tmp_path: Path, lookupd_factory: Any
) -> None:
    lookupd: LookupdProcess = lookupd_factory()
    prefix = f"nsqx-test-{uuid.uuid4().hex[:12]}"

    async def go() -> None:
        lead = worker(tmp_path, lookupd, 0, prefix)
        other = worker(tmp_path, lookupd, 1, prefix)
        # until the lead says its lookupds grant no leases, a worker needs one
        assert other.replication.lease.required
        assert not lead.replication.lease.required
        await lead.start()
        await other.start()
        try:
            await until(lambda: holds_lease(lead), what="the lead's lease")
            await until(lambda: holds_lease(other), what="the other worker's lease")
            # what else only the lead learns of nsqlookupd
            assert other.lookup.lookupd_http_addresses() == [lookupd.http_address]
            assert other.lookup.node_timeout() == lead.lookup.node_timeout()
            assert not other.lookup.peers  # one voice for the node
            # the lease is renewed, in the other worker too, without a new generation
            gen = other.replication.lease.generation
            first = other.replication.lease.until
            await until(lambda: other.replication.lease.until > first + 0.3, what="renewals")
            assert other.replication.lease.generation == gen

            # the lead gone: no lease at once (it may have lost it; nobody would say)
            await lead.close()
            await until(
                lambda: other.replication.lease.until == 0.0, timeout=2, what="lease lapsed"
            )
            assert not holds_lease(other)

            # a new lead: its grants reach the other worker again, as a new generation
            # (its leaderships are confirmed again before they acknowledge)
            lead = worker(tmp_path, lookupd, 0, prefix)
            await lead.start()
            await until(lambda: holds_lease(other), timeout=20, what="the new lead's lease")
            assert other.replication.lease.generation > gen
        finally:
            await other.close()
            await lead.close()

    asyncio.run(go())


def test_a_worker_needs_no_lease_where_the_lookupds_grant_none(tmp_path: Path) -> None:
    prefix = f"nsqx-test-{uuid.uuid4().hex[:12]}"

    async def go(lookupd: Lookupd) -> None:
        lead = worker(tmp_path, lookupd, 0, prefix)
        other = worker(tmp_path, lookupd, 1, prefix)
        assert other.replication.lease.required
        await lead.start()
        await other.start()
        try:
            # NSQ 1.3's nsqlookupd grants no lease: as in the lead, the coordinator's
            # word is enough, once the lead says where the lookupds are
            await until(
                lambda: other.lookup.lookupd_http_addresses() == [lookupd.http_address],
                what="the lead's word",
            )
            assert not other.replication.lease.required
            assert not lead.replication.lease.required
        finally:
            await other.close()
            await lead.close()

    with go_lookupd() as lookupd:
        asyncio.run(go(lookupd))


# -- three nodes of two workers each ---------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("nsqx.nsqd.workers.proxy") is None,
    reason="the consumers need a SUB on any worker served by the partition's owner "
    "(the subproxy work of issue 30)",
)
@pytest.mark.parametrize("replicator", [2, 3])
def test_leader_node_killed_nothing_acknowledged_is_lost(
    lookupd_factory: Any, tmp_path: Path, replicator: int
) -> None:
    """Three nodes of two workers, a topic of four partitions (half of them owned by
    worker 1 of the nodes that hold them, whose leaders acknowledge only within the
    lease their lead worker passes on); the node leading partition 0 is SIGKILLed (its
    supervisor: the workers die with it)."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, "--workers=2")
    topic = "wrep"
    partitions = 4
    query = f"topic={topic}&partition_num={partitions}&replicator={replicator}&multipart=true"
    status, _, body = lookupd.post(f"/topic/create?{query}")
    assert status == 200, body
    for pid in range(partitions):
        wait(lambda pid=pid: leader_port(lookupd, topic, pid), what=f"a leader of {pid}")
    pubs = [Publisher(lookupd, topic, pid) for pid in range(partitions)]
    cons = [Consumer(lookupd, topic, "c", pid) for pid in range(partitions)]
    for pub in pubs:
        pub.publish(50)

    # the node leading partition 0 killed, its workers with it
    port = leader_port(lookupd, topic, 0)
    victim = next(n for n in nodes if n.tcp_port == port)
    victim.stop(signal.SIGKILL)
    wait(
        lambda: leader_port(lookupd, topic, 0) not in (None, port),
        what="a new leader of partition 0",
    )
    # writes resume on the new leaders; every acknowledged message is there
    for pub in pubs:
        pub.publish(50)
    for pid, (pub, con) in enumerate(zip(pubs, cons, strict=True)):
        con.read_until(lambda pub=pub, con=con: set(pub.acked) <= set(con.received))
        assert set(pub.acked) <= set(con.received), pid
