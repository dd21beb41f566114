"""Run by Python at the start of every process whose PYTHONPATH names this folder (see
``nsqdproc.start_nsqd(wall_shift_ns=...)``): nsqd's wall clock (nsqx.nsqd.clock) shifted
by ``$NSQX_TEST_WALL_SHIFT_NS`` nanoseconds, in the node and in every worker it starts
(they inherit the environment). For fixtures whose due times are absolute: a test puts
the node back to before them, as the in-process tests do with fakeclock.JumpingClock."""

from __future__ import annotations

import os
import time

_shift = int(os.environ.get("NSQX_TEST_WALL_SHIFT_NS", "0") or 0)
if _shift:
    from nsqx.nsqd import clock

    clock.time_ns = lambda: time.time_ns() + _shift
