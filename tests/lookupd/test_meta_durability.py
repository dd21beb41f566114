"""nsqlookupd's embedded meta store and power cuts: a new epoch is on the disk before
any node hears of it (what a power cut of nsqlookupd takes back, no node has acted
on), and a write that failed is never stored later with another one."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from test_replicas_fencing import FakeCoordinator

from nsqx.lookupd import meta_store
from nsqx.lookupd.meta_store import FileMetaStore, read_meta_file
from nsqx.lookupd.replicas import Replicas
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.topic_meta import TopicMeta


class StoredCoordinator(FakeCoordinator):
    """The fake coordinator, its records saved in a FileMetaStore first, as the real
    one saves them (Coordinator._save)."""

    def __init__(self, nodes: list[str], store: FileMetaStore) -> None:
        super().__init__(nodes)
        self.store = store

    async def save(self, topic: str, record: TopicRecord) -> None:
        await self.store.put(topic, record)
        await super().save(topic, record)


def test_a_node_hears_of_an_epoch_only_once_it_is_on_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = FileMetaStore.open(str(tmp_path))
        coord = StoredCoordinator(["a", "b", "c"], store)
        record = TopicRecord(TopicMeta(partition_num=1, replica=3), {0: ("a", "b", "c")})
        record = record.with_first_epochs([0], "placed")
        await store.put("t", record)
        coord.records["t"] = record
        replicas = Replicas(coord)  # type: ignore[arg-type]
        # the next write hangs in its fsync until the test lets it go
        entered, go = threading.Event(), threading.Event()
        real = meta_store.write_durable

        def slow(path: str, data: bytes) -> None:
            entered.set()
            go.wait(10)
            real(path, data)

        monkeypatch.setattr(meta_store, "write_durable", slow)
        leave = asyncio.ensure_future(replicas.isr_leave("t", 0, "c", 1))
        await asyncio.to_thread(entered.wait, 10)
        assert coord.client.calls == []  # nobody told: epoch 2 may not survive yet
        assert read_meta_file(store.path)["t"].epoch_of(0) == 1
        go.set()
        assert await leave == "OK"
        assert read_meta_file(store.path)["t"].epoch_of(0) == 2
        assert ("role", "a") in coord.client.calls
        await replicas.close()

    asyncio.run(body())


def test_a_failed_write_is_not_stored_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = FileMetaStore.open(str(tmp_path))
        one = TopicRecord(TopicMeta(partition_num=1), {0: ("a",)})
        await store.put("t", one)
        real = meta_store.write_durable

        def full(path: str, data: bytes) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(meta_store, "write_durable", full)
        two = TopicRecord(TopicMeta(partition_num=2), {0: ("a",), 1: ("a",)})
        with pytest.raises(OSError):
            await store.put("t", two)
        with pytest.raises(OSError):
            await store.delete("t")
        monkeypatch.setattr(meta_store, "write_durable", real)
        await store.put("u", one)
        assert read_meta_file(store.path) == {"t": one, "u": one}
        assert await store.get("t") == one

    asyncio.run(body())
