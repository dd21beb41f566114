"""Elections that never pick a replica with less than the committed log: the rule alone
(sans-IO), then the coordinator's decisions on a fake coordinator and fake nodes after a
power cut: a lost leader whose followers restarted is replaced only once enough
replicas answer, a restarted leader leads again only through an election, a move goes
only to a replica that holds every committed record."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_replicas_fencing import FakeCoordinator

from nsqx.lookupd.elections import LogState, choose, last_epoch, log_state, needed
from nsqx.lookupd.replicas import Replicas
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.topic_meta import TopicMeta


def test_the_epoch_of_the_last_record() -> None:
    history = [[1, 0], [4, 100], [7, 250]]
    assert last_epoch(history, 300) == 7
    assert last_epoch(history, 250) == 4  # epoch 7 began at the end: no record of it
    assert last_epoch(history, 90) == 1  # a power cut took epoch 4's records
    assert last_epoch([], 10) == 0
    assert last_epoch(None, 10) == -1 and last_epoch([[1]], 10) == -1
    assert log_state({"end": 5, "history": [[2, 0]], "intact": False}) == LogState(5, 2, False)
    # an nsqd of the previous release: no history, no intact (as its elections assumed)
    assert log_state({"end": 5}) == LogState(5, -1, True)
    # where the records end counts, not sequences a torn tail made the log skip
    torn = {"end": 900, "records_end": 40, "history": [[1, 0], [2, 50]], "intact": False}
    assert log_state(torn) == LogState(40, 1, False)
    assert log_state({"role": "leader"}) is None


def test_how_many_must_answer_without_an_intact_in_sync_replica() -> None:
    assert [needed(r) for r in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]


ABC = ("a", "b", "c")


def test_an_intact_in_sync_replica_is_enough() -> None:
    states = {"b": LogState(100, 3, True)}
    assert choose(states, ABC, ABC, 3) == ("b", ("b",))


def test_restarted_replicas_alone_must_be_enough_to_meet_every_write_quorum() -> None:
    # a power cut of every node: b came back, not intact; one answer of the two needed
    states = {"b": LogState(100, 3, False)}
    assert isinstance(choose(states, ABC, ABC, 3), str)
    states["c"] = LogState(90, 3, False)
    assert choose(states, ABC, ABC, 3) == ("b", ("b",))  # the longer log; no intact ISR
    # with replicator 2 a write quorum is both replicas: either one holds everything
    assert choose({"b": LogState(7, 1, False)}, ("a", "b"), ("a", "b"), 2) == ("b", ("b",))


def test_the_newest_epoch_wins_over_the_longest_log() -> None:
    # c kept a long tail of epoch 3 that the leader of epoch 5 never had
    states = {"b": LogState(80, 5, False), "c": LogState(120, 3, False)}
    assert choose(states, ABC, ABC, 3)[0] == "b"
    # a node of the previous release says no epochs: the longest log, as it elected
    states["a"] = LogState(100, -1, True)
    assert choose(states, ABC, ABC, 3)[0] == "c"


def test_the_new_isr_keeps_only_intact_members() -> None:
    states = {
        "a": LogState(100, 3, True),
        "b": LogState(100, 3, False),
        "c": LogState(100, 3, True),
    }
    assert choose(states, ("a", "b", "c"), ABC, 3) == ("a", ("a", "c"))
    # a replica outside the ISR may lead if its log is the newest (a prefix argument)
    states = {"a": LogState(100, 3, True), "c": LogState(140, 3, False)}
    assert choose(states, ("a", "b"), ABC, 3) == ("c", ("c", "a"))


# -- the coordinator -------------------------------------------------------------------


def cluster(states: dict[str, dict[str, Any]]) -> tuple[FakeCoordinator, Replicas]:
    coord = FakeCoordinator(["a", "b", "c"])
    meta = TopicMeta(partition_num=1, replica=3)
    coord.records["t"] = TopicRecord(meta, {0: ABC}).with_first_epochs([0], "placed")

    async def partition_state(node: Any, topic: str, pid: int) -> dict[str, Any]:
        return states[node.distributed_id]

    coord.client.partition_state = partition_state  # type: ignore[method-assign]
    return coord, Replicas(coord)  # type: ignore[arg-type]


def test_a_lost_leader_is_replaced_only_once_enough_replicas_answer() -> None:
    async def body() -> None:
        states = {"b": {"end": 50, "history": [[1, 0]], "intact": False}}
        coord, replicas = cluster(states)
        replicas.lost_grace = 0.0
        del coord.connected["a"], coord.connected["c"]  # a power cut: only b is back
        await replicas.node_lost("a")
        record = coord.records["t"]
        assert record.leader(0) == "a"  # waits: b may lack what a and c acknowledged
        assert ("t", 0) in replicas._leaderless
        states["c"] = {"end": 60, "history": [[1, 0]], "intact": False}
        coord.connected["c"] = FakeCoordinator(["c"]).connected["c"]
        replicas.peer_arrived(coord.connected["c"])
        await asyncio.wait_for(_until(lambda: coord.records["t"].leader(0) == "c"), 5)
        record = coord.records["t"]
        assert record.isr_of(0) == ("c",) and record.epoch_of(0) == 2
        assert not replicas._leaderless
        await replicas.close()

    asyncio.run(body())


def test_a_lost_leader_with_an_intact_follower_is_replaced_at_once() -> None:
    async def body() -> None:
        states = {
            "b": {"end": 50, "history": [[1, 0]], "intact": True},
            "c": {"end": 70, "history": [[1, 0]], "intact": False},
        }
        coord, replicas = cluster(states)
        del coord.connected["a"]
        await replicas.node_lost("a")
        record = coord.records["t"]
        # c's longer log holds every record b holds; b stays in the ISR, c is not intact
        assert record.leader(0) == "c" and record.isr_of(0) == ("c", "b")
        await replicas.close()

    asyncio.run(body())


def test_a_restarted_leader_leads_again_only_through_an_election() -> None:
    async def body() -> None:
        states = {"a": {"end": 40, "history": [[1, 0]], "intact": False}}
        coord, replicas = cluster(states)
        del coord.connected["b"], coord.connected["c"]
        result, epoch = await replicas.leader_restarted("t", 0, "a")
        assert result != "OK" and coord.records["t"].epoch_of(0) == 1  # asks again later
        states["b"] = {"end": 55, "history": [[1, 0]], "intact": False}
        coord.connected["b"] = FakeCoordinator(["b"]).connected["b"]
        result, epoch = await replicas.leader_restarted("t", 0, "a")
        record = coord.records["t"]
        assert (result, epoch) == ("OK", 2)
        assert record.leader(0) == "b"  # b kept more of what a had acknowledged
        # asked again (a retry): another leads, nothing more to do
        assert await replicas.leader_restarted("t", 0, "a") == ("OK", 2)
        await replicas.close()

    asyncio.run(body())


def test_a_restarted_leader_with_the_newest_log_leads_in_a_new_epoch() -> None:
    async def body() -> None:
        states = {
            "a": {"end": 80, "history": [[1, 0]], "intact": False},
            "b": {"end": 80, "history": [[1, 0]], "intact": True},
            "c": {"end": 75, "history": [[1, 0]], "intact": True},
        }
        coord, replicas = cluster(states)
        assert await replicas.leader_restarted("t", 0, "a") == ("OK", 2)
        record = coord.records["t"]
        # equal logs: the first of the placement; a is not intact, so not in the ISR
        assert record.leader(0) == "b" and record.isr_of(0) == ("b", "c")
        await replicas.close()

    asyncio.run(body())


def test_a_move_goes_only_to_a_replica_that_holds_every_committed_record() -> None:
    async def body() -> None:
        states = {
            "b": {"end": 10, "history": [[1, 0]], "intact": False},
            "c": {"end": 90, "history": [[1, 0]], "intact": True},
        }
        _coord, replicas = cluster(states)
        with pytest.raises(ValueError, match="caught up"):
            await replicas.move_leader("t", 0, "b")
        assert await replicas.move_leader("t", 0) == "c"
        await replicas.close()

    asyncio.run(body())


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.01)
