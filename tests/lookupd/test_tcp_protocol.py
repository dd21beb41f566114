"""nsqlookupd's TCP protocol V1 against a real `nsqx nsqlookupd` process, speaking the
bytes Go's nsqd sends (no Go binary is available here, so the conversation is scripted
from nsqd/lookup.go and go-nsq's command encoders)."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from lookupdproc import LookupdProcess, V1Conn, wait_until


def producers(lookupd: LookupdProcess, topic: str) -> list[dict[str, object]]:
    status, _, body = lookupd.get(f"/lookup?topic={topic}")
    return json.loads(body)["producers"] if status == 200 else []  # type: ignore[no-any-return]


def test_go_nsqd_registration_conversation(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    reply = conn.identify(tcp_port=14150, http_port=14151, hostname="gonode")
    # the reply is lookupd's own info, keys sorted as Go marshals a map
    assert list(reply) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
    assert reply["tcp_port"] == lookupd.tcp_port
    assert reply["http_port"] == lookupd.http_port
    assert reply["broadcast_address"] == "127.0.0.1"
    assert reply["hostname"] == socket.gethostname()
    # one reply per command, each [i32 size]["OK"] with no frame type
    conn.send(b"REGISTER conv_t conv_c\nREGISTER conv_bare\nPING\n")
    raw = conn._read(18)
    assert raw == b"\x00\x00\x00\x02OK" * 3
    lookup = lookupd.json("/lookup?topic=conv_t")
    assert lookup["channels"] == ["conv_c"]
    (p,) = lookup["producers"]
    assert list(p) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    ]
    local = conn.sock.getsockname()
    assert p["remote_address"] == f"{local[0]}:{local[1]}"
    assert (p["hostname"], p["tcp_port"], p["http_port"]) == ("gonode", 14150, 14151)
    assert producers(lookupd, "conv_bare")
    # a channel UNREGISTER leaves the topic; a topic UNREGISTER leaves nothing
    assert conn.command("UNREGISTER conv_t conv_c") == b"OK"
    assert lookupd.json("/lookup?topic=conv_t")["producers"] != []
    assert conn.command("UNREGISTER conv_bare") == b"OK"
    assert producers(lookupd, "conv_bare") == []
    # keys outlive their producers, as in NSQ
    assert "conv_bare" in lookupd.json("/topics")["topics"]
    conn.close()


def test_disconnect_drops_the_nodes_registrations(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=24150)
    assert conn.command("REGISTER gone_t gone_c") == b"OK"
    assert conn.command("REGISTER gone#ephemeral c#ephemeral") == b"OK"
    assert producers(lookupd, "gone_t")
    conn.close()
    wait_until(lambda: producers(lookupd, "gone_t") == [], what="producer dropped")
    nodes = lookupd.json("/nodes")["producers"]
    assert all(n["tcp_port"] != 24150 for n in nodes)
    # ephemeral keys go with their last producer; others stay
    topics = lookupd.json("/topics")["topics"]
    assert "gone_t" in topics and "gone#ephemeral" not in topics


def test_ephemeral_unregister_removes_keys(lookupd: LookupdProcess) -> None:
    a, b = V1Conn(lookupd.tcp_port), V1Conn(lookupd.tcp_port)
    a.identify(tcp_port=34150)
    b.identify(tcp_port=34160)
    for conn in (a, b):
        assert conn.command("REGISTER eph#ephemeral ch#ephemeral") == b"OK"
    assert a.command("UNREGISTER eph#ephemeral ch#ephemeral") == b"OK"
    assert lookupd.json("/channels?topic=eph%23ephemeral")["channels"] == ["ch#ephemeral"]
    assert b.command("UNREGISTER eph#ephemeral ch#ephemeral") == b"OK"
    assert lookupd.json("/channels?topic=eph%23ephemeral")["channels"] == []
    for conn in (a, b):
        assert conn.command("UNREGISTER eph#ephemeral") == b"OK"
    assert "eph#ephemeral" not in lookupd.json("/topics")["topics"]
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("script", "error"),
    [
        (b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
        (b"BOGUS\n", b"E_INVALID invalid command BOGUS"),
        (b"IDENTIFY\n" + struct.pack(">i", 2) + b"{}", b"E_BAD_BODY IDENTIFY missing fields"),
        (
            b"IDENTIFY\n" + struct.pack(">i", 3) + b"{x}",
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        ),
    ],
)
def test_fatal_errors_are_sent_then_the_connection_closes(
    lookupd: LookupdProcess, script: bytes, error: bytes
) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.send(b"PING\n" + script)
    assert conn.reply() == b"OK"
    assert conn.reply() == error
    assert conn.closed()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("REGISTER", b"E_INVALID REGISTER insufficient number of params"),
        ("REGISTER b@d", b"E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
        ("UNREGISTER t b@d", b"E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    ],
)
def test_bad_names_after_identify(lookupd: LookupdProcess, line: str, error: bytes) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=44150)
    assert conn.command(line) == error
    assert conn.closed()


def test_identify_twice_and_bad_magic(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify()
    conn.send(b"IDENTIFY\n")
    assert conn.reply() == b"E_INVALID cannot IDENTIFY again"
    assert conn.closed()
    bad = V1Conn(lookupd.tcp_port, magic=False)
    bad.send(b"  V2")
    assert bad.reply() == b"E_BAD_PROTOCOL"
    assert bad.closed()


def test_ping_refreshes_and_identify_registers_the_node(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=54150)
    node = wait_until(
        lambda: [n for n in lookupd.json("/nodes")["producers"] if n["tcp_port"] == 54150],
        what="node listed",
    )[0]
    assert node["topics"] == [] and node["tombstones"] == []
    before = next(
        e["last_update"] for e in lookupd.json("/debug")["client::"] if e["tcp_port"] == 54150
    )
    assert conn.command("PING") == b"OK"
    after = next(
        e["last_update"] for e in lookupd.json("/debug")["client::"] if e["tcp_port"] == 54150
    )
    assert after >= before
    conn.close()


def test_partition_aware_registration_with_the_real_process(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    reply = conn.identify(tcp_port=64150, http_port=64151, distributed_id="127.0.0.1:64150")
    assert reply["partitions"] is True
    assert conn.command("REGISTER proc_t 1 proc_c") == b"OK"
    assert conn.command("REGISTER proc_t 0") == b"OK"
    accept = {"Accept": "application/vnd.nsq; version=1.0"}
    status, _, body = lookupd.get("/lookup?topic=proc_t&access=r&metainfo=true", headers=accept)
    data = json.loads(body)
    assert status == 200 and list(data["partitions"]) == ["0", "1"]
    assert data["meta"]["partition_num"] == 2
    assert data["partitions"]["1"]["distributed_id"] == "127.0.0.1:64150"
    # NSQ's /lookup of the same topic: one producer, NSQ's shape
    plain = lookupd.json("/lookup?topic=proc_t")
    assert plain["channels"] == ["proc_c"] and len(plain["producers"]) == 1
    assert (
        conn.command("REGISTER proc_t x")
        == b"E_BAD_PARTITIONID REGISTER partition id 'x' is not valid"
    )
    assert conn.closed()
