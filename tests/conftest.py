"""Shared fixtures: real nsqd processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from lookupdproc import LookupdProcess, start_lookupd
from nsqdproc import NsqdProcess, start_nsqd

__all__ = ["LookupdProcess", "NsqdProcess", "start_lookupd", "start_nsqd"]

# Hypothesis' per-example deadline (200 ms) measures the machine, not the code: on two
# shared cores a busy moment fails a correct example. Tests assert behaviour only.
settings.register_profile("nsqx", deadline=None)
settings.load_profile("nsqx")


@pytest.fixture
def nsqd_factory(tmp_path: Path) -> Iterator[object]:
    """Call with extra flags to start an nsqd; all are stopped at the end of the test."""
    started: list[NsqdProcess] = []

    def factory(*args: str, name: str = "nsqd") -> NsqdProcess:
        n = start_nsqd(tmp_path / f"{name}{len(started)}", *args)
        started.append(n)
        return n

    yield factory
    for n in started:
        n.stop(signal.SIGKILL)


@pytest.fixture
def nsqd(nsqd_factory: object) -> NsqdProcess:
    """One nsqd with default flags, listening on a free loopback port."""
    return nsqd_factory()  # type: ignore[operator,no-any-return]


@pytest.fixture
def lookupd_factory() -> Iterator[object]:
    """Call with extra flags to start an nsqlookupd; all are stopped at the end."""
    started: list[LookupdProcess] = []

    def factory(*args: str) -> LookupdProcess:
        lookupd = start_lookupd(*args)
        started.append(lookupd)
        return lookupd

    yield factory
    for lookupd in started:
        lookupd.stop(signal.SIGKILL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow run only when asked for (``-m slow``): a faster honest test
    covers what each checks (see its docstring)."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_RUN_TMP: str | None = None


def _temp_in_one_folder() -> None:
    """Every temporary file of the run (``mkdtemp`` data paths of in-process nsqds, the
    servers' own, those of the processes started) goes under one folder removed at the
    end: thousands of small data folders a run left behind filled a shared /tmp. pytest's
    own ``tmp_path`` keeps its root and retention (failed tests' folders stay)."""
    global _RUN_TMP
    root = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", root)
    _RUN_TMP = tempfile.mkdtemp(prefix="nsqx-run-", dir=root)
    tempfile.tempdir = _RUN_TMP
    os.environ["TMPDIR"] = _RUN_TMP


def pytest_unconfigure(config: pytest.Config) -> None:
    if _RUN_TMP is not None:
        shutil.rmtree(_RUN_TMP, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """All temporary files in one folder (`_temp_in_one_folder`). `make compiled`
    (tests/compiled_build.py) must test the compiled modules, not the source: with
    NSQX_EXPECT_COMPILED=1 every module of the list has to load compiled."""
    _temp_in_one_folder()
    if os.environ.get("NSQX_EXPECT_COMPILED") != "1":
        return
    from nsqx.compiled import COMPILED_MODULES, compiled_modules

    missing = sorted(set(COMPILED_MODULES) - set(compiled_modules()))
    if missing:
        raise pytest.UsageError(f"NSQX_EXPECT_COMPILED=1 but not compiled here: {missing}")
