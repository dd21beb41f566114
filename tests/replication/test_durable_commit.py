"""The commit rule of durable acknowledgement, without the network: a record is
committed once every ISR member holds it (written) and a write quorum of the replicas
(more than half of the replicator, the leader counted) has it fsynced; the waiters are
told in the call that learns of the last fsync or acknowledgement it needed. And the
leader's answer to a HELLO: a follower whose log ends inside one of the leader's
batches is told to cut back to where that batch starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nsqx.nsqd.guid import make_ids
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.replication.leader import LeaderReplication
from nsqx.nsqd.replication.replica import records_end
from nsqx.nsqd.replication.state import ReplicaRole
from nsqx.store.disklog import DiskLog
from nsqx.store.memlog import MemoryLog
from nsqx.wire import replication as rp
from nsqx.wire.frames import encode_message_batch
from nsqx.wire.topic_meta import TopicMeta


class Part:
    def __init__(self, log: Any = None) -> None:
        self.log = log if log is not None else MemoryLog()
        self.committed_to: list[int] = []

    def committed(self, end: int) -> None:
        self.committed_to.append(end)

    def append(self, n: int) -> None:
        ids = make_ids(self.log.end, n, 0)
        chunk, stride = encode_message_batch(1000, ids, [b"m"] * n)
        self.log.append(chunk, ids, 0, stride)

    def low_water(self) -> int:
        return self.log.start


def make_leader(
    replicator: int = 3, durable_ack: bool = True, log: Any = None
) -> tuple[LeaderReplication, Part, list[int]]:
    part = Part(log)
    nodes = ("me", "f1", "f2", "f3", "f4")[:replicator]
    role = ReplicaRole(1, "me", "127.0.0.1:1", nodes, nodes, replicator, ((1, 0),))
    kicks: list[int] = []
    replica: Any = SimpleNamespace(
        part=part,
        role=role,
        node_id="me",
        may_acknowledge=lambda: True,
        durable_ack=durable_ack,
        sync_soon=lambda: kicks.append(part.log.end),
        manager=SimpleNamespace(spawn=lambda coro: coro.close()),
    )
    return LeaderReplication(replica, 0), part, kicks


def test_written_by_the_isr_is_not_enough_a_write_quorum_must_have_it_fsynced() -> None:
    leader, part, kicks = make_leader(3)
    part.append(10)
    leader.appended()
    assert kicks == [10]  # the leader's own fsync starts with the append
    told: list[BaseException | None] = []
    leader.when_committed(10, told.append)
    leader.acked.update(f1=10, f2=10)
    leader.recompute()
    assert leader.commit == 0 and not told  # written everywhere, fsynced nowhere
    leader.durable_advanced(10)
    assert leader.commit == 0 and not told  # the leader alone is 1 of 3
    leader.follower_durable("f2", 7)
    assert leader.commit == 7 and not told  # two of three have 7 on disk
    leader.follower_durable("f1", 10)
    # told in this very call, and shown to channels before the answer
    assert leader.commit == 10 and told == [None]
    assert part.committed_to == [7, 10]


def test_a_quorum_of_followers_commits_without_the_leaders_fsync() -> None:
    leader, part, _ = make_leader(3)
    part.append(4)
    leader.acked.update(f1=4, f2=4)
    leader.follower_durable("f1", 4)
    assert leader.commit == 0
    leader.follower_durable("f2", 4)
    assert leader.commit == 4  # f1 and f2: two of three replicas


def test_the_isr_still_bounds_the_commit_point() -> None:
    leader, part, _ = make_leader(3)
    part.append(6)
    leader.durable_advanced(6)
    leader.follower_durable("f1", 6)
    leader.acked.update(f1=6, f2=2)  # f2 is in the ISR and holds only 2
    leader.recompute()
    assert leader.commit == 2


def test_replicator_2_needs_both_replicas_fsynced() -> None:
    leader, part, _ = make_leader(2)
    part.append(3)
    leader.acked["f1"] = 3
    leader.durable_advanced(3)
    assert leader.commit == 0
    leader.follower_durable("f1", 3)
    assert leader.commit == 3


def test_replicator_5_needs_three() -> None:
    leader, part, _ = make_leader(5)
    part.append(3)
    leader.acked.update(f1=3, f2=3, f3=3, f4=3)
    leader.durable_advanced(3)
    leader.follower_durable("f4", 3)
    assert leader.commit == 0
    leader.follower_durable("f3", 3)
    assert leader.commit == 3


def test_a_follower_of_the_previous_release_counts_its_written_end_as_durable() -> None:
    leader, part, _ = make_leader(3)
    part.append(5)
    leader.legacy.add("f1")  # its stream offered no DURABLE (serve() notes it)
    leader.acked.update(f1=5, f2=5)
    leader.recompute()
    assert leader.commit == 0
    leader.durable_advanced(5)
    assert leader.commit == 5  # the leader's fsync and f1's written end


def test_written_acknowledgement_commits_on_the_isrs_writes_alone() -> None:
    leader, part, kicks = make_leader(3, durable_ack=False)
    part.append(5)
    leader.appended()
    assert kicks == []  # no fsync asked for each append
    leader.acked.update(f1=5, f2=5)
    leader.recompute()
    assert leader.commit == 5


def test_going_back_to_durable_holds_the_commit_point_until_a_quorum_fsynced() -> None:
    leader, part, _ = make_leader(3, durable_ack=False)
    part.append(2)
    leader.acked.update(f1=2, f2=2)
    leader.recompute()
    assert leader.commit == 2
    leader.set_durable_ack(True)
    part.append(3)
    leader.acked.update(f1=5, f2=5)
    leader.recompute()
    assert leader.commit == 2
    leader.durable_advanced(5)
    leader.follower_durable("f2", 5)
    assert leader.commit == 5


def test_a_durable_end_never_goes_back() -> None:
    leader, part, _ = make_leader(3)
    part.append(5)
    leader.follower_durable("f1", 5)
    leader.follower_durable("f1", 3)  # (a late report of an older fsync)
    assert leader.durable["f1"] == 5
    leader.durable_advanced(4)
    leader.durable_advanced(2)
    assert leader.own_durable == 4


def test_hello_inside_a_leader_batch_is_told_to_cut_back_to_the_batch_start(
    tmp_path: Path,
) -> None:
    log = DiskLog(str(tmp_path / "log"))
    leader, part, _ = make_leader(3, log=log)
    part.append(4)  # records 0-3
    part.append(6)  # records 4-9, one stored batch
    part.append(2)  # 10-11
    hello = rp.Hello("t", 0, "f1", 1, 7, 0, [(1, 0)], True)
    welcome = leader.accept(hello)
    assert isinstance(welcome, rp.Welcome)
    assert welcome.truncate_to == 4 and welcome.reset is None and welcome.durable
    # on a batch boundary, or past this log's end: as before
    for end, cut in ((10, 10), (4, 4), (15, 12)):
        hello = rp.Hello("t", 0, "f1", 1, end, 0, [(1, 0)], True)
        answer = leader.accept(hello)
        assert isinstance(answer, rp.Welcome) and answer.truncate_to == cut
    # a follower of the previous release offers no durable end: none asked
    old = leader.accept(rp.Hello("t", 0, "f1", 1, 4, 0, [(1, 0)]))
    assert isinstance(old, rp.Welcome) and not old.durable
    # a log that starts past the cut (a torn segment set aside whole, what it may have
    # held skipped) cannot be cut back there: it starts over where readers need it
    over = leader.accept(rp.Hello("t", 0, "f1", 1, 500, 0, [(1, 0)], True, 500))
    assert isinstance(over, rp.Welcome) and over.reset is not None and over.reset[0] == 0
    log.close()


def test_the_topics_setting_wins_over_the_nodes_flag(tmp_path: Path) -> None:
    async def body() -> None:
        nsqd = NSQD(NsqdOptions(data_path=str(tmp_path), replication_ack="written"))
        plain = nsqd.create_partition("plain", 0, TopicMeta(replica=3))
        durable = nsqd.create_partition("sure", 0, TopicMeta(replica=3, replication_ack="durable"))
        assert plain.replica is not None and durable.replica is not None
        assert not plain.replica.durable_ack and durable.replica.durable_ack
        assert plain.replica.stats()["ack"] == "written"
        await nsqd.close()

    asyncio.run(body())


def test_records_end_leaves_out_what_a_torn_tail_skipped(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path / "log"))
    part = Part(log)
    part.append(5)
    part.append(5)
    assert records_end(log) == 10
    log.close()
    (seg,) = (tmp_path / "log").glob("*.seg")
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x01\x00" + b"\xee" * 300)  # a torn record after the last one
    torn = DiskLog(str(tmp_path / "log"))
    # the store never gives the sequences the torn bytes may have held again: the end
    # moved past them, and no record holds them
    assert torn.end > 10 and records_end(torn) == 10
    torn.close()
    empty = DiskLog(str(tmp_path / "empty"))
    assert records_end(empty) == 0
    empty.close()
