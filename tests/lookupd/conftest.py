"""One nsqlookupd process shared by a test module (tests use their own topic names), and
real etcd processes for the etcd backend (skipped without Debian's etcd-server)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdproc import ETCD, EtcdProcess, start_etcd
from lookupdproc import LookupdProcess, start_lookupd


@pytest.fixture(scope="module")
def lookupd() -> Iterator[LookupdProcess]:
    proc = start_lookupd()
    yield proc
    proc.stop(signal.SIGKILL)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """An etcd of this test's own, which the test may stop and start again."""
    if ETCD is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    proc = start_etcd(tmp_path)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """An etcd for a module's tests, which use cluster ids of their own."""
    if ETCD is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    proc = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield proc
    proc.stop()
