"""A fake of the node a topic and its partitions live in (nsqx.nsqd.host), for unit
tests of Topic and Partition without sockets or an NSQD: real options, loop turn and
tracer; what the topic and its partitions tell the node is recorded."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.loopturn import LoopTurn
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.partition import Partition
from nsqx.nsqd.replication.replica import PartitionReplica
from nsqx.nsqd.syncer import LogSyncer
from nsqx.nsqd.tracer import Tracer


class FakeReplicas:
    """No replication: a unit test's topics have one replica."""

    def attach(self, part: Partition) -> PartitionReplica:
        raise AssertionError(f"{part} replicated in a unit test")

    def detach(self, part: Partition) -> None:
        raise AssertionError(f"{part} replicated in a unit test")


class FakeHost:
    """What nsqx.nsqd.host's TopicHost asks for, with every call recorded."""

    def __init__(self, data_path: str = "", **options: Any) -> None:
        self.options = NsqdOptions(data_path=data_path, **options)
        self.data_path = data_path
        self.turn = LoopTurn(0.0)
        self.replication = FakeReplicas()
        self.tracer = Tracer()
        #: (event, persist) of every topology change, in order
        self.events: list[tuple[TopologyEvent, bool]] = []
        self.deleted_topics: list[str] = []
        self.metadata_writes = 0
        #: files unlinked through remove_later
        self.removed: list[str] = []
        self.added: list[Partition] = []
        self.removed_partitions: list[Partition] = []
        #: keys asked for by acknowledged()
        self.acknowledged_keys: list[set[tuple[str, int]]] = []
        #: (channel, frame, attempts, first, last) of every dead letter
        self.dead: list[tuple[str, bytes, int, int, int]] = []
        #: the real syncers (fsyncs in a thread) of the partitions sync_partitions named
        self.syncers: dict[tuple[str, int], LogSyncer] = {}

    def topology_changed(self, event: TopologyEvent, persist: bool = True) -> None:
        self.events.append((event, persist))

    def delete_topic(self, name: str) -> None:
        self.deleted_topics.append(name)

    def metadata_changed(self) -> None:
        self.metadata_writes += 1

    def remove_later(self, path: str) -> None:
        os.remove(path)
        self.removed.append(path)

    def dead_letter(
        self,
        channel: Any,
        frame: bytes,
        attempts: int,
        first_ns: int,
        last_ns: int,
        on_done: Callable[[BaseException | None], None],
    ) -> None:
        """Recorded in ``dead``, and acknowledged on the next loop iteration."""
        self.dead.append((channel.name, frame, attempts, first_ns, last_ns))
        asyncio.get_running_loop().call_soon(on_done, None)

    def acknowledged(self, keys: set[tuple[str, int]]) -> asyncio.Future[Any]:
        """Done at once: the fake's writes count as fsynced (nothing is replicated)."""
        self.acknowledged_keys.append(keys)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result([None])
        return fut

    def sync_partitions(self, keys: set[tuple[str, int]]) -> asyncio.Future[list[None]]:
        """As nsqd does: each durable partition's LogSyncer fsyncs in a thread."""
        futures = []
        for part in self.added:
            if part.key in keys and part.log.durable:
                syncer = self.syncers.setdefault(part.key, LogSyncer(part.log))
                futures.append(syncer.request())
        return asyncio.gather(*futures)

    def partition_added(self, part: Partition) -> None:
        self.added.append(part)

    def partition_removed(self, part: Partition) -> None:
        self.removed_partitions.append(part)
