from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nsqx.nsqd.guid import LEGACY_ID_BASE, PARTITION_SHIFT, id_of, make_ids, seq_of


@given(st.integers(0, 2**40), st.integers(0, 70_000), st.integers(0, 1023))
def test_ids_are_hex_of_partition_and_seq_plus_one(first: int, count: int, partition: int) -> None:
    ids = make_ids(first, count, partition)
    n = len(ids)
    want = [b"%016x" % ((partition << PARTITION_SHIFT) + s + 1) for s in range(first, first + n)]
    assert ids == want
    assert all(seq_of(i) == first + k for k, i in enumerate(ids[:50]))
    assert all(int(i, 16) == id_of(first + k, partition) for k, i in enumerate(ids[:50]))


def test_no_id_is_zero() -> None:
    """Youzan's clients read an answered id 0 as "no id": the first message of partition
    0 has id 1."""
    assert make_ids(0, 1) == [b"0000000000000001"]
    assert make_ids(0, 3, 0) == [b"%016x" % i for i in (1, 2, 3)]
    assert id_of(0) == 1
    assert seq_of(b"0000000000000001") == 0


@given(st.integers(0, 2**40), st.integers(1, 300), st.integers(0, 1023))
def test_legacy_ids_are_their_sequences(first: int, count: int, partition: int) -> None:
    """A log written before ids started at 1 keeps its rule (its stored ids do not
    change, and new ones follow them)."""
    ids = make_ids(first, count, partition, LEGACY_ID_BASE)
    assert ids == [
        b"%016x" % ((partition << PARTITION_SHIFT) + s) for s in range(first, first + count)
    ]
    assert [seq_of(i, LEGACY_ID_BASE) for i in ids] == list(range(first, first + count))
    assert id_of(first, partition, LEGACY_ID_BASE) == int(ids[0], 16)


@given(st.integers(0, 2**20), st.integers(0, 2**20), st.integers(0, 1023))
def test_ids_unique_and_growing_across_an_id_base(base: int, span: int, partition: int) -> None:
    """Records below the base keep id = sequence, those from it have sequence + 1: ids
    grow (the one id equal to the base is never given) and each leads back to its
    sequence."""
    lo = max(base - span, 0)
    hi = base + span + 1
    old = make_ids(lo, base - lo, partition, base)
    new = make_ids(base, hi - base, partition, base)
    ids = [int(i, 16) for i in old + new]
    assert ids == sorted(set(ids))
    assert (partition << PARTITION_SHIFT) + base not in ids
    assert [seq_of(i, base) for i in old + new] == list(range(lo, hi))


def test_ids_cross_a_low16_boundary() -> None:
    ids = make_ids(65530, 20)
    assert ids == [b"%016x" % (s + 1) for s in range(65530, 65550)]
    ids = make_ids(65530, 20, 0, LEGACY_ID_BASE)
    assert ids == [b"%016x" % s for s in range(65530, 65550)]


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 1023)), min_size=1, max_size=50))
def test_single_ids_in_any_order(calls: list[tuple[int, int]]) -> None:
    """One id at a time (the single-PUB path keeps the last prefix): right whatever the
    order of sequences and partitions, and across a low-16-bit boundary."""
    calls += [(65534, 0), (65535, 0), (65536, 0), (65535, 0), (65535, 1)]
    for seq, partition in calls:
        want = (partition << PARTITION_SHIFT) + seq
        assert make_ids(seq, 1, partition) == [b"%016x" % (want + 1)]
        assert make_ids(seq, 1, partition, LEGACY_ID_BASE) == [b"%016x" % want]
