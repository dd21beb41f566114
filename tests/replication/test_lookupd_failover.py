"""Failover of the coordinator itself: two nsqlookupd over a real etcd, three nsqd, a
topic with replicator 2. The leading nsqlookupd and the partition's leader are
SIGKILLed together; the other nsqlookupd takes the lead, finds the lost node and moves
the partition's leadership. Nothing acknowledged is lost."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Consumer, Publisher, leader_port, partition_state, report, start_node, until
from cutproxy import LinkProxy

from etcdproc import ETCD, EtcdProcess, start_etcd
from lookupdproc import LookupdProcess
from nsqdproc import NsqdProcess

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    if ETCD is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    proc = start_etcd(tmp_path)
    yield proc
    proc.stop()


def lookupd_leader(lookupds: list[LookupdProcess]) -> LookupdProcess | None:
    """The nsqlookupd that all of ``lookupds`` name as their leader."""
    ports = set()
    for lk in lookupds:
        body = lk.get("/listlookup", headers=V1)[2]
        ports.add(json.loads(body)["lookupdleader"]["HttpPort"])
    port = ports.pop() if len(ports) == 1 else ""
    return next((lk for lk in lookupds if str(lk.http_port) == port), None)


def test_leading_lookupd_and_partition_leader_killed_together(
    etcd: EtcdProcess, lookupd_factory: Any, tmp_path: Path
) -> None:
    flags = [f"--etcd-endpoints={etcd.endpoint}", "--cluster-id=r", "--etcd-lease-ttl=2s"]
    lookupds = [lookupd_factory(*flags) for _ in range(2)]
    args = [
        *(f"--lookupd-tcp-address={lk.tcp_address}" for lk in lookupds),
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        "--replication-lag-timeout=1s",
    ]
    nodes: list[NsqdProcess] = [start_node(tmp_path / f"nsqd{i}", *args) for i in range(3)]
    try:
        until(
            lambda: all(len(lk.json("/nodes")["producers"]) == 3 for lk in lookupds),
            what="three nsqd registered with both nsqlookupd",
        )
        leading = until(lambda: lookupd_leader(lookupds), what="one leading nsqlookupd")
        other = next(lk for lk in lookupds if lk is not leading)
        status, _, body = leading.post("/topic/create?topic=rep&partition_num=1&replicator=2")
        assert status == 200, body
        # publisher and consumer ask the nsqlookupd that will survive
        until(lambda: leader_port(other, "rep") is not None, what="a leader in /lookup")
        pub = Publisher(other, "rep")
        con = Consumer(other, "rep", "c")
        pub.publish(100)
        con.read_until(lambda: len(set(con.received)) >= 50)
        until(
            lambda: sum((partition_state(n, "rep") or {}).get("end") == 100 for n in nodes) == 2,
            what="both replicas at the leader's end",
        )
        old = leader_port(other, "rep")
        victim = next(n for n in nodes if n.tcp_port == old)
        leading.stop(signal.SIGKILL)
        victim.stop(signal.SIGKILL)
        pub.publish(100)  # retried until the new coordinator moved the leadership
        assert lookupd_leader([other]) is other
        new = leader_port(other, "rep")
        assert new is not None and new != old
        con.read_until(lambda: set(pub.acked) <= set(con.received))
        lost, _ = report("leading nsqlookupd and partition leader killed", pub, con)
        assert lost == 0
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)


def test_a_node_cut_off_from_the_leading_lookupd_only_keeps_its_roles(
    etcd: EtcdProcess, lookupd_factory: Any, tmp_path: Path
) -> None:
    """Node sessions live in etcd: the partition's leader loses its connection to the
    leading nsqlookupd (the link between them goes down) but is still registered with
    the other one, so it stays leader; when it dies later, the leading nsqlookupd, to
    which it is no longer connected, hears its session end through etcd and moves the
    leadership."""
    flags = [f"--etcd-endpoints={etcd.endpoint}", "--cluster-id=s", "--etcd-lease-ttl=2s"]
    lookupds = [lookupd_factory(*flags) for _ in range(2)]
    leading = until(lambda: lookupd_leader(lookupds), what="one leading nsqlookupd")
    other = next(lk for lk in lookupds if lk is not leading)
    # each node reaches the leading nsqlookupd through a link the test can cut
    links = [LinkProxy(leading.tcp_port) for _ in range(3)]
    nodes: list[NsqdProcess] = [
        start_node(
            tmp_path / f"nsqd{i}",
            f"--lookupd-tcp-address=127.0.0.1:{link.port}",
            f"--lookupd-tcp-address={other.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
            "--replication-lag-timeout=1s",
        )
        for i, link in enumerate(links)
    ]
    until(
        lambda: all(len(lk.json("/cluster/nodes")["nodes"]) == 3 for lk in lookupds),
        what="three nsqd with sessions on both nsqlookupd",
    )
    status, _, body = leading.post("/topic/create?topic=cut&partition_num=1&replicator=2")
    assert status == 200, body
    old = until(lambda: leader_port(other, "cut"), what="a leader in /lookup")
    pub = Publisher(other, "cut")
    con = Consumer(other, "cut", "c")
    pub.publish(50)
    victim = next(n for n in nodes if n.tcp_port == old)
    node_id = f"127.0.0.1:{victim.tcp_port}"
    sessions = {n["node_id"]: n["sessions"] for n in leading.json("/cluster/nodes")["nodes"]}
    assert sessions[node_id][0] == "local" and len(sessions[node_id]) == 2, sessions

    links[nodes.index(victim)].cut()
    judged = until(
        lambda: [
            line
            for line in leading.log
            if node_id in line and ("its roles stay" in line or f"node {node_id} lost" in line)
        ],
        what="the leading nsqlookupd judging the node it lost the connection to",
    )
    # (the leading nsqlookupd's /lookup no longer lists the node: it registers there
    # no more; the other one's does)
    assert leader_port(other, "cut") == old, judged
    assert "its roles stay" in judged[0]
    sessions = {n["node_id"]: n["sessions"] for n in leading.json("/cluster/nodes")["nodes"]}
    assert sessions[node_id] == [s for s in sessions[node_id] if s != "local"], sessions
    pub.publish(50)  # the leader still takes writes, without a hold-up
    assert pub.outages == [], pub.outages
    assert not any("node " + node_id + " lost" in line for line in leading.log)

    victim.stop(signal.SIGKILL)
    pub.publish(50)  # retried until the leadership moved
    assert leader_port(other, "cut") not in (None, old)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("leader cut off from the leading nsqlookupd, then killed", pub, con)
    assert lost == 0
