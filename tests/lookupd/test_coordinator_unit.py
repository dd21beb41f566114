"""The Coordinator without sockets: a real registry and an in-memory meta store, fake
nodes (their registrations are made directly) and a fake of the one seam that reaches
nsqd, :class:`~nsqx.lookupd.nsqd_client.NsqdClient`. What is placed where, what is
saved, which node is asked for what, and what a refusal leaves behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from nsqx.lookupd.coordinator import (
    ERR_ALREADY_EXIST,
    ERR_KEY_NOT_FOUND,
    ERR_NODE_UNAVAILABLE,
    ERR_PARTITION_REDUCED,
    Coordinator,
    CoordinatorError,
)
from nsqx.lookupd.meta_store import MemoryMetaStore
from nsqx.lookupd.nsqd_client import NsqdCallError
from nsqx.lookupd.registration_db import (
    CHANNEL,
    CLIENT,
    TOPIC,
    Peer,
    Producer,
    Registration,
    RegistrationDB,
)
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.lookupd import PeerInfo
from nsqx.wire.topic_meta import TopicMeta

T = TypeVar("T")


def multi(partition_num: int, **settings: Any) -> TopicMeta:
    """A topic whose partitions may share a node (Youzan's ``multipart``): a test
    cluster has fewer nodes than partitions."""
    return TopicMeta(partition_num=partition_num, multipart=True, **settings)


Call = tuple[str, str, str, int, str | None]  # (verb, node, topic, partition, channel)


class FakeNsqd:
    """What the coordinator calls on nodes: every call recorded; nodes in ``down``
    refuse, as an unreachable nsqd does."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.down: set[str] = set()
        self.closed = False

    def _call(self, verb: str, node: PeerInfo, topic: str, pid: int, ch: str | None) -> None:
        self.calls.append((verb, node.distributed_id, topic, pid, ch))
        if node.distributed_id in self.down:
            raise NsqdCallError(f"{node.distributed_id}: connection refused")

    async def create_partition(self, node: PeerInfo, topic: str, pid: int, meta: Any) -> None:
        self._call("create", node, topic, pid, None)

    async def delete_partition(self, node: PeerInfo, topic: str, pid: int) -> None:
        self._call("delete", node, topic, pid, None)

    async def create_channel(self, node: PeerInfo, topic: str, ch: str, pid: int) -> None:
        self._call("create", node, topic, pid, ch)

    async def delete_channel(self, node: PeerInfo, topic: str, ch: str, pid: int) -> None:
        self._call("delete", node, topic, pid, ch)

    async def send_role(self, node: PeerInfo, topic: str, pid: int, role: Any) -> None:
        self._call("role", node, topic, pid, None)

    async def close(self) -> None:
        self.closed = True

    def made(self, verb: str = "create", channel: str | None = None) -> set[tuple[str, int]]:
        """(node, partition) pairs asked for ``verb`` (of a channel, or of partitions)."""
        return {(n, p) for v, n, _, p, c in self.calls if v == verb and c == channel}


class RefusingStore(MemoryMetaStore):
    """A meta store that refuses writes while ``refuse`` is set (etcd unreachable)."""

    refuse = False

    async def put(self, topic: str, record: TopicRecord) -> None:
        if self.refuse:
            raise OSError("etcd: no leader")
        await super().put(topic, record)


class Cluster:
    """A coordinator, its registry and store, and the nodes connected to it."""

    def __init__(self) -> None:
        self.db = RegistrationDB()
        self.nsqd = FakeNsqd()
        self.store = RefusingStore()
        self.coord = Coordinator(self.db, self.nsqd, inactive_producer_timeout=300.0)  # type: ignore[arg-type]
        # asks due at once and retried fast: the tests wait on the registry, not on time
        self.coord.register_grace = 0.0
        self.coord.retry_min = 0.01
        self.coord.retry_max = 0.05
        self.peers: dict[str, Peer] = {}

    async def start(self) -> None:
        await self.coord.start(self.store)

    def connect(self, node: str, *, nsqx: bool = True) -> Peer:
        """A node identifies: an nsqx nsqd, or (``nsqx=False``) an NSQ 1.3 one."""
        info = PeerInfo(
            "127.0.0.1",
            4150,
            4151,
            "1.3.0-nsqx" if nsqx else "1.3.0",
            node,
            node if nsqx else "",
        )
        peer = Peer(f"{node}-conn", info, time.time_ns())
        self.db.add_producer(Registration(CLIENT, "", ""), Producer(peer))
        self.peers[node] = peer
        self.coord.peer_identified(peer)
        return peer

    def register(self, node: str, topic: str, pid: int, channel: str | None = None) -> None:
        """The node's REGISTER of a partition (or a channel on it)."""
        peer = self.peers[node]
        self.db.add_producer(Registration(TOPIC, topic, ""), Producer(peer, pid))
        if channel is not None:
            self.db.add_producer(Registration(CHANNEL, topic, channel), Producer(peer, pid))
        self.coord.peer_registered(peer, topic, pid, channel)

    def disconnect(self, node: str) -> None:
        peer = self.peers.pop(node)
        self.db.remove_peer(peer.id)
        self.coord.peer_gone(peer)

    def keys(self, topic: str) -> set[Registration]:
        return {k for k, _ in self.db.items() if k.key == topic}


def run(body: Callable[[Cluster], Coroutine[Any, Any, T]]) -> T:
    async def main() -> T:
        cl = Cluster()
        await cl.start()
        try:
            return await asyncio.wait_for(body(cl), 30)
        finally:
            await cl.coord.close()

    return asyncio.run(main())


async def until(cond: Callable[[], object], what: str) -> None:
    """Wait for a condition the coordinator's background asks bring about."""
    deadline = asyncio.get_running_loop().time() + 10
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def test_create_places_partitions_evenly_saves_and_asks_each_node() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.connect("b")
        await cl.coord.create_topic("orders", multi(4))
        record = await cl.store.get("orders")
        assert record is not None and record == cl.coord.record("orders")
        held = [n for nodes in record.placements.values() for n in nodes]
        assert sorted(record.placements) == [0, 1, 2, 3]
        assert held.count("a") == held.count("b") == 2
        asked = cl.nsqd.made()
        assert asked == {(nodes[0], pid) for pid, nodes in record.placements.items()}
        assert Registration(TOPIC, "orders", "") in cl.keys("orders")

    run(body)


def test_replicated_partitions_get_distinct_nodes_and_a_first_epoch() -> None:
    async def body(cl: Cluster) -> None:
        for n in "abc":
            cl.connect(n)
        await cl.coord.create_topic("t", multi(2, replica=3))
        record = cl.coord.record("t")
        assert record is not None
        for nodes in record.placements.values():
            assert sorted(nodes) == ["a", "b", "c"]
        assert set(record.history) == {0, 1}  # placed: epoch 1 of each partition
        # every replica of every partition was asked to create it
        assert cl.nsqd.made() == {(n, p) for n in "abc" for p in (0, 1)}

    run(body)


def test_refusals_change_nothing() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.connect("legacy", nsqx=False)  # an NSQ 1.3 nsqd is never a placement target
        with pytest.raises(CoordinatorError) as err:
            await cl.coord.create_topic("t", multi(1, replica=2))
        assert (err.value.status, err.value.message) == (400, ERR_NODE_UNAVAILABLE)
        assert await cl.store.list() == {} and cl.nsqd.calls == []
        assert cl.keys("t") == set()

        await cl.coord.create_topic("t", multi(2))
        with pytest.raises(CoordinatorError) as err:
            await cl.coord.create_topic("t", multi(3))
        assert err.value.message == ERR_ALREADY_EXIST
        with pytest.raises(CoordinatorError) as err:
            await cl.coord.expand_topic("t", 1)
        assert err.value.message == ERR_PARTITION_REDUCED
        with pytest.raises(CoordinatorError) as err:
            await cl.coord.delete_topic("never-made", None)
        assert err.value.message == ERR_KEY_NOT_FOUND
        record = cl.coord.record("t")
        assert record is not None and record.meta.partition_num == 2

    run(body)


def test_a_store_that_refuses_a_write_leaves_registry_and_nodes_alone() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.store.refuse = True
        with pytest.raises(OSError):
            await cl.coord.create_topic("t", multi(2))
        assert cl.coord.record("t") is None
        assert cl.nsqd.calls == [] and cl.keys("t") == set()
        cl.store.refuse = False
        await cl.coord.create_topic("t", multi(2))
        assert cl.nsqd.made() == {("a", 0), ("a", 1)}

    run(body)


def test_a_node_that_does_not_register_is_asked_again_until_it_does() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.nsqd.down.add("a")
        await cl.coord.create_topic("t", multi(1))
        # the create failed; reconciliation asks again, with a growing delay
        await until(lambda: len(cl.nsqd.calls) >= 3, "the asks to be repeated")
        assert cl.coord.pending_asks == 1
        cl.nsqd.down.clear()
        cl.register("a", "t", 0)
        await until(lambda: cl.coord.pending_asks == 0, "the node's registration to end the asks")
        asked = len(cl.nsqd.calls)
        # a registered partition is never asked for again
        cl.coord.reconcile()
        assert len(cl.nsqd.calls) == asked

    run(body)


def test_a_node_that_comes_back_without_its_partitions_gets_them_and_their_channels() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        await cl.coord.create_topic("t", multi(1))
        assert await cl.coord.create_channel("t", "billing") is True
        cl.register("a", "t", 0, "billing")
        cl.disconnect("a")
        cl.nsqd.calls.clear()
        # it lost its data: it registers nothing on its new connection
        cl.connect("a")
        await until(lambda: ("a", 0) in cl.nsqd.made("create", "billing"), "the channel ask")
        assert ("a", 0) in cl.nsqd.made()

    run(body)


def test_a_node_that_goes_away_takes_its_pending_asks_with_it() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.nsqd.down.add("a")
        await cl.coord.create_topic("t", multi(1))
        await until(lambda: cl.coord.pending_asks == 1, "an ask to be pending")
        cl.disconnect("a")
        await until(lambda: cl.coord.pending_asks == 0, "the asks to go with the node")

    run(body)


def test_channels_are_made_and_deleted_on_every_partition() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.connect("b")
        await cl.coord.create_topic("t", multi(2))
        assert await cl.coord.create_channel("t", "c1") is True
        record = cl.coord.record("t")
        assert record is not None and record.channels == ("c1",)
        placed = {(nodes[0], pid) for pid, nodes in record.placements.items()}
        assert cl.nsqd.made("create", "c1") == placed
        assert Registration(CHANNEL, "t", "c1") in cl.keys("t")
        # a topic lookupd did not create is NSQ's business, not the coordinator's
        assert await cl.coord.create_channel("plain", "c1") is False

        assert await cl.coord.delete_channel("t", "c1") is True
        assert cl.nsqd.made("delete", "c1") == placed
        record = cl.coord.record("t")
        assert record is not None and record.channels == ()
        assert Registration(CHANNEL, "t", "c1") not in cl.keys("t")

    run(body)


def test_expand_places_only_the_new_partitions() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.connect("b")
        await cl.coord.create_topic("t", multi(2))
        before = cl.coord.record("t")
        assert before is not None
        await cl.coord.expand_topic("t", 4)
        after = cl.coord.record("t")
        assert after is not None and after.meta.partition_num == 4
        assert {p: after.placements[p] for p in (0, 1)} == before.placements
        held = [n for nodes in after.placements.values() for n in nodes]
        assert held.count("a") == held.count("b") == 2

    run(body)


def test_delete_calls_every_holder_and_forgets_the_topic() -> None:
    async def body(cl: Cluster) -> None:
        cl.connect("a")
        cl.connect("b")
        await cl.coord.create_topic("t", multi(2))
        record = cl.coord.record("t")
        assert record is not None
        for pid, nodes in record.placements.items():
            cl.register(nodes[0], "t", pid)
        await cl.coord.delete_topic("t", 1)
        left = cl.coord.record("t")
        assert left is not None and list(left.placements) == [0]
        assert cl.nsqd.made("delete") == {(record.placements[1][0], 1)}

        await cl.coord.delete_topic("t", None)
        assert cl.coord.record("t") is None and await cl.store.get("t") is None
        assert cl.nsqd.made("delete") == {(n[0], p) for p, n in record.placements.items()}
        assert cl.keys("t") == set()

    run(body)


def test_another_lookupds_changes_reach_the_registry() -> None:
    async def body(cl: Cluster) -> None:
        meta = multi(1)
        cl.coord.record_changed("t", TopicRecord(meta, {0: ("a",)}, channels=("c1", "c2")))
        assert {Registration(TOPIC, "t", ""), Registration(CHANNEL, "t", "c1")} <= cl.keys("t")
        cl.coord.record_changed("t", TopicRecord(meta, {0: ("a",)}, channels=("c2",)))
        assert Registration(CHANNEL, "t", "c1") not in cl.keys("t")
        assert Registration(CHANNEL, "t", "c2") in cl.keys("t")
        cl.coord.record_changed("t", None)
        assert cl.coord.record("t") is None and cl.keys("t") == set()

    run(body)
