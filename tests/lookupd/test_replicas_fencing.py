"""Replicas' fencing decisions without sockets: a fake coordinator (the interface
Replicas uses) and fake nodes. When a node may be judged, when a successor is confirmed,
and what a failed move leaves behind."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from nsqx.lookupd.liveness import Timing
from nsqx.lookupd.nsqd_client import NsqdCallError
from nsqx.lookupd.registration_db import Peer
from nsqx.lookupd.replicas import Replicas
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.lookupd import PeerInfo
from nsqx.wire.topic_meta import TopicMeta


def peer(name: str) -> Peer:
    info = PeerInfo("127.0.0.1", 4150, 4151, "1.3.0-nsqx", name, name, liveness="heartbeat")
    return Peer(f"{name}-conn", info, 0)


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.unreachable: set[str] = set()
        self.ends: dict[str, int] = {}

    async def fence(self, node: PeerInfo, topic: str, pid: int, epoch: int) -> None:
        self.calls.append(("fence", node.distributed_id))
        if node.distributed_id in self.unreachable:
            raise NsqdCallError("unreachable")

    async def send_role(self, node: PeerInfo, topic: str, pid: int, role: Any) -> None:
        self.calls.append(("role", node.distributed_id))
        if node.distributed_id in self.unreachable:
            raise NsqdCallError("unreachable")

    async def partition_state(self, node: PeerInfo, topic: str, pid: int) -> dict[str, Any]:
        return {"end": self.ends.get(node.distributed_id, 0)}


class FakeSessions:
    def holders(self, node_id: str) -> list[str]:
        return []


class FakeCoordinator:
    """What Replicas uses of the Coordinator."""

    def __init__(self, nodes: list[str]) -> None:
        self.timing = Timing(2.0)
        self.records: dict[str, TopicRecord] = {}
        self.connected = {n: peer(n) for n in nodes}
        self.client = FakeClient()
        self.sessions = FakeSessions()
        self.leading = True
        self.admin_lock = asyncio.Lock()
        self.saves = 0
        self.fail_save = False

    def nodes(self) -> dict[str, Peer]:
        return dict(self.connected)

    def alive(self, node_id: str) -> bool:
        return node_id in self.connected

    def may_decide(self) -> bool:
        return self.leading

    async def save(self, topic: str, record: TopicRecord) -> None:
        if self.fail_save:
            raise RuntimeError("etcd said no")
        self.saves += 1
        self.records[topic] = record

    def load(self) -> Counter[str]:
        return Counter()

    def holds(self, p: Peer, topic: str, pid: int) -> bool:
        return True

    def ask_to_create(self, p: Peer, topic: str, pid: int, record: TopicRecord) -> None:
        pass


def setup(nodes: list[str]) -> tuple[FakeCoordinator, Replicas]:
    coord = FakeCoordinator(nodes)
    meta = TopicMeta(partition_num=1, replica=3)
    coord.records["t"] = TopicRecord(meta, {0: tuple(nodes)}).with_first_epochs([0], "placed")
    return coord, Replicas(coord)  # type: ignore[arg-type]


def confirmed(replicas: Replicas, node: str) -> bool:
    roles = replicas.confirm_roles(node)
    assert roles is not None
    return bool(next(r for r in roles if r["topic"] == "t")["confirmed"])


def test_a_moved_leadership_is_confirmed_only_once_the_old_leader_stepped_down() -> None:
    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        coord.client.unreachable.add("a")  # the fence and the role do not reach it
        assert confirmed(replicas, "a")
        assert await replicas.move_leader("t", 0, "b") == "b"
        assert ("fence", "a") in coord.client.calls
        assert not confirmed(replicas, "b")  # a may still hold a lease
        assert not confirmed(replicas, "a")  # a leads no more
        coord.client.unreachable.clear()
        await replicas.tell("t", coord.records["t"], 0)  # (the retell that gets there)
        assert confirmed(replicas, "b")
        await replicas.close()

    asyncio.run(body())


def test_a_dead_former_leader_does_not_hold_its_successor_back() -> None:
    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        del coord.connected["a"]  # gone, and judged already (not being judged)
        await replicas.move_leader("t", 0, "b")
        assert confirmed(replicas, "b")
        await replicas.close()

    asyncio.run(body())


def test_a_move_that_fails_to_save_leaves_the_leader_confirmable() -> None:
    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        coord.fail_save = True
        with pytest.raises(RuntimeError):
            await replicas.move_leader("t", 0, "b")
        assert coord.records["t"].leader(0) == "a"
        assert confirmed(replicas, "a")
        await replicas.close()

    asyncio.run(body())


def test_a_flapping_node_is_judged_after_its_latest_possible_lease() -> None:
    """Two closes of one node: the judgement waits for the later lease's end."""

    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        loop = asyncio.get_running_loop()
        del coord.connected["a"]
        now = loop.time()
        lost: list[float] = []

        async def node_lost(node_id: str) -> None:
            lost.append(loop.time())

        replicas.node_lost = node_lost  # type: ignore[method-assign]
        first = asyncio.ensure_future(replicas._maybe_lost("a", now + 0.05, 0.0))
        await asyncio.sleep(0.01)
        # a second connection of the node closed: its lease may run longer
        await replicas._maybe_lost("a", now + 0.3, 0.0)
        assert "a" in replicas._judging  # (the first call still decides)
        await first
        assert len(lost) == 1 and lost[0] >= now + 0.3
        await replicas.close()

    asyncio.run(body())


def test_a_node_being_judged_gets_no_confirmation() -> None:
    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        replicas._judging.add("a")
        assert replicas.confirm_roles("a") is None
        coord.leading = False  # nor does anyone from an nsqlookupd that does not lead
        replicas._judging.clear()
        assert replicas.confirm_roles("a") is None
        await replicas.close()

    asyncio.run(body())


def test_followers_that_cannot_hear_the_leader_move_it_only_as_a_majority() -> None:
    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        coord.client.ends = {"b": 10, "c": 12}
        epoch = coord.records["t"].epoch_of(0)
        assert await replicas.leader_unreachable("t", 0, "b", epoch) == "OK"
        assert coord.records["t"].leader(0) == "a"  # one of three: no
        assert await replicas.leader_unreachable("t", 0, "c", epoch) == "OK"
        record = coord.records["t"]
        assert record.leader(0) == "c"  # the newest log
        assert record.isr_of(0) == ("c", "b")
        assert "unreachable" in record.history[0][-1].reason
        # a stale report (an older epoch) is refused
        assert (await replicas.leader_unreachable("t", 0, "b", epoch)).startswith("stale")
        await replicas.close()

    asyncio.run(body())


def test_a_join_of_a_node_judged_lost_is_refused_with_a_new_epoch() -> None:
    """A stopped follower's stream stays open at the leader and can look caught up: the
    coordinator refuses its join, and the new epoch tells the leader to stop counting it."""

    async def body() -> None:
        coord, replicas = setup(["a", "b", "c"])
        epoch = coord.records["t"].epoch_of(0)
        assert await replicas.isr_leave("t", 0, "c", epoch) == "OK"
        left = coord.records["t"]
        assert left.isr_of(0) == ("a", "b")
        del coord.connected["c"]  # judged lost
        assert await replicas.isr_join("t", 0, "c", left.epoch_of(0)) == "not alive"
        refused = coord.records["t"]
        assert refused.isr_of(0) == ("a", "b")
        assert refused.epoch_of(0) == left.epoch_of(0) + 1
        assert "not alive" in refused.history[0][-1].reason
        coord.connected["c"] = peer("c")  # back: its join is taken
        assert await replicas.isr_join("t", 0, "c", refused.epoch_of(0)) == "OK"
        assert coord.records["t"].isr_of(0) == ("a", "b", "c")
        await replicas.close()

    asyncio.run(body())
