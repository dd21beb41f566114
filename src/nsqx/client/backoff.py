"""Backoff: slow a consumer down after failures, speed it up again after successes.

Plain logic, no I/O or clock (go-nsq's ``startStopContinueBackoff``):

- a failure raises the backoff level (up to the level whose duration reaches the max);
  a success lowers it; a "continue" (a requeue without backoff) leaves it as it is;
- while the level is above 0, every counted result starts a backoff *window*: RDY 0
  on every connection for ``duration(level)``; when the window ends, one connection
  gets RDY 1 to test the waters, and the next result decides what follows;
- results that arrive during a window are ignored: one result counts per window;
- when a success brings the level to 0, the consumer returns to full speed.

Durations: ``exponential`` is ``multiplier * 2**level``; ``full_jitter`` is a uniform
random value in ``[0, multiplier * 2**level)``; both capped at ``max_duration``.
A ``max_duration`` (or multiplier) of 0 turns backoff off.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackoffAction:
    """What the consumer must do after a result.

    ``duration`` > 0: send RDY 0 everywhere and wait that long, then call
    :meth:`Backoff.window_ended` and test the waters. ``resume``: backoff is over, give
    every connection its full RDY again.
    """

    duration: float = 0.0
    resume: bool = False


RESUME = BackoffAction(resume=True)


class Backoff:
    """The backoff level of one consumer, and the window in progress."""

    def __init__(
        self,
        *,
        strategy: str = "exponential",
        multiplier: float = 1.0,
        max_duration: float = 120.0,
        rng: random.Random | None = None,
    ) -> None:
        if strategy not in ("exponential", "full_jitter"):
            raise ValueError(f"unknown backoff strategy {strategy!r}")
        self.strategy = strategy
        self.multiplier = multiplier
        self.max_duration = max_duration
        self.rng = rng or random.Random()
        #: Consecutive failures not yet made up for by successes.
        self.level = 0
        #: True during a backoff window (RDY 0 everywhere).
        self.in_window = False

    @property
    def enabled(self) -> bool:
        return self.max_duration > 0 and self.multiplier > 0

    @property
    def active(self) -> bool:
        """In backoff: a window is running, or the level is not back to 0 yet."""
        return self.level > 0 or self.in_window

    def _exponential(self, level: int) -> float:
        return float(self.multiplier * (2 ** min(level, 64)))

    def duration(self, level: int) -> float:
        """The window length for a level."""
        d = self._exponential(level)
        if self.strategy == "full_jitter":
            d = self.rng.uniform(0, d)
        return min(d, self.max_duration)

    def success(self) -> BackoffAction | None:
        """A message was processed successfully."""
        if not self.enabled or self.in_window or self.level == 0:
            return None
        self.level -= 1
        if self.level == 0:
            return RESUME
        return self._window()

    def failure(self) -> BackoffAction | None:
        """A message failed (requeued with backoff)."""
        if not self.enabled or self.in_window:
            return None
        # Stop growing once a level's duration would pass the max (as go-nsq does), but
        # always reach level 1 so that a small max still backs off.
        if self.level == 0 or self._exponential(self.level + 1) <= self.max_duration:
            self.level += 1
        return self._window()

    def neutral(self) -> BackoffAction | None:
        """A message was requeued without backoff: in backoff, wait another window."""
        if not self.enabled or self.in_window or self.level == 0:
            return None
        return self._window()

    def _window(self) -> BackoffAction:
        self.in_window = True
        return BackoffAction(duration=self.duration(self.level))

    def window_ended(self) -> None:
        """The window's time is up: the next result counts."""
        self.in_window = False

    def reset(self) -> None:
        self.level = 0
        self.in_window = False
