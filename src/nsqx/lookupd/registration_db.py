"""RegistrationDB: which nsqd (producer) has which topic and channel.

The model is NSQ's: a map from :class:`Registration` keys (``client::``,
``topic:<name>:``, ``channel:<topic>:<name>``) to the producers registered under each,
keyed by peer id (the connection's remote address) and partition. A key can exist with
no producer: the HTTP API creates such keys, and, as in NSQ, keys stay when their
producers leave, so ``/topics`` still lists a topic whose nsqd went away.

Partitions (Youzan's extension) live in the producer entries, not in the keys: a peer
that serves partitions 0 and 2 of a topic has two entries under ``topic:<name>:``. NSQ's
views (:meth:`RegistrationDB.find_producers`) show one producer per peer; the partition
views (:meth:`RegistrationDB.partition_producers`) show every entry. An NSQ 1.3 nsqd's
registrations are partition 0.

Times are Unix nanoseconds passed in by the caller, so the DB itself has no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from nsqx.wire.lookupd import PeerInfo
from nsqx.wire.names import is_ephemeral

CLIENT = "client"
TOPIC = "topic"
CHANNEL = "channel"


class Registration(NamedTuple):
    """A DB key: ``(category, key, subkey)``; ``"*"`` matches anything in lookups."""

    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """True if this key fits the pattern (``"*"`` as key or subkey is a wildcard)."""
        return (
            self.category == category
            and (key == "*" or self.key == key)
            and (subkey == "*" or self.subkey == subkey)
        )

    def __str__(self) -> str:
        return f"{self.category}:{self.key}:{self.subkey}"


CLIENT_KEY = Registration(CLIENT, "", "")


@dataclass(eq=False)
class Peer:
    """One identified nsqd connection: what it announced, and when it was last heard."""

    #: The connection's remote address, ``host:port`` (``[v6]:port``): the peer's id.
    id: str
    info: PeerInfo
    #: Unix ns of the IDENTIFY or the latest PING.
    last_update: int
    #: Loop time (monotonic) when anything was last read from the connection: what
    #: liveness is judged by (:mod:`nsqx.lookupd.liveness`).
    last_heard: float = 0.0
    #: Set when the connection was closed for silence: the node is not counted as
    #: alive from then on, though its registrations go a moment later, with the close.
    lost: bool = False

    @property
    def remote_address(self) -> str:
        return self.id

    @property
    def speaks_partitions(self) -> bool:
        """True for a peer that registers partitions (see :class:`PeerInfo`)."""
        return self.info.speaks_partitions

    @property
    def node_id(self) -> str:
        """The node's stable id, the same across reconnections: its distributed_id, or
        ``broadcast_address:tcp_port`` for a peer that sent none."""
        info = self.info
        return info.distributed_id or f"{info.broadcast_address}:{info.tcp_port}"


@dataclass(eq=False)
class Producer:
    """A peer's membership in one registration (for one partition); tombstones are per
    registration."""

    peer: Peer
    #: The topic partition this entry is for (0 for NSQ's registrations).
    partition: int = 0
    tombstoned: bool = False
    #: Unix ns when tombstoned (0: never).
    tombstoned_at: int = 0

    def tombstone(self, now: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime_ns: int, now: int) -> bool:
        """True while a tombstone set less than ``lifetime_ns`` ago is in force."""
        return self.tombstoned and now - self.tombstoned_at < lifetime_ns


def filter_active(
    producers: Iterable[Producer], inactive_timeout_ns: int, tombstone_lifetime_ns: int, now: int
) -> list[Producer]:
    """Producers heard from within the inactive timeout and not currently tombstoned."""
    return [
        p
        for p in producers
        if now - p.peer.last_update <= inactive_timeout_ns
        and not p.is_tombstoned(tombstone_lifetime_ns, now)
    ]


#: A producer entry's key under a registration: (peer id, partition).
_EntryKey = tuple[str, int]


class RegistrationDB:
    """The registry: registrations and the producers under each."""

    def __init__(self) -> None:
        self._map: dict[Registration, dict[_EntryKey, Producer]] = {}

    def add_registration(self, key: Registration) -> None:
        """Make sure ``key`` exists (with no producer if it is new)."""
        self._map.setdefault(key, {})

    def add_producer(self, key: Registration, producer: Producer) -> bool:
        """Add ``producer`` under ``key`` (creating it); False if its peer was there
        already for the same partition."""
        producers = self._map.setdefault(key, {})
        entry = (producer.peer.id, producer.partition)
        if entry in producers:
            return False
        producers[entry] = producer
        return True

    def remove_producer(
        self, key: Registration, peer_id: str, partition: int | None = None
    ) -> tuple[bool, int]:
        """Remove a peer from ``key`` (one partition, or all when ``partition`` is None):
        (whether it was there, producers left).

        The key itself stays, even with no producer left, as in NSQ.
        """
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        if partition is not None:
            removed = producers.pop((peer_id, partition), None) is not None
        else:
            gone = [e for e in producers if e[0] == peer_id]
            for e in gone:
                del producers[e]
            removed = bool(gone)
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        """Forget ``key`` and all its producers."""
        self._map.pop(key, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """Existing keys that match the pattern."""
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self._map else []
        return [k for k in self._map if k.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under the matching keys, one per peer (the first entry wins): NSQ's
        view, where a peer serving several partitions is one producer."""
        seen: dict[str, Producer] = {}
        if key != "*" and subkey != "*":
            for (peer_id, _), p in self._map.get(Registration(category, key, subkey), {}).items():
                seen.setdefault(peer_id, p)
            return list(seen.values())
        for k, producers in self._map.items():
            if k.matches(category, key, subkey):
                for (peer_id, _), p in producers.items():
                    seen.setdefault(peer_id, p)
        return list(seen.values())

    def partition_producers(self, key: Registration) -> list[Producer]:
        """Every entry under ``key``: one per (peer, partition), in registration order."""
        return list(self._map.get(key, {}).values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the peer is registered under."""
        return [k for k, producers in self._map.items() if any(e[0] == peer_id for e in producers)]

    def producer(self, key: Registration, peer_id: str) -> Producer | None:
        """The peer's (first) producer entry under ``key``, if any."""
        for (pid, _), p in self._map.get(key, {}).items():
            if pid == peer_id:
                return p
        return None

    def peer_producers(self, key: Registration, peer_id: str) -> list[Producer]:
        """The peer's entries under ``key``, one per partition."""
        return [p for (pid, _), p in self._map.get(key, {}).items() if pid == peer_id]

    def items(self) -> Iterator[tuple[Registration, list[Producer]]]:
        """Every key with its producers (for /debug)."""
        for k, producers in self._map.items():
            yield k, list(producers.values())

    def remove_peer(self, peer_id: str) -> list[Registration]:
        """Drop a disconnected peer from every key; returns the keys it left.

        Non-ephemeral keys stay (NSQ keeps them). Ephemeral keys left without producers
        are dropped: NSQ does this on UNREGISTER but not on disconnect, which leaves
        ``#ephemeral`` topics and channels listed forever after their nsqd went away.
        """
        left_keys: list[Registration] = []
        for k in self.lookup_registrations(peer_id):
            removed, left = self.remove_producer(k, peer_id)
            if removed:
                left_keys.append(k)
            if left == 0 and k.category != CLIENT and _ephemeral_key(k):
                self.remove_registration(k)
        return left_keys


def _ephemeral_key(k: Registration) -> bool:
    if k.category == CHANNEL:
        return is_ephemeral(k.subkey) or is_ephemeral(k.key)
    return is_ephemeral(k.key)
