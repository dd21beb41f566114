"""Liveness by time: the timing rule, and the monitor that closes silent connections,
without sockets (fake connections and times)."""

from __future__ import annotations

from dataclasses import dataclass

from nsqx.lookupd.liveness import LivenessMonitor, Timing
from nsqx.lookupd.registration_db import Peer
from nsqx.wire.lookupd import PeerInfo


def test_the_timing_rule() -> None:
    t = Timing(2.0)
    assert t.heartbeat_interval == 0.2
    assert t.lease == 0.5
    assert t.margin == 0.25
    # a closed connection's node is judged no earlier than any lease it could hold,
    # plus the margin; a silent one only after the node timeout, which is later
    assert t.lost_after(100.0) == 100.75
    assert t.lease + t.margin < t.node_timeout
    assert t.identify_fields() == {"heartbeat_interval": 200, "lease": 500, "node_timeout": 2000}


@dataclass
class FakeConn:
    peer: Peer | None
    timed_out: float | None = None

    def time_out(self, silent_for: float) -> None:
        self.timed_out = silent_for
        assert self.peer is not None
        self.peer.lost = True


def _peer(n: int, heard: float, *, heartbeat: bool = True) -> Peer:
    info = PeerInfo(
        "127.0.0.1",
        4150 + n,
        4151 + n,
        "1.3.0-nsqx",
        "",
        f"n{n}",
        liveness="heartbeat" if heartbeat else "",
    )
    return Peer(f"127.0.0.1:{5000 + n}", info, 0, heard)


def test_silent_partition_aware_connections_are_timed_out() -> None:
    quiet = FakeConn(_peer(1, heard=0.0))
    talking = FakeConn(_peer(2, heard=9.0))
    # NSQ 1.3's nsqd, or an nsqx nsqd older than heartbeats: 15 s PINGs, judged by its
    # connection
    go_nsqd = FakeConn(_peer(3, heard=0.0, heartbeat=False))
    anonymous = FakeConn(None)  # not identified yet
    monitor = LivenessMonitor(Timing(2.0), lambda: [quiet, talking, go_nsqd, anonymous])
    monitor.check(10.0)
    assert quiet.timed_out == 10.0
    assert talking.timed_out is None
    assert go_nsqd.timed_out is None
    # once lost, not again
    quiet.timed_out = None
    monitor.check(11.0)
    assert quiet.timed_out is None


def test_a_stall_of_nsqlookupd_itself_gives_every_node_a_full_timeout_again() -> None:
    """Silence measured while nsqlookupd was stopped is its own: after a late check
    every connection starts its timeout anew instead of all being judged lost."""
    a = FakeConn(_peer(1, heard=0.0))
    b = FakeConn(_peer(2, heard=0.0))
    monitor = LivenessMonitor(Timing(2.0), lambda: [a, b])
    monitor.check(30.0, late=29.9)
    assert (a.timed_out, b.timed_out) == (None, None)
    assert monitor.stalls == 1
    assert a.peer is not None and a.peer.last_heard == 30.0
    monitor.check(31.0)
    assert (a.timed_out, b.timed_out) == (None, None)
    monitor.check(32.0)  # two seconds after the stall, still silent: lost
    assert a.timed_out == 2.0 and b.timed_out == 2.0
