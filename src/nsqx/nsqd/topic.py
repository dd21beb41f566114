"""Topic: a named stream of messages, as the partitions of it that this node hosts."""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING

from nsqx.nsqd.channel import Channel
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.partition import Partition
from nsqx.wire.names import is_ephemeral
from nsqx.wire.topic_meta import DEFAULT_META, TopicMeta

if TYPE_CHECKING:
    from nsqx.nsqd.host import TopicHost

log = logging.getLogger("nsqx.nsqd")


class Topic:
    """Topic routes to its local partitions and holds what they share: the topic's
    settings (partition count, ordering, ext headers ...), pausing and tracing.

    An NSQ 1.3 topic is one partition, 0. A client that names no partition gets the
    topic's default partition here: the lowest one this node hosts (Youzan's rule for
    a node that leads one partition of the topic).
    """

    def __init__(self, nsqd: TopicHost, name: str, meta: TopicMeta = DEFAULT_META) -> None:
        #: the node, reached only through this seam (nsqx.nsqd.host)
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.meta = meta
        #: meta.ordered, read on every publish (meta is not a compiled class)
        self.ordered = meta.ordered
        self.partitions: dict[int, Partition] = {}
        # the lowest one, looked up once: every publish that names no partition asks
        self._default: Partition | None = None
        self.paused = False
        self.deleted = False
        #: /message/trace/enable: every message of the topic is traced
        self.trace_enabled = False
        #: one shard per worker (--worker-shards, nsqx.nsqd.workers.shards): a consumer
        #: that names no partition gets every local partition's messages (nsqx.nsqd.fanin)
        self.sharded = False
        #: where this topic's files live (None: memory only)
        self.directory: str | None = None
        if not self.ephemeral:
            # the suffix keeps names such as "." or ".." harmless as paths
            self.directory = os.path.join(nsqd.data_path, f"{name}.topic")

    def __repr__(self) -> str:
        return f"<topic {self.name} {sorted(self.partitions)}>"

    @property
    def durable(self) -> bool:
        return self.directory is not None

    # -- partitions ---------------------------------------------------------------------

    def add_partition(self, pid: int) -> Partition:
        """The local partition ``pid``, made (its log opened or created) if needed."""
        part = self.partitions.get(pid)
        if part is None:
            part = Partition(self, pid)
            self.partitions[pid] = part
            self.partitions = dict(sorted(self.partitions.items()))
            self._default = None
            self.nsqd.partition_added(part)
            log.info("TOPIC(%s): created partition %d", self.name, pid)
            self.nsqd.topology_changed(
                TopologyEvent("create", self.name, None, pid), persist=not self.ephemeral
            )
        return part

    def remove_partition(self, pid: int) -> None:
        """Delete the local partition ``pid`` and its files."""
        part = self.partitions.pop(pid, None)
        if part is None:
            return
        part.delete()
        self.nsqd.partition_removed(part)
        log.info("TOPIC(%s): deleted partition %d", self.name, pid)
        self.nsqd.topology_changed(
            TopologyEvent("delete", self.name, None, pid), persist=not self.ephemeral
        )

    @property
    def default_partition(self) -> Partition:
        """The partition a client that names none uses (the lowest local one)."""
        part = self._default
        if part is None or self.partitions.get(part.id) is not part:
            part = self._default = next(iter(self.partitions.values()))
        return part

    def partition(self, pid: int) -> Partition | None:
        """The local partition ``pid`` (-1: the default one), or None."""
        if pid < 0:
            return self.default_partition if self.partitions else None
        return self.partitions.get(pid)

    @property
    def channels(self) -> dict[str, Channel]:
        """The default partition's channels (all an NSQ 1.3 topic has)."""
        return self.default_partition.channels if self.partitions else {}

    def channel_names(self) -> list[str]:
        """Every channel name of any local partition, in creation order."""
        names: dict[str, None] = {}
        for part in self.partitions.values():
            names.update(dict.fromkeys(part.channels))
        return list(names)

    def get_channel(self, name: str, start: int | None = None) -> Channel:
        """The channel ``name`` in every local partition (created where missing);
        returns the default partition's."""
        channels = [p.get_channel(name, start) for p in self.partitions.values()]
        return channels[0]

    def delete_channel(self, name: str) -> None:
        for part in list(self.partitions.values()):
            part.delete_channel(name)

    def set_meta(self, meta: TopicMeta) -> None:
        """New settings (nsqlookupd or the API changed them); persisted by the caller."""
        if meta != self.meta:
            log.info("TOPIC(%s): settings %s", self.name, meta)
            self.meta = meta
            self.ordered = meta.ordered
            if meta.ordered:
                for part in self.partitions.values():
                    for ch in part.channels.values():
                        ch.set_ordered(True)

    # -- what the partitions share ------------------------------------------------------

    @property
    def message_count(self) -> int:
        return sum(p.message_count for p in self.partitions.values())

    @property
    def message_bytes(self) -> int:
        return sum(p.message_bytes for p in self.partitions.values())

    @property
    def depth(self) -> int:
        return sum(p.depth for p in self.partitions.values())

    def pause(self) -> None:
        """Stop channels from seeing new messages (persisted by the caller)."""
        self.paused = True
        for part in self.partitions.values():
            part.pause()

    def unpause(self) -> None:
        self.paused = False
        for part in self.partitions.values():
            part.unpause()

    def empty(self) -> None:
        for part in self.partitions.values():
            part.empty()

    def traced_publish(
        self, part: Partition, ids: list[bytes], trace_ids: list[int] | None, offset: int
    ) -> None:
        """Trace a publish if the topic is traced or a message has a trace id."""
        if self.trace_enabled or (trace_ids is not None and any(trace_ids)):
            self.nsqd.tracer.published(part, ids, trace_ids, offset)

    # -- lifecycle ----------------------------------------------------------------------

    def checkpoint(self) -> None:
        for part in self.partitions.values():
            part.checkpoint()

    def close(self) -> None:
        """Shut down: checkpoint channels, fsync and close the logs."""
        for part in self.partitions.values():
            part.close()

    def delete(self) -> None:
        """Deleted: close channels and remove the files."""
        self.deleted = True
        for pid in list(self.partitions):
            part = self.partitions.pop(pid)
            part.delete()
            self.nsqd.partition_removed(part)
        if self.directory is not None:
            if getattr(self.nsqd, "workers", None) is None:
                shutil.rmtree(self.directory, ignore_errors=True)
            else:
                # other workers' partitions of the topic live here too (--workers): the
                # directory goes with the last of them
                try:
                    os.rmdir(self.directory)
                except OSError:
                    pass
