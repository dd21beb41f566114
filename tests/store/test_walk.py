"""The batch walk (nsqx.store.walk): every read of a segment file meets damage the same
way, by the one corruption policy (the damaged batch becomes a hole, the records around
it are served); and the interface both logs share. No network."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nsqx.nsqd.guid import make_ids
from nsqx.store import MemoryLog, MessageLog, open_log
from nsqx.store.disklog import SEG_HEAD_SIZE, DiskLog
from nsqx.store.log import split_chunks
from nsqx.store.record import batch_head
from nsqx.wire.frames import encode_message_batch

TS = 1_700_000_000_000_000_000


def put(log: MessageLog, bodies: list[bytes], ts: int = TS) -> int:
    ids = make_ids(log.end, len(bodies))
    chunk, stride = encode_message_batch(ts, ids, bodies)
    return log.append(chunk, ids, 0, stride)


def damaged_log(tmp_path: Path) -> tuple[DiskLog, int]:
    """A log of 30 one-record batches in several segments, written by an earlier process,
    with a flipped byte in the second record of its second (sealed) segment: that
    record's sequence."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    for i in range(30):
        put(log, [b"x%03d" % i + b"y" * 60], ts=TS + i)
    seg = log.segments[1]
    assert seg.end_seq - seg.base_seq >= 3 and len(log.segments) > 2
    bad = seg.base_seq + 1
    offset = log.offset_of(bad)
    assert offset is not None
    log.close()
    data = bytearray(Path(seg.path).read_bytes())
    data[offset - seg.base_offset + SEG_HEAD_SIZE + 40] ^= 0xFF  # in the body
    Path(seg.path).write_bytes(bytes(data))
    return DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1), bad


def read_bad(log: DiskLog, bad: int) -> object:
    chunks, _ = log.read(bad, 10)
    return chunks


def frames_bad(log: DiskLog, bad: int) -> object:
    return log.read_frames(bad - 1, 10).count


def batches_bad(log: DiskLog, bad: int) -> object:
    with pytest.raises(ValueError):
        log.read_batches(bad, 1 << 20)
    return None


READERS: dict[str, Callable[[DiskLog, int], object]] = {
    "read": read_bad,
    "read_frames": frames_bad,
    "read_batches": batches_bad,
    "offset_of": lambda log, bad: log.offset_of(bad),
    "batch_start": lambda log, bad: log.batch_start(bad),
    "get": lambda log, bad: log.get(bad),
    "seek_time": lambda log, bad: log.seek_time(TS + bad),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_meets_damage_by_the_one_policy(tmp_path: Path, reader: str) -> None:
    log, bad = damaged_log(tmp_path)
    seg = log.segments[1]
    end_seq = seg.end_seq
    READERS[reader](log, bad)
    # whichever read found it: the damaged batch is a hole (never served), the records
    # after it in its segment are served, the log's end stays, nothing is given twice
    assert seg.end_seq == end_seq and seg.hole_holding(bad) is not None
    assert log.get(bad) is None and log.offset_of(bad) is None
    assert log.read(bad, 10) == ([], [])
    assert log.resume_at(bad) == bad + 1
    chunks, ids = log.read(bad + 1, 1000)
    assert ids == make_ids(bad + 1, len(ids)) and len(split_chunks(chunks)) == len(ids) > 0
    assert log.get(bad - 1) is not None and log.get(bad + 1) is not None
    assert log.seek_time(TS + bad) == bad + 1 and log.seek_time(TS + bad - 1) == bad - 1
    [found] = log.set_aside
    assert (found.first, found.end, found.kind) == (bad, bad + 1, "hole")
    assert (
        Path(found.kept_in).read_bytes() == Path(seg.path).read_bytes()[found.pos :][: found.nbytes]
    )
    assert log.end == 30
    assert put(log, [b"next"]) == 30  # no sequence is given twice
    log.close()
    # the damage stays in the file: a restart finds the same hole, and keeps no new copy
    again = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    assert again.get(bad) is None and again.resume_at(bad) == bad + 1
    assert again.get(bad + 1) is not None and again.end == 31
    assert len(list(tmp_path.glob("*.bad*"))) == 1
    again.close()


def test_frames_that_do_not_tile_their_batch_are_damage(tmp_path: Path) -> None:
    """A record whose crc holds but whose frames' sizes do not add up (written so by a
    buggy writer) is damage to every reader that cuts it, not garbage delivered."""
    log = DiskLog(str(tmp_path), cache_size=1)
    put(log, [b"good"])
    log.close()
    ids = make_ids(1, 2)
    chunk, _ = encode_message_batch(TS, ids, [b"a", b"bb"])
    broken = bytearray(chunk)
    broken[3] += 1  # the first frame claims a byte of the second
    seg = log.segments[0]
    with open(seg.path, "ab") as f:
        f.write(batch_head(bytes(broken), 1, 2, 0) + bytes(broken))
    log = DiskLog(str(tmp_path), cache_size=1)
    assert log.end == 3  # its header and crc are whole: recovery keeps it
    log.cache.trim_to(log.end)  # (read from the file, not the cache)
    assert log.read(1, 10) == ([], [])
    assert log.segments[0].hole_holding(1) is not None  # a hole: never delivered
    assert log.resume_at(1) == 3 and log.get(0) is not None
    assert log.end == 3 and put(log, [b"after"]) == 3
    log.close()


@pytest.mark.parametrize("cut", [5, 7])
def test_a_cut_through_damage(tmp_path: Path, cut: int) -> None:
    """truncate() walks like every read: damage on its way (a header rewritten under
    nsqd) becomes a hole; a cut inside the hole cuts where it starts (nothing of it
    stays in the file), a cut after it keeps the records before and the hole."""
    log = DiskLog(str(tmp_path), cache_size=1)
    for i in range(5):
        put(log, [b"a%d" % i, b"b%d" % i])
    seg = log.segments[0]
    batch = (seg.size - SEG_HEAD_SIZE) // 5  # (five batches of one size)
    third = SEG_HEAD_SIZE + 2 * batch
    with open(seg.path, "r+b") as f:  # the third batch's first sequence, rewritten
        f.seek(third + 8)
        f.write((99).to_bytes(8, "big"))
    if cut == 5:  # inside the hole (sequences 4 and 5)
        assert log.truncate(5) == 4
        assert os.path.getsize(seg.path) == third and seg.holes is None
    else:  # in the batch after it (6 and 7)
        assert log.truncate(7) == 6
        assert os.path.getsize(seg.path) == third + batch
    assert [len(log.read(s, 1)[1]) for s in range(4)] == [1, 1, 1, 1]
    assert put(log, [b"again"]) == log.end - 1
    log.close()
    log = DiskLog(str(tmp_path))
    assert (log.start, log.end) == (0, 5 if cut == 5 else 7)
    assert log.get(4) is None if cut == 7 else log.get(4) is not None
    log.close()


@pytest.mark.parametrize("durable", [True, False])
def test_both_logs_answer_every_operation(tmp_path: Path, durable: bool) -> None:
    """What nsqd asks of any log, on either kind: no caller needs to know which."""
    log = open_log(str(tmp_path / "p0") if durable else None)
    assert isinstance(log, DiskLog if durable else MemoryLog) and log.durable is durable
    first = put(log, [b"one", b"two"])
    put(log, [b"three"], ts=TS + 5)
    found = log.read_frames(first, 10)
    assert (found.first, found.count, list(found.run_timestamps)[-1]) == (0, 3, TS + 5)
    assert b"".join(found.chunks).endswith(b"three")
    assert log.seek_time(TS + 1) == 2
    assert log.resume_at(0) == 0 and log.next_seq == 3 and not log.staged
    log.sync()  # nothing to do in memory
    assert not log.sync_pending and log.sync_error is None
    assert (log.first_id() is not None) is durable  # an id rule only in files
    log.drop_before(3)
    assert log.start == 3 and log.read(0, 10) == ([], [])
    log.close()
    log.destroy()
