"""nsqadmin's JSON API against a real cluster (nsqlookupd, two nsqd, the admin: all real
processes on free loopback ports): its numbers match the nodes' /stats, its actions
change the nodes, admins and notifications work as NSQ's, and garbage harms nothing."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adminproc import Cluster, start_admin, start_cluster
from lookupdproc import http_request, wait_until
from rawnsq import Raw, run


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"), "--history-interval=100ms")
    yield c
    c.stop()


def tail(c: Cluster, node: int, topic: str, channel: str, n: int) -> bytes:
    """Consume and finish ``n`` messages with `nsqx tail` (a real consumer)."""
    addr = f"127.0.0.1:{c.nsqds[node].tcp_port}"
    r = subprocess.run(
        [sys.executable, "-m", "nsqx", "tail", f"--topic={topic}", f"--channel={channel}",
         f"--nsqd-tcp-address={addr}", f"--n={n}"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return r.stdout


def channel_of(c: Cluster, node: int, topic: str, channel: str) -> dict[str, Any]:
    for t in c.stats(c.nsqds[node], topic):
        for ch in t["channels"]:
            if ch["channel_name"] == channel:
                return ch  # type: ignore[no-any-return]
    return {}


def test_counts_match_every_nodes_stats(cluster: Cluster) -> None:
    a, b = cluster.nsqds
    for n in (a, b):
        assert cluster.post_nsqd(n, "/topic/create?topic=sums") == 200
        assert cluster.post_nsqd(n, "/channel/create?topic=sums&channel=work") == 200
    cluster.pub(a, "sums", *[b"a%d" % i for i in range(7)])
    cluster.pub(b, "sums", *[b"b%d" % i for i in range(5)])
    tail(cluster, 0, "sums", "work", 3)
    wait_until(lambda: len(cluster.lookupd.json("/lookup?topic=sums")["producers"]) == 2)
    topic = cluster.admin.get("/api/topics/sums")
    per_node = [cluster.stats(n, "sums")[0] for n in (a, b)]
    assert topic["message"] == ""
    assert topic["message_count"] == sum(t["message_count"] for t in per_node) == 12
    assert topic["depth"] == sum(t["depth"] for t in per_node)
    assert sorted(n["node"] for n in topic["nodes"]) == sorted(
        f"127.0.0.1:{n.http_port}" for n in (a, b)
    )
    (ch,) = topic["channels"]
    want = [channel_of(cluster, i, "sums", "work") for i in (0, 1)]
    for key in ("depth", "in_flight_count", "deferred_count", "requeue_count", "message_count"):
        assert ch[key] == sum(w[key] for w in want), key
    assert ch["depth"] == 9  # 3 of 12 finished
    # the channel page's answer, with clients and latency
    detail = cluster.admin.get("/api/topics/sums/work")
    assert detail["depth"] == 9 and len(detail["nodes"]) == 2 and detail["clients"] == []
    pcts = detail["e2e_processing_latency"]["percentiles"]
    assert {p["quantile"] for p in pcts} == {1.0, 0.5}
    assert detail["e2e_processing_latency"]["count"] == 3
    # every topic at once, as the topics page asks
    listing = cluster.admin.get("/api/topics?stats=true")
    row = next(s for s in listing["stats"] if s["topic_name"] == "sums")
    assert (row["message_count"], row["channel_count"], row["node_count"]) == (12, 1, 2)
    counter = cluster.admin.get("/api/counter")["stats"]
    assert sum(s["message_count"] for s in counter.values() if s["topic_name"] == "sums") == sum(
        w["message_count"] for w in want
    )


def test_nodes_lookupds_and_one_node(cluster: Cluster) -> None:
    nodes = cluster.admin.get("/api/nodes")["nodes"]
    assert len(nodes) == 2
    assert all(n["health"] == "OK" and n["version"] == "1.3.0-nsqx" for n in nodes)
    (lk,) = cluster.admin.get("/api/lookupds")["lookupds"]
    assert lk["health"] == "OK" and lk["address"] == cluster.lookupd.http_address
    a = cluster.nsqds[0]
    cluster.pub(a, "onenode", b"x")
    node = cluster.admin.get(f"/api/nodes/127.0.0.1:{a.http_port}")
    assert "onenode" in [t["topic_name"] for t in node["topics"]]
    status, data = cluster.admin.request("GET", "/api/nodes/127.0.0.1:1")
    assert (status, data["message"]) == (404, "NODE_NOT_FOUND")


def test_topic_and_channel_actions(cluster: Cluster) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "acts", b"1", b"2", b"3")
    assert cluster.post_nsqd(a, "/channel/create?topic=acts&channel=c") == 200
    wait_until(lambda: cluster.lookupd.get("/lookup?topic=acts")[0] == 200)
    adm = cluster.admin

    def topic_entry() -> dict[str, Any]:
        return cluster.stats(a, "acts")[0]

    assert adm.request("POST", "/api/topics/acts", {"action": "pause"}) == (200, {"message": ""})
    assert topic_entry()["paused"] is True
    adm.request("POST", "/api/topics/acts", {"action": "unpause"})
    assert topic_entry()["paused"] is False
    adm.request("POST", "/api/topics/acts/c", {"action": "pause"})
    assert channel_of(cluster, 0, "acts", "c")["paused"] is True
    adm.request("POST", "/api/topics/acts/c", {"action": "unpause"})
    assert channel_of(cluster, 0, "acts", "c")["paused"] is False
    assert channel_of(cluster, 0, "acts", "c")["depth"] == 3
    assert adm.request("POST", "/api/topics/acts/c", {"action": "empty"})[0] == 200
    assert channel_of(cluster, 0, "acts", "c")["depth"] == 0
    # replay from the start of time, then skip to the end (Youzan's setoffset)
    status, _ = adm.request(
        "POST", "/api/topics/acts/c", {"action": "setoffset", "position": "timestamp:0"}
    )
    assert status == 200 and channel_of(cluster, 0, "acts", "c")["depth"] == 3
    adm.request("POST", "/api/topics/acts/c", {"action": "setoffset", "position": "special:-1"})
    assert channel_of(cluster, 0, "acts", "c")["depth"] == 0
    adm.request(
        "POST",
        "/api/topics/acts/c",
        {"action": "setoffset", "position": "msgcount:2", "partition": 0},
    )
    assert channel_of(cluster, 0, "acts", "c")["depth"] == 2
    status, data = adm.request(
        "POST",
        "/api/topics/acts/c",
        {"action": "setoffset", "position": "msgcount:1", "partition": 7},
    )
    assert (status, data["message"]) == (404, "PARTITION_NOT_FOUND")
    # create a channel through the lookupd and on the producers, then delete it
    assert adm.request("POST", "/api/topics", {"topic": "acts", "channel": "new"})[0] == 200
    assert channel_of(cluster, 0, "acts", "new") != {}
    assert adm.request("DELETE", "/api/topics/acts/new")[0] == 200
    assert channel_of(cluster, 0, "acts", "new") == {}
    assert adm.request("POST", "/api/topics/acts", {"action": "empty"})[0] == 200
    assert adm.request("DELETE", "/api/topics/acts")[0] == 200
    assert cluster.stats(a, "acts") == []
    assert "acts" not in cluster.lookupd.json("/topics")["topics"]


def test_peek_shows_each_nodes_next_messages_and_changes_nothing(cluster: Cluster) -> None:
    a, b = cluster.nsqds[0], cluster.nsqds[1]
    cluster.pub(a, "peeked", b"a1", b"a2")
    cluster.pub(b, "peeked", b"b1")
    for n in (a, b):
        assert cluster.post_nsqd(n, "/channel/create?topic=peeked&channel=c") == 200
    cluster.pub(a, "peeked", b"a3")
    wait_until(
        lambda: (
            cluster.lookupd.get("/lookup?topic=peeked")[0] == 200
            and len(cluster.lookupd.json("/lookup?topic=peeked")["producers"]) == 2
        )
    )
    adm = cluster.admin
    before = [channel_of(cluster, i, "peeked", "c")["depth"] for i in (0, 1)]
    status, data = adm.request("GET", "/api/topics/peeked/c/peek?n=5")
    assert status == 200 and data["message"] == ""
    bodies = {p["node"]: [m["body"] for m in p["messages"]] for p in data["peeks"]}
    assert bodies[f"127.0.0.1:{a.http_port}"][-1] == "a3"
    assert f"127.0.0.1:{b.http_port}" in bodies
    assert [channel_of(cluster, i, "peeked", "c")["depth"] for i in (0, 1)] == before
    for path, want in [
        ("/api/topics/peeked/c/peek?n=0", (400, "INVALID_N")),
        ("/api/topics/peeked/c/peek?n=x", (400, "INVALID_N")),
        ("/api/topics/peeked/bad!/peek", (400, "INVALID_CHANNEL")),
        ("/api/topics/nosuchtopic/c/peek", (404, "TOPIC_NOT_FOUND")),
    ]:
        status, data = adm.request("GET", path)
        assert (status, data["message"]) == want, path


def test_channel_policy_is_set_on_every_node_and_read_back(cluster: Cluster) -> None:
    a, b = cluster.nsqds[0], cluster.nsqds[1]
    for n in (a, b):
        assert cluster.post_nsqd(n, "/topic/create?topic=pol") == 200
        assert cluster.post_nsqd(n, "/channel/create?topic=pol&channel=c") == 200
    wait_until(lambda: len(cluster.lookupd.json("/lookup?topic=pol")["producers"]) == 2)
    adm = cluster.admin
    body = {"action": "config", "settings": {"max_attempts": 4, "max_msgs_per_sec": "100"}}
    status, data = adm.request("POST", "/api/topics/pol/c", body)
    assert (status, data["message"]) == (200, "")
    status, data = adm.request("GET", "/api/topics/pol/c/config")
    assert status == 200
    assert sorted(c["node"] for c in data["configs"]) == sorted(
        f"127.0.0.1:{n.http_port}" for n in (a, b)
    )
    assert {(c["max_attempts"], c["max_msgs_per_sec"]) for c in data["configs"]} == {(4, 100)}
    status, data = adm.request("POST", "/api/topics/pol/c", {"action": "replay_dead_letters"})
    assert status == 200
    # the nodes' refusal, and the admin's own
    status, data = adm.request(
        "POST", "/api/topics/pol/c", {"action": "config", "settings": {"max_attempts": "x"}}
    )
    assert status == 502 and "INVALID_MAX_ATTEMPTS" in data["message"]
    for bad in ({"action": "config"}, {"action": "config", "settings": {"topic": "x"}}):
        status, data = adm.request("POST", "/api/topics/pol/c", bad)
        assert (status, data["message"]) == (400, "INVALID_SETTINGS")
    assert adm.request("GET", "/api/topics/pol/c")[1]["dead_letter_count"] == 0


def test_a_replicated_topics_channel_policy_reaches_its_followers(cluster: Cluster) -> None:
    """nsqlookupd lists a replicated partition's leader only; the policy must be on the
    follower too, for when it leads."""
    status, _, body = cluster.lookupd.post(
        "/topic/create?topic=polrep&partition_num=1&replicator=2"
    )
    assert status == 200, body
    a, b = cluster.nsqds

    def hosted() -> bool:
        return all(cluster.stats(n, "polrep") for n in (a, b))

    wait_until(hosted, what="the partition on both nodes")
    for n in (a, b):
        assert cluster.post_nsqd(n, "/channel/create?topic=polrep&channel=c") == 200
    adm = cluster.admin
    body_ = {"action": "config", "settings": {"max_attempts": 7}}
    status, data = adm.request("POST", "/api/topics/polrep/c", body_)
    assert status == 200, data
    for n in (a, b):
        got = cluster.nsqd_json(n, "/channel/config?topic=polrep&channel=c")
        assert got["max_attempts"] == 7, n


def test_create_partitioned_topic_and_see_its_partitions(cluster: Cluster) -> None:
    adm = cluster.admin
    assert adm.request("POST", "/api/topics", {"topic": "parts", "partition_num": 4})[0] == 200
    wait_until(
        lambda: len(adm.get("/api/topics/parts")["partitions"]) == 4,
        what="4 partitions placed on the nodes",
    )
    topic = adm.get("/api/topics/parts")
    assert topic["partition_num"] == 4
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2, 3]
    assert {p["node"] for p in topic["partitions"]} == {n["node"] for n in topic["nodes"]}


def test_tombstone_a_node(cluster: Cluster) -> None:
    a, b = cluster.nsqds
    cluster.pub(a, "tomb", b"x")
    cluster.pub(b, "tomb", b"y")
    wait_until(lambda: len(cluster.lookupd.json("/lookup?topic=tomb")["producers"]) == 2)
    node = f"127.0.0.1:{a.http_port}"
    assert cluster.admin.request("DELETE", f"/api/nodes/{node}", {"topic": "tomb"})[0] == 200
    assert cluster.stats(a, "tomb") == []
    producers = cluster.lookupd.json("/lookup?topic=tomb")["producers"]
    assert [p["http_port"] for p in producers] == [b.http_port]


def test_garbage_gets_400s_and_harms_nothing(cluster: Cluster) -> None:
    adm = cluster.admin
    cases: list[tuple[str, str, bytes | None, int, str]] = [
        ("POST", "/api/topics", b"{not json", 400, "INVALID_BODY"),
        ("POST", "/api/topics", b"[1,2]", 400, "INVALID_BODY"),
        ("POST", "/api/topics", b'{"topic": 5}', 400, "INVALID_TOPIC"),
        ("POST", "/api/topics", b'{"topic": "<script>x</script>"}', 400, "INVALID_TOPIC"),
        ("POST", "/api/topics", b'{"topic": "ok", "channel": "a b"}', 400, "INVALID_CHANNEL"),
        ("POST", "/api/topics", b'{"topic": "ok", "partition_num": 999}', 400, "INVALID_PARTITION_NUM"),
        ("POST", "/api/topics/sums", b'{"action": "explode"}', 400, "INVALID_ACTION"),
        ("POST", "/api/topics/sums", b"\xff\xfe", 400, "INVALID_BODY"),
        ("POST", "/api/topics/sums/work", b'{"action": "setoffset", "position": "soon"}', 400, "INVALID_POSITION"),
        ("POST", "/api/topics/sums/work", b'{"action": "setoffset", "position": "special:-1", "partition": "x"}', 400, "INVALID_PARTITION"),
        ("GET", "/api/topics/bad%20name", None, 400, "INVALID_TOPIC"),
        ("GET", "/api/topics/sums/%3Cb%3E", None, 400, "INVALID_CHANNEL"),
        ("DELETE", "/api/nodes/not-a-node", b'{"topic": "sums"}', 400, "INVALID_NODE"),
        ("DELETE", "/api/nodes/127.0.0.1:1", b"null", 400, "INVALID_BODY"),
        ("GET", "/api/history?topic=", None, 400, "INVALID_TOPIC"),
        ("GET", "/api/nope", None, 404, "NOT_FOUND"),
        ("PUT", "/api/topics", b"{}", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/api/topics", b"x" * (2 * 1024 * 1024), 413, "BODY_TOO_BIG"),
        ("PUT", "/config/log_level", b"loud", 400, "INVALID_VALUE"),
        ("PUT", "/config/nope", b"1", 400, "INVALID_OPTION"),
        ("GET", "/api/topics/sums/nochannel", None, 404, "CHANNEL_NOT_FOUND"),
    ]  # fmt: skip
    for method, path, raw, status, message in cases:
        got, data = adm.request(method, path, raw=raw)
        assert (got, data["message"]) == (status, message), (method, path)
    # nothing was created, and everything still answers
    assert "ok" not in adm.get("/api/topics")["topics"]
    assert adm.request("GET", "/ping") == (200, "OK")
    assert adm.get("/api/topics/sums")["message_count"] == 12


def test_history_gives_rates_over_time(cluster: Cluster) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "hist", b"x")
    wait_until(lambda: len(cluster.admin.get("/api/history?topic=hist")["points"]) >= 2)
    cluster.pub(a, "hist", *[b"y"] * 10)

    def grown() -> bool:
        points = cluster.admin.get("/api/history?topic=hist")["points"]
        return points[-1]["message_count"] == 11 and any(
            (p["message_rate"] or 0) > 0 for p in points
        )

    wait_until(grown, what="the 10 new messages in the history, as a rate")
    data = cluster.admin.get("/api/history?topic=hist")
    assert data["interval"] == 0.1 and data["points"][0]["message_rate"] is None


def test_config_endpoint(cluster: Cluster) -> None:
    adm = cluster.admin
    assert adm.get("/config/nsqlookupd_http_addresses") == [cluster.lookupd.http_address]
    assert adm.get("/config/http_client_connect_timeout") == 2_000_000_000
    assert adm.request("PUT", "/config/log_level", raw=b"debug") == (200, "debug")
    adm.request("PUT", "/config/log_level", raw=b"info")


class Receiver:
    """A real HTTP endpoint that records the JSON POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_admin_users_and_notifications(cluster: Cluster, tmp_path: Path) -> None:
    receiver = Receiver()
    admin = start_admin(
        f"--lookupd-http-address={cluster.lookupd.http_address}",
        "--admin-user=alice",
        "--acl-http-header=X-User",
        f"--notification-http-endpoint={receiver.url}",
    )
    try:
        a = cluster.nsqds[0]
        cluster.pub(a, "guarded", b"x")
        wait_until(lambda: cluster.lookupd.get("/lookup?topic=guarded")[0] == 200)
        for method, path, body in [
            ("POST", "/api/topics/guarded", {"action": "pause"}),
            ("POST", "/api/topics", {"topic": "guarded2"}),
            ("DELETE", "/api/topics/guarded", None),
            ("DELETE", f"/api/nodes/127.0.0.1:{a.http_port}", {"topic": "guarded"}),
            ("POST", "/api/topics/guarded/c", {"action": "empty"}),
            # message bodies are for admins
            ("GET", "/api/topics/guarded/c/peek", None),
        ]:
            for headers in ({}, {"X-User": "bob"}):
                status, data = admin.request(method, path, body, headers=headers)
                assert (status, data["message"]) == (403, "FORBIDDEN"), (method, path, headers)
        assert cluster.stats(a, "guarded")[0]["paused"] is False
        # reading needs no admin; the page says who may act
        assert admin.get("/api/topics/guarded")["message_count"] == 1
        page = http_request(admin.url + "/topics/guarded", headers={"X-User": "bob"})[2].decode()
        assert '"is_admin": false' in page
        page = http_request(admin.url + "/topics/guarded", headers={"X-User": "alice"})[2].decode()
        assert '"is_admin": true' in page
        status, _ = admin.request(
            "POST", "/api/topics/guarded", {"action": "pause"},
            headers={"X-User": "alice", "Authorization": "Basic YWxpY2U6cHc="},
        )  # fmt: skip
        assert status == 200 and cluster.stats(a, "guarded")[0]["paused"] is True
        wait_until(lambda: receiver.bodies, what="the notification")
        (note,) = receiver.bodies
        assert note["action"] == "pause_topic" and note["topic"] == "guarded"
        assert note["user"] == "alice" and note["url"].endswith("/api/topics/guarded")
        assert isinstance(note["timestamp"], int) and note["via"]
    finally:
        admin.stop()
        receiver.close()


def test_nsqd_addresses_instead_of_lookupd(cluster: Cluster) -> None:
    a = cluster.nsqds[0]
    admin = start_admin(f"--nsqd-http-address=127.0.0.1:{a.http_port}")
    try:
        # without lookupd, creating a topic creates it on every listed nsqd
        assert admin.request("POST", "/api/topics", {"topic": "direct", "channel": "c"})[0] == 200
        assert channel_of(cluster, 0, "direct", "c") != {}
        assert "direct" in admin.get("/api/topics")["topics"]
        assert admin.get("/api/lookupds")["lookupds"] == []
        (node,) = admin.get("/api/nodes")["nodes"]
        assert node["http_port"] == a.http_port and node["health"] == "OK"
    finally:
        admin.stop()


def test_bad_command_lines_are_one_line() -> None:
    for args, text in [
        ([], "--nsqd-http-address or --lookupd-http-address required"),
        (["--lookupd-http-address=a:1", "--nsqd-http-address=b:2"], "not both"),
        (["--lookupd-http-address=nonsense"], "is not host:port"),
        (["--lookupd-http-address=a:1", "--allow-config-from-cidr=x"], "allow-config-from-cidr"),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "nsqx", "nsqadmin", *args], capture_output=True, timeout=30
        )
        assert r.returncode == 2
        err = r.stderr.decode()
        assert text in err and "Traceback" not in err, err


def test_an_unreachable_cluster_is_a_502_with_reasons() -> None:
    admin = start_admin(
        "--lookupd-http-address=127.0.0.1:1", "--history-interval=1h", "--history-length=1h"
    )
    try:
        status, data = admin.request("GET", "/api/topics")
        assert status == 502 and data["message"].startswith("UPSTREAM_ERROR: failed to query any")
        assert "127.0.0.1:1" in data["message"]
        assert admin.request("GET", "/ping") == (200, "OK")
    finally:
        admin.stop()


def test_every_endpoint_survives_garbage(cluster: Cluster) -> None:
    adm = cluster.admin
    cluster.pub(cluster.nsqds[0], "junk", b"x")
    bodies = [
        b"", b"null", b"{}", b"[]", b'"x"', b"\x00\xff" * 8, b'{"action": null}',
        b'{"topic": ["x"], "channel": {}}', b'{"action": "setoffset", "position": 7}',
        b'{"action": "setoffset", "position": "timestamp:9999999999999999999"}',
        b'{"topic": "' + b"a" * 100 + b'"}', b"{" * 5000,
    ]  # fmt: skip
    paths = [
        "/api/topics", "/api/topics/junk", "/api/topics/junk/ch", "/api/nodes/127.0.0.1:1",
        "/api/counter", "/api/history?topic=junk&channel=%ZZ", "/api/lookupds",
        "/config/log_level", "/api/topics/%ZZ", "/topics/%00", "/api/topics/junk/ch/extra",
    ]  # fmt: skip
    for path in paths:
        for method in ("GET", "POST", "PUT", "DELETE"):
            for body in bodies if method != "GET" else [None]:
                status, data = adm.request(method, path, raw=body)
                assert status != 500, (method, path, body, data)
                if path.startswith("/api"):
                    assert isinstance(data, dict) and "message" in data, (method, path, data)
    assert adm.request("GET", "/ping") == (200, "OK")
    assert adm.get("/api/topics/sums")["message_count"] == 12


def test_a_mistyped_topic_is_404_and_nothing_creates_it(cluster: Cluster) -> None:
    adm = cluster.admin
    cluster.pub(cluster.nsqds[0], "realtopic", b"x")
    wait_until(lambda: cluster.lookupd.get("/lookup?topic=realtopic")[0] == 200)
    for method, path, body in [
        ("GET", "/api/topics/realtopik", None),
        ("GET", "/api/topics/realtopik/somechannel", None),
        ("POST", "/api/topics/realtopik", {"action": "pause"}),
        ("POST", "/api/topics/realtopik", {"action": "empty"}),
    ]:
        status, data = adm.request(method, path, body)
        assert (status, data["message"]) == (404, "TOPIC_NOT_FOUND"), (method, path)
    # the real one and its unknown channel are told apart
    assert adm.request("GET", "/api/topics/realtopic/nochannel")[1]["message"] == (
        "CHANNEL_NOT_FOUND"
    )
    assert adm.get("/api/topics/realtopic")["message_count"] == 1
    assert "realtopik" not in cluster.lookupd.json("/topics")["topics"]
    assert all(cluster.stats(n, "realtopik") == [] for n in cluster.nsqds)


def test_a_rate_is_measured_up_to_now_not_at_the_last_sample(cluster: Cluster) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "flow", b"0")
    assert cluster.post_nsqd(a, "/channel/create?topic=flow&channel=c") == 200
    wait_until(lambda: cluster.lookupd.get("/lookup?topic=flow")[0] == 200)
    # samples an hour apart: every rate the page shows comes from its own readings
    admin = start_admin(
        f"--lookupd-http-address={cluster.lookupd.http_address}",
        "--history-interval=1h",
        "--history-length=2h",
    )
    try:

        def rates() -> tuple[Any, Any]:
            t = admin.get("/api/topics/flow")
            return t["rate"], t["channels"][0]["rate"]

        # nothing is published: 0 msgs/s once there is a window to measure over
        wait_until(lambda: rates()[0] == 0.0, what="a rate of 0 over a window")
        cluster.pub(a, "flow", *[b"m"] * 20)
        wait_until(lambda: (rates()[0] or 0) > 0, what="the 20 messages as a rate")
        # once the flow stops, the rate says so at once, not an interval later
        wait_until(lambda: rates()[0] == 0.0, what="the rate back to 0")
        listing = admin.get("/api/topics?stats=true")["stats"]
        assert next(s for s in listing if s["topic_name"] == "flow")["rate"] == 0.0
        # a paused channel has no rate
        assert admin.request("POST", "/api/topics/flow/c", {"action": "pause"})[0] == 200
        wait_until(lambda: rates() == (0.0, None), what="no rate for the paused channel")
        history = admin.get("/api/history?topic=flow")
        assert history["now"] >= history["points"][-1]["ts"]
    finally:
        admin.stop()


def test_a_node_page_has_its_clients_lookupds_and_tombstones(cluster: Cluster) -> None:
    a, b = cluster.nsqds
    cluster.pub(a, "gone", b"x")
    cluster.pub(b, "gone", b"y")
    wait_until(lambda: len(cluster.lookupd.json("/lookup?topic=gone")["producers"]) == 2)
    node = f"127.0.0.1:{a.http_port}"
    assert cluster.admin.request("DELETE", f"/api/nodes/{node}", {"topic": "gone"})[0] == 200
    # nsqlookupd forgets the tombstone once the node deleted the topic; the admin does not
    page = cluster.admin.get(f"/api/nodes/{node}")
    assert "gone" in page["tombstones"]
    assert page["remote_addresses"] == [f"{cluster.lookupd.http_address}/127.0.0.1:" + (
        page["remote_addresses"][0].rsplit(":", 1)[1]
    )]  # fmt: skip
    assert page["clients"] == [] and page["total_clients"] == 0
    (listed,) = [
        n for n in cluster.admin.get("/api/nodes")["nodes"] if n["http_port"] == a.http_port
    ]
    assert {"topic": "gone", "tombstoned": True} in listed["topics"]
    other = cluster.admin.get(f"/api/nodes/127.0.0.1:{b.http_port}")
    assert other["tombstones"] == []


def test_replaying_dead_letters_answers_what_nsqd_did(cluster: Cluster) -> None:
    """The admin's replay passes on nsqd's counts (added up over the nodes), each node's
    own answer beside them."""
    a = cluster.nsqds[0]
    assert cluster.post_nsqd(a, "/topic/create?topic=dlq") == 200
    assert cluster.post_nsqd(a, "/channel/create?topic=dlq&channel=c") == 200
    wait_until(lambda: cluster.lookupd.get("/lookup?topic=dlq")[0] == 200)
    adm = cluster.admin
    body = {"action": "config", "settings": {"max_attempts": 1}}
    assert adm.request("POST", "/api/topics/dlq/c", body)[0] == 200
    cluster.pub(a, "dlq", b"one", b"two", b"three")

    async def take_and_leave() -> None:
        # delivered once (their last attempt), then the client leaves: they die
        raw = await Raw.connect(("127.0.0.1", a.tcp_port))
        await raw.subscribe("dlq", "c", rdy=3)
        await raw.messages(3)
        await raw.close()

    run(take_and_leave())
    wait_until(lambda: channel_of(cluster, 0, "dlq", "c").get("dead_letter_count") == 3,
               what="three dead letters")  # fmt: skip
    status, data = adm.request("POST", "/api/topics/dlq/c", {"action": "replay_dead_letters"})
    assert status == 200, data
    assert (data["replayed"], data["missing"], data["scanned"]) == (3, 0, 3), data
    (node,) = data["nodes"]
    assert node["node"] == f"127.0.0.1:{a.http_port}" and node["replayed"] == 3
    # each is replayed once: a second replay finds nothing new
    data = adm.request("POST", "/api/topics/dlq/c", {"action": "replay_dead_letters"})[1]
    assert data["replayed"] == 0, data


def test_a_channel_that_does_not_exist_is_404_everywhere(cluster: Cluster) -> None:
    """As nsqd answers: the channel's policy, peek, replay and actions of a channel no
    node has are 404 CHANNEL_NOT_FOUND (its topic exists)."""
    a = cluster.nsqds[0]
    cluster.pub(a, "nochan", b"x")
    wait_until(lambda: cluster.lookupd.get("/lookup?topic=nochan")[0] == 200)
    adm = cluster.admin
    for method, path, body in [
        ("GET", "/api/topics/nochan/ghost/config", None),
        ("GET", "/api/topics/nochan/ghost/peek", None),
        ("POST", "/api/topics/nochan/ghost", {"action": "replay_dead_letters"}),
        ("POST", "/api/topics/nochan/ghost", {"action": "pause"}),
        ("POST", "/api/topics/nochan/ghost", {"action": "empty"}),
    ]:
        status, data = adm.request(method, path, body)
        assert (status, data["message"]) == (404, "CHANNEL_NOT_FOUND"), (method, path, data)
    for method, path, body in [
        ("GET", "/api/topics/notopic/ghost/config", None),
        ("POST", "/api/topics/notopic/ghost", {"action": "replay_dead_letters"}),
        ("POST", "/api/topics/notopic/ghost", {"action": "pause"}),
    ]:
        status, data = adm.request(method, path, body)
        assert (status, data["message"]) == (404, "TOPIC_NOT_FOUND"), (method, path, data)
    assert all(
        ch["channel_name"] != "ghost" for t in cluster.stats(a, "nochan") for ch in t["channels"]
    )
