"""Several `nsqx nsqlookupd --etcd-endpoints` processes over a real etcd process, with
real nsqd: records shared, one leader, failover when the leader is killed, /lookup
served throughout, and etcd stopped and started again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from etcdproc import ETCD, EtcdProcess
from lookupdproc import LookupdProcess, wait_until
from nsqdproc import NsqdProcess

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
NOT_LEADER = {"message": "E_FAILED_ON_NOT_LEADER"}


def etcd_flags(etcd: EtcdProcess, ttl: str = "2s") -> list[str]:
    return [f"--etcd-endpoints={etcd.endpoint}", "--cluster-id=t", f"--etcd-lease-ttl={ttl}"]


def listlookup(lk: LookupdProcess) -> dict[str, Any]:
    status, _, body = lk.get("/listlookup", headers=V1)
    assert status == 200, body
    data: dict[str, Any] = json.loads(body)
    return data


def agreed_leader(lookupds: list[LookupdProcess]) -> LookupdProcess | None:
    """The lookupd that every one of ``lookupds`` names as leader, if they agree."""
    ports = {listlookup(lk)["lookupdleader"]["HttpPort"] for lk in lookupds}
    if len(ports) != 1:
        return None
    port = ports.pop()
    return next((lk for lk in lookupds if str(lk.http_port) == port), None)


def lookup(lk: LookupdProcess, topic: str) -> dict[str, Any]:
    status, _, body = lk.get(f"/lookup?topic={topic}&access=r&metainfo=true", headers=V1)
    assert status == 200, (lk.http_port, status, body)
    data: dict[str, Any] = json.loads(body)
    return data


def serves(lk: LookupdProcess, topic: str, partitions: int) -> bool:
    """``lk`` knows the topic's meta and finds a node for each of its partitions."""
    data = lookup(lk, topic)
    return (
        data.get("meta", {}).get("partition_num") == partitions
        and len(data["partitions"]) == partitions
    )


def post(lk: LookupdProcess, path: str) -> tuple[int, Any]:
    status, _, body = lk.post(path)
    return status, json.loads(body) if body else None


def start_nodes(nsqd_factory: Any, lookupds: list[LookupdProcess], n: int) -> list[NsqdProcess]:
    addresses = [f"--lookupd-tcp-address={lk.tcp_address}" for lk in lookupds]
    return [
        nsqd_factory(*addresses, "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1")
        for _ in range(n)
    ]


def test_one_leads_records_are_shared_and_a_killed_leader_is_replaced(
    etcd: EtcdProcess, lookupd_factory: Any, nsqd_factory: Any
) -> None:
    lookupds = [lookupd_factory(*etcd_flags(etcd)) for _ in range(3)]
    nodes = start_nodes(nsqd_factory, lookupds, 2)
    wait_until(
        lambda: all(len(lk.json("/nodes")["producers"]) == 2 for lk in lookupds),
        what="both nsqd registered with every lookupd",
    )
    leader = wait_until(lambda: agreed_leader(lookupds), what="one leader")
    followers = [lk for lk in lookupds if lk is not leader]
    assert sorted(n["HttpPort"] for n in listlookup(followers[0])["lookupdnodes"]) == sorted(
        str(lk.http_port) for lk in lookupds
    )
    # administration on the leader only, as Youzan's lookupd
    create = "/topic/create?topic=orders&partition_num=2&replicator=1"
    for lk in followers:
        assert post(lk, create) == (400, NOT_LEADER)
        assert post(lk, "/topic/partition/expand?topic=orders&partition_num=3") == (
            400,
            NOT_LEADER,
        )
    assert post(leader, create) == (200, None)
    # the record reaches every lookupd: each one serves the topic's meta and partitions
    wait_until(lambda: all(serves(lk, "orders", 2) for lk in lookupds), what="records shared")
    assert post(leader, "/channel/create?topic=orders&channel=audit")[0] == 200
    wait_until(
        lambda: all("audit" in lk.json("/channels?topic=orders")["channels"] for lk in lookupds),
        what="the channel on every lookupd",
    )
    for lk in followers:
        assert post(lk, "/channel/delete?topic=orders&channel=audit") == (400, NOT_LEADER)
        assert post(lk, "/topic/delete?topic=orders&partition=**") == (400, NOT_LEADER)
        # NSQ 1.3's writes stay each lookupd's own, on any of them
        assert post(lk, "/channel/create?topic=plain&channel=c") == (200, None)
    assert post(leader, "/channel/delete?topic=orders&channel=audit") == (200, None)
    wait_until(
        lambda: all(lk.json("/channels?topic=orders")["channels"] == [] for lk in lookupds),
        what="the channel gone from every lookupd",
    )

    # one node loses its data while it is down (its id stays): the next leader must
    # give its partition back, which only a reconciling coordinator does
    victim = nodes[1]
    victim.stop(signal.SIGKILL)
    for path in victim.data_path.iterdir():
        if path.name != "nsqd.node_id":
            subprocess.run(["rm", "-rf", str(path)], check=True)

    leader.stop(signal.SIGKILL)
    survivors = followers

    def new_leader() -> LookupdProcess | None:
        # /lookup answers on every survivor at every moment of the failover
        for lk in survivors:
            assert lookup(lk, "orders")["meta"]["partition_num"] == 2
        return agreed_leader(survivors)

    second = wait_until(new_leader, timeout=20, what="a new leader")
    assert any("now leads cluster t" in line for line in second.log)
    nsqd_factory(
        *(f"--lookupd-tcp-address={lk.tcp_address}" for lk in survivors),
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--data-path={victim.data_path}",
        name="again",
    )
    wait_until(
        lambda: all(serves(lk, "orders", 2) for lk in survivors),
        what="the wiped node's partition created again by the new leader",
    )
    # administration goes through the new leader, and reaches the other lookupd
    assert post(second, "/topic/create?topic=events&partition_num=2&replicator=1") == (200, None)
    other = next(lk for lk in survivors if lk is not second)
    assert post(other, "/topic/create?topic=more&partition_num=1&replicator=1") == (
        400,
        NOT_LEADER,
    )
    wait_until(lambda: all(serves(lk, "events", 2) for lk in survivors), what="the new topic")
    assert post(second, "/topic/delete?topic=events&partition=**") == (200, None)
    wait_until(
        lambda: "events" not in other.json("/topics")["topics"], what="the delete on the other"
    )


def test_etcd_stopped_and_started_again(
    etcd: EtcdProcess, lookupd_factory: Any, nsqd_factory: Any
) -> None:
    lookupds = [lookupd_factory(*etcd_flags(etcd)) for _ in range(2)]
    start_nodes(nsqd_factory, lookupds, 1)
    wait_until(
        lambda: all(len(lk.json("/nodes")["producers"]) == 1 for lk in lookupds),
        what="the nsqd registered with every lookupd",
    )
    leader = wait_until(lambda: agreed_leader(lookupds), what="one leader")
    assert post(leader, "/topic/create?topic=orders&partition_num=1&replicator=1") == (200, None)
    wait_until(lambda: all(serves(lk, "orders", 1) for lk in lookupds), what="records shared")

    etcd.stop()
    create = "/topic/create?topic=later&partition_num=1&replicator=1"

    def no_leader() -> bool:
        return all(
            listlookup(lk)["lookupdleader"]["ID"] == "" and post(lk, create) == (400, NOT_LEADER)
            for lk in lookupds
        )

    wait_until(no_leader, what="every lookupd to step down")
    assert any("steps down" in line for line in leader.log)
    # lookups go on from what each lookupd knows
    assert all(serves(lk, "orders", 1) for lk in lookupds)

    etcd.start()
    leader = wait_until(lambda: agreed_leader(lookupds), timeout=20, what="a leader again")
    assert post(leader, create) == (200, None)
    wait_until(
        lambda: all(serves(lk, t, 1) for lk in lookupds for t in ("orders", "later")),
        what="old and new records on every lookupd",
    )


def test_a_stopped_leader_hands_over_at_once(etcd: EtcdProcess, lookupd_factory: Any) -> None:
    # a TTL longer than the wait below: only the revoked lease lets the other lead
    lookupds = [lookupd_factory(*etcd_flags(etcd, ttl="120s")) for _ in range(2)]
    leader = wait_until(lambda: agreed_leader(lookupds), what="one leader")
    other = next(lk for lk in lookupds if lk is not leader)
    assert leader.stop(signal.SIGTERM) == 0
    wait_until(lambda: agreed_leader([other]) is other, what="the other leads")


def test_a_lookupd_starts_without_etcd_and_leads_once_it_comes(
    tmp_path: Path, lookupd_factory: Any
) -> None:
    if ETCD is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    etcd = EtcdProcess(tmp_path / "etcd")  # not started yet: its port refuses
    lk = lookupd_factory(*etcd_flags(etcd))
    assert listlookup(lk)["lookupdleader"]["ID"] == ""
    assert post(lk, "/topic/create?topic=t&partition_num=1&replicator=1") == (400, NOT_LEADER)
    assert lk.get("/lookup?topic=t&access=r", headers=V1)[0] == 200
    try:
        etcd.start()
        wait_until(lambda: agreed_leader([lk]) is lk, timeout=20, what="it leads")
    finally:
        etcd.stop()


def test_a_bad_etcd_flag_is_refused() -> None:
    # the flag table's checks are unit-tested (tests/cli); this is the command's answer
    proc = subprocess.run(
        [sys.executable, "-m", "nsqx", "nsqlookupd", "--etcd-endpoints=127.0.0.1:2379"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "is not an http(s):// URL" in proc.stderr, proc.stderr
