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


class _Link:
    """A connection as the pieces see it: its messages' layout is its ``msg_cls``."""

    def __init__(self, youzan: bool, ext: bool = False, detail: bool = False) -> None:
        from nsqx.client.message import message_class

        self.msg_cls = message_class(youzan, ext, detail)


def youzan_frame(
    partition: int, seq: int, trace: int, body: bytes, ext: bytes | None, layout: _Link
) -> bytes:
    """Youzan's frame: binary id and trace id, then the ext part on an ext
    subscription, then offset and raw size after SUB_ORDERED / SUB_ADVANCED."""
    out = struct.pack(">qHQQ", 1_700_000_000_000_000_000 + seq, 2, partition << 50 | seq, trace)
    if getattr(layout.msg_cls, "_ext", False):
        out += b"\x00" if ext is None else struct.pack(">BH", 4, len(ext)) + ext
    if getattr(layout.msg_cls, "_detail", False):
        out += struct.pack(">QI", 1000 + seq, 40)
    return out + body


def test_every_layout_gives_partition_id_trace_id_and_ext() -> None:
    """Connections to partitions (Youzan's binary ids; the ext part on an ext topic; the
    offset and size of ordered subscriptions) and NSQ 1.3 ones, mixed in one piece:
    every row has its partition (the id's high bits), its id as 16 hex digits (as the
    range reader shows it), its trace id (a u64 above 2**63 reads as negative, as
    Spark's BIGINT), its ext header and the body alone."""
    plain = _Link(False)
    layouts = [_Link(True), _Link(True, ext=True), _Link(True, detail=True)]
    layouts.append(_Link(True, ext=True, detail=True))
    chunks: list[tuple[object, list[bytes]]] = [(plain, [frame(1), frame(2)])]
    want = [(0, f"{i:016x}", 0, None, b"b%d" % i) for i in (1, 2)]
    for k, link in enumerate(layouts):
        datas = []
        for j in range(3):
            p, seq, trace = k + j, 10 * k + j + 1, (1 << 63) + j if j == 2 else 7 * j
            ext = b'{"k":"%d"}' % j if j and getattr(link.msg_cls, "_ext", False) else None
            body = b"" if j == 1 else b"body %d %d" % (k, j)
            datas.append(youzan_frame(p, seq, trace, body, ext, link))
            signed = trace - (1 << 64) if trace >= 1 << 63 else trace
            want.append((p, f"{p << 50 | seq:016x}", signed, ext and ext.decode(), body))
        chunks.append((link, datas))
    piece = _Piece.build(chunks)
    assert piece.error is None, piece.error
    assert piece.columns is not None
    rows = columns_to_batch(piece.columns, "t", 0).to_pylist()
    assert [(r["partition"], r["id"], r["trace_id"], r["ext"], r["body"]) for r in rows] == want
    _, rest = piece.split(5)
    assert rest.columns is not None
    tail = columns_to_batch(rest.columns, "t", 5).to_pylist()
    assert [r["id"] for r in tail] == [w[1] for w in want[5:]]
    assert [r["offset"] for r in tail] == list(range(5, len(want)))
    # an ext part cut short fails the read that takes it
    short = _Piece.build([(layouts[1], [youzan_frame(0, 1, 0, b"", None, plain) + b"\x04\x00"])])
    assert isinstance(short.error, RuntimeError)
