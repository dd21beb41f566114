"""What timing the event loop's turns costs, per turn (nanoseconds).

- ``LoopTurn``: the compiled LoopTurn's bookkeeping for one turn that reads (a read's
  ``spend_read_budget`` and the turn's ``_end``, which nsqd does anyway), which now
  also times the turn; run it with the Python of a build before and after a change
  (e.g. ``.venv-compiled/bin/python``) and compare.
- ``call_soon chain``: the alternative nsqx.nsqd.loop_monitor turned down, a callback
  that re-arms itself with ``call_soon`` on uvloop, so that it runs once per loop
  iteration (and keeps the loop from ever sleeping).

    .venv-compiled/bin/python bench/loop_turn_cost.py
"""

from __future__ import annotations

import asyncio
import sys
import time

import uvloop

from nsqx.compiled import build_description
from nsqx.nsqd.loopturn import LoopTurn


def loopturn_ns(busy_poll: float, n: int = 200_000, repeat: int = 5) -> float:
    """The best of ``repeat`` runs of ``n`` read turns, ns per turn."""
    loop = asyncio.new_event_loop()  # not running: call_soon only queues the handle
    turn = LoopTurn(busy_poll)
    turn.loop = loop
    best = float("inf")
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(n):
                turn.spend_read_budget(100, None, False)
                turn._end()
            best = min(best, time.perf_counter() - t0)
            loop._ready.clear()  # type: ignore[attr-defined]  # the queued handles
    finally:
        loop.close()
    return best / n * 1e9


async def _chain(n: int) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        if left:
            loop.call_soon(step)
        else:
            done.set_result(None)

    t0 = time.perf_counter()
    loop.call_soon(step)
    await done
    return (time.perf_counter() - t0) / n * 1e9


def chain_ns(n: int = 200_000, repeat: int = 3) -> float:
    """A self-re-arming call_soon on uvloop: ns per loop iteration (best of ``repeat``)."""
    return min(uvloop.run(_chain(n)) for _ in range(repeat))


def main() -> None:
    print(f"{sys.executable}: {build_description()}")
    print(f"LoopTurn, one read turn, --busy-poll 0:     {loopturn_ns(0.0):6.0f} ns")
    print(f"LoopTurn, one read turn, --busy-poll 200us: {loopturn_ns(0.0002):6.0f} ns")
    print(f"uvloop call_soon chain, per iteration:      {chain_ns():6.0f} ns")


if __name__ == "__main__":
    main()
