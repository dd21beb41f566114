"""Failover with real processes: three nsqd, one nsqlookupd, a topic with replicator 2
or 3; a publisher and a consumer run while a node is SIGKILLed. Nothing acknowledged
is lost, and writes resume through the new leader."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    STARTED,
    Consumer,
    Publisher,
    create_replicated,
    leader_port,
    partition_state,
    report,
    start_cluster,
    start_node,
    until,
)
from cutproxy import CutProxy

from lookupdproc import http_request
from nsqdproc import NsqdProcess


def _replicated_topic(lookupd: Any, topic: str, replicator: int) -> tuple[Publisher, Consumer]:
    """Create a one-partition topic with ``replicator`` replicas, wait for its leader in
    /lookup; a publisher and a consumer (channel ``c``) that follow the leader."""
    create_replicated(lookupd, topic, replicator)
    return Publisher(lookupd, topic), Consumer(lookupd, topic, "c")


def _holders(nodes: list[NsqdProcess], topic: str) -> dict[str, NsqdProcess]:
    """The nodes that hold the partition, by role."""
    out: dict[str, NsqdProcess] = {}
    for n in nodes:
        if not n.alive():
            continue
        state = partition_state(n, topic)
        if state is not None and state.get("role") in ("leader", "follower"):
            out.setdefault(state["role"], n)
            out[f"{state['role']}:{n.http_port}"] = n
    return out


@pytest.mark.parametrize("replicator", [2, 3])
def test_leader_killed_nothing_acknowledged_is_lost(
    lookupd_factory: Any, tmp_path: Path, replicator: int
) -> None:
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path)
    topic = f"rep{replicator}"
    pub, con = _replicated_topic(lookupd, topic, replicator)
    pub.publish(200)
    con.read_until(lambda: len(set(con.received)) >= 100)
    # every replica holds what was acknowledged
    holders = until(
        lambda: (
            (h := _holders(nodes, topic))
            and sum(1 for k in h if ":" in k) == replicator
            and all(
                (partition_state(n, topic) or {}).get("end") == 200
                for k, n in h.items()
                if ":" in k
            )
            and h
        ),
        what="every replica at the leader's end",
    )
    leader = holders["leader"]
    followers = [n for k, n in holders.items() if k.startswith("follower:")]
    # the channel's position reached the followers (so few messages come twice)
    until(
        lambda: all(
            (partition_state(f, topic) or {}).get("channels", {}).get("c", 0) >= 100
            for f in followers
        ),
        what="the channel's position on the followers",
    )
    old_port = leader.tcp_port
    leader.stop(signal.SIGKILL)
    pub.publish(200)  # retried through the failover
    assert leader_port(lookupd, topic) != old_port
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, dups = report(f"replicator {replicator}, leader killed", pub, con)
    assert lost == 0
    # at most what was in flight (RDY 100) or not yet confirmed comes twice
    assert dups <= 100 + len(pub.acked) - 200
    back = start_node(leader.data_path, *args)
    nodes.append(back)
    if replicator == 3:
        # the old leader is a replica still: it comes back as a follower, catches up
        # and joins the ISR
        until(
            lambda: (
                (s := partition_state(back, topic)) is not None
                and s.get("role") == "follower"
                and s.get("end") == 400
            ),
            what="the old leader caught up",
        )
        until(
            lambda: len((partition_state(back, topic) or {}).get("isr", [])) == 3,
            what="the old leader back in the ISR",
        )
    else:
        # a spare took its place: it is told it holds no replica (no leader, no writes)
        until(
            lambda: (partition_state(back, topic) or {}).get("role") == "none",
            what="the replaced old leader told it is no replica",
        )
        assert leader_port(lookupd, topic) != back.tcp_port
    for n in nodes:
        n.stop(signal.SIGKILL)


@pytest.mark.parametrize("replicator", [2, 3])
def test_follower_killed_writes_go_on(
    lookupd_factory: Any, tmp_path: Path, replicator: int
) -> None:
    """A follower SIGKILLed: it leaves the ISR; with replicator 2 the ISR alone is too
    small to write (Youzan's rule), so the spare node catches up and joins it."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path)
    topic = f"fol{replicator}"
    pub, con = _replicated_topic(lookupd, topic, replicator)
    pub.publish(150)
    holders = until(
        lambda: (h := _holders(nodes, topic)) and sum(1 for k in h if ":" in k) == replicator and h,
        what="every replica",
    )
    follower = holders["follower"]
    follower.stop(signal.SIGKILL)
    pub.publish(150)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report(f"replicator {replicator}, follower killed", pub, con)
    assert lost == 0
    leader = holders["leader"]
    state = partition_state(leader, topic)
    gone = (follower.data_path / "nsqd.node_id").read_text().strip()
    assert state is not None and gone not in state["isr"], state
    # replicator 2: the leader and the spare that caught up; 3: the two left
    assert len(state["isr"]) == 2, state
    for n in nodes:
        n.stop(signal.SIGKILL)


def test_drain_moves_leaderships_and_stats_show_roles(lookupd_factory: Any, tmp_path: Path) -> None:
    """Before maintenance: /cluster/node/drain moves the node's leaderships to in-sync
    replicas; publishing goes on there and the drained node follows and rejoins the
    ISR. /stats shows each partition's role, epoch, leader, ISR and lag."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path)
    topic = "drained"
    pub, con = _replicated_topic(lookupd, topic, 2)
    pub.publish(100)
    holders = until(
        lambda: (h := _holders(nodes, topic)) and "follower" in h and h, what="a follower"
    )
    leader = holders["leader"]
    node_id = (leader.data_path / "nsqd.node_id").read_text().strip()
    stats = json.loads(http_request(f"{leader.http_url}/stats?format=json")[2])
    (entry,) = [t for t in stats["topics"] if t["topic_name"] == topic]
    repl = entry["replication"]
    assert entry["is_leader"] and repl["role"] == "leader" and repl["leader"] == node_id
    assert len(repl["isr"]) == 2 and set(repl["followers"]) == set(repl["isr"]) - {node_id}
    metrics = http_request(f"{leader.http_url}/metrics")[2].decode()
    assert f'nsq_partition_is_leader{{partition="0",topic="{topic}"}} 1.0' in metrics
    assert f'nsq_partition_isr_size{{partition="0",topic="{topic}"}} 2.0' in metrics
    # the CLI lists the partition, then drains its leader's node
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "nsqx",
            "replicas",
            f"--lookupd-http-address={lookupd.http_address}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert listed[0].split()[:4] == ["topic", "part", "epoch", "leader"]
    assert listed[1].split()[:4] == [topic, "0", str(repl["epoch"]), node_id], listed
    drained = subprocess.run(
        [
            sys.executable,
            "-m",
            "nsqx",
            "replicas",
            f"--lookupd-http-address={lookupd.http_address}",
            f"--drain={node_id}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert drained.strip() == f"moved 1 leadership(s) away from {node_id}: {topic}:0"
    until(lambda: leader_port(lookupd, topic) not in (None, leader.tcp_port), what="a move")
    pub.publish(100)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("drain", pub, con)
    assert lost == 0
    until(
        lambda: (
            (s := partition_state(leader, topic)) is not None
            and s["role"] == "follower"
            and len(s["isr"]) == 2
            and s["end"] == 200
        ),
        what="the drained node following, in the ISR again",
    )
    assert lookupd.post(f"/topic/partition/move?topic={topic}&partition=0")[0] == 400
    # a follower's channel positions come from its leader: moving one there is refused
    status, _, body = http_request(
        f"{leader.http_url}/channel/setoffset?topic={topic}&channel=c&partition=0",
        method="POST",
    )
    assert (status, json.loads(body)) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    # and so is emptying its channel or its topic (as Youzan's nsqd answers)
    until(
        lambda: "c" in (partition_state(leader, topic) or {}).get("channels", {}),
        what="the channel's position on the follower",
    )
    for path in (f"/channel/empty?topic={topic}&channel=c", f"/topic/empty?topic={topic}"):
        status, _, body = http_request(f"{leader.http_url}{path}", method="POST")
        assert (status, json.loads(body)) == (400, {"message": "E_FAILED_ON_NOT_LEADER"}), path
    for n in nodes:
        n.stop(signal.SIGKILL)


def test_network_cut_between_leader_and_follower(lookupd_factory: Any, tmp_path: Path) -> None:
    """Replicator 3: the replication stream between the leader and one follower goes
    silent (a proxy holds it). The leader reports the follower, the ISR shrinks to two
    and writes go on; once healed the follower catches up and joins again."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    proxies = [CutProxy() for _ in range(3)]
    nodes = []
    for i, proxy in enumerate(proxies):
        node = start_node(
            tmp_path / f"nsqd{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
            "--replication-lag-timeout=1s",
            f"--replication-address=127.0.0.1:{proxy.port}",
        )
        proxy.target_port = node.http_port
        nodes.append(node)
    until(lambda: len(lookupd.json("/nodes")["producers"]) == 3, what="three nsqd")
    topic = "cut"
    pub, con = _replicated_topic(lookupd, topic, 3)
    pub.publish(100)
    holders = until(
        lambda: (h := _holders(nodes, topic)) and sum(1 for k in h if ":" in k) == 3 and h,
        what="every replica",
    )
    leader = holders["leader"]
    follower = holders["follower"]
    proxy = proxies[nodes.index(leader)]
    follower_id = (follower.data_path / "nsqd.node_id").read_text().strip()
    proxy.cut(follower_id)
    pub.publish(100)  # held until the follower leaves the ISR, then on
    until(
        lambda: follower_id not in (partition_state(leader, topic) or {}).get("isr", [follower_id]),
        what="the cut follower out of the ISR",
    )
    pub.publish(100)
    behind = (partition_state(follower, topic) or {}).get("end", 0)
    assert behind < 300  # it really was cut off
    proxy.heal(follower_id)
    until(
        lambda: follower_id in (partition_state(leader, topic) or {}).get("isr", []),
        what="the follower back in the ISR",
    )
    assert (partition_state(follower, topic) or {}).get("end") == 300
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("replicator 3, leader-follower network cut", pub, con)
    assert lost == 0
    for n in nodes:
        n.stop(signal.SIGKILL)


def test_follower_back_after_the_leader_reclaimed_starts_over(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """A follower down while the leader deleted the segments it lacks (consumed, no
    retention) cannot catch up from its own end: it empties its log, starts over where
    the leader's log starts, and joins the ISR again."""
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path, "--max-bytes-per-file=4096")
    topic = "reclaimed"
    pub, con = _replicated_topic(lookupd, topic, 3)
    pub.publish(20)
    holders = until(
        lambda: (h := _holders(nodes, topic)) and sum(1 for k in h if ":" in k) == 3 and h,
        what="every replica",
    )
    leader, follower = holders["leader"], holders["follower"]
    follower.stop(signal.SIGKILL)
    pub.publish(300)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    until(
        lambda: (s := partition_state(leader, topic)) is not None and s["start"] > 20,
        what="the leader reclaiming what the follower lacks",
    )
    back = start_node(follower.data_path, *args)
    nodes.append(back)
    until(
        lambda: (
            (s := partition_state(back, topic)) is not None
            and s.get("role") == "follower"
            and s["end"] == 320
            and s["start"] > 20
        ),
        what="the follower started over and caught up",
    )
    until(
        lambda: len((partition_state(leader, topic) or {}).get("isr", [])) == 3,
        what="the follower back in the ISR",
    )
    pub.publish(10)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("replicator 3, follower back after reclaim", pub, con)
    assert lost == 0
    for n in nodes:
        n.stop(signal.SIGKILL)


def test_leader_killed_and_restarted_at_once(lookupd_factory: Any, tmp_path: Path) -> None:
    """A supervisor restarts a SIGKILLed leader at once, within the grace nsqlookupd
    gives a lost node (where Youzan's nsqd lost acknowledged messages): it keeps its
    leadership after nsqlookupd confirms it, its followers catch up from it, and nothing
    acknowledged is lost."""
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path)
    topic = "quick"
    pub, con = _replicated_topic(lookupd, topic, 3)
    pub.publish(150)
    con.read_until(lambda: len(set(con.received)) >= 50)
    holders = until(
        lambda: (h := _holders(nodes, topic)) and "leader" in h and h, what="the leader"
    )
    leader = holders["leader"]
    leader.stop(signal.SIGKILL)
    start_node(leader.data_path, *args)
    pub.publish(150)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("replicator 3, leader killed and restarted at once", pub, con)
    assert lost == 0
    ends = {(partition_state(n, topic) or {}).get("end") for n in STARTED if n.alive()}
    assert ends == {300}, ends  # every live replica holds every acknowledged message


def test_a_spare_copies_from_what_readers_still_need(lookupd_factory: Any, tmp_path: Path) -> None:
    """A spare that replaces a dead follower starts at the partition's low water (the
    oldest message a channel still needs), not at the start of the retained log, so
    that replicator 2 writes again sooner; after a failover onto it, nothing that was
    not consumed is missing."""
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path)
    pub, con = _replicated_topic(lookupd, "floor", 2)
    pub.publish(300)
    con.read_until(lambda: len(set(con.received)) == 300)
    assert con.conn is not None
    con.conn.close()  # nothing more in flight: the channel's low water is its cursor
    con.conn = None
    pub.publish(50)
    holders = until(
        lambda: (h := _holders(nodes, "floor")) and "follower" in h and "leader" in h and h,
        what="both replicas",
    )
    leader, follower = holders["leader"], holders["follower"]
    until(
        lambda: (partition_state(leader, "floor") or {}).get("channels", {}).get("c") == 300,
        what="the channel's cursor at 300 on the leader",
    )
    follower.stop(signal.SIGKILL)
    spare = next(n for n in nodes if n is not leader and n is not follower)
    state = until(
        lambda: (
            (s := partition_state(spare, "floor")) is not None
            and s.get("role") == "follower"
            and s["end"] == 350
            and len((partition_state(leader, "floor") or {}).get("isr", [])) == 2
            and s
        ),
        what="the spare in the ISR",
    )
    assert 0 < state["start"] <= 300, state  # not the 300 messages consumed already
    assert (partition_state(leader, "floor") or {})["start"] == 0  # the leader kept them
    pub.publish(10)  # writes go on with the spare in the ISR

    leader.stop(signal.SIGKILL)
    until(lambda: leader_port(lookupd, "floor") == spare.tcp_port, what="the spare leads")
    # replicator 2 needs a second replica again before the newest records count as
    # committed (the new leader may not have heard the last commit point): no node is
    # free, until one starts and takes the dead leader's place
    late = start_node(tmp_path / "nsqd3", *args)
    nodes.append(late)
    con.read_until(lambda: set(range(360)) <= set(con.received))
    state = partition_state(late, "floor")
    assert state is not None and state["role"] == "follower" and state["start"] >= 300, state
    lost, _ = report("replicator 2, spare from the low water, then failover", pub, con)
    assert lost == 0


def test_a_follower_behind_a_gap_in_the_leaders_log_starts_after_it(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """The leader finds a damaged segment while a returning follower catches up through
    it (the store sets the records aside: a gap). The follower cannot copy them: it
    starts over after the gap, catches up and joins the ISR, instead of retrying the
    same read for ever."""
    lookupd, nodes, args = start_cluster(
        lookupd_factory, tmp_path, "--max-bytes-per-file=4096", "--mem-queue-size=10"
    )
    pub, _ = _replicated_topic(lookupd, "gap", 3)
    pub.publish(20)
    holders = until(
        lambda: (h := _holders(nodes, "gap")) and sum(1 for k in h if ":" in k) == 3 and h,
        what="every replica",
    )
    leader, follower = holders["leader"], holders["follower"]
    follower.stop(signal.SIGKILL)
    pub.publish(300)
    # damage a sealed segment of the leader in the range the follower lacks (read from
    # the file: the leader's cache holds the last 10 records only)
    segments = sorted(
        p for p in leader.data_path.rglob("*.seg") if "gap" in str(p.relative_to(leader.data_path))
    )
    base = [int(p.name.split(".")[0]) for p in segments]
    victim = next(p for p, b, nxt in zip(segments, base, base[1:], strict=False) if b < 150 <= nxt)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    back = start_node(follower.data_path, *args)
    nodes.append(back)
    state = until(
        lambda: (
            (s := partition_state(back, "gap")) is not None
            and s.get("role") == "follower"
            and s["end"] == 320
            and len((partition_state(leader, "gap") or {}).get("isr", [])) == 3
            and s
        ),
        what="the follower past the gap and in the ISR",
    )
    assert state["start"] > 20, state  # it started over after the gap
    pub.publish(10)  # and writes go on with it
