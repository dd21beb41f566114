"""One nsqlookupd process shared by a test module (tests use their own topic names)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from lookupdproc import LookupdProcess, start_lookupd


@pytest.fixture(scope="module")
def lookupd() -> Iterator[LookupdProcess]:
    proc = start_lookupd()
    yield proc
    proc.stop(signal.SIGKILL)
