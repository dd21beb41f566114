"""The corruption policy bit by bit (docs/reliability.md): a flipped bit anywhere in a
segment file or its index costs at most the batch it hit, at start and under a running
log; a torn tail, cut at any byte, costs only what was not whole; a replica's log
(``skip_lost=False``) ends at its last whole record and converges to its leader's. No
network."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.nsqd.guid import make_ids, seq_of
from nsqx.store.disklog import SEG_HEAD_SIZE, DiskLog
from nsqx.store.fsutil import remove_file
from nsqx.store.log import split_chunks
from nsqx.store.segment import new_segment
from nsqx.wire.frames import FRAME_DATA_AT, decode_message, encode_message_batch

TS = 1_700_000_000_000_000_000
HEAD = struct.Struct(">IIQIqH")
EXAMPLES = int(os.environ.get("NSQX_DAMAGE_EXAMPLES", "40"))


def body(seq: int) -> bytes:
    """Message ``seq``'s body (lengths vary, so frames of a batch differ)."""
    return b"s%d-" % seq + b"p" * (seq * 7 % 40)


def put(log: DiskLog, count: int) -> int:
    first = log.end
    ids = make_ids(first, count)
    chunk, stride = encode_message_batch(TS + first, ids, [body(first + k) for k in range(count)])
    return log.append(chunk, ids, 0, stride)


def layout(path: str) -> list[tuple[int, int, int, int]]:
    """(position, end, first sequence, count) of each batch record in a segment file."""
    data = Path(path).read_bytes()
    out = []
    pos = SEG_HEAD_SIZE
    while pos + HEAD.size <= len(data):
        plen, _crc, first, count, _d, _f = HEAD.unpack_from(data, pos)
        out.append((pos, pos + HEAD.size + plen, first, count))
        pos += HEAD.size + plen
    return out


def served(log: DiskLog) -> list[int]:
    """The sequences a channel reads, each checked to hold its own message: where there
    is no record (a gap, a hole), it goes on at ``resume_at``."""
    out: list[int] = []
    seq = log.start
    while seq < log.end:
        chunks, ids = log.read(seq, 1000)
        if not ids:
            nxt = log.resume_at(seq)
            assert nxt > seq, "a gap must lead somewhere"
            seq = nxt
            continue
        assert ids == make_ids(seq, len(ids))  # consecutive from the sequence asked
        for frame, mid in zip(split_chunks(chunks), ids, strict=True):
            s = seq_of(mid)
            assert decode_message(frame[FRAME_DATA_AT:]).body == body(s), "a garbled body"
            out.append(s)
        seq += len(ids)
    assert out == sorted(set(out))
    return out


def flip(path: str, bit: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    with open(path, "r+b") as f:  # in place: a running log's fds see it
        f.write(bytes(data))


def hit_batch(path: str, byte: int) -> set[int]:
    """The sequences of the batch holding ``byte`` of a segment file (none: its header)."""
    for pos, end, first, count in layout(path):
        if pos <= byte < end:
            return set(range(first, first + count))
    return set()


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=2, max_size=25),
    st.integers(0, 1 << 30),
    st.integers(0, 1 << 30),
    st.sampled_from(["segment", "index", "segment without its index"]),
    st.sampled_from(["start", "running"]),
)
def test_a_flipped_bit_costs_at_most_the_batch_it_hit(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[int],
    which: int,
    bit: int,
    target: str,
    when: str,
) -> None:
    """Whatever bit of whichever segment (its header; a batch's length, crc, sequence,
    count, deliver-at, flags or body) or sealed segment's index is flipped, at start or
    under a running log: every other record is served, each under its own id with its
    own body, and no sequence is given again."""
    d = str(tmp_path_factory.mktemp("flip"))
    log = DiskLog(d, max_bytes_per_file=500, cache_size=1)
    for count in batches:
        put(log, count)
    n = log.end
    segs = [s for s in log.segments if s.size > SEG_HEAD_SIZE]
    seg = segs[which % len(segs)]
    if when == "start":
        log.close()
    lost: set[int] = set()
    if target == "index" and os.path.exists(seg.idx_path):
        path = seg.idx_path  # (only a restart reads an index)
    else:
        path = seg.path
        if target == "segment without its index" and when == "start":
            remove_file(seg.idx_path)
    bit %= os.path.getsize(path) * 8
    if path == seg.path:
        lost = hit_batch(path, bit // 8)
    flip(path, bit)
    if when == "running":
        assert set(range(n)) - set(served(log)) <= lost
        assert put(log, 1) == n  # the end never moves back
        n += 1
        log.close()
    again = DiskLog(d, max_bytes_per_file=500, cache_size=1)
    assert set(range(n)) - set(served(again)) <= lost
    if set(range(n)) - set(served(again)):
        assert again.set_aside  # reported (and logged)
    new = put(again, 1)
    assert new >= n  # no sequence given twice
    again.close()
    third = DiskLog(d, max_bytes_per_file=500, cache_size=1)
    got = served(third)
    assert set(range(n)) - set(got) <= lost and got[-1] == new
    third.close()


@pytest.mark.parametrize("which", ["first", "middle", "newest", "alone"])
def test_every_bit_of_a_segment_header(tmp_path: Path, which: str) -> None:
    """A flipped bit in a segment's header (magic, first sequence, first offset) loses
    nothing: the name gives the sequence, a neighbour the offset (the previous segment's
    end, or the next one's start), and the header is rewritten. Alone, a segment's
    offset has no neighbour to check it by: only its magic and sequence are repaired."""
    d = tmp_path / "log"
    log = DiskLog(str(d), max_bytes_per_file=400 if which != "alone" else 1 << 20)
    for _ in range(12):
        put(log, 2)
    n = log.end
    offsets = [log.offset_of(s) for s in range(n)]
    log.close()
    segs = [s for s in log.segments if s.size > SEG_HEAD_SIZE]
    assert (len(segs) == 1) is (which == "alone")
    seg = segs[{"first": 0, "middle": 1, "newest": -1, "alone": 0}[which]]
    original = Path(seg.path).read_bytes()
    bits = range(16 * 8) if which == "alone" else range(SEG_HEAD_SIZE * 8)
    for bit in bits:
        for p in d.glob("*.bad"):
            p.unlink()
        Path(seg.path).write_bytes(original)
        flip(seg.path, bit)
        again = DiskLog(str(d), max_bytes_per_file=400)
        assert served(again) == list(range(n)), bit
        assert [again.offset_of(s) for s in range(n)] == offsets, bit
        assert [x.kind for x in again.set_aside] == ["header"], bit
        again.close(sync=False)
        assert Path(seg.path).read_bytes() == original, bit  # rewritten


def test_a_flipped_length_is_stepped_over_by_a_scan(tmp_path: Path) -> None:
    """A batch whose length is garbled does not say where the next one is: the records
    after it are found by their headers (a sequence that fits, a crc that checks), also
    across stretches of zeros, and served."""
    log = DiskLog(str(tmp_path), cache_size=1)
    for _ in range(20):
        put(log, 3)
    log.close()
    seg = log.segments[0].path
    batches = layout(seg)
    pos, _end, first, _ = batches[5]
    data = bytearray(Path(seg).read_bytes())
    data[pos : pos + 4] = (70_000).to_bytes(4, "big")  # past the file's end
    nxt = batches[6][0]
    data[pos + 40 : nxt] = bytes(nxt - pos - 40)  # and its body zeroed
    Path(seg).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path), cache_size=1)
    assert served(again) == [s for s in range(60) if not first <= s < first + 3]
    [hole] = again.set_aside
    assert (hole.pos, hole.nbytes, hole.first, hole.end) == (pos, nxt - pos, first, first + 3)
    assert put(again, 1) == 60


def test_a_message_body_that_holds_a_record_is_not_taken_for_one(tmp_path: Path) -> None:
    """A message whose body is a whole record (a segment's bytes published as a message)
    is not mistaken for the record after a damaged one: its sequences are not the
    ones due there."""
    log = DiskLog(str(tmp_path), cache_size=1)
    put(log, 1)
    seg = log.segments[0].path
    inner = Path(seg).read_bytes()[SEG_HEAD_SIZE:]  # a whole record: sequence 0
    ids = make_ids(1, 1)
    chunk, stride = encode_message_batch(TS, ids, [inner])
    log.append(chunk, ids, 0, stride)
    put(log, 1)
    log.close()
    batches = layout(seg)
    data = bytearray(Path(seg).read_bytes())
    data[batches[1][0]] ^= 0x40  # the length of the batch whose body holds a record
    Path(seg).write_bytes(bytes(data))
    again = DiskLog(str(tmp_path), cache_size=1)
    assert served(again) == [0, 2]


# -- torn writes: any prefix of the unsynced bytes reaches the disk ------------------


def torn_cases(tmp_path: Path) -> tuple[bytes, int, int, list[tuple[int, int, int, int]]]:
    """A log with fsynced batches and then unsynced ones (the process gone without a
    clean close): the segment's bytes, where the unsynced ones start, how many records
    were written, and every batch's layout."""
    log = DiskLog(str(tmp_path), cache_size=1)
    for _ in range(4):
        put(log, 2)
    log.sync()
    synced = log.segments[-1].size
    for count in (1, 3, 1, 2):
        put(log, count)
    data = Path(log.segments[-1].path).read_bytes()
    batches = layout(log.segments[-1].path)
    n = log.end
    log.close(sync=False)
    return data, synced, n, batches


def reopen_torn(tmp_path: Path, d: Path, data: bytes) -> DiskLog:
    """The log directory after a power loss: the segment's bytes as given, the lease
    as the crashed run left it."""
    if d.exists():
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    d.mkdir()
    (d / "00000000000000000000.seg").write_bytes(data)
    lease = tmp_path / "orig" / "sequences.lease"
    (d / lease.name).write_bytes(lease.read_bytes())
    return DiskLog(str(d), cache_size=1)


@pytest.mark.parametrize("fill", ["cut", "zeros"])
def test_a_torn_tail_cut_at_any_byte(tmp_path: Path, fill: str) -> None:
    """A power loss leaves any prefix of the unsynced bytes in the file (the rest cut
    off, or zeros where the file had grown): every whole record is served, the restart
    is clean (a second one finds nothing more to set aside), and no sequence that was
    given out is given again, whether its bytes left a trace in the file or none (its
    lease covers it)."""
    data, synced, n, batches = torn_cases(tmp_path / "orig")
    d = tmp_path / "log"
    for cut in range(synced, len(data) + 1):
        kept = data[:cut] + (bytes(len(data) - cut) if fill == "zeros" else b"")
        log = reopen_torn(tmp_path, d, kept)
        whole = [
            s
            for _p, end, first, count in batches
            if end <= cut
            for s in range(first, first + count)
        ]
        assert served(log) == whole, cut
        assert put(log, 1) >= n, cut
        log.close()
        again = DiskLog(str(d), cache_size=1)
        assert served(again)[:-1] == whole and not again.set_aside, cut
        again.close()


def test_a_lost_page_in_the_middle_of_the_unsynced_bytes(tmp_path: Path) -> None:
    """Pages may reach the disk out of order: a zeroed stretch anywhere in the unsynced
    bytes costs only the records it changed; the whole records after it are served."""
    data, synced, n, batches = torn_cases(tmp_path / "orig")
    d = tmp_path / "log"
    for start in range(synced, len(data), 5):
        stop = min(start + 40, len(data) - 1)
        damaged = data[:start] + bytes(stop - start) + data[stop:]
        log = reopen_torn(tmp_path, d, damaged)
        intact = [
            s
            for pos, end, first, count in batches
            if data[pos:end] == damaged[pos:end]
            for s in range(first, first + count)
        ]
        assert served(log) == intact, start
        assert put(log, 1) >= n
        log.close()


def test_a_clean_close_skips_nothing_and_a_crash_skips_at_most_a_lease(tmp_path: Path) -> None:
    """The sequence lease (nsqx.store.lease): a clean close leaves none, so a restart
    goes on at the log's end; a crash that lost records with no trace in the file skips
    past everything the lease covered, which is renewed long before it runs out."""
    from nsqx.store.lease import LEASE_SEQUENCES, SequenceLease

    log = DiskLog(str(tmp_path), cache_size=1)
    put(log, 3)
    log.close()
    log = DiskLog(str(tmp_path), cache_size=1)
    assert put(log, 1) == 3
    lease = SequenceLease(str(tmp_path))
    assert lease.seq > 3 + LEASE_SEQUENCES // 2
    while log.end < lease.seq - LEASE_SEQUENCES // 2 + 10:
        ids = make_ids(log.end, 1000)
        chunk, stride = encode_message_batch(TS, ids, [b"x"] * 1000)
        log.append(chunk, ids, 0, stride)
        log.sync()  # (nsqd's syncer, every --sync-every)
    renewed = SequenceLease(str(tmp_path)).seq
    assert renewed > lease.seq  # by a sync, before the old one ran out
    end = log.end
    log.close(sync=False)  # a crash
    again = DiskLog(str(tmp_path), cache_size=1)
    assert again.end == renewed and renewed - end <= LEASE_SEQUENCES
    assert put(again, 1) == renewed
    assert again.resume_at(end) == renewed  # a gap, read past
    # a depth counts no sequence of the gap (nsqd's channels and topics ask this)
    assert again.missing_between(again.start, again.end) == renewed - end
    assert again.missing_between(end + 1, renewed + 1) == renewed - end - 1
    assert again.missing_between(renewed, again.end) == 0


# -- a replica's log: no gap of its own ------------------------------------------------


def copy(src: DiskLog, dst: DiskLog) -> None:
    """Store ``src``'s batches in ``dst`` as a follower does (same bytes, same offsets)."""
    while dst.end < src.end:
        for b in src.read_batches(dst.end, 1 << 20):
            assert (b.first, b.offset) == (dst.end, dst.next_offset)
            dst.stage(b.chunk, None, b.deliver_at, b.stride, 0, False, b.messages)
            dst.commit()


def same(a: DiskLog, b: DiskLog) -> None:
    assert (a.start, a.end, a.end_offset) == (b.start, b.end, b.end_offset)
    assert a.read_batches(a.start, 1 << 30) == b.read_batches(b.start, 1 << 30)
    assert served(a) == served(b) == list(range(a.start, a.end))


def test_a_replicas_torn_tail_ends_its_log_at_its_last_whole_record(tmp_path: Path) -> None:
    """``skip_lost=False``: the torn tail is set aside and reported, nothing is skipped,
    and the leader's batches follow on."""
    leader = DiskLog(str(tmp_path / "leader"))
    for count in (2, 3, 1, 4, 2):
        put(leader, count)
    follower = DiskLog(str(tmp_path / "follower"), skip_lost=False)
    copy(leader, follower)
    follower.close()
    seg = follower.segments[-1].path
    last = layout(seg)[-1]
    Path(seg).write_bytes(Path(seg).read_bytes()[: last[0] + 35])
    again = DiskLog(str(tmp_path / "follower"), skip_lost=False)
    assert again.end == last[2]  # its last whole record's end: no gap of its own
    [tail] = again.set_aside
    assert (tail.kind, tail.first, tail.pos, tail.nbytes) == ("tail", last[2], last[0], 35)
    copy(leader, again)
    same(leader, again)
    # a single node's log skips them instead (consumers may have seen their ids)
    single = DiskLog(str(tmp_path / "single"))
    copy(leader, single)
    single.close()
    seg = single.segments[-1].path
    Path(seg).write_bytes(Path(seg).read_bytes()[: last[0] + 35])
    assert DiskLog(str(tmp_path / "single")).end > last[2]


def test_a_replica_cuts_at_a_hole_and_converges(tmp_path: Path) -> None:
    """A replica whose log has a hole (a flipped bit in a sealed segment) reports it;
    cut there, it fetches the rest from its leader and holds the same log."""
    leader = DiskLog(str(tmp_path / "leader"), max_bytes_per_file=600)
    for i in range(40):
        put(leader, 1 + i % 3)
    follower = DiskLog(str(tmp_path / "follower"), max_bytes_per_file=600, skip_lost=False)
    copy(leader, follower)
    follower.close()
    seg = follower.segments[1]
    os.remove(seg.idx_path)
    pos, _end, first, count = layout(seg.path)[2]
    flip(seg.path, (pos + 40) * 8)
    again = DiskLog(str(tmp_path / "follower"), max_bytes_per_file=600, skip_lost=False)
    [hole] = again.set_aside
    assert (hole.kind, hole.first, hole.end) == ("hole", first, first + count)
    assert again.end == leader.end
    assert again.truncate(hole.first) == first
    copy(leader, again)
    same(leader, again)
    again.close()
    same(leader, DiskLog(str(tmp_path / "follower"), max_bytes_per_file=600, skip_lost=False))


def test_a_replica_with_an_old_skip_gap_converges(tmp_path: Path) -> None:
    """A log that older code left with a gap segment (its torn tail's sequences skipped:
    an empty newest segment that starts past the records) cuts back through the gap and
    converges to its leader's log."""
    leader = DiskLog(str(tmp_path / "leader"), max_bytes_per_file=600)
    for i in range(30):
        put(leader, 1 + i % 3)
    follower = DiskLog(str(tmp_path / "follower"), max_bytes_per_file=600, skip_lost=False)
    copy(leader, follower)
    end, end_offset = follower.end, follower.end_offset
    follower.close()
    for _ in range(10):
        put(leader, 2)
    new_segment(str(tmp_path / "follower"), end + 5, end_offset + 300)  # what a skip left
    again = DiskLog(str(tmp_path / "follower"), max_bytes_per_file=600, skip_lost=False)
    assert again.end == end + 5
    # the leader answers "inside a batch" at end + 5: the replication layer cuts to the
    # last batch they agree on, here the one that holds end + 5, through the gap
    with pytest.raises(ValueError, match="inside a batch"):
        leader.read_batches(end + 5, 1)
    agreed = leader.batch_start(end + 5)
    assert agreed is not None and end <= agreed < end + 5
    assert again.truncate(agreed) == end
    copy(leader, again)
    same(leader, again)


def test_reset_after_holes_and_gaps(tmp_path: Path) -> None:
    """reset() starts over whatever recovery left: holes, gap segments, .bad files."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=500, cache_size=1, skip_lost=False)
    for _ in range(20):
        put(log, 2)
    log.close()
    seg = log.segments[1]
    os.remove(seg.idx_path)
    flip(seg.path, (layout(seg.path)[1][0] + 40) * 8)
    again = DiskLog(str(tmp_path), max_bytes_per_file=500, cache_size=1, skip_lost=False)
    assert again.set_aside
    again.reset(1000, 50_000)
    assert (again.start, again.end, again.next_offset) == (1000, 1000, 50_000)
    first = again.end
    ids = make_ids(first, 1)
    chunk, stride = encode_message_batch(TS, ids, [body(first)])
    again.append(chunk, ids, 0, stride)
    again.close()
    third = DiskLog(str(tmp_path), max_bytes_per_file=500, skip_lost=False)
    assert (third.start, third.end) == (1000, 1001) and served(third) == [1000]
    assert third.offset_of(1000) == 50_000
