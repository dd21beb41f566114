"""The seams between nsqd's node and the topics and partitions it hosts.

A :class:`~nsqx.nsqd.partition.Partition` reaches its node only through
:class:`PartitionHost`, and a :class:`~nsqx.nsqd.topic.Topic` through
:class:`TopicHost`: the handful of things they need (settings, the loop's group commit,
replication, tracing, telling the node what changed), as Youzan's nsqd gives its topics
an ``INsqdNotify`` rather than the whole node. NSQD satisfies both; unit tests drive a
partition or a topic on a fake of them (tests/nsqd/test_partition_unit.py), and a
partition can move to another owner (a worker process) that provides the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.events import TopologyEvent
    from nsqx.nsqd.loopturn import LoopTurn
    from nsqx.nsqd.options import NsqdOptions
    from nsqx.nsqd.partition import Partition
    from nsqx.nsqd.replication.replica import PartitionReplica
    from nsqx.nsqd.tracer import Tracer


class Replicas(Protocol):
    """Where a replicated partition gets its replication state (the node's manager)."""

    def attach(self, part: Partition) -> PartitionReplica:
        """A replicated partition was opened or created here: its replica state."""
        ...

    def detach(self, part: Partition) -> None:
        """The partition closes or goes: forget its replica state."""
        ...


class PartitionHost(Protocol):
    """What a partition (and its channels) needs from the node that hosts it."""

    @property
    def options(self) -> NsqdOptions:
        """The node's settings (mem-queue-size, sync and retention, message timeouts)."""
        ...

    @property
    def turn(self) -> LoopTurn:
        """The loop's iteration: where a partition asks for its group commit at the end of
        the iteration (``commit_soon``) and reports a failed write (``health_error``)."""
        ...

    @property
    def replication(self) -> Replicas:
        """Replication state of replicated partitions."""
        ...

    @property
    def tracer(self) -> Tracer:
        """Message tracing (publishes, deliveries, FINs)."""
        ...

    def topology_changed(self, event: TopologyEvent, persist: bool = True) -> None:
        """A channel or partition was made or deleted (lookupd registration, metadata)."""
        ...

    def delete_topic(self, name: str) -> None:
        """An ephemeral topic lost its last channel: the node drops it."""
        ...

    def metadata_changed(self) -> None:
        """Something nsqd.dat keeps changed (a follower's replay marks): write it."""
        ...

    def remove_later(self, path: str) -> None:
        """Unlink a reclaimed file off the loop."""
        ...

    def dead_letter(
        self,
        channel: Channel,
        frame: bytes,
        attempts: int,
        first_ns: int,
        last_ns: int,
        on_done: Callable[[BaseException | None], None],
    ) -> None:
        """Publish ``frame`` (of ``channel``, delivered ``attempts`` times, first and
        last at these wall-clock times) to the channel's dead-letter topic; call
        ``on_done`` once, later, with None when that is acknowledged or the error."""
        ...

    def acknowledged(self, keys: set[tuple[str, int]]) -> asyncio.Future[Any]:
        """A future done once the writes so far to these partitions (by key) are
        fsynced (--sync-before-ack) and held by their ISR if replicated."""
        ...

    def sync_partitions(self, keys: set[tuple[str, int]]) -> asyncio.Future[list[None]]:
        """A future done once the writes so far to these partitions are fsynced (an
        fsync starts now if none is running)."""
        ...


class TopicHost(PartitionHost, Protocol):
    """What a topic needs from its node besides what its partitions need."""

    @property
    def data_path(self) -> str:
        """The node's data directory (a durable topic's files are below it)."""
        ...

    def partition_added(self, part: Partition) -> None:
        """A partition was opened or made here (its log may need fsyncs)."""
        ...

    def partition_removed(self, part: Partition) -> None:
        """A partition was deleted here."""
        ...
