"""BatchCache against a plain list of frames (the model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.nsqd.guid import make_ids
from nsqx.store.batchcache import BatchCache, CachedBatch
from nsqx.store.log import split_chunk, split_chunks
from nsqx.wire.frames import encode_message_batch

bodies_st = st.lists(st.binary(max_size=12), min_size=1, max_size=8)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), bodies_st, st.booleans(), st.booleans()),
        st.tuples(st.just("trim"), st.integers(0, 80)),
        st.tuples(st.just("trim_to"), st.integers(0, 80)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(0, 80), st.integers(0, 30))
def test_cache_reads_what_a_list_would(
    script: list[tuple[object, ...]], seq: int, limit: int
) -> None:
    cache = BatchCache(5)
    frames: dict[int, bytes] = {}  # the model: sequence -> frame
    ids_of: dict[int, bytes] = {}
    for op in script:
        if op[0] == "append":
            bodies = op[1]
            assert isinstance(bodies, list)
            same_size = bool(op[2])
            if same_size:
                bodies = [b.ljust(4, b"x")[:4] for b in bodies]
            ids = make_ids(cache.end, len(bodies))
            chunk, stride = encode_message_batch(7, ids, bodies)
            # (ids None: read from the frames, as a follower's records are)
            lazy = bool(op[3])
            first = cache.append(CachedBatch(chunk, None if lazy else ids, stride, count=len(ids)))
            for k, frame in enumerate(split_chunk(chunk, len(ids), stride)):
                frames[first + k] = frame
                ids_of[first + k] = ids[k]
        elif op[0] == "trim":
            cache.trim(int(str(op[1])))
        else:
            cache.trim_to(int(str(op[1])))
        assert cache.start <= cache.end == 5 + len(frames)
    chunks, ids = cache.read(seq, limit)
    lo = max(seq, cache.start)
    want = [s for s in range(lo, min(lo + limit, cache.end))]
    assert split_chunks(chunks) == [frames[s] for s in want]
    assert ids == [ids_of[s] for s in want]
    for s in (seq, cache.start, cache.end - 1, cache.end):
        expect = frames.get(s) if cache.start <= s < cache.end else None
        assert cache.get(s) == expect


def test_whole_batches_are_handed_over_without_a_copy() -> None:
    cache = BatchCache()
    ids = make_ids(0, 3)
    chunk, stride = encode_message_batch(1, ids, [b"a", b"b", b"c"])
    cache.append(CachedBatch(chunk, ids, stride))
    chunks, got = cache.read(0, 10)
    assert chunks[0] is chunk and got == ids
    got.append(b"x")  # the caller's list, not the cache's
    assert cache.read(0, 10)[1] == ids


def test_unequal_frames_that_do_not_tile_the_chunk_are_refused() -> None:
    ids = make_ids(0, 2)
    chunk, _ = encode_message_batch(1, ids, [b"a", b"bb"])
    with pytest.raises(ValueError):
        CachedBatch(chunk[:-1], ids, 0)
    with pytest.raises(ValueError):
        CachedBatch(chunk, ids, 5)  # a stride that does not fit


def test_a_batch_without_ids_reads_them_from_its_frames() -> None:
    for bodies in ([b"aa", b"bb", b"cc"], [b"a", b"bbb", b""]):
        ids = make_ids(1 << 20, len(bodies), 3)
        chunk, stride = encode_message_batch(1, ids, bodies)
        batch = CachedBatch(chunk, None, stride, count=len(bodies))
        assert batch.count == 3 and batch.ids == ids
        cache = BatchCache(1 << 20)
        cache.append(CachedBatch(chunk, None, stride, count=len(bodies)))
        assert cache.read(1 << 20, 10) == ([chunk], ids)
        assert cache.read((1 << 20) + 1, 1)[1] == ids[1:2]
