"""Restarts that leave replicas with less than they held: every node SIGKILLed at once
and started again with the old leader's newest records gone (what a power cut does to
what was not fsynced), and a follower whose segment is garbage when it comes back. The
election never picks a replica with less than the committed log, and every replica
converges to the leader's log; nothing acknowledged is lost.

(A SIGKILL keeps the page cache; the records a power cut would take are cut from the
files here, between the kill and the restart. tests/chaos runs the real thing on a
filesystem that forgets.)"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from cluster import (
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

from nsqx.store.disklog import DiskLog

from nsqdproc import NsqdProcess


def _roles(nodes: list[NsqdProcess], topic: str) -> dict[str, NsqdProcess]:
    out: dict[str, NsqdProcess] = {}
    for n in nodes:
        state = partition_state(n, topic) if n.alive() else None
        if state is not None and state.get("role") in ("leader", "follower"):
            out.setdefault(state["role"], n)
    return out


def _in_step(nodes: list[NsqdProcess], topic: str, end: int) -> bool:
    """Every node holds ``end`` records and knows they are committed."""
    for n in nodes:
        state = partition_state(n, topic)
        if state is None or state.get("end") != end or state.get("commit") != end:
            return False
    return True


def test_every_node_killed_the_leader_back_first_with_less(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path)
    topic = "cut"
    create_replicated(lookupd, topic, 3)
    pub = Publisher(lookupd, topic)
    pub.publish(120)
    until(lambda: _in_step(nodes, topic, 120), what="every replica at 120, committed")
    roles = _roles(nodes, topic)
    leader = roles["leader"]
    followers = [n for n in nodes if n is not leader]
    for n in nodes:
        n.stop(signal.SIGKILL)
    # the old leader lost its newest records (not fsynced when the power went): every
    # acknowledged one is on the two others, as durable acknowledgement requires
    log = DiskLog(str(leader.data_path / f"{topic}.topic" / "p0"))
    assert log.truncate(100) == 100
    log.close()
    old = start_node(leader.data_path, *args)
    # back first, it asks for an election, which waits for a second replica
    until(
        lambda: (
            (s := partition_state(old, topic)) is not None
            and s.get("role") == "leader"
            and s.get("intact") is False
        ),
        what="the old leader back, not leading",
    )
    assert leader_port(lookupd, topic) in (None, old.tcp_port)
    back = [old, start_node(followers[0].data_path, *args)]
    # a follower's log is the newest: it leads; the old leader cuts nothing (it holds a
    # prefix) and copies what it lost
    port = until(
        lambda: (p := leader_port(lookupd, topic)) not in (None, old.tcp_port) and p,
        what="a new leader",
    )
    assert port == back[1].tcp_port
    back.append(start_node(followers[1].data_path, *args))
    pub.conn = None
    pub.publish(30)
    con = Consumer(lookupd, topic, "c")
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("every node killed, the leader back first with 20 fewer", pub, con)
    assert lost == 0
    until(lambda: _in_step(back, topic, 150), what="every replica converged")


def test_a_follower_whose_segment_is_garbage_starts_over_and_converges(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    lookupd, nodes, args = start_cluster(lookupd_factory, tmp_path)
    topic = "garbage"
    create_replicated(lookupd, topic, 3)
    pub = Publisher(lookupd, topic)
    pub.publish(60)
    until(lambda: _in_step(nodes, topic, 60), what="every replica at 60")
    roles = _roles(nodes, topic)
    follower = roles["follower"]
    follower.stop(signal.SIGKILL)
    # its only segment's header is garbage: the store sets the file aside and skips
    # every sequence it may have held, so this log now starts far past the leader's end
    (seg,) = sorted((follower.data_path / f"{topic}.topic" / "p0").glob("*.seg"))
    with open(seg, "r+b") as f:
        f.write(b"\xff" * 16)
    back = start_node(follower.data_path, *args)
    nodes = [n for n in nodes if n is not follower] + [back]
    pub.publish(40)
    until(lambda: _in_step(nodes, topic, 100), what="the damaged follower converged")
    state = partition_state(back, topic)
    assert state is not None and len(state["isr"]) == 3, state
    # it holds what readers need: with the two others gone, it serves every message
    for n in nodes:
        if n is not back:
            n.stop(signal.SIGKILL)
    con = Consumer(lookupd, topic, "c")
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("a follower's segment garbage, then the others killed", pub, con)
    assert lost == 0
