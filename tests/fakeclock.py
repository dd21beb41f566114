"""Clocks a test controls, put in place of nsqd's (nsqx.nsqd.clock)."""

from __future__ import annotations

import time
from types import TracebackType

from nsqx.nsqd import clock


class JumpingClock:
    """The real clocks plus offsets the test sets: ``jump_wall`` moves the wall clock
    only (what an operator or NTP does), ``advance`` moves both (time passing)."""

    def __init__(self) -> None:
        self.wall_offset_ns = 0
        self.mono_offset = 0.0

    def jump_wall(self, seconds: float) -> None:
        self.wall_offset_ns += int(seconds * 1e9)

    def advance(self, seconds: float) -> None:
        self.mono_offset += seconds
        self.wall_offset_ns += int(seconds * 1e9)

    def __enter__(self) -> JumpingClock:
        clock.monotonic = lambda: time.monotonic() + self.mono_offset
        clock.time_ns = lambda: time.time_ns() + self.wall_offset_ns
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        clock.monotonic = time.monotonic
        clock.time_ns = time.time_ns


class FrozenClock(JumpingClock):
    """Time stands still until the test advances it: deadlines are exact numbers."""

    def __init__(self, start: float = 1000.0, wall_start_ns: int = 1_800_000_000 * 10**9) -> None:
        super().__init__()
        self.now = start
        self.wall_start_ns = wall_start_ns
        self.start = start

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __enter__(self) -> FrozenClock:
        clock.monotonic = lambda: self.now
        clock.time_ns = lambda: self.wall_start_ns + int((self.now - self.start) * 1e9)
        return self
