"""Backoff logic (no network, no clock): levels, windows, one result per window."""

from __future__ import annotations

import random

from nsqx.client.backoff import Backoff


def test_failure_opens_a_window_that_grows_exponentially():
    b = Backoff(multiplier=1.0, max_duration=120.0)
    a = b.failure()
    assert a is not None and a.duration == 2.0 and b.level == 1 and b.in_window
    # results during the window are ignored: one result per window
    assert b.failure() is None and b.success() is None and b.level == 1
    b.window_ended()
    assert b.failure().duration == 4.0  # type: ignore[union-attr]
    b.window_ended()
    assert b.failure().duration == 8.0  # type: ignore[union-attr]
    assert b.level == 3


def test_successes_shrink_the_backoff_until_it_is_over():
    b = Backoff(multiplier=1.0, max_duration=120.0)
    for _ in range(3):
        b.failure()
        b.window_ended()
    assert b.level == 3
    a = b.success()
    assert a is not None and not a.resume and a.duration == 4.0 and b.level == 2
    b.window_ended()
    assert b.success().duration == 2.0  # type: ignore[union-attr]
    b.window_ended()
    a = b.success()
    assert a is not None and a.resume and b.level == 0 and not b.active
    # at full speed, successes do nothing
    assert b.success() is None


def test_level_stops_growing_at_the_max_duration():
    b = Backoff(multiplier=1.0, max_duration=10.0)
    durations = []
    for _ in range(10):
        durations.append(b.failure().duration)  # type: ignore[union-attr]
        b.window_ended()
    assert max(durations) <= 10.0
    assert b.level == 3  # 2, 4, 8; 16 would pass the max
    assert durations[-1] == 8.0


def test_neutral_requeue_continues_backoff_without_changing_the_level():
    b = Backoff(multiplier=0.5, max_duration=60.0)
    assert b.neutral() is None  # not in backoff: nothing
    b.failure()
    b.window_ended()
    a = b.neutral()
    assert a is not None and a.duration == 1.0 and b.level == 1


def test_full_jitter_stays_below_the_exponential_value():
    b = Backoff(strategy="full_jitter", multiplier=1.0, max_duration=120.0, rng=random.Random(7))
    for level in range(1, 7):
        for _ in range(50):
            assert 0 <= b.duration(level) < 2**level


def test_backoff_can_be_turned_off():
    b = Backoff(multiplier=1.0, max_duration=0.0)
    assert not b.enabled
    assert b.failure() is None and b.level == 0 and not b.active
    b = Backoff(multiplier=0.0, max_duration=10.0)
    assert b.failure() is None
