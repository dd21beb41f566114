"""The embedded meta stores: JSON records, atomic file writes, refusing a bad file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nsqx.lookupd.meta_store import META_FILE, FileMetaStore, MemoryMetaStore, read_meta_file
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.topic_meta import TopicMeta

RECORD = TopicRecord(
    TopicMeta(3, sync_every=10, retention_days=2, ordered=True, ext=True),
    {0: ("n1",), 1: ("n2",), 2: ("n1",)},
    ("c1", "c2"),
)


def test_record_json_round_trip() -> None:
    assert TopicRecord.from_json(json.loads(json.dumps(RECORD.to_json()))) == RECORD
    assert RECORD.leader(1) == "n2" and RECORD.leader(7) is None
    assert TopicRecord(TopicMeta(3), {1: ("x",)}).unplaced() == [0, 2]


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"meta": {}},
        {"meta": {**RECORD.meta.to_json(), "partition_num": 0}},
        {"meta": {**RECORD.meta.to_json(), "ordered": 1}},
        {"meta": RECORD.meta.to_json(), "placements": {"x": ["n"]}},
        {"meta": RECORD.meta.to_json(), "placements": {"0": [1]}},
        {"meta": RECORD.meta.to_json(), "channels": "c"},
    ],
)
def test_bad_records_are_refused(doc: object) -> None:
    with pytest.raises(ValueError):
        TopicRecord.from_json(doc)


def test_file_store_survives_reopening(tmp_path: Path) -> None:
    async def body() -> None:
        store = FileMetaStore.open(str(tmp_path / "d"))
        assert await store.list() == {} and store.durable
        await store.put("t1", RECORD)
        await store.put("t2", TopicRecord(TopicMeta(1)))
        await store.delete("t2")
        await store.delete("never")
        again = FileMetaStore.open(str(tmp_path / "d"))
        assert await again.list() == {"t1": RECORD}
        assert await again.get("t1") == RECORD and await again.get("t2") is None
        assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [META_FILE]
        # concurrent changes are all written, in order
        await asyncio.gather(*(store.put(f"x{i}", RECORD) for i in range(10)))
        assert len(read_meta_file(store.path)) == 11

    asyncio.run(body())


def test_memory_store() -> None:
    async def body() -> None:
        store = MemoryMetaStore()
        await store.put("t", RECORD)
        assert await store.get("t") == RECORD and not store.durable
        await store.delete("t")
        assert await store.list() == {}

    asyncio.run(body())


@pytest.mark.parametrize("content", ["{x", "[]", '{"version": 2, "topics": {}}', '{"version": 1}'])
def test_unreadable_file_is_an_error(tmp_path: Path, content: str) -> None:
    (tmp_path / META_FILE).write_text(content)
    with pytest.raises(ValueError, match=META_FILE):
        FileMetaStore.open(str(tmp_path))
