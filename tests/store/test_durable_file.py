"""write_durable, and every small durable file of nsqd and nsqlookupd written through it.

Each caller is driven for real while os.fsync and os.replace are recorded (the path
behind each fsynced descriptor is read from /proc): the new content must be fsynced
before the rename, and the directory after it (without that, a power loss can undo
the rename or leave an empty file).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nsqx.lookupd.meta_store import META_FILE, FileMetaStore
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.nsqd.metadata import METADATA_FILE, TopicMetadata, read_metadata, write_metadata
from nsqx.nsqd.nsqd import NODE_ID_FILE, NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.replication.state import ReplicaRole, read_role, write_role
from nsqx.store.cursor import CursorState, read_cursor, write_cursor
from nsqx.store.data_format import FORMAT_FILE, DataFormat, read_format, write_format
from nsqx.store.durable_file import write_durable
from nsqx.wire.topic_meta import TopicMeta

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads fsynced paths from /proc"
)

Event = tuple[str, str]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """("fsync", path) and ("replace", destination), in the order they happened."""
    seen: list[Event] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        seen.append(("replace", os.path.realpath(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def assert_durably_replaced(events: list[Event], path: str) -> None:
    path = os.path.realpath(path)
    renames = [i for i, e in enumerate(events) if e == ("replace", path)]
    assert renames, f"{path} was not replaced by a rename: {events}"
    at = renames[-1]
    before = [p for kind, p in events[:at] if kind == "fsync"]
    assert before and before[-1].startswith(path), f"no fsync of {path}'s new content"
    after = [p for kind, p in events[at + 1 :] if kind == "fsync"]
    assert os.path.dirname(path) in after, f"{path}'s directory not fsynced: {events}"


def test_write_durable_replaces_whole_files(tmp_path: Path, events: list[Event]) -> None:
    path = tmp_path / "state"
    write_durable(str(path), b"one")
    write_durable(str(path), b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["state"]  # no temporary file left
    assert_durably_replaced(events, str(path))


def test_write_durable_failure_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state"
    write_durable(str(path), b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        write_durable(str(path), b"new")
    assert path.read_bytes() == b"old"


def _node_id(tmp: Path) -> str:
    nsqd = NSQD(NsqdOptions(data_path=str(tmp), broadcast_address="node.example"))
    assert nsqd._node_id() == "node.example:0"
    return str(tmp / NODE_ID_FILE)


def _partition_state(tmp: Path) -> str:
    nsqd = NSQD(NsqdOptions(data_path=str(tmp)))
    part = nsqd.get_topic("t").partitions[0]
    try:
        part.save_state()
    finally:
        part.log.close()
    return str(tmp / "t.topic" / "topic.json")


def _nsqd_metadata(tmp: Path) -> str:
    write_metadata(str(tmp), [TopicMetadata("t", False, [])], "1.3.0")
    assert [t.name for t in read_metadata(str(tmp))] == ["t"]
    return str(tmp / METADATA_FILE)


def _replica_role(tmp: Path) -> str:
    path = str(tmp / "role.json")
    role = ReplicaRole(3, "a", "a:4151", ("a",), ("a", "b"), 2)
    write_role(path, role)
    assert read_role(path) == role
    return path


def _cursor(tmp: Path) -> str:
    path = str(tmp / "c.cursor")
    write_cursor(path, CursorState(5, 9))
    state = read_cursor(path)
    assert state is not None and (state.confirmed, state.cursor) == (5, 9)
    return path


def _lookupd_meta_store(tmp: Path) -> str:
    store = FileMetaStore.open(str(tmp))
    record = TopicRecord(TopicMeta(partition_num=1), {0: ("n1",)})
    asyncio.run(store.put("t", record))
    assert asyncio.run(FileMetaStore.open(str(tmp)).get("t")) == record
    return str(tmp / META_FILE)


def _data_format(tmp: Path) -> str:
    write_format(str(tmp), DataFormat(1, "nsqx test"))
    assert read_format(str(tmp)) == DataFormat(1, "nsqx test")
    return str(tmp / FORMAT_FILE)


CALLERS: dict[str, Callable[[Path], str]] = {
    "nsqd node id": _node_id,
    "partition state": _partition_state,
    "nsqd metadata": _nsqd_metadata,
    "replica role": _replica_role,
    "channel cursor": _cursor,
    "lookupd meta store": _lookupd_meta_store,
    "data directory format": _data_format,
}


@pytest.mark.parametrize("caller", CALLERS)
def test_each_durable_file_fsyncs_its_directory(
    caller: str, tmp_path: Path, events: list[Event]
) -> None:
    path = CALLERS[caller](tmp_path)
    assert_durably_replaced(events, path)
