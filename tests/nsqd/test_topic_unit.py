"""Topic alone: routing to its local partitions, channels made in each, what the
partitions share (pausing, counts, settings, tracing) and deletion, with a fake of the
node it reaches through nsqx.nsqd.host (no sockets, no NSQD)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from fakehost import FakeHost
from nsqx.nsqd.topic import Topic
from nsqx.wire.topic_meta import TopicMeta


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]


async def turn() -> None:
    await asyncio.sleep(0)


def test_a_topic_routes_to_its_local_partitions(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t", TopicMeta(partition_num=4))
        assert topic.partition(-1) is None and topic.channels == {}
        p3 = topic.add_partition(3)
        assert topic.default_partition is p3
        p1 = topic.add_partition(1)
        assert topic.add_partition(1) is p1  # made once
        # the default is the lowest local partition (Youzan's rule)
        assert list(topic.partitions) == [1, 3]
        assert topic.partition(-1) is p1 and topic.default_partition is p1
        assert topic.partition(3) is p3 and topic.partition(0) is None
        assert host.added == [p3, p1]
        assert [(e.kind, e.partition, persist) for e, persist in host.events] == [
            ("create", 3, True),
            ("create", 1, True),
        ]
        assert p1.directory == os.path.join(str(tmp_path), "t.topic", "p1")
        topic.close()

    run(main)


def test_channels_are_made_and_deleted_in_every_local_partition(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t", TopicMeta(partition_num=2))
        p0, p1 = topic.add_partition(0), topic.add_partition(1)
        ch = topic.get_channel("a")
        topic.get_channel("b")
        assert ch is p0.channels["a"] and topic.channels is p0.channels
        assert list(p1.channels) == ["a", "b"]
        assert topic.channel_names() == ["a", "b"]
        topic.delete_channel("a")
        assert topic.channel_names() == ["b"] and list(p1.channels) == ["b"]
        deleted = [(e.partition, e.channel) for e, _ in host.events if e.kind == "delete"]
        assert deleted == [(0, "a"), (1, "a")]
        topic.close()

    run(main)


def test_what_the_partitions_share(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t", TopicMeta(partition_num=2))
        p0, p1 = topic.add_partition(0), topic.add_partition(1)
        ch = topic.get_channel("c")
        p0.publish([b"a", b"b"])
        p1.publish([b"ccc"])
        await turn()
        assert (topic.message_count, topic.message_bytes, topic.depth) == (3, 5, 0)
        topic.pause()
        assert p0.paused and p1.paused
        p1.publish([b"d"])
        await turn()
        assert topic.depth == 1
        topic.unpause()
        assert topic.depth == 0 and not p1.paused
        # new settings reach every partition's channels
        topic.set_meta(TopicMeta(partition_num=2, ordered=True))
        assert topic.ordered and ch.ordered and p1.channels["c"].ordered
        topic.close()

    run(main)


def test_traced_publishes_go_to_the_hosts_tracer(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t")
        part = topic.add_partition(0)
        part.publish([b"plain"])
        part.publish([b"traced", b"zero"], trace_ids=[7, 0])
        assert [(e["event"], e["trace_id"]) for e in host.tracer.events] == [
            ("PUB", 7),
            ("PUB", 0),
        ]
        topic.trace_enabled = True
        part.publish([b"all"])
        assert len(host.tracer.events) == 3
        await turn()
        topic.close()

    run(main)


def test_an_ephemeral_topic_lives_in_memory(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t#ephemeral")
        part = topic.add_partition(0)
        assert topic.directory is None and not topic.durable
        assert not part.log.durable and part.directory is None
        assert all(not persist for _, persist in host.events)
        assert os.listdir(tmp_path) == []

    run(main)


def test_deleting_a_topic_removes_its_partitions_and_files(tmp_path: Path) -> None:
    async def main() -> None:
        host = FakeHost(str(tmp_path))
        topic = Topic(host, "t", TopicMeta(partition_num=2))
        p0, p1 = topic.add_partition(0), topic.add_partition(1)
        topic.get_channel("c")
        p0.publish([b"x"])
        await turn()
        topic.remove_partition(1)
        assert host.removed_partitions == [p1] and p1.deleted
        assert list(topic.partitions) == [0]
        assert not os.path.exists(os.path.join(str(tmp_path), "t.topic", "p1"))
        topic.delete()
        assert topic.deleted and p0.deleted and topic.partitions == {}
        assert host.removed_partitions == [p1, p0]
        assert not os.path.exists(os.path.join(str(tmp_path), "t.topic"))

    run(main)
