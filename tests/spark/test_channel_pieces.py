"""mode=channel's pieces: messages kept as bytes with their connection, their Arrow
columns built as they arrive, split wherever a micro-batch ends (no Spark needed)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.spark.channel_mode import _Piece, columns_to_batch


def frame(i: int, attempts: int = 1) -> bytes:
    return struct.pack(">qH", 1_700_000_000_000_000_000 + i, attempts) + b"%016x" % i + b"b%d" % i


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    cut=st.integers(0, 1000),
    first=st.integers(0, 10**12),
)
def test_a_split_piece_keeps_rows_and_answers_together(
    sizes: list[int], cut: int, first: int
) -> None:
    links = [object(), object()]
    chunks = []
    i = 0
    for k, n in enumerate(sizes):
        chunks.append((links[k % 2], [frame(j) for j in range(i, i + n)]))
        i += n
    piece = _Piece.build(chunks)
    assert piece.error is None and piece.n == i
    k = cut % (i + 1)
    head, rest = piece.split(k)
    assert (head.n, rest.n) == (k, i - k)
    for part, start in ((head, 0), (rest, k)):
        # each message stays with the connection it came on, in order
        flat = [(link, d) for link, ds in part.chunks for d in ds]
        assert [d for _, d in flat] == [frame(j) for j in range(start, start + part.n)]
        assert all(link is links[_owner(sizes, start + n)] for n, (link, _) in enumerate(flat))
        assert part.columns is not None
        batch = columns_to_batch(part.columns, "t", first + start)
        rows = batch.to_pylist()
        assert [r["id"] for r in rows] == [f"{j:016x}" for j in range(start, start + part.n)]
        assert [r["body"] for r in rows] == [b"b%d" % j for j in range(start, start + part.n)]
        assert [r["offset"] for r in rows] == list(range(first + start, first + start + part.n))
        assert all(r["attempts"] == 1 and r["topic"] == "t" for r in rows)


def _owner(sizes: list[int], index: int) -> int:
    """Which link (0 or 1) the message at ``index`` came on."""
    for k, n in enumerate(sizes):
        if index < n:
            return k % 2
        index -= n
    raise AssertionError(index)


def test_a_frame_shorter_than_its_header_fails_the_read_not_the_loop() -> None:
    """Built on the subscription's loop thread, the error waits in the piece for the
    read that takes it (and fails Spark's query with it)."""
    piece = _Piece.build([(object(), [frame(1), b"short"])])
    assert piece.columns is None and isinstance(piece.error, RuntimeError)
    head, rest = piece.split(1)
    assert head.error is piece.error and rest.error is piece.error


def test_the_batch_before_is_finished_when_spark_takes_the_next_in() -> None:
    """read() hands Spark an iterator that FINs the committed batch before its first
    item is taken; Spark's simple-reader wrapper copies it (copy.copy) before taking
    from the copy: the FIN happens once, whichever copy goes first."""
    import copy

    from nsqx.spark.channel_mode import _OnFirst

    calls: list[int] = []
    it = _OnFirst(["a", "b", "c"], lambda: calls.append(1))
    assert calls == []  # nothing before Spark takes the data in
    dup = copy.copy(it)
    assert next(dup) == "a" and calls == [1]
    assert list(copy.copy(dup)) == ["b", "c"] and list(it) == ["a", "b", "c"]
    assert calls == [1]
    empty = _OnFirst([], lambda: calls.append(2))
    assert list(empty) == [] and calls == [1, 2]
