"""Choosing destinations for nsq_to_http and nsq_to_nsq: their ``--mode`` values.

- ``round-robin``: each message to the next destination in turn.
- ``hostpool`` (the default): go-hostpool's rule: destinations in turn, skipping one
  that failed until its retry time (30 s, doubling on each further failure up to
  15 min); if all are down, all are tried again.
- ``epsilon-greedy``: mostly the destination with the lowest recent response time,
  sometimes (epsilon, 10%) another one at random, skipping failed ones as above.
- ``all`` (nsqx's name for nsq_to_http's fan-out): every message to every destination.

No I/O and the clock is an argument, so tests drive it directly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MODES", "HostPool"]

MODES = ("hostpool", "round-robin", "epsilon-greedy", "all")
_RETRY_FIRST = 30.0
_RETRY_MAX = 900.0
_EPSILON = 0.1
#: weight of the newest response time in a destination's running mean
_ALPHA = 0.2


@dataclass
class _Host:
    name: str
    dead_until: float = 0.0
    retry: float = _RETRY_FIRST
    mean: float = 0.0
    samples: int = 0


class HostPool:
    """Picks destinations by ``mode`` and learns from :meth:`mark`."""

    def __init__(
        self, hosts: Sequence[str], mode: str = "hostpool", rng: random.Random | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)} (got {mode!r})")
        if not hosts:
            raise ValueError("no destinations")
        self.mode = mode
        self._hosts = [_Host(h) for h in hosts]
        self._by_name = {h.name: h for h in self._hosts}
        self._next = 0
        self._rng = rng or random.Random()

    def pick(self, now: float) -> list[str]:
        """The destinations for the next message (several only in ``all`` mode)."""
        if self.mode == "all":
            return [h.name for h in self._hosts]
        if self.mode == "round-robin":
            host = self._hosts[self._next % len(self._hosts)]
            self._next += 1
            return [host.name]
        alive = [h for h in self._hosts if h.dead_until <= now]
        if not alive:
            # all down: try them all again (go-hostpool resets)
            for h in self._hosts:
                h.dead_until = 0.0
            alive = list(self._hosts)
        if self.mode == "epsilon-greedy" and self._rng.random() >= _EPSILON:
            measured = [h for h in alive if h.samples]
            if measured:
                return [min(measured, key=lambda h: h.mean).name]
        host = alive[self._next % len(alive)]
        self._next += 1
        return [host.name]

    def mark(self, name: str, ok: bool, now: float, seconds: float = 0.0) -> None:
        """Record a result: a failure takes the destination out until its retry time."""
        host = self._by_name[name]
        if ok:
            host.retry = _RETRY_FIRST
            host.mean = seconds if not host.samples else (1 - _ALPHA) * host.mean + _ALPHA * seconds
            host.samples += 1
        else:
            host.dead_until = now + host.retry
            host.retry = min(host.retry * 2, _RETRY_MAX)
