"""The replication stream's messages and the divergence rule (sans-IO)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.wire import replication as rp
from nsqx.wire.batch import StoredBatch


def test_messages_round_trip() -> None:
    hello = rp.Hello("t", 3, "127.0.0.1:4150", 7, 120, 9000, [(1, 0), (7, 100)])
    assert rp.decode(rp.encode_hello(hello)) == hello
    welcome = rp.Welcome(7, [(1, 0), (7, 100)], 110)
    assert rp.decode(rp.encode_welcome(welcome)) == welcome
    reset = rp.Welcome(7, [(7, 100)], 500, (500, 40000))
    assert rp.decode(rp.encode_welcome(reset)) == reset
    refused = rp.Refused("E_NOT_REPLICA", "who?")
    assert rp.decode(rp.encode_refused(refused)) == refused
    assert rp.decode(rp.encode_ack(42)) == rp.Ack(42)
    cursors = rp.Cursors({"a": (10, False), "b": (3, True)}, 2)
    assert rp.decode(rp.encode_cursors(cursors)) == cursors
    marked = rp.Cursors({"a": (10, False)}, 2, {"a": {"t.dead:0": (7, 1795000000123)}})
    assert rp.decode(rp.encode_cursors(marked)) == marked
    # durable acknowledgement: the HELLO offers, the WELCOME asks, DURABLE reports
    offering = rp.Hello("t", 0, "n", 1, 5, 50, [(1, 0)], True, 2)
    assert rp.decode(rp.encode_hello(offering)) == offering
    asking = rp.Welcome(7, [(7, 100)], 110, None, True)
    assert rp.decode(rp.encode_welcome(asking)) == asking
    assert rp.decode(rp.encode_durable(42)) == rp.Durable(42)
    deferred = rp.Cursors(
        {"a": (10, False)}, 2, deferred={"a": [(11, 2, 1_700_000_000_000)]}, now_ms=1_699
    )
    assert rp.decode(rp.encode_cursors(deferred)) == deferred


def test_the_previous_release_s_messages_still_decode() -> None:
    """What nsqx wrote before durable acknowledgement and replicated schedules: no
    durable flags, no deferred messages (read as "none")."""
    hello = rp.decode(
        b'\x01{"topic":"t","partition":0,"node":"n","epoch":1,"end":5,"end_offset":50,'
        b'"history":[[1,0]]}'
    )
    assert isinstance(hello, rp.Hello) and not hello.durable
    welcome = rp.decode(b'\x02{"epoch":1,"history":[[1,0]],"truncate_to":5}')
    assert isinstance(welcome, rp.Welcome) and not welcome.durable
    cursors = rp.decode(b'\x06{"channels":{"a":[3,false]},"hold_from":0}')
    assert cursors == rp.Cursors({"a": (3, False)}, 0)
    # and what the previous release reads of the new ones: fields it does not know are
    # extra keys of the JSON objects, the channel entries keep their shape
    new = rp.encode_cursors(rp.Cursors({"a": (3, False)}, 0, deferred={"a": [(4, 1, 9)]}, now_ms=5))
    assert b'"channels":{"a":[3,false]}' in new


def test_cursors_without_replay_marks_are_what_they_were() -> None:
    """A leader of an earlier release sends no replay marks, and one with none to send
    sends the same bytes as before them (a follower of an earlier release reads it)."""
    old = b'\x06{"channels":{"a":[10,false]},"hold_from":2}'
    assert rp.decode(old) == rp.Cursors({"a": (10, False)}, 2)
    assert rp.encode_cursors(rp.Cursors({"a": (10, False)}, 2)) == old


@given(
    st.integers(0, 2**63),
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 8), st.integers(0, 2**40)), max_size=5),
)
def test_batches_round_trip(commit: int, shapes: list[tuple[int, int, int]]) -> None:
    batches = []
    first = 0
    for n, size, deliver_at in shapes:
        stride = size + 4
        chunk = (size.to_bytes(4, "big") + b"x" * size) * n
        batches.append(StoredBatch(first, n, first * 10, deliver_at, stride, chunk))
        first += n
    assert rp.decode(rp.encode_batches(commit, batches)) == rp.Batches(commit, batches)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x09",
        b"\x01not json",
        b"\x01[]",
        b'\x01{"topic": 1}',
        b'\x02{"epoch": 1, "history": [[1]], "truncate_to": 0}',
        b'\x02{"epoch": 1, "history": [], "truncate_to": -1}',
        b'\x02{"epoch": 1, "history": [], "truncate_to": 0, "reset": [1]}',
        b"\x05\x00",
        b"\x04\x00",
        rp.encode_batches(0, [StoredBatch(0, 2, 0, 0, 5, b"12345")]),  # size != 2 x 5
        rp.encode_batches(0, [StoredBatch(0, 1, 0, 0, 0, b"abc")]) + b"!",
        rp.encode_batches(0, [StoredBatch(0, 1, 0, 0, 0, b"abc")])[:-1],
        b'\x06{"channels": {"a": [1]}, "hold_from": 0}',
        b'\x06{"channels": {}, "hold_from": 0, "deferred": {"a": [[1, 2]]}, "now_ms": 0}',
        b'\x06{"channels": {}, "hold_from": 0, "deferred": {"a": [[1, 2, 3]]}}',
        b'\x06{"channels": {}, "hold_from": 0, "deferred": [], "now_ms": 0}',
        b"\x07\x00",
        b'\x06{"channels": {}, "hold_from": 0, "replay_marks": []}',
        b'\x06{"channels": {}, "hold_from": 0, "replay_marks": {"a": [1, 2]}}',
        b'\x06{"channels": {}, "hold_from": 0, "replay_marks": {"a": {"t:0": [1]}}}',
        b'\x06{"channels": {}, "hold_from": 0, "replay_marks": {"a": {"t:0": [1, true]}}}',
    ],
)
def test_malformed_messages_are_refused(data: bytes) -> None:
    with pytest.raises(rp.ReplicationProtocolError):
        rp.decode(data)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_refuse(data: bytes) -> None:
    try:
        rp.decode(data)
    except rp.ReplicationProtocolError:
        pass


def test_divergence() -> None:
    # the follower followed this leader (same history): keep all it has
    assert rp.divergence([(1, 0), (2, 50)], 80, [(1, 0), (2, 50)], 70) == 70
    # the follower was leader in epoch 2 and wrote past what the new leader (epoch 3,
    # from 60) had: cut at 60
    assert rp.divergence([(1, 0), (2, 50), (3, 60)], 90, [(1, 0), (2, 50)], 75) == 60
    # the follower is behind the point where the histories part: keep all it has
    assert rp.divergence([(1, 0), (2, 50), (3, 60)], 90, [(1, 0), (2, 50)], 55) == 55
    # an epoch the leader never saw (a leadership nobody followed): back to the last
    # shared one
    assert rp.divergence([(1, 0), (3, 40)], 90, [(1, 0), (2, 30)], 45) == 30
    # nothing shared: start over
    assert rp.divergence([(4, 0)], 10, [(2, 0)], 5) == 0
    assert rp.divergence([(1, 0)], 10, [], 0) == 0
