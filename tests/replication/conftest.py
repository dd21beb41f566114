"""Every nsqd a replication test started is killed when the test ends, also when it
fails half-way (a leaked nsqd would hold memory and ports for the rest of the run)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from cluster import STARTED


@pytest.fixture(autouse=True)
def _stop_started_nodes() -> Iterator[None]:
    yield
    while STARTED:
        STARTED.pop().stop(signal.SIGKILL)
