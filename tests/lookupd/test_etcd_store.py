"""EtcdMetaStore and Leadership against a real etcd process, in-process: records shared
and followed, compare-and-swap writes, the leader fence, and leases."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nsqx.lookupd.etcd_client import EtcdClient, EtcdUnavailable
from nsqx.lookupd.etcd_store import EtcdKeys, EtcdMetaStore
from nsqx.lookupd.leadership import Leadership, LookupdNode
from nsqx.lookupd.meta_store import ConflictError, MetaStoreUnavailable, NotLeaderError
from nsqx.lookupd.topic_record import TopicRecord
from nsqx.wire.topic_meta import TopicMeta

from etcdproc import EtcdProcess, free_port

_ids = itertools.count()

R1 = TopicRecord(TopicMeta(2), {0: ("n1",), 1: ("n2",)}, ("c1",))
R2 = TopicRecord(TopicMeta(3), {0: ("n1",), 1: ("n2",), 2: ("n1",)}, ("c1", "c2"))


def cluster() -> EtcdKeys:
    return EtcdKeys(f"store-test-{next(_ids)}")


async def until(cond: Callable[[], object], what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def test_records_are_shared_and_followed(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        writer_client, reader_client = (EtcdClient([shared_etcd.endpoint]) for _ in range(2))
        writer = EtcdMetaStore(writer_client, keys)
        reader = EtcdMetaStore(reader_client, keys)
        seen: list[tuple[str, TopicRecord | None]] = []
        reader.follow(lambda t, r: seen.append((t, r)))
        await reader.synced.wait()
        await writer.put("t1", R1)
        await until(lambda: seen == [("t1", R1)], "the reader sees the new record")
        await writer.put("t1", R2)
        await writer.put("t2", R1)
        await writer.delete("t1")
        await until(lambda: len(seen) == 4, "every change")
        assert seen[1:] == [("t1", R2), ("t2", R1), ("t1", None)]
        assert await reader.get("t2") == R1 and await reader.get("t1") is None
        # a fresh store reads what is there; the record is the JSON to_json() gives
        fresh = EtcdMetaStore(reader_client, keys)
        assert await fresh.list() == {"t2": R1}
        _, kvs = await writer_client.range(keys.topic("t2"))
        assert json.loads(kvs[0].value) == R1.to_json()
        # the writer's own changes never come back to it as someone else's
        mine: list[object] = []
        writer.follow(lambda t, r: mine.append((t, r)))
        await writer.synced.wait()
        await writer.put("t3", R2)
        await until(lambda: len(seen) == 5, "the reader sees t3")
        assert mine == []
        for s in (writer, reader):
            await s.close()
        await writer_client.close()
        await reader_client.close()

    run(body)


def test_a_write_never_loses_a_concurrent_change(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        client = EtcdClient([shared_etcd.endpoint])
        a, b = EtcdMetaStore(client, keys), EtcdMetaStore(client, keys)
        await a.put("t", R1)
        assert await b.list() == {"t": R1}
        await a.put("t", R2)
        # b still holds R1's revision: its write would undo a's, so it is refused and
        # b learns the newer record
        with pytest.raises(ConflictError):
            await b.put("t", TopicRecord(TopicMeta(7)))
        assert await b.get("t") == R2
        await b.put("t", R1)  # now it compares the right revision
        with pytest.raises(ConflictError):
            await a.delete("t")
        # a record created meanwhile is not overwritten by a store that thought it absent
        c = EtcdMetaStore(client, keys)
        await a.list()
        await c.put("new", R1)
        with pytest.raises(ConflictError):
            await a.put("new", R2)
        assert (await EtcdMetaStore(client, keys).list())["new"] == R1
        await client.close()

    run(body)


def test_only_the_fenced_leader_writes(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        client = EtcdClient([shared_etcd.endpoint])
        fence: list[int | None] = [None]
        store = EtcdMetaStore(client, keys, fence=lambda: fence[0])
        with pytest.raises(NotLeaderError):
            await store.put("t", R1)
        # leading by a leader key of create revision N: writes compare N
        epoch = await client.put(keys.leader, b"{}")
        fence[0] = epoch
        await store.put("t", R1)
        # another leader took over (the key was made again): the old fence fails in
        # etcd, even though this store still believes it leads
        await client.delete(keys.leader)
        await client.put(keys.leader, b"{}")
        with pytest.raises(NotLeaderError):
            await store.put("t", R2)
        with pytest.raises(NotLeaderError):
            await store.delete("t")
        assert await EtcdMetaStore(client, keys).list() == {"t": R1}
        await client.close()

    run(body)


def test_etcd_out_of_reach(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        dead = f"http://127.0.0.1:{free_port()}"
        client = EtcdClient([dead], connect_timeout=0.5)
        store = EtcdMetaStore(client, keys)
        with pytest.raises(MetaStoreUnavailable):
            await store.put("t", R1)
        with pytest.raises(MetaStoreUnavailable):
            await store.list()
        with pytest.raises(EtcdUnavailable):
            async for _ in client.watch(keys.root):
                pass
        await client.close()
        # a dead endpoint first: the next one answers
        client = EtcdClient([dead, shared_etcd.endpoint], connect_timeout=0.5)
        store = EtcdMetaStore(client, keys)
        await store.put("t", R1)
        assert await EtcdMetaStore(client, keys).list() == {"t": R1}
        await client.close()

    run(body)


def test_a_record_that_is_not_one_is_left_alone(
    shared_etcd: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        keys = cluster()
        client = EtcdClient([shared_etcd.endpoint])
        store = EtcdMetaStore(client, keys)
        seen: list[str] = []
        store.follow(lambda t, r: seen.append(t))
        await store.synced.wait()
        await client.put(keys.topic("junk"), b"not json")
        await client.put(keys.topic("bad"), json.dumps({"meta": {}}).encode())
        await client.put(keys.topic("ok"), json.dumps(R1.to_json()).encode())
        await until(lambda: seen == ["ok"], "the good record")
        assert await EtcdMetaStore(client, keys).list() == {"ok": R1}
        await store.close()
        await client.close()

    with caplog.at_level(logging.ERROR, "nsqx.lookupd"):
        run(body)
    assert any("is not a topic record" in r.getMessage() for r in caplog.records)


class Node:
    """A Leadership with counters of its elections and depositions."""

    def __init__(self, client: EtcdClient, keys: EtcdKeys, port: int, ttl: int = 2) -> None:
        self.events: list[str] = []
        self.leadership = Leadership(
            client,
            keys,
            LookupdNode.make("127.0.0.1", port, port + 1),
            ttl,
            self._elected,
            self._deposed,
        )

    async def _elected(self) -> None:
        self.events.append("elected")

    async def _deposed(self) -> None:
        self.events.append("deposed")


def test_one_leads_and_a_clean_stop_hands_over(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        client = EtcdClient([shared_etcd.endpoint])
        # a TTL far longer than the test's waits: the handover comes from revocation
        nodes = [Node(client, keys, 1000 + 10 * i, ttl=60) for i in range(3)]
        for n in nodes:
            n.leadership.start()

        def leaders() -> list[Node]:
            return [n for n in nodes if n.leadership.leading]

        await until(lambda: len(leaders()) == 1, "one leader")
        first = leaders()[0]
        epoch = first.leadership.fence()
        assert epoch is not None and first.events == ["elected"]
        others = [n for n in nodes if n is not first]
        await until(
            lambda: all(n.leadership.leader == first.leadership.leader for n in others),
            "everyone knows the leader",
        )
        assert all(n.leadership.fence() is None for n in others)
        listed = await others[0].leadership.nodes()
        assert sorted(n.id for n in listed) == sorted(n.leadership.node.id for n in nodes)
        await first.leadership.close()
        assert first.events == ["elected", "deposed"] and first.leadership.fence() is None
        await until(lambda: len(leaders()) == 1, "a new leader")
        second = leaders()[0]
        new_epoch = second.leadership.fence()
        assert new_epoch is not None and new_epoch > epoch
        assert len(await second.leadership.nodes()) == 2
        # the leader key deleted by hand: the leader steps down and campaigns again
        await client.delete(keys.leader)
        await until(lambda: "deposed" in second.events, "the leader steps down")
        await until(lambda: len(leaders()) == 1, "a leader again")
        for n in others:
            await n.leadership.close()
        await client.close()

    run(body)


def test_a_leader_steps_down_when_etcd_goes(etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = cluster()
        client = EtcdClient([etcd.endpoint], connect_timeout=0.5)
        node = Node(client, keys, 2000, ttl=2)
        node.leadership.start()
        await until(lambda: node.leadership.leading, "leading")
        etcd.stop()
        await until(lambda: not node.leadership.leading, "stepped down")
        assert node.events == ["elected", "deposed"] and node.leadership.fence() is None
        assert node.leadership.leader is None
        etcd.start()
        await until(lambda: node.leadership.leading, "leading again", timeout=20)
        assert node.events == ["elected", "deposed", "elected"]
        await node.leadership.close()
        await client.close()

    run(body)


def test_node_json_is_youzans() -> None:
    node = LookupdNode.make("10.0.0.1", 4160, 4161)
    assert node.to_json() == {
        "ID": "10.0.0.1::4160:nsqlookup",
        "NodeIP": "10.0.0.1",
        "TcpPort": "4160",
        "HttpPort": "4161",
        "RpcPort": "",
        "Epoch": 0,
    }
    assert LookupdNode.decode(node.encode(), 7) == LookupdNode(node.id, node.ip, 4160, 4161, 7)
    bad: list[Any] = [
        b"",
        b"[]",
        b'{"ID":"x"}',
        b'{"ID":"x","NodeIP":"","TcpPort":"a","HttpPort":"1"}',
    ]
    assert all(LookupdNode.decode(raw) is None for raw in bad)
