"""Range bodies: the wire encoding, its refusals, and the Arrow batch built from it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nsqx.nsqd.guid import make_ids
from nsqx.nsqd.http import range_body
from nsqx.spark.source import SCHEMA_NAMES, frames_to_batch
from nsqx.store.disklog import DiskLog
from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import encode_extended_batch, encode_message_batch
from nsqx.wire.range import decode_range, decode_range_frames

TS = 1_700_000_000_123_456_789


def _log_with_mixed_batches(path: Path) -> DiskLog:
    log = DiskLog(str(path), max_bytes_per_file=900, cache_size=2)
    for i in range(12):
        # even batches: equal sizes (one run each); odd: unequal (one run per frame)
        bodies = (
            [b"e%02d-%d" % (i, k) for k in range(3)]
            if i % 2 == 0
            else [b"u" * (k + i) for k in range(1, 4)]
        )
        ids = make_ids(log.end, len(bodies))
        chunk, stride = encode_message_batch(TS + i * 1000, ids, bodies)
        log.append(chunk, ids, 0, stride)
    return log


def _body(log: DiskLog, start: int, limit: int) -> bytes:
    return range_body(log, start, limit, 1 << 30)


def test_arrow_batch_matches_the_records(tmp_path: Path) -> None:
    log = _log_with_mixed_batches(tmp_path)
    body = _body(log, 4, 25)
    records = decode_range(body).records
    assert [r.sequence for r in records] == list(range(4, 29))
    batch = frames_to_batch(decode_range_frames(body), "t", "h:1", 0)
    assert batch.schema.names == SCHEMA_NAMES
    cols = batch.to_pydict()
    assert cols["offset"] == [r.sequence for r in records]
    assert cols["body"] == [r.body for r in records]
    assert cols["id"] == [r.id.decode() for r in records]
    assert [int(t.timestamp() * 1_000_000) for t in cols["timestamp"]] == [
        r.timestamp // 1000 for r in records
    ]
    assert set(cols["attempts"]) == {1} and set(cols["topic"]) == {"t"}
    assert set(cols["ext"]) == {None} and set(cols["trace_id"]) == {0}


def test_extended_records_give_trace_ids_and_ext_headers(tmp_path: Path) -> None:
    """Plain and extended batches mixed in one read: trace ids and ext headers from the
    extended records (nothing from the plain ones), the body only in ``body``, the same
    16-hex-digit ids; Arrow's columns agree with the record decoder."""
    log = DiskLog(str(tmp_path), cache_size=2)
    expected = []  # (body, trace id, ext)
    for i in range(6):
        n = 3
        bodies = [b"m%d-%d" % (i, k) * (k + 1) for k in range(n)]
        ids = make_ids(log.end, n)
        if i % 3 == 0:
            chunk, stride = encode_message_batch(TS + i, ids, bodies)
            expected += [(b, 0, None) for b in bodies]
        elif i % 3 == 1:
            traces = [(1 << 63) + 7 * k + i for k in range(n)]  # one past BIGINT: wraps
            exts = [f'{{"k":"é{i}","n":{k}}}'.encode() for k in range(n)]
            chunk, stride = encode_extended_batch(TS + i, ids, bodies, traces, [4] * n, exts)
            expected += [
                (b, t - (1 << 64), e.decode()) for b, t, e in zip(bodies, traces, exts, strict=True)
            ]
        else:  # traced, no ext header
            chunk, stride = encode_extended_batch(
                TS + i, ids, bodies, [1000 + k for k in range(n)], [0] * n, [b""] * n
            )
            expected += [(b, 1000 + k, None) for k, b in enumerate(bodies)]
        log.append(chunk, ids, 0, stride)
    body = _body(log, 0, 100)
    records = decode_range(body).records
    assert [r.body for r in records] == [e[0] for e in expected]
    assert [r.trace_id for r in records] == [e[1] % (1 << 64) for e in expected]
    cols = frames_to_batch(decode_range_frames(body), "t", "h:1", 0).to_pydict()
    assert cols["body"] == [e[0] for e in expected]
    assert cols["trace_id"] == [e[1] for e in expected]
    assert cols["ext"] == [e[2] for e in expected]
    assert cols["id"] == [i.decode() for i in make_ids(0, len(expected))]
    assert cols["offset"] == list(range(len(expected)))
    # a read that starts inside the extended batches: the same columns from there
    tail = frames_to_batch(decode_range_frames(_body(log, 4, 100)), "t", "h:1", 0).to_pydict()
    assert tail["ext"] == cols["ext"][4:] and tail["body"] == cols["body"][4:]
    # an ext length that runs past its frame is refused, not read past
    pos = body.index(b'{"k"')
    bad = body[: pos - 2] + b"\xff\xff" + body[pos:]
    with pytest.raises(RuntimeError, match="malformed extended records"):
        frames_to_batch(decode_range_frames(bad), "t", "h:1", 0)
    with pytest.raises(ProtocolError):
        decode_range(bad)


def test_malformed_bodies_are_refused(tmp_path: Path) -> None:
    log = _log_with_mixed_batches(tmp_path)
    body = _body(log, 0, 10)
    with pytest.raises(ProtocolError):
        decode_range_frames(body[:20])  # shorter than the header
    with pytest.raises(ProtocolError):
        decode_range_frames(body[:40])  # tables cut off
    # runs that do not add up to the record count
    n, runs = struct.unpack_from(">II", body, 24)
    bad = body[:24] + struct.pack(">II", n + 1, runs) + body[32:]
    with pytest.raises(ProtocolError):
        decode_range_frames(bad)
    # frames shorter than their sizes say: refused when cut, not read past
    with pytest.raises(ProtocolError):
        decode_range(body[:-5])
    with pytest.raises(RuntimeError, match="malformed frames"):
        frames_to_batch(decode_range_frames(body[:-5]), "t", "h:1", 0)
    # an id that is not text: Arrow's error, named as a bad range read from that nsqd
    pos = body.index(make_ids(0, 1)[0])
    bad_id = body[:pos] + b"\xff" + body[pos + 1 :]
    with pytest.raises(RuntimeError, match=r"from h:1 has malformed frames: Invalid UTF8"):
        frames_to_batch(decode_range_frames(bad_id), "t", "h:1", 0)


def test_sizes_that_add_up_are_not_taken_for_equal_ones(tmp_path: Path) -> None:
    """Bodies of 10, 5 and 15 bytes make frames whose sizes average the first's: the
    size prefixes decide, not the sum."""
    log = DiskLog(str(tmp_path), cache_size=1)
    ids = make_ids(0, 3)
    bodies = [b"a" * 10, b"b" * 5, b"c" * 15]
    chunk, stride = encode_message_batch(TS, ids, bodies)
    assert stride == 0
    log.append(chunk, ids, 0, stride)
    z_ids = make_ids(3, 1)
    z_chunk, z_stride = encode_message_batch(TS, z_ids, [b"z"])
    log.append(z_chunk, z_ids, 0, z_stride)
    body = _body(log, 0, 10)
    assert [r.body for r in decode_range(body).records] == [*bodies, b"z"]
    batch = frames_to_batch(decode_range_frames(body), "t", "h:1", 0)
    assert batch.column("body").to_pylist() == [*bodies, b"z"]


def test_a_read_stops_at_a_gap_and_says_where_it_starts(tmp_path: Path) -> None:
    """A segment lost leaves a gap: a read that reaches it stops there, and one that
    starts in it reports the first sequence it really has (a reader sees the loss)."""
    log = DiskLog(str(tmp_path), max_bytes_per_file=400, cache_size=1)
    for i in range(12):
        ids = make_ids(log.end, 2)
        chunk, stride = encode_message_batch(TS, ids, [b"m%02d-%d" % (i, k) for k in range(2)])
        log.append(chunk, ids, 0, stride)
    log.close()
    segs = sorted(p for p in tmp_path.iterdir() if p.suffix == ".seg")
    assert len(segs) >= 4
    victim = segs[1]
    victim.unlink()  # (a bad header is repaired from the name and the neighbours now)
    log = DiskLog(str(tmp_path), max_bytes_per_file=400, cache_size=1)
    lo = log.segments[0].end_seq
    hi = log.segments[1].base_seq
    assert hi > lo  # the gap
    before = decode_range(_body(log, 0, 100))
    assert [r.sequence for r in before.records] == list(range(lo))
    inside = decode_range(_body(log, lo, 100))
    assert inside.start_sequence == hi and inside.records[0].sequence == hi
    assert all([r.id] == make_ids(r.sequence, 1) for r in inside.records)


def test_a_large_read_is_taken_in_steps_that_let_other_work_run(tmp_path: Path) -> None:
    """GET /range reads in steps of RANGE_STEP_BYTES on nsqd's event loop: the body is
    the one a single read makes, and other tasks (consumers, publishers) run between the
    steps instead of waiting for the whole read."""
    import asyncio

    from nsqx.nsqd.http import RANGE_STEP_BYTES, range_steps

    log = DiskLog(str(tmp_path), max_bytes_per_file=1 << 20, cache_size=10)
    body = b"x" * 1000
    for _ in range(40):  # 40 batches of 100 frames of ~1 KiB: 4 MiB, 4 segments
        ids = make_ids(log.end, 100)
        chunk, stride = encode_message_batch(TS, ids, [body] * 100)
        log.append(chunk, ids, 0, stride)
    # and one batch of unequal frames (one run per frame)
    ids = make_ids(log.end, 3)
    chunk, stride = encode_message_batch(TS, ids, [b"a", b"bb", b"ccc"])
    log.append(chunk, ids, 0, stride)

    async def read_while_counting() -> tuple[bytes, int]:
        ticks = 0
        done = False

        async def other_work() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        ticks = 0
        head, chunks = await range_steps(log, 10, 100_000, 64 << 20)
        seen = ticks
        done = True
        await task
        return head + b"".join(chunks), seen

    whole, ticks = asyncio.run(read_while_counting())
    # the same records (a batch cut between two steps makes two runs instead of one)
    assert decode_range(whole) == decode_range(range_body(log, 10, 100_000, 64 << 20))
    assert len(decode_range(whole).records) == 4003 - 10
    assert ticks >= (4 << 20) // RANGE_STEP_BYTES - 1  # the loop turned between steps
    # budgets and an empty read are the same as one read's too
    for start, n, size in ((0, 250, 1 << 30), (5, 100_000, 3000), (4003, 10, 1 << 20)):
        head, chunks = asyncio.run(range_steps(log, start, n, size))
        assert decode_range(head + b"".join(chunks)) == decode_range(
            range_body(log, start, n, size)
        )
