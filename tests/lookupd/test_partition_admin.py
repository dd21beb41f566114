"""Administration of partitioned topics through nsqlookupd (Youzan's /topic/create,
/topic/delete, /topic/partition/expand, /topic/meta/update, /channel/create|delete):
validation with Youzan's codes and texts, placement on the registered nodes, the calls
to nsqd's HTTP API, reconciliation, and persistence across a restart.

The error texts marked "Youzan" were checked against Youzan's running nsqlookupd.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from partition_fakes import (
    V1Client,
    get_json,
    http,
    post,
    run,
    start_lookupd,
    start_nodes,
    wait_for,
)

from nsqx.lookupd.meta_store import META_FILE

NODE_UNAVAILABLE = "ErrType:9 ErrCode:1 : No node is available for topic"  # Youzan


@pytest.mark.parametrize(
    ("query", "message"),
    [
        # Youzan's, in its order
        ("partition_num=1", "MISSING_ARG_TOPIC"),
        ("topic=&partition_num=1", "MISSING_ARG_TOPIC"),
        ("topic=bad!&partition_num=1&replicator=1", "INVALID_ARG_TOPIC"),
        ("topic=t&replicator=1", "MISSING_ARG_TOPIC_PARTITION_NUM"),
        ("topic=t&partition_num=0&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=t&partition_num=256&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=t&partition_num=x&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=t&partition_num=+1&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=t&partition_num=1", "MISSING_ARG_TOPIC_REPLICATOR"),
        ("topic=t&partition_num=1&replicator=6", "INVALID_ARG_TOPIC_REPLICATOR"),
        ("topic=t&partition_num=1&replicator=1&suggestload=x", "INVALID_ARG_TOPIC_LOAD_FACTOR"),
        ("topic=t&partition_num=1&replicator=1&syncdisk=x", "INVALID_ARG_TOPIC_SYNC_DISK"),
        # nsqx's (Youzan: Go's parse error; it takes negative values)
        ("topic=t&partition_num=1&replicator=1&retention=x", "INVALID_ARG_TOPIC_RETENTION"),
        ("topic=t&partition_num=1&replicator=1&retention=-1", "INVALID_ARG_TOPIC_RETENTION"),
        ("topic=t&partition_num=1&replicator=1&syncdisk=-1", "INVALID_ARG_TOPIC_SYNC_DISK"),
        (
            "topic=t&partition_num=1&replicator=1&replication_ack=fsync",
            "INVALID_ARG_TOPIC_REPLICATION_ACK",
        ),
        # more replicas than nodes
        ("topic=t&partition_num=1&replicator=3", NODE_UNAVAILABLE),
        # Youzan: more partitions than nodes for a topic that is not multipart
        ("topic=t&partition_num=3&replicator=1", NODE_UNAVAILABLE),
    ],
)
def test_create_validation(query: str, message: str) -> None:
    async def body() -> None:
        lk = await start_lookupd()
        nodes = await start_nodes(lk, "a", "b")
        status, data = await post(lk, f"/topic/create?{query}")
        assert (status, data) == (400, {"message": message})
        # nothing was created anywhere
        assert all(n.calls == [] for n in nodes)
        assert lk.coordinator.records == {}
        assert (await get_json(lk, "/topics"))["topics"] == []
        for n in nodes:
            await n.stop()
        await lk.close()

    run(body())


def test_create_places_one_partition_per_node_and_creates_them() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        q = "topic=pt&partition_num=2&replicator=1&retention=3&syncdisk=100&extend=true"
        assert await post(lk, f"/topic/create?{q}") == (200, None)
        # one partition on each node, created with the topic's settings
        assert (a.partitions_created("pt") | b.partitions_created("pt")) == {0, 1}
        assert len(a.created()) == len(b.created()) == 1
        (query,) = a.created()
        assert query == {
            "topic": "pt",
            "partition": query["partition"],
            "partition_num": "2",
            "orderedmulti": "false",
            "extend": "true",
            "multipart": "false",
            "disable_channel_auto_create": "false",
            "retention": "3",
            "syncdisk": "100",
            "replicator": "1",
        }
        # usable at once: the nodes registered what they were asked for
        yz = await get_json(lk, "/lookup?topic=pt&access=w&metainfo=true")
        assert yz["meta"] == {
            "disable_channel_auto_create": False,
            "extend_support": True,
            "multi_part": False,
            "ordered": False,
            "partition_num": 2,
            "replica": 1,
        }
        assert list(yz["partitions"]) == ["0", "1"]
        assert "pt" in (await get_json(lk, "/topics"))["topics"]
        # the same create again is fine and changes nothing; another meta is refused
        assert await post(lk, f"/topic/create?{q}") == (200, None)
        assert (a.partitions_created("pt") | b.partitions_created("pt")) == {0, 1}
        assert await post(lk, "/topic/create?topic=pt&partition_num=2&replicator=1") == (
            400,
            {"message": "already exist"},
        )
        # a third partition needs a third node (not multipart)
        assert await post(lk, "/topic/partition/expand?topic=pt&partition_num=3") == (
            500,
            {"message": NODE_UNAVAILABLE},
        )
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_multipart_and_ordered_spread_evenly() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        assert await post(
            lk, "/topic/create?topic=mp&partition_num=4&replicator=1&multipart=true"
        ) == (200, None)
        assert len(a.partitions_created("mp")) == len(b.partitions_created("mp")) == 2
        assert await post(
            lk, "/topic/create?topic=od&partition_num=3&replicator=1&orderedmulti=true"
        ) == (200, None)
        counts = sorted([len(a.partitions_created("od")), len(b.partitions_created("od"))])
        assert counts == [1, 2]
        # placement considers load across topics: the node with fewer replicas first
        assert len(a.created()) + len(b.created()) == 7
        assert abs(len(a.created()) - len(b.created())) <= 1
        assert a.created()[0]["orderedmulti"] == "false"
        assert {q["orderedmulti"] for q in a.created() + b.created() if q["topic"] == "od"} == {
            "true"
        }
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_create_adopts_partitions_made_directly_on_nodes() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        await a.register("adopt", 1)  # made with nsqd's own /topic/create
        assert await post(lk, "/topic/create?topic=adopt&partition_num=2&replicator=1") == (
            200,
            None,
        )
        assert lk.coordinator.records["adopt"].placements == {0: (b.node_id,), 1: (a.node_id,)}
        # a learns the topic's settings for the partition it has
        assert [q["partition_num"] for q in a.created()] == ["2"]
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


@pytest.mark.parametrize(
    ("version", "distributed"),
    [("1.3.0", False), ("0.3.7-HA.1.13.0", True)],
    ids=["go-nsqd-1.3", "youzan-nsqd"],
)
def test_only_nsqx_nodes_are_placement_targets(version: str, distributed: bool) -> None:
    """Go's nsqd would register any partition as 0; Youzan's takes its partitions
    from etcd. Both register and are found, but nothing is placed on them."""

    async def body() -> None:
        lk = await start_lookupd()
        (other,) = await start_nodes(lk, "other", version=version, distributed=distributed)
        status, data = await post(lk, "/topic/create?topic=gt&partition_num=1&replicator=1")
        assert (status, data) == (400, {"message": NODE_UNAVAILABLE})
        assert other.calls == []
        await other.stop()
        await lk.close()

    run(body())


def test_a_node_that_joins_later_gets_the_new_partitions() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        (a,) = await start_nodes(lk, "a")
        q = "topic=grow&partition_num=2&replicator=1&multipart=true"
        assert await post(lk, f"/topic/create?{q}") == (200, None)
        assert a.partitions_created("grow") == {0, 1}
        (b,) = await start_nodes(lk, "b")
        assert await post(lk, "/topic/partition/expand?topic=grow&partition_num=4") == (200, None)
        assert b.partitions_created("grow") == {2, 3}
        # the old partitions are told the new partition_num
        assert [q["partition_num"] for q in a.created()] == ["2", "2", "4", "4"]
        yz = await get_json(lk, "/lookup?topic=grow&access=r&metainfo=true")
        assert yz["meta"]["partition_num"] == 4
        assert {pid: p["hostname"] for pid, p in yz["partitions"].items()} == {
            "0": "a",
            "1": "a",
            "2": "b",
            "3": "b",
        }
        # Youzan's expansion errors
        for query, message in [
            ("topic=grow&partition_num=3", "the partition number can not be reduced"),
            ("topic=nope&partition_num=3", "topic is not created"),
        ]:
            assert await post(lk, f"/topic/partition/expand?{query}") == (500, {"message": message})
        for query, message in [
            ("partition_num=3", "MISSING_ARG_TOPIC"),
            ("topic=grow", "MISSING_ARG_TOPIC_PARTITION_NUM"),
            ("topic=grow&partition_num=0", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ]:
            assert await post(lk, f"/topic/partition/expand?{query}") == (400, {"message": message})
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_reconcile_asks_until_the_node_registers() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        # b's HTTP API fails at create time: the create still succeeds (the meta is
        # stored), and b is asked again with backoff
        b.status = 503
        assert await post(lk, "/topic/create?topic=rc&partition_num=2&replicator=1") == (200, None)
        placed_b = lk.coordinator.records["rc"].placements
        (pid_b,) = [p for p, held in placed_b.items() if held == (b.node_id,)]
        await wait_for(lambda: len(b.created()) >= 3, what="b asked again")
        b.status = 200
        await wait_for(
            lambda: (
                lk.db.partition_producers(_topic_key("rc"))
                and pid_b in {p.partition for p in lk.db.partition_producers(_topic_key("rc"))}
            ),
            what="b registered its partition",
        )
        asked = len(b.created())
        # registered: no more asks (the next one would have come within 0.4 s)
        await wait_for(lambda: lk.coordinator.pending_asks == 0, what="nothing left to ask")
        assert len(b.created()) == asked

        # b restarts without its data: it reconnects and registers nothing
        await b.disconnect()
        b.calls.clear()
        b.auto_register = False
        await b.connect(lk)
        await wait_for(lambda: b.partitions_created("rc") == {pid_b}, what="asked after reconnect")
        await b.register("rc", pid_b)
        await wait_for(lambda: lk.coordinator.pending_asks == 0, what="settled")

        # deleted on the node on purpose (registered, then unregistered): left alone
        await b.unregister("rc", pid_b)
        n = len(b.created())
        await wait_for(lambda: lk.coordinator.reconcile() is None, what="a quiet pass")
        assert len(b.created()) == n
        for node in (a, b):
            await node.stop()
        await lk.close()

    run(body())


def _topic_key(topic: str) -> object:
    from nsqx.lookupd.registration_db import Registration

    return Registration("topic", topic, "")


def test_meta_persists_across_a_restart(tmp_path: Path) -> None:
    async def body() -> None:
        data = str(tmp_path / "lookupd")
        lk = await start_lookupd(data)
        a, b = await start_nodes(lk, "a", "b")
        q = "topic=keep&partition_num=2&replicator=1&orderedmulti=true&disable_channel_auto_create=true"
        assert await post(lk, f"/topic/create?{q}") == (200, None)
        assert await post(lk, "/channel/create?topic=keep&channel=c1") == (200, None)
        placements = dict(lk.coordinator.records["keep"].placements)
        await lk.close()
        for n in (a, b):
            await n.disconnect()
        doc = json.loads((Path(data) / META_FILE).read_text())
        assert doc["topics"]["keep"]["meta"]["ordered"] is True
        assert doc["topics"]["keep"]["channels"] == ["c1"]
        assert not [f for f in os.listdir(data) if f.endswith(".tmp")]

        lk = await start_lookupd(data)
        assert lk.coordinator.records["keep"].placements == placements
        assert (await get_json(lk, "/topics"))["topics"] == ["keep"]
        assert (await get_json(lk, "/channels?topic=keep"))["channels"] == ["c1"]
        meta = (await get_json(lk, "/lookup?topic=keep&metainfo=true"))["meta"]
        assert meta["ordered"] and meta["disable_channel_auto_create"]
        assert meta["partition_num"] == 2
        # the nodes come back empty: they are asked for their partitions and channel
        for n in (a, b):
            n.calls.clear()
            await n.connect(lk)
        await wait_for(
            lambda: a.partitions_created("keep") | b.partitions_created("keep") == {0, 1},
            what="partitions re-created",
        )
        # each partition gets the channel: at least once each (asked again if a node
        # answers late under load)
        await wait_for(
            lambda: (
                {
                    (q["partition"], q["channel"])
                    for n in (a, b)
                    for q in n.created("/channel/create")
                }
                == {("0", "c1"), ("1", "c1")}
            ),
            what="channels re-created",
        )
        await wait_for(lambda: lk.coordinator.pending_asks == 0, what="settled")
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_a_corrupt_meta_file_stops_the_start(tmp_path: Path) -> None:
    async def body() -> None:
        (tmp_path / META_FILE).write_text("{not json")
        with pytest.raises(ValueError, match="not a valid nsqlookupd meta file"):
            await start_lookupd(str(tmp_path))

    run(body())


def test_delete_all_partitions_one_partition_and_nsq_delete() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        q = "partition_num=2&replicator=1&multipart=true"
        for t in ("d1", "d2", "d3"):
            assert await post(lk, f"/topic/create?topic={t}&{q}") == (200, None)
        # **: deleted on the nodes, forgotten here
        assert await post(lk, "/topic/delete?topic=d1&partition=**") == (200, None)
        deleted = {int(x["partition"]) for n in (a, b) for x in n.created("/topic/delete")}
        assert deleted == {0, 1}
        assert "d1" not in lk.coordinator.records
        assert "d1" not in (await get_json(lk, "/topics"))["topics"]
        # one partition: that one only; the topic and its other partition stay
        assert await post(lk, "/topic/delete?topic=d2&partition=1") == (200, None)
        assert lk.coordinator.records["d2"].unplaced() == [1]
        yz = await get_json(lk, "/lookup?topic=d2&access=r")
        assert list(yz["partitions"]) == ["0"]
        # creating it again with the same settings places the missing partition
        assert await post(lk, f"/topic/create?topic=d2&{q}") == (200, None)
        assert lk.coordinator.records["d2"].unplaced() == []
        # NSQ's delete (no partition) forgets the record and keys, calls no node
        calls = sum(len(n.calls) for n in (a, b))
        assert await post(lk, "/topic/delete?topic=d3") == (200, None)
        assert "d3" not in lk.coordinator.records
        assert sum(len(n.calls) for n in (a, b)) == calls
        # errors
        for query, status, message in [
            ("topic=gone&partition=**", 500, "Key not found"),
            ("topic=d2&partition=", 400, "MISSING_ARG_TOPIC_PARTITION"),
            ("topic=d2&partition=x", 400, "INVALID_ARG_TOPIC_PARTITION"),
            ("topic=&partition=**", 400, "MISSING_ARG_TOPIC"),
            ("partition=**", 400, "MISSING_ARG_TOPIC"),
        ]:
            assert await post(lk, f"/topic/delete?{query}") == (status, {"message": message})
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_meta_update_pushes_the_settings() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        assert await post(lk, "/topic/create?topic=mu&partition_num=2&replicator=1") == (200, None)
        q = "topic=mu&retention=5&syncdisk=10&upgradeext=true&disable_channel_auto_create=true"
        assert await post(lk, f"/topic/meta/update?{q}") == (200, None)
        last = [n.created()[-1] for n in (a, b)]
        for query in last:
            assert (query["retention"], query["syncdisk"], query["extend"]) == ("5", "10", "true")
            assert query["disable_channel_auto_create"] == "true"
        meta = (await get_json(lk, "/lookup?topic=mu&metainfo=true"))["meta"]
        assert meta["extend_support"] and meta["disable_channel_auto_create"]
        assert "replication_ack" not in last[0]  # (none set: each nsqd's flag)
        q = "topic=mu&replication_ack=written"
        assert await post(lk, f"/topic/meta/update?{q}") == (200, None)
        assert all(n.created()[-1]["replication_ack"] == "written" for n in (a, b))
        for query, message in [
            ("topic=mu&replication_ack=sometimes", "INVALID_ARG_TOPIC_REPLICATION_ACK"),
            ("topic=nope&retention=3", "topic is not created"),
            ("topic=mu&retention=61", "max retention days allowed exceed"),
            ("topic=mu&syncdisk=4001", "max sync every allowed exceed"),
            ("topic=mu&replicator=9", "INVALID_ARG_TOPIC_REPLICATOR"),
            (
                "topic=mu&replicator=2",
                "INVALID_ARG_TOPIC_REPLICATOR changing the replicator of a topic is not supported",
            ),
            ("topic=mu&syncdisk=x", "INVALID_ARG_TOPIC_SYNC_DISK"),
            ("topic=mu&retention=x", "INVALID_ARG_TOPIC_RETENTION"),
            ("retention=3", "MISSING_ARG_TOPIC"),
        ]:
            assert await post(lk, f"/topic/meta/update?{query}") == (400, {"message": message})
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_channels_of_partitioned_topics() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        q = "partition_num=2&replicator=1&multipart=true"
        assert await post(lk, f"/topic/create?topic=dc&{q}&disable_channel_auto_create=true") == (
            200,
            None,
        )
        assert await post(lk, "/channel/create?topic=dc&channel=c1") == (200, None)
        # created on every partition's node
        made = sorted(
            (int(x["partition"]), x["channel"])
            for n in (a, b)
            for x in n.created("/channel/create")
        )
        assert made == [(0, "c1"), (1, "c1")]
        assert (await get_json(lk, "/channels?topic=dc"))["channels"] == ["c1"]
        # Youzan's rules on a disable_channel_auto_create topic
        assert await post(lk, "/channel/create?topic=dc&channel=c1") == (
            400,
            {"message": "channel c1 already registered"},
        )
        assert await post(lk, "/channel/delete?topic=dc&channel=c2") == (
            400,
            {"message": "channel c2 not registered"},
        )
        assert await post(lk, "/channel/delete?topic=dc&channel=c1") == (200, None)
        assert sorted(x["partition"] for n in (a, b) for x in n.created("/channel/delete")) == [
            "0",
            "1",
        ]
        assert lk.coordinator.records["dc"].channels == ()
        # another partitioned topic: idempotent, created everywhere too
        assert await post(lk, f"/topic/create?topic=ac&{q}") == (200, None)
        for _ in range(2):
            assert await post(lk, "/channel/create?topic=ac&channel=c") == (200, None)
        # a topic with no record: NSQ's /channel/create (a key, no node called)
        calls = sum(len(n.calls) for n in (a, b))
        assert await post(lk, "/channel/create?topic=plain&channel=c") == (200, None)
        assert sum(len(n.calls) for n in (a, b)) == calls
        assert (await get_json(lk, "/channels?topic=plain"))["channels"] == ["c"]
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())


def test_bad_requests_harm_nothing() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = await start_nodes(lk, "a", "b")
        assert await post(lk, "/topic/create?topic=safe&partition_num=2&replicator=1") == (
            200,
            None,
        )
        before = await get_json(lk, "/lookup?topic=safe&access=r&metainfo=true")
        record = lk.coordinator.records["safe"]
        for path in [
            "/topic/create?topic=safe&partition_num=2&replicator=1&extend=true",
            "/topic/create?topic=safe&partition_num=999&replicator=1",
            "/topic/create?topic=safe&partition_num=%zz",
            "/topic/partition/expand?topic=safe&partition_num=1",
            "/topic/meta/update?topic=safe&retention=100",
            "/topic/delete?topic=safe&partition=300",
            "/channel/create?topic=safe&channel=bad!",
        ]:
            status, _ = await post(lk, path)
            assert 400 <= status < 600, path
        assert lk.coordinator.records["safe"] is record
        assert await get_json(lk, "/lookup?topic=safe&access=r&metainfo=true") == before
        # and a bad registration only ends that connection
        bad = await V1Client.connect(lk)
        await bad.identify(
            broadcast_address="127.0.0.1",
            tcp_port=1,
            http_port=2,
            version="1.3.0-nsqx",
            distributed_id="x",
        )
        assert (await bad.command("REGISTER safe 999")).startswith(b"E_BAD_PARTITIONID")
        assert await bad.closed()
        assert await get_json(lk, "/lookup?topic=safe&access=r&metainfo=true") == before
        assert (await http(lk, "GET", "/ping"))[0] == 200
        for n in (a, b):
            await n.stop()
        await lk.close()

    run(body())
