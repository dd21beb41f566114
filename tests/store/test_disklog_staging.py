"""DiskLog's group commit: staged batches, one write, one record per run. No network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nsqx.store.disklog as disklog
from nsqx.nsqd.guid import make_ids
from nsqx.store.disklog import DiskLog
from nsqx.store.log import split_chunks
from nsqx.wire.frames import (
    FRAME_DATA_AT,
    ID_AT,
    ID_END,
    decode_message,
    encode_extended_batch,
    encode_message_batch,
    is_extended,
)

TS = 1_700_000_000_000_000_000


def stage(log: DiskLog, bodies: list[bytes], deliver_at: int = 0, kind: int = 0) -> int:
    ids = make_ids(log.next_seq, len(bodies))
    if kind:
        n = len(bodies)
        chunk, stride = encode_extended_batch(TS, ids, bodies, [7] * n, [0] * n, [b""] * n)
    else:
        chunk, stride = encode_message_batch(TS, ids, bodies)
    return log.stage(chunk, ids, deliver_at, stride, kind)


def read_bodies(log: DiskLog) -> list[bytes]:
    chunks, ids = log.read(log.start, 1 << 20)
    frames = split_chunks(chunks)
    assert ids == [f[ID_AT:ID_END] for f in frames]
    return [decode_message(f[FRAME_DATA_AT:]).body for f in frames if not is_extended(f)]


def count_writevs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.writev

    def writev(fd: int, buffers: list[bytes]) -> int:
        calls.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(disklog.os, "writev", writev)
    return calls


def test_staged_batches_are_written_by_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing staged is visible before commit(); commit writes all of it with one
    writev; PUB-sized batches in a row share one record, a DPUB's deliver-at time or
    another kind of frame starts a new one; the offsets stage() gave are the records'."""
    log = DiskLog(str(tmp_path))
    stage(log, [b"first"])
    log.commit()
    writevs = count_writevs(monkeypatch)
    offsets = [
        stage(log, [b"a"]),
        stage(log, [b"bb"]),  # another size: the record keeps frame positions
        stage(log, [b"c1", b"c2", b"c3"]),  # an MPUB
        stage(log, [b"later"], deliver_at=TS + 10**9),  # a DPUB: its own record
        stage(log, [b"traced"], kind=1),  # extended frames: their own record
        stage(log, [b"d"]),
    ]
    assert log.end == 1 and log.next_seq == 9 and log.staged
    assert log.read(1, 100) == ([], [])
    assert log.commit() == 4  # records: a+bb+c*, later, traced, d
    assert writevs == [8]  # one system call: a header and a chunk per record
    assert not log.staged and log.end == 9
    assert read_bodies(log) == [b"first", b"a", b"bb", b"c1", b"c2", b"c3", b"later", b"d"]
    firsts = [1, 2, 3, 6, 7, 8]
    assert [log.offset_of(s) for s in firsts] == offsets
    assert log.deferred_between(0, 9) == [(6, TS + 10**9)]
    log.close()
    # the records are on disk as committed: same sequences, offsets, deferral
    again = DiskLog(str(tmp_path), cache_size=1)
    assert again.end == 9
    assert [again.offset_of(s) for s in firsts] == offsets
    assert again.deferred_between(0, 9) == [(6, TS + 10**9)]
    assert [r[0] for r in again.read_range(0, 100)] == list(range(9))


def test_a_failed_commit_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails leaves no partial record and nothing staged: the sequences are
    given again, and the next commit writes after the last whole record."""
    log = DiskLog(str(tmp_path))
    stage(log, [b"kept"])
    log.commit()
    size = log.segments[-1].size
    real = os.writev

    def torn(fd: int, buffers: list[bytes]) -> int:
        real(fd, [buffers[0][:7]])  # part of a header reaches the file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disklog.os, "writev", torn)
    stage(log, [b"lost1"])
    stage(log, [b"lost2"])
    with pytest.raises(OSError):
        log.commit()
    assert not log.staged and log.end == 1 and log.next_seq == 1
    assert os.path.getsize(log.segments[-1].path) == size
    monkeypatch.setattr(disklog.os, "writev", real)
    assert stage(log, [b"next"]) == log.next_offset
    log.commit()
    log.close()
    assert read_bodies(DiskLog(str(tmp_path))) == [b"kept", b"next"]


def test_a_commit_of_many_records_is_cut_at_iov_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More buffers than the kernel takes in one writev: several calls, one commit."""
    writevs = count_writevs(monkeypatch)
    log = DiskLog(str(tmp_path))
    # alternating deliver-at times: a record each, two buffers each
    for i in range(700):
        stage(log, [b"m%d" % i], deliver_at=TS + i % 2)
    assert log.commit() == 700
    assert writevs == [1024, 376]
    assert read_bodies(log) == [b"m%d" % i for i in range(700)]


def test_append_writes_its_own_record_after_what_is_staged(tmp_path: Path) -> None:
    """append() (a follower's copy of a leader's batch) commits what is staged first and
    stores its batch as one record of its own."""
    log = DiskLog(str(tmp_path))
    stage(log, [b"staged"])
    ids = make_ids(1, 2)
    chunk, stride = encode_message_batch(TS, ids, [b"x", b"y"])
    assert log.append(chunk, ids, 0, stride) == 1
    assert read_bodies(log) == [b"staged", b"x", b"y"]
    assert len(log.cache._batches) == 2


def test_stage_refuses_a_chunk_its_frames_do_not_tile(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path))
    ids = make_ids(0, 2)
    chunk, _ = encode_message_batch(TS, ids, [b"x", b"yy"])
    with pytest.raises(ValueError):
        log.stage(chunk[:-1], ids)
    with pytest.raises(ValueError):
        log.stage(chunk, ids, stride=7)
    assert not log.staged and log.next_seq == 0


def test_big_batches_are_not_merged(tmp_path: Path) -> None:
    """Staged batches merge into one record only while it stays small: bigger ones (an
    MPUB of 200 messages) are written as their own records, without a copy."""
    log = DiskLog(str(tmp_path))
    big = [b"x" * 200] * 200
    stage(log, big)
    stage(log, big)
    stage(log, [b"small"])
    stage(log, [b"small too"])
    assert log.commit() == 3
    assert read_bodies(log) == big + big + [b"small", b"small too"]
