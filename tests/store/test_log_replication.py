"""What replication needs of a log: whole stored batches out (read_batches), the same
bytes at the same offsets in (append), a cut (truncate) and a fresh start (reset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsqx.nsqd.guid import make_ids
from nsqx.store.disklog import DiskLog
from nsqx.store.log import split_chunks
from nsqx.store.memlog import MemoryLog
from nsqx.wire.frames import encode_message_batch


def fill(log: DiskLog | MemoryLog, batches: int) -> None:
    for i in range(batches):
        n = 1 + i % 3
        ids = make_ids(log.end, n, 0)
        chunk, stride = encode_message_batch(1000 + i, ids, [b"m%03d" % i + b"x" * i] * n)
        log.append(chunk, ids, 5_000 if i % 7 == 3 else 0, stride)


def copy(src: DiskLog | MemoryLog, dst: DiskLog | MemoryLog, max_bytes: int = 300) -> None:
    while dst.end < src.end:
        for b in src.read_batches(dst.end, max_bytes):
            assert (b.first, b.offset) == (dst.end, dst.next_offset)
            # as a follower stores them: no ids given (read from the frames if needed)
            dst.stage(b.chunk, None, b.deliver_at, b.stride, 0, False, b.messages)
            dst.commit()


def same(a: DiskLog | MemoryLog, b: DiskLog | MemoryLog) -> None:
    assert (a.end, a.end_offset) == (b.end, b.end_offset)
    ra = a.read_batches(max(a.start, b.start), 1 << 30)
    rb = b.read_batches(max(a.start, b.start), 1 << 30)
    assert ra == rb
    # the same frames and ids to a consumer, from the cache or the files
    start = max(a.start, b.start)
    assert read_all(a, start) == read_all(b, start)
    assert a.deferred_between(0, a.end) == b.deferred_between(0, b.end)


def read_all(log: DiskLog | MemoryLog, seq: int) -> tuple[list[bytes], list[bytes]]:
    """Every record from ``seq``: frames and ids (a read may stop short of the end)."""
    frames: list[bytes] = []
    ids: list[bytes] = []
    while seq < log.end:
        chunks, got = log.read(seq, 1 << 30)
        assert got
        frames += split_chunks(chunks)
        ids += got
        seq = log.resume_at(seq + len(got))
    return frames, ids


def test_a_copy_holds_the_same_bytes_at_the_same_offsets(tmp_path: Path) -> None:
    leader = DiskLog(str(tmp_path / "a"), max_bytes_per_file=1500, cache_size=4)
    fill(leader, 60)
    follower = DiskLog(str(tmp_path / "b"), max_bytes_per_file=4000, cache_size=4)
    copy(leader, follower)
    same(leader, follower)
    follower.close()
    again = DiskLog(str(tmp_path / "b"), max_bytes_per_file=4000)
    same(leader, again)  # also after a restart (read from the files)


def test_read_batches_starts_at_a_batch(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path / "a"), cache_size=2)
    fill(log, 10)  # batches start at 0, 1, 3, 6, 7, 9, 12, 13, 15, 18; end 19
    with pytest.raises(ValueError, match="inside a batch"):
        log.read_batches(2, 100)  # from the files
    cached = DiskLog(str(tmp_path / "b"))
    fill(cached, 10)
    with pytest.raises(ValueError, match="inside a batch"):
        cached.read_batches(16, 100)  # from the cache
    assert [b.first for b in cached.read_batches(15, 1 << 20)] == [15, 18]
    assert log.read_batches(log.end, 100) == []
    assert [b.first for b in log.read_batches(0, 1)] == [0]  # at least one


@pytest.mark.parametrize("cut", [0, 1, 3, 25, 59, 100])
def test_truncate_then_copy_again(tmp_path: Path, cut: int) -> None:
    leader = DiskLog(str(tmp_path / "a"), max_bytes_per_file=1500, cache_size=4)
    fill(leader, 40)
    follower = DiskLog(str(tmp_path / "b"), max_bytes_per_file=1000, cache_size=4)
    copy(leader, follower)
    fill(follower, 10)  # a tail the leader never had
    end = follower.truncate(min(cut, leader.end))
    # cut at the start of the batch that holds ``cut`` (batches hold 1-3 records)
    assert min(cut, leader.end) - 3 < end <= min(cut, leader.end)
    assert end == leader.end or leader.read_batches(end, 1)[0].first == end
    copy(leader, follower)
    same(leader, follower)
    follower.close()
    same(leader, DiskLog(str(tmp_path / "b"), max_bytes_per_file=1000))


def test_reset_starts_over_where_the_leader_starts(tmp_path: Path) -> None:
    leader = DiskLog(str(tmp_path / "a"), max_bytes_per_file=800, cache_size=4)
    fill(leader, 40)
    leader.reclaim(30)
    assert leader.start > 0
    follower = DiskLog(str(tmp_path / "b"), cache_size=4)
    fill(follower, 3)
    first = leader.read_batches(leader.start, 1)[0]
    follower.reset(leader.start, first.offset)
    assert (follower.start, follower.end, follower.next_offset) == (
        leader.start,
        leader.start,
        first.offset,
    )
    copy(leader, follower)
    same(leader, follower)
    follower.close()
    same(leader, DiskLog(str(tmp_path / "b")))


def test_memory_log_too() -> None:
    a, b = MemoryLog(), MemoryLog()
    fill(a, 20)
    copy(a, b)
    same(a, b)
    b.truncate(7)
    assert b.end == 7
    copy(a, b)
    same(a, b)
    b.reset(100, 5000)
    assert (b.start, b.end, b.next_offset) == (100, 100, 5000)
