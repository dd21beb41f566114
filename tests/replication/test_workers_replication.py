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

from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.nsqd.workers.spec import WorkerSpec
from workernode import Lookupd, go_lookupd, worker_pids

from lookupdproc import LookupdProcess
from nsqdproc import NsqdProcess

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


NEEDS_SUB_PROXY = pytest.mark.skipif(
    importlib.util.find_spec("nsqx.nsqd.workers.proxy") is None,
    reason="the consumers need a SUB on any worker served by the partition's owner "
    "(the subproxy work of issue 30)",
)
TOPIC = "wrep"
PARTITIONS = 4


def replicated_cluster(
    lookupd_factory: Any, tmp_path: Path, replicator: int
) -> tuple[LookupdProcess, list[NsqdProcess], list[Publisher], list[Consumer]]:
    """Three nodes of two workers, a topic of four partitions (half of them owned by
    worker 1 of the nodes that hold them, whose leaders acknowledge only within the
    lease their lead worker passes on), 50 messages acknowledged in each; a publisher
    and a consumer of each partition."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, "--workers=2")
    query = f"topic={TOPIC}&partition_num={PARTITIONS}&replicator={replicator}&multipart=true"
    status, _, body = lookupd.post(f"/topic/create?{query}")
    assert status == 200, body
    for pid in range(PARTITIONS):
        wait(lambda pid=pid: leader_port(lookupd, TOPIC, pid), what=f"a leader of {pid}")
    pubs = [Publisher(lookupd, TOPIC, pid) for pid in range(PARTITIONS)]
    cons = [Consumer(lookupd, TOPIC, "c", pid) for pid in range(PARTITIONS)]
    for pub in pubs:
        pub.publish(50)
    return lookupd, nodes, pubs, cons


def nothing_lost(pubs: list[Publisher], cons: list[Consumer]) -> None:
    """Writes resume on every partition; every acknowledged message is read."""
    for pub in pubs:
        pub.publish(50)
    for pid, (pub, con) in enumerate(zip(pubs, cons, strict=True)):
        con.read_until(lambda pub=pub, con=con: set(pub.acked) <= set(con.received))
        assert len(pub.acked) == 100
        assert set(pub.acked) <= set(con.received), pid


@NEEDS_SUB_PROXY
@pytest.mark.parametrize("replicator", [2, 3])
def test_leader_node_killed_nothing_acknowledged_is_lost(
    lookupd_factory: Any, tmp_path: Path, replicator: int
) -> None:
    """The node leading partition 0 is SIGKILLed (its supervisor: the workers die
    with it): its partitions' leadership moves, writes resume, nothing is lost."""
    lookupd, nodes, pubs, cons = replicated_cluster(lookupd_factory, tmp_path, replicator)
    port = leader_port(lookupd, TOPIC, 0)
    victim = next(n for n in nodes if n.tcp_port == port)
    victim.stop(signal.SIGKILL)
    wait(
        lambda: leader_port(lookupd, TOPIC, 0) not in (None, port),
        what="a new leader of partition 0",
    )
    nothing_lost(pubs, cons)


@NEEDS_SUB_PROXY
def test_lead_worker_killed_the_other_workers_leaders_resume(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """The lead worker of a node that leads a partition owned by its worker 1 is
    SIGKILLed: worker 1 holds no lease until the restarted lead is granted one (then
    its leaderships are confirmed again); writes resume, nothing is lost."""
    lookupd, nodes, pubs, cons = replicated_cluster(lookupd_factory, tmp_path, 2)
    pid = next(p for p in range(PARTITIONS) if owner_of(TOPIC, p, 2) == 1)
    port = leader_port(lookupd, TOPIC, pid)
    node = next(n for n in nodes if n.tcp_port == port)
    before = worker_pids(node)
    os.kill(before[0], signal.SIGKILL)
    wait(lambda: worker_pids(node).get(0) != before[0], what="the lead worker restarted")
    wait(
        lambda: any("lease lapsed" in line for line in list(node.log)),
        what="worker 1 holding the lease as lapsed",
    )
    nothing_lost(pubs, cons)
