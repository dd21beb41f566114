"""InFlight and Held (nsqx.nsqd.inflight) alone: no socket, no event loop, no clock.

Times are plain numbers handed in, so every deadline is exact.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nsqx.nsqd.guid import make_ids
from nsqx.nsqd.inflight import Held, InFlight

IDS = make_ids(0, 8)  # sequences 0..7 of partition 0, id base 0


def test_held_expires_in_delivery_order_and_stops_at_the_first_live_one() -> None:
    held = Held(10.0)
    held.add(IDS[:3], 10.0)
    held.add(IDS[3:5], 20.0)
    assert len(held) == 5 and IDS[4] in held and IDS[5] not in held
    assert held.expire(9.9) == []
    assert held.expire(10.0) == IDS[:3]
    assert held.ids() == IDS[3:5]
    assert held.expire(100.0) == IDS[3:5]
    assert len(held) == 0


def test_touch_moves_the_deadline_and_is_clamped_by_max_timeout() -> None:
    held = Held(10.0)
    held.add(IDS[:2], 10.0)  # delivered at 0 with a timeout of 10
    assert held.touch(IDS[0], 5.0, 12.0)  # to 15, clamped to 0 + 12
    assert held.deadline(IDS[0]) == 12.0
    # clamped below the newest deadline (IDS[1]: 10 < 12 keeps order, so it stays in the
    # ordered dict); a second touch at 11 would be 21, clamped to 12 again
    assert held.touch(IDS[0], 11.0, 12.0) and held.deadline(IDS[0]) == 12.0
    assert held.expire(10.0) == [IDS[1]]
    assert held.expire(12.0) == [IDS[0]]
    assert not held.touch(IDS[0], 12.0, 12.0)  # gone
    assert held.deadline(IDS[0]) == -1.0


def test_a_clamped_touch_out_of_order_still_expires_on_time() -> None:
    held = Held(10.0)
    held.add([IDS[0]], 10.0)  # delivered at 0
    held.add([IDS[1]], 18.0)  # delivered at 8
    # IDS[0] touched at 9: 19, clamped to 0 + 12 = 12, which is before IDS[1]'s 18
    assert held.touch(IDS[0], 9.0, 12.0)
    assert held.ids() == [IDS[1], IDS[0]]  # kept aside, not at the ordered dict's end
    assert held.expire(12.0) == [IDS[0]]
    assert held.expire(17.0) == []
    assert held.expire(18.0) == [IDS[1]]


def test_finish_in_bulk_reports_what_was_not_in_flight() -> None:
    flight = InFlight()
    a, b = flight.attach(10.0), flight.attach(10.0)
    a.add(IDS[:3], 10.0)
    b.add([IDS[3]], 10.0)
    done, missing = flight.finish(a, [IDS[0], IDS[3], IDS[2], IDS[0]])
    assert sorted(done) == [IDS[0], IDS[2]]
    assert missing == [IDS[3], IDS[0]]  # another's, and a repeat
    assert a.finish_count == 2 and len(a) == 1 and len(b) == 1
    assert flight.holder(IDS[3]) is b and flight.holder(IDS[0]) is None
    assert flight.count == 2


def test_requeue_now_and_later_keeps_attempts() -> None:
    flight = InFlight()
    held = flight.attach(10.0)
    held.add(IDS[:2], 10.0)
    flight.redelivered(IDS[1], 3)  # IDS[1] is out for the third time
    assert flight.requeue(held, IDS[0], 0, 0)
    assert flight.requeue(held, IDS[1], 1, 5_000)
    assert not flight.requeue(held, IDS[1], 1, 0)  # no longer in flight
    assert list(flight.requeued) == [(0, 1)]
    assert flight.deferred == [(5_000, 1, 3)] and flight.next_due() == 5_000
    assert held.requeue_count == 2 and not flight.attempts
    assert not flight.release(4_999)
    assert flight.release(5_000)
    assert list(flight.requeued) == [(0, 1), (1, 3)] and flight.next_due() == 0


def test_expire_queues_by_sequence_and_counts() -> None:
    flight = InFlight()
    held = flight.attach(10.0)
    held.add(IDS[2:5], 10.0)
    flight.redelivered(IDS[3], 2)
    assert flight.expire(held, 10.0, 0) == IDS[2:5]
    assert list(flight.requeued) == [(2, 1), (3, 2), (4, 1)]
    assert held.timeout_count == 3 and flight.count == 0


def test_a_consumer_that_leaves_has_its_messages_queued_again() -> None:
    flight = InFlight()
    held = flight.attach(10.0)
    held.add(IDS[:3], 10.0)
    held.touch(IDS[1], 5.0, 60.0)
    flight.requeued.append((7, 1))
    assert flight.detach(held, 0) == [IDS[0], IDS[2], IDS[1]]
    assert list(flight.requeued) == [(7, 1), (0, 1), (2, 1), (1, 1)]
    assert flight.count == 0 and len(held) == 0
    assert flight.detach(held, 0) == []  # twice is harmless


def test_positions_low_water_and_checkpoint_entries() -> None:
    flight = InFlight()
    held = flight.attach(10.0)
    assert flight.low_water(6, 0) == 6
    held.add([IDS[4]], 10.0)
    flight.requeued.append((5, 2))
    flight.defer(3, 1, 1_000)
    assert flight.low_water(6, 0) == 3
    assert list(flight.pending(0, 100)) == [4, 1, 0, 5, 2, 0, 3, 1, 1_100]
    flight.drop_below(4)
    assert flight.low_water(6, 0) == 4 and not flight.deferred
    flight.drop_queued()
    assert not flight.requeued and flight.count == 1
    flight.clear()
    assert flight.count == 0


@given(
    st.lists(st.tuples(st.sampled_from(["add", "fin", "req", "touch", "tick"]), st.integers(0, 7)))
)
def test_every_message_is_in_exactly_one_place(steps: list[tuple[str, int]]) -> None:
    """In flight, queued or finished: never two of them, never none."""
    flight = InFlight()
    held = flight.attach(10.0)
    now = 0.0
    fresh = list(range(8))
    finished: set[int] = set()
    for op, k in steps:
        if op == "add" and fresh:
            seq = fresh.pop(0)
            held.add([IDS[seq]], now + 10.0)
        elif op == "fin":
            done, _ = flight.finish(held, [IDS[k]])
            finished.update(IDS.index(m) for m in done)
        elif op == "req":
            flight.requeue(held, IDS[k], k, 0)
        elif op == "touch":
            held.touch(IDS[k], now, 25.0)
        else:
            now += 6.0
            flight.expire(held, now, 0)
        queued = [s for s, _ in flight.requeued]
        flying = [IDS.index(m) for m in held.ids()]
        places = queued + flying + sorted(finished)
        assert len(places) == len(set(places)), (queued, flying, finished)
        assert set(places) | set(fresh) == set(range(8))
        assert all(d > now for d in map(held.deadline, held.ids()))
