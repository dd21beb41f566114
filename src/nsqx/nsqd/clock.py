"""nsqd's clocks, read through this module so that tests can make them jump.

Timeouts, heartbeats and delays are measured on the monotonic clock, which never jumps:
the wall clock being set back or forward changes no deadline. The wall clock gives
message timestamps and the due times written to disk (a restart has no monotonic
clock to come back to). Call ``clock.monotonic()``, never ``from ... import``, so that
a test's replacement is seen.
"""

from __future__ import annotations

import time

#: seconds on a clock that never jumps (deadlines)
monotonic = time.monotonic
#: wall-clock nanoseconds since the epoch (timestamps, due times on disk)
time_ns = time.time_ns


def monotonic_ns() -> int:
    """:func:`monotonic` in integer nanoseconds (due times of deferred messages)."""
    return int(monotonic() * 1_000_000_000)
