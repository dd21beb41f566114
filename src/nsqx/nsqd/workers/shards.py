"""Topics of NSQ 1.3 split over the workers: one shard per worker (``--worker-shards``).

A topic of NSQ 1.3 is one partition, and a partition has one owner: with forwarding or
moved connections alike, one busy topic is as fast as one worker. With shards, such a
topic has one partition in every worker (*shard* ``p`` lives in the worker
:func:`~.ownership.owner_of` names for ``p``, so worker ``i`` holds
:func:`shard_of` ``(topic, i)``): a publish that names no partition is written where its
connection is, with no hop, and a consumer that names no partition gets every shard's
messages through one connection (nsqx.nsqd.fanin). NSQ 1.3 promises no order between
messages, so nothing a client of it relies on changes; a Youzan client sees the shards
as the topic's partitions on this node.

Who decides: the owner of partition 0, where a topic of NSQ 1.3 is made today. It makes
a new topic of default settings (not ephemeral) as sharded, shards such a topic loaded
from nsqd.dat at its start (its partition 0 is shard 0), and tells the other workers
(:data:`SHARDS`), which make their shards at once, with the topic's channels. A channel
made on one shard is made on all (:data:`SHARD_CHANNEL`). Until a worker heard of the
topic its publishes and subscriptions go to partition 0's owner as before, which is
correct, only not spread. nsqd.dat marks the topic (``worker_shards``), so a restart,
with any number of workers, keeps it sharded.
"""

from __future__ import annotations

import logging
import zlib
from typing import TYPE_CHECKING, Any, Final

from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire.names import is_ephemeral
from nsqx.wire.topic_meta import DEFAULT_META

if TYPE_CHECKING:
    from nsqx.nsqd.topic import Topic
    from nsqx.nsqd.workers.forwarding import WorkerSet
    from nsqx.nsqd.workers.links import Link

log = logging.getLogger("nsqx.nsqd")

#: (SHARDS, topic, worker index, its shards, its channels, answer, paused, paused
#: channels): a worker holds these shards of a sharded topic; ``answer``: the receiver
#: sends its own back; the pause states are taken by a shard or channel made by it
SHARDS: Final = "shards"
#: (SHARD_CHANNEL, topic, channel): a channel of a sharded topic was made
SHARD_CHANNEL: Final = "shard_ch"


def shard_of(topic: str, index: int, workers: int) -> int:
    """The shard (partition id) of ``topic`` that worker ``index`` holds: the inverse
    of :func:`~.ownership.owner_of` over partitions 0 to ``workers`` - 1."""
    return (index - zlib.crc32(topic.encode())) % workers


class Shards:
    """This worker's view of the node's sharded topics."""

    def __init__(self, workers: WorkerSet, enabled: bool) -> None:
        self.workers = workers
        #: --worker-shards: new topics of NSQ 1.3 are sharded (those sharded before, as
        #: nsqd.dat says, stay so either way)
        self.enabled = enabled
        #: sharded topic -> every shard of it in the node (as the workers said)
        self.topics: dict[str, set[int]] = {}
        #: bumped when a topic becomes sharded (connections cache where they publish)
        self.generation = 0
        workers.handlers[SHARDS] = self._on_shards
        workers.handlers[SHARD_CHANNEL] = self._on_channel

    def start(self) -> None:
        """Follow the topology; shard the topics of NSQ 1.3 loaded here (with
        --worker-shards), and tell the others of the sharded topics loaded here."""
        nsqd = self.workers.nsqd
        nsqd.watchers.append(self._topology)
        became = [
            t for t in nsqd.topics.values() if self._may_shard(t) and list(t.partitions) == [0]
        ]
        for topic in became:
            # its partition 0 (its backlog, channels and cursors) is this worker's shard;
            # the other workers make theirs, empty, when they hear of it below
            topic.sharded = True
            log.info("TOPIC(%s): sharded over %d workers", topic.name, self.workers.count)
        if became:
            nsqd.persist_metadata()
        for topic in nsqd.topics.values():
            if topic.sharded:
                self._known(topic)
                self._announce(topic, answer=True)

    def close(self) -> None:
        nsqd = self.workers.nsqd
        if self._topology in nsqd.watchers:
            nsqd.watchers.remove(self._topology)

    def sharded(self, name: str) -> bool:
        return name in self.topics

    def own(self, name: str) -> int:
        """The shard of ``name`` this worker holds."""
        return shard_of(name, self.workers.index, self.workers.count)

    def every(self, name: str) -> list[int]:
        """Every shard of ``name`` in the node: one per worker, and any more that the
        workers hold (made with another number of workers)."""
        count = self.workers.count
        pids = {shard_of(name, i, count) for i in range(count)}
        pids.update(self.topics.get(name, ()))
        return sorted(pids)

    def _may_shard(self, topic: Topic) -> bool:
        """A topic as NSQ 1.3 makes one (default settings, not ephemeral, not sharded
        yet) whose partition 0 this worker owns (it decides), with --worker-shards."""
        workers = self.workers
        return (
            self.enabled
            and not topic.sharded
            and not topic.ephemeral
            and topic.meta == DEFAULT_META
            and owner_of(topic.name, 0, workers.count) == workers.index
        )

    def made(self, topic: Topic) -> None:
        """``topic`` was just made here, new, as NSQ 1.3 makes a topic: shard it if this
        worker owns partition 0 (it decides), and tell the others."""
        if not self._may_shard(topic):
            topic.add_partition(0)
            return
        topic.sharded = True
        topic.add_partition(self.own(topic.name))
        self._known(topic)
        self._announce(topic, answer=True)

    def learned(self, name: str) -> Topic | None:
        """Another worker answered that ``name`` is sharded (its word may come later
        on another link): this worker's shard, made now (None: a topic of other
        settings lives here under that name)."""
        existing = self.workers.nsqd.topics.get(name)
        if existing is not None and not existing.sharded and existing.partitions:
            return None
        if name not in self.topics:
            self.topics[name] = set()
            self.generation += 1
        topic = self._local(name)
        self.topics[name].update(topic.partitions)
        return topic

    def _local(self, name: str) -> Topic:
        nsqd = self.workers.nsqd
        topic = nsqd.topics.get(name)
        if topic is None:
            topic = nsqd._new_topic(name, DEFAULT_META)
        topic.sharded = True
        own = self.own(name)
        if own not in topic.partitions:
            topic.add_partition(own)
        return topic

    def _known(self, topic: Topic) -> None:
        pids = self.topics.get(topic.name)
        if pids is None:
            pids = self.topics[topic.name] = set()
            self.generation += 1
        pids.update(topic.partitions)

    def _announce(self, topic: Topic, answer: bool, to: int = -1) -> None:
        item = (
            SHARDS,
            topic.name,
            self.workers.index,
            sorted(topic.partitions),
            [c for c in topic.channel_names() if not is_ephemeral(c)],
            answer,
            topic.paused,
            sorted(
                {
                    name
                    for part in topic.partitions.values()
                    for name, ch in part.channels.items()
                    if ch.paused and not ch.ephemeral
                }
            ),
        )
        links = self.workers.links
        for i in range(self.workers.count):
            if i != self.workers.index and (to < 0 or i == to):
                links.link(i).send(item)
        # and back on the links the others opened, ahead of the answers to what they
        # asked meanwhile (a publish that made the topic): a publisher that reads its
        # answer there knows, by then, that it publishes where it is
        for link in list(links.incoming):
            if not link.closed and link.peer >= 0 and (to < 0 or link.peer == to):
                link.send(item)

    def _on_shards(self, link: Link, item: tuple[Any, ...]) -> None:
        _, name, index, pids, channels, answer, paused, paused_channels = item
        nsqd = self.workers.nsqd
        existing = nsqd.topics.get(name)
        if existing is not None and not existing.sharded and existing.partitions:
            # a topic of other settings already lives here under that name (made before
            # this word came): it stays as it is
            log.warning("WORKERS: topic %s is sharded on worker %d but not here", name, index)
            return
        known = self.topics.setdefault(name, set())
        if not known:
            self.generation += 1
        known.update(pids)
        own = self.own(name)
        new_shard = existing is None or own not in existing.partitions
        topic = self._local(name)
        # a shard made now takes the topic's pause, and a channel made now the channel's
        # (an existing topic sharded at start may have been paused): what an HTTP pause
        # did after reached every worker anyway
        changed = new_shard and paused and not topic.paused
        if changed:
            topic.pause()
        for channel in channels:
            missing = [p for p in topic.partitions.values() if channel not in p.channels]
            topic.get_channel(channel)
            if channel in paused_channels:
                for part in missing:
                    part.channels[channel].pause()
                    changed = True
        if changed:
            nsqd.persist_metadata()
        known.update(topic.partitions)
        if answer:
            self._announce(topic, answer=False, to=index)

    def _on_channel(self, link: Link, item: tuple[Any, ...]) -> None:
        _, name, channel = item
        topic = self.workers.nsqd.topics.get(name)
        if topic is not None and topic.sharded and channel not in topic.channel_names():
            topic.get_channel(channel)

    def _topology(self, event: TopologyEvent) -> None:
        name = event.topic
        if name not in self.topics:
            return
        topic = self.workers.nsqd.topics.get(name)
        if event.kind == "create" and event.channel is not None:
            # (an ephemeral channel lives where its consumers are: a fan-in's SUB makes
            # it on every shard, and it goes with them)
            if topic is not None and topic.sharded and not is_ephemeral(event.channel):
                item = (SHARD_CHANNEL, name, event.channel)
                for i in range(self.workers.count):
                    if i != self.workers.index:
                        self.workers.links.link(i).send(item)
        elif event.kind == "delete" and event.channel is None and topic is None:
            # deleted here (an HTTP delete reaches every worker): forget it
            del self.topics[name]
            self.generation += 1
