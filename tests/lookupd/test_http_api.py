"""nsqlookupd's HTTP API against a real `nsqx nsqlookupd` process: NSQ 1.3's routes, exact
JSON shapes (byte for byte where the order is fixed), status codes and error texts."""

from __future__ import annotations

import json

import pytest

from lookupdproc import LookupdProcess, V1Conn, wait_until

V1 = "nsq; version=1.0"
JSON = "application/json; charset=utf-8"


def test_ping_and_info(lookupd: LookupdProcess) -> None:
    status, headers, body = lookupd.get("/ping")
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    status, headers, body = lookupd.get("/info")
    assert status == 200 and headers["Content-Type"] == JSON
    assert headers["X-NSQ-Content-Type"] == V1
    assert body == b'{"version":"1.3.0-nsqx"}'


@pytest.mark.parametrize(
    "accept", [None, "application/vnd.nsq; version=1.0", "application/vnd.nsq version=1.0"]
)
def test_no_envelope_whatever_the_accept_header(
    lookupd: LookupdProcess, accept: str | None
) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=4250, http_port=4251, hostname="h1")
    assert conn.command("REGISTER env_t env_c") == b"OK"
    headers = {"Accept": accept} if accept else {}
    status, _, body = lookupd.get("/lookup?topic=env_t", headers=headers)
    assert status == 200
    local = conn.sock.getsockname()
    assert body == (
        b'{"channels":["env_c"],"producers":[{"remote_address":"%s:%d","hostname":"h1",'
        b'"broadcast_address":"127.0.0.1","tcp_port":4250,"http_port":4251,"version":"1.3.0"}]}'
        % (local[0].encode(), local[1])
    )
    conn.close()


def test_empty_lists_are_lists_not_null(lookupd: LookupdProcess) -> None:
    """NSQ's lookupd builds every list with make(): empty lists are [] (unlike nsqd's
    /stats, where some are null)."""
    assert lookupd.post("/topic/create?topic=empty_t")[0] == 200
    assert lookupd.get("/lookup?topic=empty_t")[2] == b'{"channels":[],"producers":[]}'
    assert lookupd.get("/channels?topic=nothing_here")[2] == b'{"channels":[]}'
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=4350)
    nodes = lookupd.json("/nodes")["producers"]
    (mine,) = [n for n in nodes if n["tcp_port"] == 4350]
    assert list(mine) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "tombstones",
        "topics",
    ]
    assert mine["tombstones"] == [] and mine["topics"] == []
    conn.close()


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=never_registered", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/delete?topic=t&channel=nochannel", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("POST", "/topic/tombstone?node=n:1", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/debug/pprof", 404, "NOT_FOUND"),
        ("POST", "/ping", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/topic/create?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("DELETE", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
    ],
)
def test_errors(lookupd: LookupdProcess, method: str, path: str, status: int, message: str) -> None:
    got, headers, body = lookupd.get(path, method=method)
    assert (got, json.loads(body)) == (status, {"message": message})
    assert headers["Content-Type"] == JSON
    assert headers["X-NSQ-Content-Type"] == V1
    if status == 405:
        assert headers["Allow"] in ("GET, OPTIONS", "OPTIONS, POST")


def test_router_redirects_and_options(lookupd: LookupdProcess) -> None:
    status, headers, _ = lookupd.get("/topics/")
    assert (status, headers["Location"]) == (301, "/topics")
    status, headers, _ = lookupd.get("/LOOKUP?topic=x")
    assert (status, headers["Location"]) == (301, "/lookup?topic=x")
    status, headers, _ = lookupd.get("/topic/create/?topic=x", method="POST")
    assert (status, headers["Location"]) == (307, "/topic/create?topic=x")
    status, headers, body = lookupd.get("/topic/create", method="OPTIONS")
    assert (status, headers["Allow"], body) == (200, "OPTIONS, POST", b"")


def test_topic_and_channel_administration(lookupd: LookupdProcess) -> None:
    ok = (200, b"")
    assert lookupd.post("/channel/create?topic=adm_t&channel=adm_c")[::2] == ok
    assert lookupd.post("/channel/create?topic=adm_t&channel=adm_d")[::2] == ok
    assert "adm_t" in lookupd.json("/topics")["topics"]
    assert lookupd.json("/channels?topic=adm_t")["channels"] == ["adm_c", "adm_d"]
    assert lookupd.post("/channel/delete?topic=adm_t&channel=adm_c")[::2] == ok
    assert lookupd.json("/channels?topic=adm_t")["channels"] == ["adm_d"]
    assert lookupd.post("/topic/delete?topic=adm_t")[::2] == ok
    assert "adm_t" not in lookupd.json("/topics")["topics"]
    assert lookupd.json("/channels?topic=adm_t")["channels"] == []
    assert lookupd.get("/lookup?topic=adm_t")[0] == 404
    # deleting what is not there is still OK, as in NSQ
    assert lookupd.post("/topic/delete?topic=adm_t")[::2] == ok


def test_debug_dump(lookupd: LookupdProcess) -> None:
    conn = V1Conn(lookupd.tcp_port)
    conn.identify(tcp_port=4450, http_port=4451)
    assert conn.command("REGISTER dbg_t dbg_c") == b"OK"
    data = lookupd.json("/debug")
    (entry,) = [e for e in data["channel:dbg_t:dbg_c"] if e["tcp_port"] == 4450]
    assert list(entry) == [
        "broadcast_address",
        "hostname",
        "http_port",
        "id",
        "last_update",
        "tcp_port",
        "tombstoned",
        "tombstoned_at",
        "version",
    ]
    local = conn.sock.getsockname()
    assert entry["id"] == f"{local[0]}:{local[1]}"
    assert entry["tombstoned"] is False
    # Go's zero time.Time in Unix ns
    assert entry["tombstoned_at"] == -6795364578871345152
    assert any(e["tcp_port"] == 4450 for e in data["topic:dbg_t:"])
    assert any(e["tcp_port"] == 4450 for e in data["client::"])
    conn.close()


def test_tombstone_hides_a_producer_for_the_lifetime(lookupd_factory: object) -> None:
    lk: LookupdProcess = lookupd_factory("--tombstone-lifetime=1500ms")  # type: ignore[operator]
    a, b = V1Conn(lk.tcp_port), V1Conn(lk.tcp_port)
    a.identify(tcp_port=5150, http_port=5151)
    b.identify(tcp_port=5160, http_port=5161)
    for conn in (a, b):
        assert conn.command("REGISTER tomb_t") == b"OK"
        assert conn.command("REGISTER other_t") == b"OK"

    def ports(topic: str) -> list[object]:
        return sorted(p["tcp_port"] for p in lk.json(f"/lookup?topic={topic}")["producers"])

    assert ports("tomb_t") == [5150, 5160]
    assert lk.post("/topic/tombstone?topic=tomb_t&node=127.0.0.1:5151")[0] == 200
    # hidden from this topic's lookup only; /nodes still lists it, flagged
    assert ports("tomb_t") == [5160]
    assert ports("other_t") == [5150, 5160]
    node = next(n for n in lk.json("/nodes")["producers"] if n["tcp_port"] == 5150)
    assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {
        "tomb_t": True,
        "other_t": False,
    }
    # back once the lifetime has passed
    wait_until(lambda: ports("tomb_t") == [5150, 5160], what="tombstone to lapse")
    a.close()
    b.close()


def test_inactive_producers_leave_lookup_and_nodes(lookupd_factory: object) -> None:
    lk: LookupdProcess = lookupd_factory("--inactive-producer-timeout=1s")  # type: ignore[operator]
    conn = V1Conn(lk.tcp_port)
    conn.identify(tcp_port=6150)
    assert conn.command("REGISTER idle_t") == b"OK"
    assert conn.command("PING") == b"OK"
    assert lk.json("/lookup?topic=idle_t")["producers"] != []
    wait_until(lambda: lk.json("/lookup?topic=idle_t")["producers"] == [], what="inactivity")
    assert lk.json("/nodes")["producers"] == []
    # still registered: a PING brings it back
    assert conn.command("PING") == b"OK"
    assert [p["tcp_port"] for p in lk.json("/lookup?topic=idle_t")["producers"]] == [6150]
    assert [p["tcp_port"] for p in lk.json("/nodes")["producers"]] == [6150]
    conn.close()
