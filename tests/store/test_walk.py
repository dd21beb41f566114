"""The batch walk (nsqx.store.walk): every read of a segment file meets damage the same
way, by the one corruption policy; and the interface both logs share. No network."""

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
    READERS[reader](log, bad)
    # whichever read found it: the segment's readable records end at the damage, the
    # damaged record is never served, the log's end stays, the rest is read past the gap
    assert seg.end_seq == bad
    assert log.get(bad) is None and log.offset_of(bad) is None
    assert log.read(bad, 10) == ([], [])
    after = log.resume_at(bad)
    assert after == log.segments[2].base_seq
    chunks, ids = log.read(after, 1000)
    assert len(split_chunks(chunks)) == len(ids) > 0
    assert log.end == 30
    assert put(log, [b"next"]) == 30  # no sequence is given twice
    log.close()


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
    assert log.segments[0].end_seq == 1  # a gap from there: never delivered
    assert log.end == 3 and put(log, [b"after"]) == 3
    log.close()


def test_a_cut_through_damage_ends_at_the_damage(tmp_path: Path) -> None:
    """truncate() walks like every read: damage on its way (a header rewritten under
    nsqd) ends the records there, and the cut leaves nothing of it in the file."""
    log = DiskLog(str(tmp_path), cache_size=1)
    for i in range(5):
        put(log, [b"a%d" % i, b"b%d" % i])
    seg = log.segments[0]
    batch = (seg.size - SEG_HEAD_SIZE) // 5  # (five batches of one size)
    third = SEG_HEAD_SIZE + 2 * batch
    with open(seg.path, "r+b") as f:  # the third batch's first sequence, rewritten
        f.seek(third + 8)
        f.write((99).to_bytes(8, "big"))
    assert log.truncate(7) == 4
    assert os.path.getsize(seg.path) == third
    assert [len(log.read(s, 1)[1]) for s in range(4)] == [1, 1, 1, 1]
    assert put(log, [b"again"]) == 4
    log.close()
    log = DiskLog(str(tmp_path))
    assert (log.start, log.end) == (0, 5)
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
