"""DiskLog: segments, recovery, seeks, space. No network."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.nsqd.guid import make_ids, seq_of
from nsqx.store.cursor import CursorState, read_cursor, write_cursor
from nsqx.store.disklog import SEG_HEAD_SIZE, DiskLog
from nsqx.store.log import split_chunks
from nsqx.wire.frames import FRAME_DATA_AT, ID_AT, ID_END, decode_message, encode_message_batch

TS = 1_700_000_000_000_000_000


def put(log: DiskLog, bodies: list[bytes], ts: int = TS, deliver_at: int = 0) -> int:
    ids = make_ids(log.end, len(bodies))
    chunk, stride = encode_message_batch(ts, ids, bodies)
    return log.append(chunk, ids, deliver_at, stride)


def bodies_of(frames: list[bytes]) -> list[bytes]:
    return [decode_message(f[FRAME_DATA_AT:]).body for f in frames]


def read_all(log: DiskLog, start: int = 0) -> list[bytes]:
    out: list[bytes] = []
    seq = max(start, log.start)
    while seq < log.end:
        chunks, ids = log.read(seq, 1000)
        if not ids:
            if log.resume_at(seq) == seq:
                break
            seq = log.resume_at(seq)  # a gap left by damage
            continue
        frames = split_chunks(chunks)
        assert ids == [f[ID_AT:ID_END] for f in frames]
        out += bodies_of(frames)
        seq += len(frames)
    return out


def test_append_read_across_segments_and_restart(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), max_bytes_per_file=4096, cache_size=5)
    expected = []
    for i in range(200):
        batch = [b"m%d-%d" % (i, j) for j in range(i % 4 + 1)]
        put(log, batch)
        expected += batch
    assert len(log.segments) > 5
    assert read_all(log) == expected
    assert log.get(3) is not None and bodies_of([log.get(3)]) == [expected[3]]  # type: ignore[list-item]
    log.close()
    again = DiskLog(str(tmp_path), max_bytes_per_file=4096, cache_size=5)
    assert again.end == len(expected)
    assert read_all(again) == expected
    # the ids are the frames' (put() made them from the sequence)
    _frames, ids = again.read(10, 1)
    assert ids == make_ids(10, 1)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=5), max_size=40))
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]]
) -> None:
    d = tmp_path_factory.mktemp("log")
    log = DiskLog(str(d), max_bytes_per_file=2000, cache_size=3)
    expected = [b for batch in batches for b in batch]
    for batch in batches:
        put(log, batch)
    assert read_all(log) == expected
    log.close()
    assert read_all(DiskLog(str(d), max_bytes_per_file=2000, cache_size=3)) == expected


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path))
    put(log, [b"a", b"b"])
    put(log, [b"c"])
    log.close()
    seg = log.segments[-1].path
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.truncate(size - 3)  # the last record loses its end
    again = DiskLog(str(tmp_path))
    assert read_all(again) == [b"a", b"b"]
    assert again.end >= 3  # "c" (sequence 2) may have been seen: never given again
    assert put(again, [b"d"]) >= 3
    assert read_all(again) == [b"a", b"b", b"d"]


def test_corrupt_record_is_never_delivered(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), cache_size=1)
    put(log, [b"first"])
    put(log, [b"second"])
    put(log, [b"third"])
    log.close()
    seg = log.segments[-1].path
    data = bytearray(Path(seg).read_bytes())
    i = data.index(b"second")
    data[i] ^= 0xFF
    Path(seg).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path), cache_size=1)
    # the corrupt record is set aside (a log line, a .bad copy); the ones after it are
    # served
    assert read_all(again) == [b"first", b"third"]
    assert [(d.first, d.end, d.kind) for d in again.set_aside] == [(1, 2, "hole")]


def test_corrupt_sealed_segment_found_at_read(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    for i in range(20):
        put(log, [b"x%03d" % i + b"y" * 100])
    first = log.segments[0]
    assert first.sealed
    log.close()
    # a sealed segment is not re-read at start (its index is used); damage found at read
    data = bytearray(Path(first.path).read_bytes())
    data[SEG_HEAD_SIZE + 40] ^= 0xFF
    Path(first.path).write_bytes(bytes(data))
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    got = read_all(log)
    assert all(b.startswith(b"x") and b.endswith(b"y" * 100) for b in got)
    assert b"x000" + b"y" * 100 not in got


def test_bad_segment_header_set_aside(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path))
    put(log, [b"a"])
    log.close()
    Path(tmp_path, "00000000000000000099.seg").write_bytes(b"garbage")
    again = DiskLog(str(tmp_path))
    assert read_all(again) == [b"a"]
    assert Path(tmp_path, "00000000000000000099.seg.bad").exists()


def test_seek_by_offset_count_and_time(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), max_bytes_per_file=1000, cache_size=2)
    for i in range(30):
        put(log, [b"m%02d" % i], ts=TS + i * 1000)
    offsets = []
    for seq in range(30):
        loc = log.locate(seq)
        assert loc is not None
        offsets.append(loc[0])
        assert loc[1] == TS + seq * 1000
    assert offsets == sorted(offsets) and len(set(offsets)) == 30
    for seq in (0, 7, 29):
        assert log.seek_offset(offsets[seq]) == seq
        assert log.seek_offset(offsets[seq] - 1) == seq
        assert log.seek_time(TS + seq * 1000) == seq
        assert log.seek_time(TS + seq * 1000 - 1) == seq
    assert log.seek_time(TS + 10**9) == log.end
    assert log.seek_offset(log.end_offset) == log.end


def test_an_offset_inside_a_message_seeks_to_the_next_one(tmp_path: Path) -> None:
    """Within a batch, at its last message (the next batch's first answers), and at the
    last message of a segment (the next segment's first)."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=2)
    for i in range(12):
        put(log, [b"b%02d-%d" % (i, k) for k in range(3)], ts=TS + i)
    assert len(log.segments) > 2
    for seq in range(log.end - 1):
        loc = log.locate(seq)
        assert loc is not None
        assert log.seek_offset(loc[0] + 1) == seq + 1, seq
    last = log.locate(log.end - 1)
    assert last is not None and log.seek_offset(last[0] + 1) == log.end


def test_reclaim_and_drop(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), max_bytes_per_file=1000, cache_size=2)
    for _ in range(50):
        put(log, [b"x" * 100])
    n = len(log.segments)
    assert log.reclaim(0) == 0
    freed = log.reclaim(25)
    assert freed > 0 and len(log.segments) < n
    assert log.start <= 25
    assert read_all(log, 25) == [b"x" * 100] * 25
    log.drop_before(log.end)
    assert log.start == log.end == 50
    put(log, [b"after"])
    assert read_all(log) == [b"after"]


def test_first_id_is_the_oldest_records(tmp_path: Path) -> None:
    """The sequence and id of the oldest record (nsqd reads its id rule from it), past
    reclaimed segments, and None in a log without records."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=300, cache_size=2)
    assert log.first_id() is None
    for _ in range(20):
        put(log, [b"x" * 40, b"y"])
    assert log.first_id() == (0, make_ids(0, 1)[0])
    log.reclaim(10)
    assert log.start > 0 and log.first_id() == (log.start, make_ids(log.start, 1)[0])
    log.close()
    again = DiskLog(str(tmp_path), max_bytes_per_file=300, cache_size=2)
    assert again.first_id() == (again.start, make_ids(again.start, 1)[0])
    again.drop_before(again.end)
    assert again.first_id() is None


def test_deferred_records_survive_restart(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path), max_bytes_per_file=500)
    put(log, [b"now"])
    put(log, [b"later"], deliver_at=TS + 5)
    for _ in range(10):
        put(log, [b"z" * 50])
    assert log.deferred_between(0, 100) == [(1, TS + 5)]
    log.close()
    again = DiskLog(str(tmp_path), max_bytes_per_file=500)
    assert again.deferred_between(0, 100) == [(1, TS + 5)]


def test_cursor_file_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "c.cursor")
    assert read_cursor(path) is None
    state = CursorState(5, 10)
    state.pending.extend((6, 2, 0, 8, 1, TS))
    write_cursor(path, state)
    back = read_cursor(path)
    assert back is not None
    assert (back.confirmed, back.cursor, back.entries()) == (5, 10, [(6, 2, 0), (8, 1, TS)])
    Path(path).write_bytes(Path(path).read_bytes()[:-1])
    with pytest.raises(ValueError):
        read_cursor(path)


def reference_range(
    log: DiskLog, start: int, limit: int, max_bytes: int
) -> list[tuple[int, int, bytes]]:
    """What a range read must return, record by record through get() and locate():
    records while fewer than ``limit`` and fewer than ``max_bytes`` are taken."""
    out: list[tuple[int, int, bytes]] = []
    taken = 0
    seq = max(start, log.start)
    while seq < log.end and len(out) < limit and taken < max_bytes:
        frame, at = log.get(seq), log.locate(seq)
        assert frame is not None and at is not None
        out.append((seq, at[0], frame))
        taken += len(frame)
        seq += 1
    return out


def test_read_range_is_stateless_and_bounded(tmp_path: Path) -> None:
    from nsqx.wire.range import decode_range, encode_range

    log = DiskLog(str(tmp_path), max_bytes_per_file=3000, cache_size=5)
    for i in range(40):
        put(log, [b"r%02d-%d" % (i, k) for k in range(3)], ts=TS + i)
    recs = log.read_range(0, 1000)
    assert [r[0] for r in recs] == list(range(120))
    assert [bodies_of([r[2]])[0] for r in recs[:4]] == [b"r00-0", b"r00-1", b"r00-2", b"r01-0"]
    for seq, offset, _frame in recs[::17]:
        assert log.locate(seq) is not None and log.locate(seq)[0] == offset  # type: ignore[index]
        assert log.seek_offset(offset) == seq
    assert [r[0] for r in log.read_range(10, 5)] == list(range(10, 15))
    assert [r[0] for r in log.read_range(10, 100, end=13)] == [10, 11, 12]
    one = log.read_range(10, 100, max_bytes=1)
    assert [r[0] for r in one] == [10]
    # 39-byte frames: a 40-byte budget is not reached by one, so a second is taken
    two = log.read_range(9, 100, max_bytes=40)
    assert [r[0] for r in two] == [9, 10] and two == reference_range(log, 9, 100, 40)
    assert log.read_range(120, 10) == []
    body = encode_range(log.end, log.end_offset, 10, log.read_range(10, 5))
    res = decode_range(body)
    assert res.end_sequence == 120 and res.next_sequence == 15
    assert [r.body for r in res.records] == [b"r03-1", b"r03-2", b"r04-0", b"r04-1", b"r04-2"]
    assert res.records[0].timestamp == TS + 3 and res.records[0].id == make_ids(10, 1)[0]


def test_failed_write_leaves_no_partial_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nsqx.store.disklog as disklog

    log = DiskLog(str(tmp_path))
    put(log, [b"before"])
    real_writev = os.writev

    def half_write(fd: int, buffers: list[bytes]) -> int:
        data = b"".join(buffers)
        return real_writev(fd, [data[: len(data) // 2]])  # e.g. the disk filled up

    monkeypatch.setattr(disklog.os, "writev", half_write)
    with pytest.raises(OSError, match="short write"):
        put(log, [b"lost" * 10])
    monkeypatch.setattr(disklog.os, "writev", real_writev)
    put(log, [b"after"])
    assert read_all(log) == [b"before", b"after"]
    log.close()
    assert read_all(DiskLog(str(tmp_path))) == [b"before", b"after"]


def _open_files() -> set[str]:
    files = set()
    for n in os.listdir("/proc/self/fd"):
        try:
            files.add(os.readlink(f"/proc/self/fd/{n}"))
        except FileNotFoundError:  # listdir's own fd
            pass
    return files


def test_roll_leaves_fsyncs_to_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll does no fsync on the appending thread; the next sync() fsyncs the sealed
    segments (then closes them), the directory and the active segment."""
    import nsqx.store.disklog as disklog

    log = DiskLog(str(tmp_path), max_bytes_per_file=2048)
    put(log, [b"first"])  # (the first commit takes the sequence lease: nsqx.store.lease)
    synced: list[str] = []
    monkeypatch.setattr(
        disklog.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    )
    for i in range(40):
        put(log, [b"x" * 100, b"y%d" % i])
    sealed = [s.path for s in log.segments if s.sealed]
    assert len(sealed) >= 3 and log.sync_pending
    assert synced == []  # nothing on the appending thread
    log.sync()
    assert set(sealed) <= set(synced) and not log.sync_pending
    assert str(tmp_path) in synced and log.segments[-1].path in synced
    assert not set(sealed) & _open_files()  # closed once synced
    synced.clear()
    log.sync()
    assert synced == [log.segments[-1].path]  # each sealed segment once
    log.close()
    assert read_all(DiskLog(str(tmp_path), max_bytes_per_file=2048)) == [b"first"] + [
        b for i in range(40) for b in (b"x" * 100, b"y%d" % i)
    ]


def test_a_failed_fsync_is_never_forgotten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed fsync the kernel may have dropped the pages, and a later fsync
    would succeed without them: every later sync fails too, close() still closes."""
    import nsqx.store.disklog as disklog

    log = DiskLog(str(tmp_path), max_bytes_per_file=2048)
    for i in range(20):
        put(log, [b"x" * 100, b"y%d" % i])
    sealed = [s.path for s in log.segments if s.sealed]

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(disklog.os, "fsync", failing)
    with pytest.raises(OSError):
        log.sync()
    monkeypatch.undo()  # the device "works" again
    with pytest.raises(OSError, match="Input/output"):
        log.sync()
    assert log.sync_error is not None
    with pytest.raises(OSError):
        log.close()
    assert not set(sealed) & _open_files()


def test_deleted_segments_waiting_for_fsync_are_closed(tmp_path: Path) -> None:
    """Emptying a topic deletes its segments at once; one only sealed by that roll
    must not stay open (its disk space would not come back)."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=1 << 20)
    for i in range(20):
        put(log, [b"x" * 100, b"y%d" % i])
    log.sync()
    path = log.segments[-1].path
    log.drop_before(log.end)
    assert not os.path.exists(path)
    assert path not in _open_files() and path + " (deleted)" not in _open_files()
    log.close()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=6),
        min_size=1,
        max_size=25,
    ),
    st.integers(0, 60),
    st.integers(1, 80),
    st.integers(1, 3000),
)
def test_read_frames_matches_read_range(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[bytes]],
    start: int,
    limit: int,
    max_bytes: int,
) -> None:
    from nsqx.wire.range import decode_range, encode_range, encode_range_frames

    log = DiskLog(str(tmp_path_factory.mktemp("cols")), max_bytes_per_file=700, cache_size=2)
    for i, batch in enumerate(batches):
        put(log, batch if i % 2 else [b.ljust(60, b"=") for b in batch], ts=TS + i)
    recs = log.read_range(start, limit, max_bytes)
    assert recs == reference_range(log, start, limit, max_bytes)
    found = log.read_frames(start, limit, max_bytes)
    a = decode_range(encode_range(log.end, log.end_offset, max(start, log.start), recs))
    b = decode_range(
        encode_range_frames(
            log.end,
            log.end_offset,
            max(start, log.start),
            found.run_lengths,
            found.run_timestamps,
            found.run_offsets,
            found.sizes,
            found.chunks,
        )
    )
    assert a == b
    assert len(found.sizes) == found.count == sum(found.run_lengths)


def test_a_chunk_that_does_not_match_its_ids_is_refused_before_writing(tmp_path: Path) -> None:
    log = DiskLog(str(tmp_path))
    put(log, [b"before"])
    size = log.segments[-1].size
    ids = make_ids(log.end, 2)
    chunk, _ = encode_message_batch(TS, ids, [b"a", b"bb"])
    with pytest.raises(ValueError):
        log.append(chunk[:-1], ids)  # frames do not tile the chunk
    with pytest.raises(ValueError):
        log.append(chunk, ids, 0, 7)  # a stride that does not fit
    assert log.segments[-1].size == size and log.end == 1
    put(log, [b"after"])
    assert read_all(log) == [b"before", b"after"]


# -- the corruption policy (docs/reliability.md): never a sequence given twice ----------


def read_across_gaps(log: DiskLog) -> list[tuple[int, bytes]]:
    """(sequence, body) of every readable record, as a channel reads: where there is no
    record (sequences skipped after damage), go on at ``resume_at``."""
    out: list[tuple[int, bytes]] = []
    seq = log.start
    while seq < log.end:
        chunks, ids = log.read(seq, 1000)
        if not ids:
            nxt = log.resume_at(seq)
            assert nxt > seq, "a gap must lead somewhere"
            seq = nxt
            continue
        assert ids == make_ids(seq, len(ids))  # records are consecutive from the asked sequence
        for frame, mid in zip(split_chunks(chunks), ids, strict=True):
            out.append((seq_of(mid), bodies_of([frame])[0]))
        seq += len(ids)
    return out


def test_damage_found_while_reading_never_moves_the_end_back(tmp_path: Path) -> None:
    """The file of the segment being written is damaged under nsqd (found when a
    consumer behind the cache reads it): the log's end stays, later appends get new
    sequences, and each sequence reads back as the record appended with it."""
    log = DiskLog(str(tmp_path), cache_size=1)
    for i in range(6):
        put(log, [b"a%d" % i, b"bb%d" % i])  # frames of unequal size: cut by their prefixes
    end = log.end
    seg = log.segments[-1].path
    data = bytearray(Path(seg).read_bytes())
    i = data.index(b"a3")
    data[i - 34 + 3] ^= 0x7F  # the size prefix of the 4th batch's first frame
    with open(seg, "r+b") as f:
        f.write(bytes(data))
    got = read_across_gaps(log)
    assert [b for _, b in got][:6] == [b"a0", b"bb0", b"a1", b"bb1", b"a2", b"bb2"]
    assert log.end == end
    first_new = put(log, [b"new1"])
    put(log, [b"new2", b"new3"])
    assert first_new == end
    assert log.get(end) is not None and bodies_of([log.get(end)]) == [b"new1"]  # type: ignore[list-item]
    seqs = [s for s, _ in read_across_gaps(log)]
    assert len(seqs) == len(set(seqs))
    log.close()
    again = DiskLog(str(tmp_path), cache_size=1)
    after = read_across_gaps(again)
    assert [s for s, _ in after] == sorted({s for s, _ in after})
    assert after[-3:] == [(end, b"new1"), (end + 1, b"new2"), (end + 2, b"new3")]
    assert put(again, [b"later"]) == end + 3


@pytest.mark.parametrize("damage", ["torn", "garbage"])
def test_torn_newest_segment_at_start_skips_its_sequences(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A power loss leaves the newest segment torn: its tail is set aside (a .bad file,
    a log line), every whole record before it is served, and the sequences the tail
    may have held are never given again (consumers may have seen them)."""
    caplog.set_level(logging.WARNING, logger="nsqx.store")
    log = DiskLog(str(tmp_path))
    for i in range(10):
        put(log, [b"m%d" % i])
    log.close()
    seg = log.segments[-1].path
    data = bytearray(Path(seg).read_bytes())
    pos = data.index(b"m7") - 34 - 30  # the 8th record's batch header
    if damage == "torn":
        data = data[: pos + 40]
    else:
        data[pos:] = os.urandom(len(data) - pos) + b"\0" * 500
    Path(seg).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path))
    assert any("setting aside" in r.getMessage() for r in caplog.records)
    assert list(tmp_path.glob("*.bad"))
    got = read_across_gaps(again)
    assert [b for _, b in got] == [b"m%d" % i for i in range(7)]
    # the sequences of the records whose bytes were set aside may have been seen: never
    # given again (a torn file holds 7 in part, and 8 and 9 not at all: they are lost)
    seen = 8 if damage == "torn" else 10
    [tail] = again.set_aside
    assert (tail.first, tail.kind) == (7, "tail") and tail.end >= seen
    assert again.end >= seen
    new = put(again, [b"after"])
    assert new >= seen
    assert read_across_gaps(again)[-1] == (new, b"after")
    again.close()
    third = DiskLog(str(tmp_path))
    assert [b for _, b in read_across_gaps(third)] == [b"m%d" % i for i in range(7)] + [b"after"]
    assert put(third, [b"more"]) == new + 1


def test_damaged_sealed_segment_at_start_is_set_aside_and_the_rest_served(tmp_path: Path) -> None:
    """A sealed segment without its index is scanned at start: damage in its middle
    costs the record it hit; the rest is served, nothing is renumbered."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    for i in range(30):
        put(log, [b"x%03d" % i + b"y" * 60])
    log.close()
    second = log.segments[1]
    os.remove(second.idx_path)
    data = bytearray(Path(second.path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(second.path).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    got = read_across_gaps(again)
    seqs = [s for s, _ in got]
    assert all(b == b"x%03d" % s + b"y" * 60 for s, b in got)  # each at its own sequence
    lost = set(range(30)) - set(seqs)
    assert len(lost) == 1 and all(second.base_seq <= s < second.end_seq for s in lost)
    assert seqs[-1] == 29 and put(again, [b"next"]) == 30
    assert list(tmp_path.glob(f"{Path(second.path).name}.*.bad"))


def test_damage_in_a_sealed_segment_found_by_range_reads_and_seeks(tmp_path: Path) -> None:
    """Range reads (Spark), offset and time seeks meet the damage as delivery does:
    no exception, no garbage, the records after the gap are served."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    for i in range(30):
        put(log, [b"x%03d" % i + b"y" * 60], ts=TS + i)
    offsets = {s: log.locate(s) for s in range(30)}
    log.close()
    first = log.segments[0]
    data = bytearray(Path(first.path).read_bytes())
    data[-10] ^= 0xFF  # the last record of the first (sealed, indexed) segment
    Path(first.path).write_bytes(bytes(data))
    log = DiskLog(str(tmp_path), max_bytes_per_file=600, cache_size=1)
    recs = log.read_range(0, 1000)
    assert [r[0] for r in recs] == list(range(first.end_seq - 1))  # stops at the gap
    after = log.read_range(first.end_seq - 1, 1000)
    assert [r[0] for r in after] == list(range(first.end_seq, 30))
    assert log.locate(first.end_seq - 1) is None
    assert log.seek_time(TS + first.end_seq - 1) == first.end_seq
    loc = offsets[first.end_seq]
    assert loc is not None and log.seek_offset(loc[0]) == first.end_seq
    assert log.get(first.end_seq - 1) is None and log.resume_at(first.end_seq - 1) == first.end_seq
    assert put(log, [b"next"]) == 30


def test_a_damaged_segment_header_is_rewritten_and_nothing_lost(tmp_path: Path) -> None:
    """A segment's header (magic, first sequence, first offset) garbled: its name and
    its neighbours say what it was; the old bytes are kept; every record is served at
    its own offset."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600)
    for i in range(20):
        put(log, [b"x%03d" % i + b"y" * 60])
    put(log, [b"last"])
    offsets = [log.offset_of(s) for s in range(21)]
    log.close()
    newest = log.segments[-1]
    assert newest.end_seq > newest.base_seq
    head = Path(newest.path).read_bytes()[:SEG_HEAD_SIZE]
    data = bytearray(Path(newest.path).read_bytes())
    data[:SEG_HEAD_SIZE] = b"garbage!" + bytes(16)
    Path(newest.path).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path), max_bytes_per_file=600)
    assert [s for s, _ in read_across_gaps(again)] == list(range(21))
    assert [again.offset_of(s) for s in range(21)] == offsets
    assert put(again, [b"next"]) == 21
    assert Path(newest.path).read_bytes()[:SEG_HEAD_SIZE] == head  # rewritten on disk
    assert Path(newest.path + ".0.bad").read_bytes() == b"garbage!" + bytes(16)
    assert [d.kind for d in again.set_aside] == ["header"]


def test_a_newest_segment_too_short_for_a_header_is_set_aside_and_skipped(
    tmp_path: Path,
) -> None:
    """A power loss right after a roll may leave the new segment shorter than its
    header: it is set aside whole, and the sequences its name says it started at are
    not given again on a single node."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=600)
    for i in range(20):
        put(log, [b"x%03d" % i + b"y" * 60])
    log.close()
    newest = log.segments[-1]
    Path(newest.path).write_bytes(b"NSQX")
    again = DiskLog(str(tmp_path), max_bytes_per_file=600)
    assert [s for s, _ in read_across_gaps(again)] == list(range(newest.base_seq))
    assert put(again, [b"next"]) >= newest.base_seq
    assert Path(newest.path + ".bad").exists()
    assert [d.kind for d in again.set_aside] == ["file"]


@settings(max_examples=int(os.environ.get("NSQX_DAMAGE_EXAMPLES", "40")), deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=30),
    st.sampled_from(["flip", "truncate", "zeros"]),
    st.floats(0, 1),
    st.booleans(),
)
def test_any_damage_never_reuses_a_sequence(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[int],
    kind: str,
    where: float,
    keep_index: bool,
) -> None:
    """Whatever byte of whichever segment is damaged (flipped, cut off, zeroed from
    there on, as a power loss may leave it), a restart serves only records at their
    own sequence, and the next append gets a sequence no record ever had in the file."""
    d = tmp_path_factory.mktemp("damage")
    log = DiskLog(str(d), max_bytes_per_file=400, cache_size=2)
    n = 0
    for k in batches:
        put(log, [b"s%d" % (n + j) for j in range(k)])
        n += k
    original = {s.path: Path(s.path).read_bytes() for s in log.segments}
    log.close()
    segs = [s for s in log.segments if s.size > SEG_HEAD_SIZE]
    seg = segs[int(where * (len(segs) - 1))]
    if not keep_index and os.path.exists(seg.idx_path):
        os.remove(seg.idx_path)
    data = bytearray(Path(seg.path).read_bytes())
    at = SEG_HEAD_SIZE + int(where * (len(data) - SEG_HEAD_SIZE - 1))
    # sequences whose bytes are still in the file after the damage
    surviving = n
    if kind == "flip":
        data[at] ^= 0x55
    else:
        if kind == "truncate":
            del data[at:]
        else:
            data[at:] = bytes(len(data) - at)
        if seg is segs[-1]:
            surviving = _records_starting_before(original[seg.path], seg.base_seq, at)
    Path(seg.path).write_bytes(bytes(data))
    again = DiskLog(str(d), max_bytes_per_file=400, cache_size=2)
    got = read_across_gaps(again)
    assert all(b == b"s%d" % s for s, b in got)
    assert [s for s, _ in got] == sorted({s for s, _ in got})
    new = put(again, [b"new"])
    assert new >= surviving
    assert read_across_gaps(again)[-1] == (new, b"new")
    again.close()
    assert read_across_gaps(DiskLog(str(d), max_bytes_per_file=400))[-1] == (new, b"new")


def _records_starting_before(data: bytes | bytearray, first: int, at: int) -> int:
    """The sequence after the records a damaged segment still shows a trace of: those of
    batches whose header is whole before ``at``, and one for a batch whose header is
    cut (its count is gone)."""
    import struct

    pos, seq = SEG_HEAD_SIZE, first
    while pos < at:
        if pos + 30 > at:
            return seq + 1
        plen, _crc, _first, count = struct.unpack_from(">IIQI", data, pos)
        seq += count
        pos += 30 + plen
    return seq


def test_a_partial_write_that_cannot_be_cut_is_cut_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write (disk full) whose truncation fails too (the disk refuses that as
    well) must not leave the next record behind garbage: it is cut before the next
    write, or the next write fails."""
    import nsqx.store.disklog as disklog

    log = DiskLog(str(tmp_path))
    put(log, [b"before"])
    real_writev, real_ftruncate = os.writev, os.ftruncate

    def half_write(fd: int, buffers: list[bytes]) -> int:
        data = b"".join(buffers)
        return real_writev(fd, [data[: len(data) // 2]])

    def refuse(fd: int, size: int) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(disklog.os, "writev", half_write)
    monkeypatch.setattr(disklog.os, "ftruncate", refuse)
    with pytest.raises(OSError, match="short write"):
        put(log, [b"lost" * 10])
    monkeypatch.setattr(disklog.os, "writev", real_writev)
    with pytest.raises(OSError, match="Read-only"):
        put(log, [b"refused"])  # the garbage cannot be cut yet: nothing is written
    monkeypatch.setattr(disklog.os, "ftruncate", real_ftruncate)
    put(log, [b"after"])
    assert read_all(log) == [b"before", b"after"]
    log.close()
    assert read_all(DiskLog(str(tmp_path))) == [b"before", b"after"]


def test_a_roll_that_fails_does_not_fail_the_append_that_was_written(tmp_path: Path) -> None:
    """The batch is in the file when the roll to a new segment fails (the directory
    refuses new files): the append succeeds, the segment grows, a later roll works."""
    import nsqx.store.disklog as disklog

    log = DiskLog(str(tmp_path), max_bytes_per_file=300, cache_size=1)
    # a directory where each next segment would go: creating the file fails for real
    # (patching DiskLog would not reach its compiled build, see setup.py)
    blockers = [tmp_path / disklog.segment_name(seq) for seq in range(1, 11)]
    for path in blockers:
        path.mkdir()
    for i in range(10):
        assert put(log, [b"x%02d" % i + b"y" * 40]) == i  # each one acknowledged
    assert len(log.segments) == 1 and log.segments[0].size > 300
    for path in blockers:
        path.rmdir()
    put(log, [b"z"])
    assert len(log.segments) == 2 and not log.segments[1].sealed and log.segments[0].sealed
    assert len(read_all(log)) == 11
    log.close()
    assert len(read_all(DiskLog(str(tmp_path), max_bytes_per_file=300))) == 11
