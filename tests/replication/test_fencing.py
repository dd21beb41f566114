"""Liveness by time and fencing, with real processes on loopback: a leader that stops
answering (SIGSTOP: a hung process, a paused VM) is replaced within the node timeout and,
when it wakes, acknowledges nothing; leaders stop acknowledging while no nsqlookupd can
grant them a lease, and go on without a failover when it is back; followers that cannot
hear their leader move its leadership (docs/replication.md, "Timing and fencing")."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from cluster import (
    Conn,
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

from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_ERROR, FRAME_RESPONSE


def history(lookupd: Any, topic: str) -> dict[str, Any]:
    doc: dict[str, Any] = lookupd.json(f"/partition/history?topic={topic}&partition=0")
    return doc["partitions"]["0"]


def node_id(node: Any) -> str:
    return str((node.data_path / "nsqd.node_id").read_text().strip())


def frames_until_closed(conn: Conn, timeout: float) -> list[tuple[int, bytes]]:
    """Every frame the connection gets before it closes or is quiet for ``timeout``."""
    conn.sock.settimeout(timeout)
    out: list[tuple[int, bytes]] = []
    try:
        while True:
            out.append(conn.frame())
    except (TimeoutError, ConnectionError, OSError):
        return out


def test_a_stopped_leader_is_replaced_and_acknowledges_nothing_when_it_wakes(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}", "--node-timeout=1s")
    args = [
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ]
    nodes = [start_node(tmp_path / f"nsqd{i}", *args) for i in range(3)]
    until(lambda: len(lookupd.json("/nodes")["producers"]) == 3, what="three nsqd")
    topic = "stopped"
    port = create_replicated(lookupd, topic, 3)
    pub = Publisher(lookupd, topic, timeout=1.0)
    con = Consumer(lookupd, topic, "c")
    pub.publish(50)
    leader = next(n for n in nodes if n.tcp_port == port)
    old_id = node_id(leader)
    first = history(lookupd, topic)
    assert first["leader"] == old_id

    stuck = Conn(port)
    stuck.send(c.pub(topic, b"m900001"))
    assert stuck.frame() == (FRAME_RESPONSE, b"OK")
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        # sits in the stopped node's socket, to be read when it wakes
        stuck.send(c.pub(topic, b"m900002"))
        pub.publish(50)  # through a new leader, once the stopped one is judged lost
        now = history(lookupd, topic)
        assert now["leader"] != old_id
        assert now["epoch"] > first["epoch"]
        assert any(f"node {old_id} lost" in h["reason"] for h in now["history"])
    finally:
        leader.proc.send_signal(signal.SIGCONT)
    # woken, it acknowledges nothing: its lease ended before the election
    got = frames_until_closed(stuck, 5.0)
    assert (FRAME_RESPONSE, b"OK") not in got, got
    assert all(f[0] == FRAME_ERROR for f in got), got
    # and it comes back as a follower of the new leader, which holds what it took
    until(
        lambda: (partition_state(leader, topic) or {}).get("role") == "follower",
        what="the woken node following",
    )
    again = Conn(leader.tcp_port)
    again.send(c.pub(topic, b"m900003"))
    ftype, data = again.frame()
    assert ftype == FRAME_ERROR and data.startswith(b"E_FAILED_ON_NOT_LEADER"), data
    pub.publish(20)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("replicator 3, leader stopped", pub, con)
    assert lost == 0
    for n in nodes:
        n.stop(signal.SIGKILL)


def test_leaders_stop_acknowledging_while_no_lookupd_grants_a_lease(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """nsqlookupd stopped: no lease is renewed, so leaders refuse writes (nobody could
    fail them over, but they cannot know nsqlookupd is not electing someone else behind
    a cut). It wakes: its own stall gives every node a full timeout again, the leases
    come back, and writes go on with no failover."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, count=2)
    topic = "nolease"
    port = create_replicated(lookupd, topic, 2)
    before = history(lookupd, topic)

    def answer(body: bytes) -> tuple[int, bytes] | None:
        """One PUB on a new connection: its answer, or None if it was closed unanswered
        (a write held for a lease that did not come back in time)."""
        conn = Conn(port, timeout=10)
        try:
            conn.send(c.pub(topic, body))
            return conn.frame()
        except (ConnectionError, OSError):
            return None
        finally:
            conn.close()

    assert answer(b"m1") == (FRAME_RESPONSE, b"OK")
    lookupd.proc.send_signal(signal.SIGSTOP)
    try:
        refused = until(
            lambda: (f := answer(b"m2")) is not None and f[0] == FRAME_ERROR and f,
            what="a refusal once the lease was out for a while",
        )
        assert refused[1].startswith(b"E_FAILED_ON_NOT_WRITABLE"), refused
    finally:
        lookupd.proc.send_signal(signal.SIGCONT)
    until(lambda: answer(b"m3") == (FRAME_RESPONSE, b"OK"), what="writes again")
    after = history(lookupd, topic)
    assert (after["epoch"], after["leader"]) == (before["epoch"], before["leader"])
    for n in nodes:
        state = partition_state(n, topic) or {}
        assert state.get("lease", {}).get("valid") is True


def test_followers_that_cannot_hear_their_leader_move_its_leadership(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """Replicator 3: the leader's replication streams go silent (a proxy holds them)
    while it still reaches nsqlookupd. Both followers report it; they could write without
    it, so the leadership moves to one of them; the old leader, told first, steps down
    and catches up from the new one."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}", "--node-timeout=1s")
    proxies = [CutProxy() for _ in range(3)]
    nodes = []
    for i, proxy in enumerate(proxies):
        node = start_node(
            tmp_path / f"nsqd{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
            # above the node timeout: the followers report before the leader does
            "--replication-lag-timeout=3s",
            f"--replication-address=127.0.0.1:{proxy.port}",
        )
        proxy.target_port = node.http_port
        nodes.append(node)
    until(lambda: len(lookupd.json("/nodes")["producers"]) == 3, what="three nsqd")
    topic = "deaf"
    port = create_replicated(lookupd, topic, 3)
    pub = Publisher(lookupd, topic, timeout=1.0)
    con = Consumer(lookupd, topic, "c")
    pub.publish(50)
    leader = next(n for n in nodes if n.tcp_port == port)
    proxy = proxies[nodes.index(leader)]
    followers = [node_id(n) for n in nodes if n is not leader]
    until(
        lambda: all(
            (partition_state(n, topic) or {}).get("connected") for n in nodes if n is not leader
        ),
        what="both followers streaming",
    )
    for f in followers:
        proxy.cut(f)
    pub.publish(50)
    now = history(lookupd, topic)
    assert now["leader"] in followers
    assert "unreachable" in now["history"][-1]["reason"] or any(
        "unreachable" in h["reason"] for h in now["history"]
    )
    until(
        lambda: (partition_state(leader, topic) or {}).get("role") == "follower",
        what="the old leader following",
    )
    assert leader_port(lookupd, topic) != port
    pub.publish(20)
    con.read_until(lambda: set(pub.acked) <= set(con.received))
    lost, _ = report("replicator 3, leader cut from its followers", pub, con)
    assert lost == 0
    # the old leader caught up from the new one
    until(
        lambda: (partition_state(leader, topic) or {}).get("end", 0) >= len(pub.acked),
        what="the old leader caught up",
    )
    assert json.dumps(now)  # (printed on failure)
    for n in nodes:
        n.stop(signal.SIGKILL)
