"""RegistrationDB: keys, producers, wildcards, activity and tombstones (no network)."""

from __future__ import annotations

from nsqx.lookupd.registration_db import (
    CLIENT_KEY,
    Peer,
    Producer,
    Registration,
    RegistrationDB,
    filter_active,
)
from nsqx.wire.lookupd import PeerInfo

S = 1_000_000_000


def peer(n: int, now: int = 0) -> Peer:
    return Peer(f"127.0.0.1:{5000 + n}", PeerInfo("127.0.0.1", 4150 + n, 4151 + n, "1.3.0"), now)


def test_keys_outlive_their_producers() -> None:
    db = RegistrationDB()
    a = peer(1)
    key = Registration("topic", "t", "")
    assert db.add_producer(key, Producer(a))
    assert not db.add_producer(key, Producer(a))  # one entry per peer
    assert db.remove_producer(key, a.id) == (True, 0)
    assert db.remove_producer(key, a.id) == (False, 0)
    assert db.find_registrations("topic", "t", "") == [key]
    db.remove_registration(key)
    assert db.find_registrations("topic", "*", "") == []
    assert db.remove_producer(key, a.id) == (False, 0)


def test_wildcards_and_dedup() -> None:
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    for k in (Registration("channel", "t", "c1"), Registration("channel", "t", "c2")):
        db.add_producer(k, Producer(a))
        db.add_producer(k, Producer(b))
    db.add_registration(Registration("channel", "u", "c1"))
    assert [k.subkey for k in db.find_registrations("channel", "t", "*")] == ["c1", "c2"]
    assert [k.key for k in db.find_registrations("channel", "*", "c1")] == ["t", "u"]
    assert [p.peer for p in db.find_producers("channel", "t", "*")] == [a, b]
    assert db.find_producers("channel", "nope", "*") == []
    assert set(db.lookup_registrations(a.id)) == {
        Registration("channel", "t", "c1"),
        Registration("channel", "t", "c2"),
    }


def test_filter_active_inactivity_and_tombstones() -> None:
    fresh, stale = peer(1, now=100 * S), peer(2, now=0)
    tomb = Producer(peer(3, now=100 * S))
    tomb.tombstone(now=99 * S)
    producers = [Producer(fresh), Producer(stale), tomb]
    got = filter_active(producers, 60 * S, 45 * S, now=100 * S)
    assert [p.peer for p in got] == [fresh]
    # the tombstone lapses after its lifetime; the stale peer stays out until it pings
    later = filter_active(producers, 60 * S, 45 * S, now=145 * S)
    assert [p.peer for p in later] == [fresh, tomb.peer]
    stale.last_update = 145 * S
    assert len(filter_active(producers, 60 * S, 45 * S, now=145 * S)) == 3


def test_remove_peer_keeps_keys_but_drops_ephemeral_ones() -> None:
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    keys = [
        CLIENT_KEY,
        Registration("topic", "t", ""),
        Registration("channel", "t", "c"),
        Registration("channel", "t", "c#ephemeral"),
        Registration("topic", "e#ephemeral", ""),
        Registration("channel", "e#ephemeral", "c"),
    ]
    for k in keys:
        db.add_producer(k, Producer(a))
    db.add_producer(Registration("topic", "e#ephemeral", ""), Producer(b))
    assert set(db.remove_peer(a.id)) == set(keys)
    remaining = {k for k, _ in db.items()}
    assert remaining == {
        CLIENT_KEY,
        Registration("topic", "t", ""),
        Registration("channel", "t", "c"),
        # b still has it
        Registration("topic", "e#ephemeral", ""),
    }


def test_partition_entries() -> None:
    """A peer has one entry per partition; NSQ's view shows it once."""
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    key = Registration("topic", "t", "")
    assert db.add_producer(key, Producer(a, 0))
    assert db.add_producer(key, Producer(a, 2))
    assert not db.add_producer(key, Producer(a, 2))
    assert db.add_producer(key, Producer(b, 1))
    assert [(p.peer, p.partition) for p in db.partition_producers(key)] == [
        (a, 0),
        (a, 2),
        (b, 1),
    ]
    assert [p.peer for p in db.find_producers("topic", "t", "")] == [a, b]
    assert [p.peer for p in db.find_producers("topic", "*", "")] == [a, b]
    assert [p.partition for p in db.peer_producers(key, a.id)] == [0, 2]
    # one partition, then all of a peer's
    assert db.remove_producer(key, a.id, 2) == (True, 2)
    assert db.remove_producer(key, a.id, 2) == (False, 2)
    assert db.add_producer(key, Producer(a, 3))
    assert db.remove_producer(key, a.id) == (True, 1)
    assert db.lookup_registrations(a.id) == []
    assert db.remove_peer(b.id) == [key]
    assert db.partition_producers(key) == []


def test_node_id_and_partition_awareness() -> None:
    go = peer(1)
    assert not go.speaks_partitions and go.node_id == "127.0.0.1:4151"
    nsqx = Peer("127.0.0.1:6000", PeerInfo("10.1.1.1", 4150, 4151, "1.3.0-nsqx", "", "n1"), 0)
    assert nsqx.speaks_partitions and nsqx.node_id == "n1"
