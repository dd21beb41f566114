"""Waiters: callbacks told once whether what they wait for happened (``None``) or will
not (the error), called in the code that decides it (a future's callbacks run one loop
iteration later); and a future made from one, for code that awaits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: Told ``None`` once what it waits for happened, or the error if it will not.
Waiter = Callable[[BaseException | None], None]


def future_waiter() -> tuple[asyncio.Future[None], Waiter]:
    """A future and the waiter that completes it (the first call decides)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(err: BaseException | None) -> None:
        if not fut.done():
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)

    return fut, done
