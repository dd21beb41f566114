"""Partition-aware registration and Youzan's discovery API (/lookup with access,
metainfo or partition, /listlookup), with the negotiated envelope, against an
in-process nsqlookupd; NSQ 1.3's answers for NSQ 1.3's requests stay as they were.

The expected bytes of Youzan's form were recorded from Youzan's own nsqlookupd
(shared/reference/youzan-nsq-bin, b16e68eb) in the same situations; only addresses and
versions differ.
"""

from __future__ import annotations

import json

import pytest
from partition_fakes import V1_ACCEPT, FakeNsqd, V1Client, get_json, http, run, start_lookupd

# Youzan's answers, recorded from its nsqlookupd
YZ_UNKNOWN_TOPIC = b'{"channels":[],"partitions":{},"producers":[]}'
YZ_UNKNOWN_TOPIC_META = (
    b'{"channels":[],"meta":{"disable_channel_auto_create":false,"extend_support":false,'
    b'"multi_part":false,"ordered":false,"partition_num":0,"replica":0},"partitions":{},'
    b'"producers":[]}'
)
YZ_WRAPPED_ERROR = b'{"status_code":500,"status_txt":"INVALID_ACCESS_MODE","data":null}'


def peer_json(node: FakeNsqd, conn_addr: str) -> str:
    """Youzan's PeerInfo for a fake node, as lookupd shows it."""
    return (
        f'{{"id":"{conn_addr}","remote_address":"{conn_addr}","hostname":"{node.name}",'
        f'"broadcast_address":"127.0.0.1","tcp_port":{node.tcp_port},'
        f'"http_port":{node.http_port},"version":"{node.version}",'
        f'"distributed_id":"{node.node_id}"}}'
    )


def local_addr(node: FakeNsqd) -> str:
    assert node.conn is not None
    host, port = node.conn.writer.get_extra_info("sockname")[:2]
    return f"{host}:{port}"


def test_identify_reply_says_partitions_only_to_partition_aware_peers() -> None:
    async def body() -> None:
        lk = await start_lookupd(node_timeout=2.0)
        go = await V1Client.connect(lk)
        go_reply = await go.identify_raw(
            broadcast_address="127.0.0.1", tcp_port=4150, http_port=4151, version="1.3.0"
        )
        # a Go nsqd gets NSQ's reply, key for key
        assert list(json.loads(go_reply)) == [
            "broadcast_address",
            "hostname",
            "http_port",
            "tcp_port",
            "version",
        ]
        for extra in ({"distributed_id": "127.0.0.1:4250"}, {"version": "0.3.7-HA.1.13.0"}):
            conn = await V1Client.connect(lk)
            fields = {
                "broadcast_address": "127.0.0.1",
                "tcp_port": 4250,
                "http_port": 4251,
                "version": "1.3.0-nsqx",
                **extra,
            }
            reply = await conn.identify(**fields)
            assert list(reply) == [
                "broadcast_address",
                "heartbeat_interval",
                "hostname",
                "http_port",
                "lease",
                "node_timeout",
                "partitions",
                "tcp_port",
                "version",
            ]
            assert reply["partitions"] is True
            # the liveness times (ms), all from --node-timeout (2 s by default)
            assert (reply["heartbeat_interval"], reply["lease"], reply["node_timeout"]) == (
                200,
                500,
                2000,
            )
            assert await conn.command("REGISTER yzt 3 ch") == b"OK"
            await conn.close()
        await go.close()
        await lk.close()

    run(body())


def test_go_nsqd_registrations_are_partition_0() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        go = await V1Client.connect(lk)
        await go.identify(
            broadcast_address="127.0.0.1", tcp_port=4150, http_port=4151, version="1.3.0"
        )
        # NSQ's form; a channel named "5" stays a channel (Youzan would read a partition)
        assert await go.command("REGISTER got 5") == b"OK"
        assert await go.command("REGISTER got") == b"OK"
        assert (await get_json(lk, "/channels?topic=got"))["channels"] == ["5"]
        plain = await get_json(lk, "/lookup?topic=got")
        assert list(plain) == ["channels", "producers"]
        yz = await get_json(lk, "/lookup?topic=got&access=r&metainfo=true")
        assert list(yz) == ["channels", "meta", "partitions", "producers"]
        assert list(yz["partitions"]) == ["0"]
        assert yz["partitions"]["0"]["distributed_id"] == ""
        assert yz["meta"]["partition_num"] == 1 and yz["meta"]["replica"] == 1
        assert await go.command("UNREGISTER got") == b"OK"
        assert (await get_json(lk, "/lookup?topic=got&access=r"))["partitions"] == {}
        await go.close()
        await lk.close()

    run(body())


def test_partition_registrations_and_youzan_lookup_bytes() -> None:
    """Two nodes with alternating partitions of an ordered topic: the situation of the
    reference's ex_ord, whose /lookup?metainfo=true answer has exactly this layout."""

    async def body() -> None:
        lk = await start_lookupd()
        a, b = FakeNsqd("vm"), FakeNsqd("vm")
        for node in (a, b):
            await node.start_http()
            await node.connect(lk)
        await a.register("ordt", 0)
        await b.register("ordt", 1)
        await a.register("ordt", 2)
        await b.register("ordt", 3)
        pa, pb = peer_json(a, local_addr(a)), peer_json(b, local_addr(b))
        status, headers, raw = await http(lk, "GET", "/lookup?topic=ordt&access=r", V1_ACCEPT)
        assert status == 200 and headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        assert raw.decode() == (
            f'{{"channels":[],"partitions":{{"0":{pa},"1":{pb},"2":{pa},"3":{pb}}},'
            f'"producers":[{pa},{pb}]}}'
        )
        # one partition: its node only
        raw = (await http(lk, "GET", "/lookup?topic=ordt&partition=1", V1_ACCEPT))[2]
        assert raw.decode() == f'{{"channels":[],"partitions":{{"1":{pb}}},"producers":[{pb}]}}'
        # NSQ's form: one producer per node, NSQ's six fields
        plain = await get_json(lk, "/lookup?topic=ordt")
        assert [p["tcp_port"] for p in plain["producers"]] == [a.tcp_port, b.tcp_port]
        assert list(plain["producers"][0]) == [
            "remote_address",
            "hostname",
            "broadcast_address",
            "tcp_port",
            "http_port",
            "version",
        ]
        # partitions sort as Go sorts map keys: as strings
        for pid in (10, 4):
            await a.register("ordt", pid)
        yz = await get_json(lk, "/lookup?topic=ordt&access=r")
        assert list(yz["partitions"]) == ["0", "1", "10", "2", "3", "4"]
        # derived meta for a topic nobody created through lookupd: max partition + 1
        meta = (await get_json(lk, "/lookup?topic=ordt&metainfo=true"))["meta"]
        assert meta == {
            "disable_channel_auto_create": False,
            "extend_support": False,
            "multi_part": False,
            "ordered": False,
            "partition_num": 11,
            "replica": 1,
        }
        # channels per partition; UNREGISTER of one partition leaves the others
        await b.register("ordt", 3, "c3")
        await a.register("ordt", 0, "c0")
        assert (await get_json(lk, "/channels?topic=ordt"))["channels"] == ["c3", "c0"]
        assert (await get_json(lk, "/channels?topic=ordt&partition=3"))["channels"] == ["c3"]
        part3 = await get_json(lk, "/lookup?topic=ordt&partition=3")
        assert part3["channels"] == ["c3"]
        await b.unregister("ordt", 3)
        yz = await get_json(lk, "/lookup?topic=ordt&access=r")
        assert list(yz["partitions"]) == ["0", "1", "10", "2", "4"]
        assert (await get_json(lk, "/channels?topic=ordt&partition=3"))["channels"] == []
        # /nodes adds Youzan's partitions for partition-aware nodes
        nodes = (await get_json(lk, "/nodes"))["producers"]
        mine = next(n for n in nodes if n["tcp_port"] == a.tcp_port)
        assert mine["partitions"] == {"ordt": ["0", "2", "10", "4"]}
        assert mine["topics"] == ["ordt"] and mine["tombstones"] == [False]
        debug = await get_json(lk, "/debug")
        entry = next(e for e in debug["topic:ordt:"] if e["tcp_port"] == b.tcp_port)
        assert (entry["partition"], entry["distributed_id"]) == (1, b.node_id)
        # a disconnected node leaves every partition
        await b.stop()
        await wait_gone(lk, b)
        yz = await get_json(lk, "/lookup?topic=ordt&access=r")
        assert list(yz["partitions"]) == ["0", "10", "2", "4"]
        await a.stop()
        await lk.close()

    run(body())


async def wait_gone(lk: object, node: FakeNsqd) -> None:
    from partition_fakes import wait_for

    await wait_for(
        lambda: all(
            p.peer.info.tcp_port != node.tcp_port
            for p in lk.db.find_producers("client", "", "")  # type: ignore[attr-defined]
        ),
        what="node gone",
    )


def test_unknown_topic_answers_as_youzan() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        assert (await http(lk, "GET", "/lookup?topic=nope&access=r", V1_ACCEPT))[2] == (
            YZ_UNKNOWN_TOPIC
        )
        assert (await http(lk, "GET", "/lookup?topic=nope&metainfo=true", V1_ACCEPT))[2] == (
            YZ_UNKNOWN_TOPIC_META
        )
        # NSQ's form keeps NSQ's 404
        status, _, raw = await http(lk, "GET", "/lookup?topic=nope", V1_ACCEPT)
        assert (status, raw) == (404, b'{"message":"TOPIC_NOT_FOUND"}')
        await lk.close()

    run(body())


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("topic=&access=r", 400, "MISSING_ARG_TOPIC"),
        ("access=r", 400, "MISSING_ARG_TOPIC"),
        ("topic=t&access=x", 400, "INVALID_ACCESS_MODE"),
    ],
)
def test_youzan_lookup_errors(query: str, status: int, message: str) -> None:
    async def body() -> None:
        lk = await start_lookupd()
        got, headers, raw = await http(lk, "GET", f"/lookup?{query}", V1_ACCEPT)
        assert (got, json.loads(raw)) == (status, {"message": message})
        # wrapped, the error is a 500, as Youzan's
        got, headers, raw = await http(lk, "GET", f"/lookup?{query}")
        assert got == 500 and "X-NSQ-Content-Type" not in headers
        assert json.loads(raw) == {"status_code": 500, "status_txt": message, "data": None}
        await lk.close()

    run(body())


def test_envelope_only_for_youzan_requests_without_the_accept_header() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        (node,) = [FakeNsqd("n1")]
        await node.start_http()
        await node.connect(lk)
        await node.register("envt", 0)
        v1 = (await http(lk, "GET", "/lookup?topic=envt&access=r", V1_ACCEPT))[2]
        status, headers, raw = await http(lk, "GET", "/lookup?topic=envt&access=r")
        assert status == 200 and "X-NSQ-Content-Type" not in headers
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        assert raw == b'{"status_code":200,"status_txt":"OK","data":' + v1 + b"}"
        # the exact error bytes of Youzan's wrapped answer
        raw = (await http(lk, "GET", "/lookup?topic=envt&access=x"))[2]
        assert raw == YZ_WRAPPED_ERROR
        # NSQ's request is never wrapped, whatever the Accept header
        for headers_ in ({}, V1_ACCEPT):
            status, headers, raw = await http(lk, "GET", "/lookup?topic=envt", headers_)
            assert status == 200 and headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
            assert list(json.loads(raw)) == ["channels", "producers"]
        # /listlookup: this lookupd, leader of itself
        node_json = (
            f'{{"ID":"127.0.0.1::{lk.tcp_port}:nsqlookup","NodeIP":"127.0.0.1",'
            f'"TcpPort":"{lk.tcp_port}","HttpPort":"{lk.http_port}","RpcPort":"","Epoch":0}}'
        )
        listed = f'{{"lookupdleader":{node_json},"lookupdnodes":[{node_json}]}}'
        assert (await http(lk, "GET", "/listlookup", V1_ACCEPT))[2].decode() == listed
        status, headers, raw = await http(lk, "GET", "/listlookup")
        assert raw.decode() == f'{{"status_code":200,"status_txt":"OK","data":{listed}}}'
        await node.stop()
        await lk.close()

    run(body())


def test_access_w_drops_tombstoned_nodes_and_ignores_channels() -> None:
    async def body() -> None:
        lk = await start_lookupd()
        a, b = FakeNsqd("a"), FakeNsqd("b")
        for node in (a, b):
            await node.start_http()
            await node.connect(lk)
        await a.register("tombt", 0)
        await b.register("tombt", 1)
        # no channel anywhere: nsqx still lists the partitions for writers (Youzan: 404)
        w = await get_json(lk, "/lookup?topic=tombt&access=w")
        assert list(w["partitions"]) == ["0", "1"]
        status, _ = (
            await http(lk, "POST", f"/topic/tombstone?topic=tombt&node=127.0.0.1:{b.http_port}")
        )[:2]
        assert status == 200
        w = await get_json(lk, "/lookup?topic=tombt&access=w")
        assert list(w["partitions"]) == ["0"] and len(w["producers"]) == 1
        # readers still see it, to drain it
        r = await get_json(lk, "/lookup?topic=tombt&access=r")
        assert list(r["partitions"]) == ["0", "1"]
        # NSQ's form hides it, as NSQ does
        plain = await get_json(lk, "/lookup?topic=tombt")
        assert [p["tcp_port"] for p in plain["producers"]] == [a.tcp_port]
        for node in (a, b):
            await node.stop()
        await lk.close()

    run(body())


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("REGISTER t", b"E_INVALID REGISTER insufficient number of params"),
        ("REGISTER t x", b"E_BAD_PARTITIONID REGISTER partition id 'x' is not valid"),
        ("UNREGISTER t 255", b"E_BAD_PARTITIONID UNREGISTER partition id '255' is not valid"),
        ("REGISTER t -1 c", b"E_BAD_PARTITIONID REGISTER partition id '-1' is not valid"),
        ("REGISTER b@d 0", b"E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
        ("REGISTER t 0 b@d", b"E_BAD_CHANNEL REGISTER channel name 'b@d' is not valid"),
    ],
)
def test_partition_errors_are_fatal(line: str, error: bytes) -> None:
    async def body() -> None:
        lk = await start_lookupd()
        node = FakeNsqd("n")
        await node.start_http()
        await node.connect(lk)
        assert node.conn is not None
        assert await node.conn.command(line) == error
        assert await node.conn.closed()
        await node.stop()
        await lk.close()

    run(body())
