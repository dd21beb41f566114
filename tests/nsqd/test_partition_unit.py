"""Partition alone: publishing, the commit barrier, channels' starts, pausing, emptying,
reclaiming, restarts and a follower's copy, on a MemoryLog and a DiskLog in tmp_path,
with a fake of the node it reaches through nsqx.nsqd.host (no sockets, no NSQD)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from fakehost import FakeHost
from nsqx.nsqd.guid import PARTITION_SHIFT
from nsqx.nsqd.partition import Partition
from nsqx.nsqd.topic import Topic
from nsqx.wire.commands import OFFSET_MSGCOUNT, OFFSET_SPECIAL, OFFSET_TIMESTAMP
from nsqx.wire.topic_meta import TopicMeta

KINDS = ["disk", "memory"]


def run(test: Callable[[], Awaitable[None]]) -> None:
    """Channels and commits need a running loop: run ``test`` in one."""
    asyncio.run(test())  # type: ignore[arg-type]


def make(
    tmp_path: Path, kind: str, pid: int = 0, meta: TopicMeta | None = None, **options: Any
) -> tuple[FakeHost, Topic, Partition]:
    """A host, a topic ("t" on disk, "t#ephemeral" in memory) and its partition ``pid``."""
    host = FakeHost(str(tmp_path), **options)
    name = "t" if kind == "disk" else "t#ephemeral"
    topic = Topic(host, name, meta or TopicMeta(partition_num=pid + 1))
    return host, topic, topic.add_partition(pid)


async def turn() -> None:
    """Let the loop iteration end: the host's LoopTurn commits what was staged."""
    await asyncio.sleep(0)


def test_a_durable_publish_is_staged_until_the_iterations_commit(tmp_path: Path) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "disk", pid=2)
        assert part.log.durable
        published = part.publish([b"a", b"bb"])
        told: list[BaseException | None] = []
        part.when_acknowledged(told.append)
        # staged: not in the log, nor visible, nor answered, until the turn ends
        assert (part.log.end, part.visible_end, told) == (0, 0, [])
        assert host.turn.to_commit == [part]
        await turn()
        assert told == [None]
        assert (part.log.end, part.visible_end, part.message_count) == (2, 2, 2)
        # ids: the partition in the high bits, sequence + 1 below (guid.py)
        assert published.first_id == (2 << PARTITION_SHIFT) | 1
        assert (published.seq, published.messages) == (0, 2)
        assert published.offset == part.log.offset_of(0)
        part.close()

    run(main)


def test_a_memory_publish_is_appended_and_answered_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "memory")
        assert not part.log.durable and part.directory is None
        part.publish([b"a", b"b", b"c"])
        told: list[BaseException | None] = []
        part.when_acknowledged(told.append)
        assert told == [None]
        assert (part.log.end, part.visible_end) == (3, 3)
        assert host.turn.to_commit == []

    run(main)


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_channel_gets_what_was_held_later_ones_start_at_the_end(
    tmp_path: Path, kind: str
) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, kind)
        part.publish([b"1", b"2", b"3"])
        await turn()
        assert part.depth == 3  # held for the first channel
        first = part.get_channel("first")
        part.publish([b"4"])
        await turn()
        later = part.get_channel("later")
        assert (first.cursor, later.cursor) == (0, 4)
        made = [(e.kind, e.channel, persist) for e, persist in host.events if e.channel]
        durable = kind == "disk"
        assert made == [("create", "first", durable), ("create", "later", durable)]
        assert first.log is part.log

    run(main)


def test_a_failed_write_fails_its_publishes_and_is_reported_until_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "disk")

        def disk_full(fd: int, buffers: list[bytes]) -> int:
            raise OSError(28, "No space left on device")

        real = os.writev
        monkeypatch.setattr(os, "writev", disk_full)
        part.publish([b"lost"])
        told: list[BaseException | None] = []
        part.when_acknowledged(told.append)
        await turn()
        assert len(told) == 1 and isinstance(told[0], OSError)
        assert (part.log.end, part.message_count, part.message_bytes) == (0, 0, 0)
        assert host.turn.health_error is not None and "t" in host.turn.health_error
        monkeypatch.setattr(os, "writev", real)
        published = part.publish([b"kept"])
        await turn()
        assert host.turn.health_error is None
        assert published.seq == 0  # nothing of the failed group was kept
        assert part.log.end == 1
        part.close()

    run(main)


def test_sync_before_ack_waits_for_the_hosts_barrier(tmp_path: Path) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "disk", sync_before_ack=True)
        part.publish([b"x"])
        told: list[BaseException | None] = []
        part.when_acknowledged(told.append)
        await turn()
        await turn()  # (the barrier's future calls back an iteration later)
        assert told == [None]
        assert host.acknowledged_keys == [{part.key}]
        part.close()

    run(main)


@pytest.mark.parametrize("kind", KINDS)
def test_pausing_freezes_what_channels_see(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        _, _, part = make(tmp_path, kind)
        part.get_channel("c")
        part.publish([b"1"])
        await turn()
        part.pause()
        part.publish([b"2", b"3"])
        await turn()
        assert (part.visible_end, part.depth) == (1, 2)
        part.unpause()
        assert (part.visible_end, part.depth) == (3, 0)

    run(main)


@pytest.mark.parametrize("kind", KINDS)
def test_emptying_without_channels_drops_what_was_held(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        _, _, part = make(tmp_path, kind)
        part.publish([b"1", b"2"])
        part.publish([b"3"])
        await turn()
        part.empty()
        assert part.depth == 0
        assert (part.hold_from, part.log.start, part.log.end) == (3, 3, 3)
        assert part.get_channel("c").cursor == 3

    run(main)


def test_reclaim_unlinks_finished_segments_through_the_host(tmp_path: Path) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "disk", max_bytes_per_file=1024)
        part.get_channel("c")
        for _ in range(20):  # one batch record each, segments of about 1 KiB
            part.publish([b"x" * 200])
            await turn()
        assert part.reclaim() == 0  # the channel has read none of them
        part.delete_channel("c")  # later messages wait for the next first channel
        assert part.hold_from == 20
        freed = part.reclaim()
        assert freed > 0 and host.removed
        assert all(p.endswith((".seg", ".idx")) for p in host.removed)
        assert not any(os.path.exists(p) for p in host.removed)
        assert part.log.start > 0 and part.log.end == 20
        part.close()

    run(main)


def test_an_ephemeral_topic_goes_with_its_last_channel(tmp_path: Path) -> None:
    async def main() -> None:
        host, _, part = make(tmp_path, "memory")
        part.get_channel("a")
        part.get_channel("b")
        part.delete_channel("a")
        assert host.deleted_topics == []
        part.delete_channel("b")
        assert host.deleted_topics == ["t#ephemeral"]
        assert all(not persist for _, persist in host.events)

    run(main)


def test_a_restart_keeps_positions_and_never_gives_an_id_twice(tmp_path: Path) -> None:
    async def main() -> None:
        _, _, part = make(tmp_path, "disk", pid=1)
        part.publish([b"1", b"2", b"3"])
        await turn()
        ch = part.get_channel("c")
        assert ch.cursor == 0
        part.close()
        _, _, again = make(tmp_path, "disk", pid=1)
        assert (again.log.start, again.log.end, again.id_base) == (0, 3, part.id_base)
        assert again.log.first_id() == (0, b"%016x" % ((1 << PARTITION_SHIFT) | 1))
        published = again.publish([b"4"])
        assert published.seq == 3
        assert published.first_id == (1 << PARTITION_SHIFT) | 4
        await turn()
        again.close()

    run(main)


def test_a_crashs_skipped_sequences_are_not_counted_in_depths(tmp_path: Path) -> None:
    """After a crash the log goes on past its sequence lease (no id given twice): the
    sequences it skipped hold no message, so no depth counts them."""

    async def main() -> None:
        _, _, part = make(tmp_path, "disk")
        part.publish([b"1", b"2", b"3"])
        await turn()
        part.get_channel("c")
        part.checkpoint()
        part.log.close(sync=False)  # a crash: the lease is left as it was
        _, _, again = make(tmp_path, "disk")
        skipped = again.log.end - 3
        assert skipped > 0
        ch = again.get_channel("c")
        assert (ch.cursor, ch.depth, ch.reported_depths()) == (0, 3, (3, 0))
        again.publish([b"4"])
        await turn()
        assert ch.depth == 4
        ch.cursor = again.log.end - 1  # (as if past the gap)
        assert ch.depth == 1
        again.close()

    run(main)


@pytest.mark.parametrize("kind", KINDS)
def test_a_follower_stores_its_leaders_batches_at_the_same_offsets(
    tmp_path: Path, kind: str
) -> None:
    async def main() -> None:
        _, _, leader = make(tmp_path / "leader", kind)
        _, _, follower = make(tmp_path / "follower", kind)
        for n in (1, 3, 2):
            leader.publish([b"m%d" % k for k in range(n)])
            await turn()
        follower.append_replicated(leader.log.read_batches(0, 1 << 20))
        assert follower.log.end == leader.log.end == 6
        for seq in range(6):
            assert follower.log.get(seq) == leader.log.get(seq)
            assert follower.log.offset_of(seq) == leader.log.offset_of(seq)
        assert follower.message_count == 6
        # a batch that does not follow the log end is refused, none of it stored
        with pytest.raises(ValueError):
            follower.append_replicated(leader.log.read_batches(1, 1 << 20))
        # cut back (a new leader never had the tail), then start over past it
        follower.truncate(1)
        assert follower.log.end == 1 and follower.visible_end <= 1
        follower.reset(50, leader.log.end_offset + 1000)
        assert (follower.log.start, follower.log.end, follower.id_base) == (50, 50, 50)
        assert follower.hold_from == 50

    run(main)


@pytest.mark.parametrize("kind", KINDS)
def test_positions_name_sequences(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        _, _, part = make(tmp_path, kind)
        part.publish([b"a", b"b", b"c", b"d"])
        await turn()
        assert part.position((OFFSET_MSGCOUNT, 0)) == 0  # (0 and 1 are both the first)
        assert part.position((OFFSET_MSGCOUNT, 3)) == 2
        assert part.position((OFFSET_MSGCOUNT, 99)) == 4
        assert part.position((OFFSET_SPECIAL, -1)) == 4
        assert part.position((OFFSET_TIMESTAMP, 0)) == 0
        with pytest.raises(ValueError):
            part.position((OFFSET_MSGCOUNT, -1))
        with pytest.raises(ValueError):
            part.position((OFFSET_SPECIAL, 7))

    run(main)


class _NoReplicas:
    """A replicated topic's partition, its replication left out: only how its log is
    opened is looked at."""

    def attach(self, part: Partition) -> None:
        return None


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_replicated_partitions_log_ends_at_its_last_whole_record(
    tmp_path: Path, replicas: int
) -> None:
    """After a torn tail, a single node's log skips the sequences the tail may have held
    (no id given twice); a replica's ends at its last whole record, for its leader to
    ship what follows (docs/storage.md)."""

    async def main() -> None:
        host, _, part = make(tmp_path, "disk")
        for n in (2, 3):
            part.publish([b"m%d" % k for k in range(n)])
            await turn()
        part.close()
        seg = os.path.join(part.directory or "", "00000000000000000000.seg")
        with open(seg, "r+b") as f:
            f.truncate(os.path.getsize(seg) - 5)  # the second batch torn
        host = FakeHost(str(tmp_path))
        host.replication = _NoReplicas()  # type: ignore[assignment]
        topic = Topic(host, "t", TopicMeta(partition_num=1, replica=replicas))
        again = topic.add_partition(0)
        if replicas > 1:
            assert again.log.end == 2 and again.log.set_aside[0].kind == "tail"
        else:
            assert again.log.end > 5
        again.close()

    run(main)


def test_answers_past_the_sync_window_wait_for_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--sync-every 100: once 100 written messages wait for an fsync, one starts at once
    (not at the next scan); publishes go on while it runs, and those past 4 windows
    (SYNC_PACE_WINDOWS) are answered when it is done: a power cut loses at most 400
    acknowledged messages (docs/storage.md)."""
    import threading

    import nsqx.store.disklog as disklog
    from nsqx.nsqd.partition import SYNC_PACE_WINDOWS

    from rawnsq import wait_for

    async def main() -> None:
        host, _, part = make(tmp_path, "disk", sync_every=100)
        told: list[BaseException | None] = []
        part.publish([b"first"])  # (its files made, its sequence lease taken)
        part.when_acknowledged(told.append)
        await turn()
        gate = threading.Event()
        real = os.fsync

        def held_fsync(fd: int) -> None:
            gate.wait(30)
            real(fd)

        monkeypatch.setattr(disklog.os, "fsync", held_fsync)
        try:
            cap = 100 * SYNC_PACE_WINDOWS
            for i in range(60):
                part.publish([b"m%d-%d" % (i, k) for k in range(10)])
                part.when_acknowledged(told.append)
                await turn()
            # "first" and 10 a batch unsynced: the 10th batch made 101, an fsync was
            # asked for (held); the batches up to the cap (1 + 390) were answered
            # while it ran, the one that passed it and every later one wait for it
            assert len(told) == 1 + (cap - 1) // 10 and part.log.unsynced == 601
            assert host.syncers[part.key].log is part.log
        finally:
            gate.set()
        await wait_for(lambda: len(told) == 61, what="every answer after the fsyncs")
        assert told == [None] * 61 and part.log.unsynced == 0
        part.close()

    run(main)


def test_a_follower_takes_its_leaders_replay_marks_and_keeps_them(tmp_path: Path) -> None:
    """The marks of dead-letter replays in a replicated dead-letter topic come with the
    leader's CURSORS; nsqd.dat is written when they change, not otherwise."""

    async def main() -> None:
        host, _, part = make(tmp_path, "disk")
        part.apply_cursors({"c": (0, False)}, 0)
        ch = part.channels["c"]
        part.apply_replay_marks({"c": {"t.dead:0": (3, 42)}, "gone": {"t.dead:0": (1, 1)}})
        assert ch.replay_marks == {"t.dead:0": (3, 42)} and host.metadata_writes == 1
        part.apply_replay_marks({"c": {"t.dead:0": (3, 42)}})
        assert host.metadata_writes == 1
        part.apply_replay_marks({"c": {"t.dead:0": (5, 43), "t.dx:1": (2, 7)}})
        assert ch.replay_marks == {"t.dead:0": (5, 43), "t.dx:1": (2, 7)}
        assert host.metadata_writes == 2

    run(main)
