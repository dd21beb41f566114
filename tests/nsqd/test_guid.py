from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nsqx.nsqd.guid import PARTITION_SHIFT, make_ids, seq_of


@given(st.integers(0, 2**40), st.integers(0, 70_000), st.integers(0, 1023))
def test_ids_are_hex_of_partition_and_seq(first: int, count: int, partition: int) -> None:
    ids = make_ids(first, count, partition)
    n = len(ids)
    assert ids == [b"%016x" % ((partition << PARTITION_SHIFT) + s) for s in range(first, first + n)]
    assert all(seq_of(i) == first + k for k, i in enumerate(ids[:50]))


def test_ids_cross_a_low16_boundary() -> None:
    ids = make_ids(65530, 20)
    assert ids == [b"%016x" % s for s in range(65530, 65550)]


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 1023)), min_size=1, max_size=50))
def test_single_ids_in_any_order(calls: list[tuple[int, int]]) -> None:
    """One id at a time (the single-PUB path keeps the last prefix): right whatever the
    order of sequences and partitions, and across a low-16-bit boundary."""
    calls += [(65535, 0), (65536, 0), (65535, 0), (65535, 1)]
    for seq, partition in calls:
        assert make_ids(seq, 1, partition) == [b"%016x" % ((partition << PARTITION_SHIFT) + seq)]
