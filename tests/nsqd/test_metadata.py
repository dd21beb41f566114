"""nsqd.dat and the data-directory lock."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from nsqx.nsqd.metadata import DataDirLock

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run
from rawnsq import start_nsqd as start_inproc


def test_metadata_written_and_restored(tmp_path: Path) -> None:
    async def first() -> None:
        nsqd = await start_inproc(data_path=str(tmp_path))
        r = await Raw.connect(nsqd)
        await r.subscribe("t", "c1")
        r2 = await Raw.connect(nsqd)
        await r2.subscribe("t", "c2#ephemeral")
        await r2.publish("e#ephemeral", b"x")
        nsqd.topics["t"].channels["c1"].pause()
        nsqd.persist_metadata()
        doc = json.loads((tmp_path / "nsqd.dat").read_text())
        assert doc["topics"] == [
            {"name": "t", "paused": False, "channels": [{"name": "c1", "paused": True}]}
        ]
        await nsqd.close()

    async def second() -> None:
        nsqd = await start_inproc(data_path=str(tmp_path))
        assert list(nsqd.topics) == ["t"]
        assert list(nsqd.topics["t"].channels) == ["c1"]
        assert nsqd.topics["t"].channels["c1"].paused
        await nsqd.close()

    run(first())
    run(second())


def test_data_dir_is_locked(tmp_path: Path) -> None:
    lock = DataDirLock(str(tmp_path))
    lock.acquire()
    with pytest.raises(RuntimeError, match="in use"):
        DataDirLock(str(tmp_path)).acquire()
    lock.release()
    DataDirLock(str(tmp_path)).acquire()


def test_second_nsqd_on_same_data_path_exits(tmp_path: Path) -> None:
    first: NsqdProcess = start_nsqd(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="in use"):
            start_nsqd(tmp_path)
    finally:
        first.stop(signal.SIGTERM)
