"""RDY logic (no network): the client guide's rules, and invariants under random events."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.client.rdy import RdyController


def apply(state: dict[str, int], decisions: list[tuple[str, int]]) -> None:
    for key, count in decisions:
        state[key] = count


def test_new_connections_start_at_one_then_get_an_even_share():
    r: RdyController[str] = RdyController(100)
    sent: dict[str, int] = {}
    apply(sent, r.add("a", 2500, 0.0))
    assert sent == {"a": 1}
    r.received("a", 1, 1.0)
    assert r.maybe_update("a", 1.0) == 100
    sent["a"] = 100
    # a second connection: the first is lowered at once, the new one starts at 1
    apply(sent, r.add("b", 2500, 2.0))
    assert sent == {"a": 50, "b": 1}
    r.received("b", 1, 3.0)
    assert r.maybe_update("b", 3.0) == 50
    r.check()
    assert r.total == 100


def test_update_only_when_count_is_low_or_share_changed():
    r: RdyController[str] = RdyController(100)
    r.add("a", 2500, 0.0)
    r.received("a", 1, 0.0)
    assert r.maybe_update("a", 0.0) == 100
    r.received("a", 50, 1.0)  # 50 of 100 left: no update
    assert r.maybe_update("a", 1.0) is None
    r.received("a", 26, 1.0)  # 24 left, below 25%: same count again
    assert r.maybe_update("a", 1.0) == 100
    r.received("a", 100, 2.0)  # 0 left
    assert r.maybe_update("a", 2.0) == 100


def test_never_above_max_rdy_count():
    r: RdyController[str] = RdyController(10_000)
    r.add("a", 300, 0.0)
    r.received("a", 1, 0.0)
    assert r.maybe_update("a", 0.0) == 300
    r.check()


def test_removal_gives_the_share_back_to_busy_connections():
    r: RdyController[str] = RdyController(10)
    for k in "ab":
        r.add(k, 2500, 0.0)
        r.received(k, 1, 0.0)
        r.maybe_update(k, 0.0)
    assert {k: c.rdy for k, c in r.conns.items()} == {"a": 5, "b": 5}
    assert r.remove("b", 1.0) == [("a", 10)]
    r.check()


def test_scarce_rdy_rotates_among_connections():
    r: RdyController[str] = RdyController(
        1, low_rdy_idle_timeout=1.0, low_rdy_timeout=3.0, rng=random.Random(1)
    )
    for k in "abc":
        r.add(k, 2500, 0.0)
    # only the first got RDY 1: the sum never exceeds max_in_flight
    assert r.total == 1 and r.conns["a"].rdy == 1
    holders = set()
    now = 0.0
    for _ in range(40):
        now += 1.5
        r.redistribute(now)
        r.check()
        holders |= {k for k, c in r.conns.items() if c.rdy}
    assert holders == {"a", "b", "c"}


def test_is_starved():
    r: RdyController[str] = RdyController(10)
    r.add("a", 2500, 0.0)
    r.received("a", 1, 0.0)
    r.maybe_update("a", 0.0)
    assert not r.is_starved()
    r.received("a", 8, 0.0)  # 9 in flight of RDY 10 (>= 85%)
    assert r.is_starved()
    r.answered("a", 5)
    assert not r.is_starved()


def test_backoff_pauses_then_tests_the_waters_then_resumes():
    r: RdyController[str] = RdyController(30, rng=random.Random(3))
    for k in "abc":
        r.add(k, 2500, 0.0)
        r.received(k, 1, 0.0)
        r.maybe_update(k, 0.0)
    assert r.total == 30
    r.pause(1.0)
    assert r.total == 0
    assert r.maybe_update("a", 1.0) is None
    d = r.test_waters(2.0)
    assert len(d) == 1 and d[0][1] == 1 and r.total == 1
    # still limited: a new connection gets nothing while one has RDY 1
    assert r.add("d", 2500, 2.5) == []
    r.resume(3.0)
    assert all(c.rdy == 7 for c in r.conns.values())
    r.check()


def test_max_in_flight_zero_pauses():
    r: RdyController[str] = RdyController(10)
    r.add("a", 2500, 0.0)
    r.received("a", 1, 0.0)
    r.maybe_update("a", 0.0)
    assert r.set_max_in_flight(0, 1.0) == [("a", 0)]
    assert r.set_max_in_flight(10, 2.0) == [("a", 10)]


events = st.lists(
    st.tuples(
        st.sampled_from(
            ["add", "remove", "msgs", "answer", "tick", "pause", "waters", "resume", "mif"]
        ),
        st.integers(0, 5),
        st.integers(0, 3000),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(0, 50), st.integers(1, 3000))
def test_invariants_hold_under_any_sequence_of_events(evs, max_in_flight, max_rdy):
    """Whatever happens, what was sent keeps: sum <= max_in_flight (<= 1 in backoff, 0 in
    a backoff window) and every count <= the connection's max_rdy_count."""
    r: RdyController[str] = RdyController(
        max_in_flight, low_rdy_idle_timeout=1.0, low_rdy_timeout=2.0, rng=random.Random(0)
    )
    sent: dict[str, int] = {}
    now = 0.0
    for op, i, n in evs:
        now += 0.7
        key = f"c{i}"
        if op == "add" and key not in r.conns:
            apply(sent, r.add(key, max_rdy, now))
        elif op == "remove":
            apply(sent, r.remove(key, now))
            sent.pop(key, None)
        elif op == "msgs" and key in r.conns:
            got = min(n % 50, max(sent.get(key, 0), 0))
            r.received(key, got, now)
            count = r.maybe_update(key, now)
            if count is not None:
                sent[key] = count
        elif op == "answer":
            r.answered(key, n % 50)
        elif op == "tick":
            apply(sent, r.redistribute(now))
        elif op == "pause":
            apply(sent, r.pause(now))
        elif op == "waters":
            apply(sent, r.test_waters(now))
        elif op == "resume":
            apply(sent, r.resume(now))
        elif op == "mif":
            apply(sent, r.set_max_in_flight(n % 60, now))
        r.check()
        limit = 0 if r.paused else 1 if r.limited else r.max_in_flight
        assert sum(sent.values()) <= limit
        assert all(0 <= v <= max_rdy for v in sent.values())
        assert {k: v for k, v in sent.items() if k in r.conns} == {
            k: c.rdy for k, c in r.conns.items() if k in sent
        }
