"""The HTTP API of ``nsqx nsqd --workers=N`` answers as one node
(nsqx.nsqd.workers.http_routes).

Real processes on free loopback ports; every request on a fresh connection, so the
kernel spreads them over the workers: whichever worker takes one, publishes land in
the partition's owner, /stats, /metrics and /ping speak for the whole node, and actions
on a topic or channel reach the workers that host it. A request sent with the forwarded
header is answered by the worker that took it, with its own part.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsqx.client import Producer
from nsqx.nsqd.workers.http_routes import FORWARDED, WORKER
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.nsqd.workers.spec import SPEC_ENV, WorkerSpec
from nsqx.wire import commands as c
from nsqx.wire import replication as rp
from tlsnsq import make_certs
from workernode import wait_for

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="workers need fork/exec")

HTTP = "--http-address=127.0.0.1:0"

_NODE_HTTP_RE = re.compile(r"HTTP: listening on [\d.]+:(\d+) \(\d+ workers\)")
_WORKER_HTTP_RE = re.compile(r"\bw(\d+): .*HTTP: listening on 127\.0\.0\.1:(\d+)")


_WORKER_PID_RE = re.compile(r"WORKERS: worker \d+ started \(pid (\d+)\)")


def node_token(node: NsqdProcess) -> str:
    """The node's secret between its workers (what a forwarded request carries), read
    from a worker's environment as its supervisor gave it."""
    for line in list(node.log):
        if m := _WORKER_PID_RE.search(line):
            raw = Path(f"/proc/{m.group(1)}/environ").read_bytes()
            for var in raw.split(b"\0"):
                if var.startswith(SPEC_ENV.encode() + b"="):
                    return WorkerSpec.from_json(var.split(b"=", 1)[1].decode()).token
    raise AssertionError("no worker's spec found")


def test_a_client_cannot_pass_for_a_worker(node: NsqdProcess) -> None:
    """A request that claims to come from another worker, without the node's token, is
    routed as any other: it is answered as the node, never by the wrong worker."""
    topics = topics_spread(10)
    for topic in topics:
        status, body, _ = http(node, "POST", f"/pub?topic={topic}", b"x", {FORWARDED: "1"})
        assert (status, body) == (200, b"OK")
    doc = stats(node)
    assert sorted(t["topic_name"] for t in doc["topics"]) == sorted(topics)
    for index, port in internal_ports(node).items():
        url = f"http://127.0.0.1:{port}/stats?format=json"
        status, body, _ = http(node, "GET", "", None, {FORWARDED: node_token(node)}, url)
        own = sorted(t["topic_name"] for t in json.loads(body)["topics"])
        assert own == sorted(t for t in topics if owner_of(t, 0, 2) == index)


def internal_ports(node: NsqdProcess, workers: int = 2) -> dict[int, int]:
    """Each worker's own loopback HTTP port (the one that is not the node's), from the
    log; the node's port is set on ``node`` (a worker's lines name both)."""
    deadline = time.monotonic() + 20
    while True:
        public = ports = None
        found: dict[int, int] = {}
        for line in list(node.log):
            if m := _NODE_HTTP_RE.search(line):
                public = int(m.group(1))
        for line in list(node.log):
            if (m := _WORKER_HTTP_RE.search(line)) and int(m.group(2)) != public:
                found[int(m.group(1))] = int(m.group(2))
        if public is not None and len(found) == workers:
            ports = found
            node.http_port = public
            return ports
        if time.monotonic() > deadline:
            raise AssertionError("workers did not say where they listen:\n" + "".join(node.log))
        time.sleep(0.05)


def http(
    node: NsqdProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    url: str = "",
) -> tuple[int, bytes, dict[str, str]]:
    """One request on a fresh connection (urllib opens one per request)."""
    req = urllib.request.Request(
        url or node.http_url + path, data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def stats(node: NsqdProcess, query: str = "") -> dict[str, Any]:
    status, body, _ = http(node, "GET", "/stats?format=json" + query)
    assert status == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def each_worker(
    node: NsqdProcess, method: str, path: str, body: bytes | None = None
) -> dict[int, tuple[int, bytes]]:
    """The answer of every worker itself: on its own port, marked forwarded (so it
    answers with its own part, routing nothing)."""
    seen: dict[int, tuple[int, bytes]] = {}
    for index, port in internal_ports(node).items():
        url = f"http://127.0.0.1:{port}{path}"
        status, data, headers = http(node, method, path, body, {FORWARDED: node_token(node)}, url)
        assert headers[WORKER] == str(index)
        seen[index] = (status, data)
    return seen


def topics_spread(n: int, workers: int = 2) -> list[str]:
    names = [f"ht{i}" for i in range(n)]
    assert {owner_of(t, 0, workers) for t in names} == set(range(workers))
    return names


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NsqdProcess]:
    proc = start_nsqd(tmp_path / "node", "--workers=2", HTTP)
    try:
        internal_ports(proc)  # (and the node's own port)
        yield proc
    finally:
        proc.stop()
        proc.stop(signal.SIGKILL)


@pytest.fixture
def single(tmp_path: Path) -> Iterator[NsqdProcess]:
    proc = start_nsqd(tmp_path / "single", HTTP)
    try:
        yield proc
    finally:
        proc.stop()


def test_publishes_land_once_and_stats_show_one_node(node: NsqdProcess) -> None:
    topics = topics_spread(10)
    answered_by: set[str] = set()
    for topic in topics:
        for i in range(3):
            status, body, headers = http(node, "POST", f"/pub?topic={topic}", f"m{i}".encode())
            assert (status, body) == (200, b"OK")
            answered_by.add(headers[WORKER])
        status, body, headers = http(node, "POST", f"/mpub?topic={topic}", b"a\nb\n")
        assert (status, body) == (200, b"OK")
        answered_by.add(headers[WORKER])
    assert answered_by == {"0", "1"}  # the requests reached both workers

    doc = stats(node)
    assert set(doc) == {"version", "health", "start_time", "topics", "memory", "producers"} | {
        "event_loop"
    }
    assert doc["health"] == "OK"
    assert [t["topic_name"] for t in doc["topics"]] == sorted(topics)
    for t in doc["topics"]:
        assert (t["depth"], t["message_count"]) == (5, 5), t
        assert "topic_partition" not in t  # an NSQ 1.3 topic, as a single nsqd shows it
    assert len(doc["event_loop"]["workers"]) == 2

    # each worker hosts (and reports by itself) only the topics it owns
    for index, (status, body) in each_worker(node, "GET", "/stats?format=json").items():
        assert status == 200
        local = [t["topic_name"] for t in json.loads(body)["topics"]]
        assert local == sorted(t for t in topics if owner_of(t, 0, 2) == index)

    # the text format and the filters, of the whole node
    status, text, _ = http(node, "GET", "/stats")
    assert status == 200
    for topic in topics:
        assert text.decode().count(f"[{topic:<15}] depth: 5 ") == 1
    one = stats(node, f"&topic={topics[3]}&include_clients=false&include_mem=false")
    assert [t["topic_name"] for t in one["topics"]] == [topics[3]]
    assert "memory" not in one and one["producers"] is None
    assert stats(node, "&topic=nosuch")["topics"] is None

    # /metrics: one series per topic, the node's count
    status, body, headers = http(node, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    lines = body.decode().splitlines()
    for topic in topics:
        series = [ln for ln in lines if ln.startswith(f'nsq_topic_messages_total{{topic="{topic}"')]
        assert series == [f'nsq_topic_messages_total{{topic="{topic}"}} 5.0']
    assert sum(ln.startswith("nsq_info{") for ln in lines) == 1
    assert [ln for ln in lines if ln.startswith("nsq_topics ")] == ["nsq_topics 10.0"]


def kept(node: NsqdProcess) -> HTTPConnection:
    """A keep-alive connection to the node's HTTP address."""
    return HTTPConnection("127.0.0.1", node.http_port, timeout=30)


def ask(
    conn: HTTPConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """One request on a kept connection."""
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, resp.read(), dict(resp.headers)


def one_on_each_worker(node: NsqdProcess) -> dict[int, HTTPConnection]:
    """Kept connections, one taken by each worker (a first GET /ping is answered where
    it arrived, and says which worker that is: such a connection never moves)."""
    conns: dict[int, HTTPConnection] = {}
    for _ in range(100):
        conn = kept(node)
        status, _, headers = ask(conn, "GET", "/ping")
        assert status == 200
        index = int(headers[WORKER])
        if index in conns:
            conn.close()
        else:
            conns[index] = conn
        if len(conns) == 2:
            return conns
    raise AssertionError("a hundred connections landed on one worker")


def test_deferred_and_binary_publishes_reach_the_owner(node: NsqdProcess) -> None:
    """/pub?defer and /mpub?binary land once in the owner's partition: on fresh
    connections (moved to the owner), and on connections kept by each worker, whose
    publishes to the other worker's partitions go over the link, as a TCP one's."""
    topics = topics_spread(10)[:6]
    assert {owner_of(t, 0, 2) for t in topics} == {0, 1}
    two = struct.pack(">I", 2) + b"".join(struct.pack(">I", 2) + m for m in (b"b0", b"b1"))
    conns = one_on_each_worker(node)
    for topic in topics:
        assert http(node, "POST", f"/topic/create?topic={topic}")[0] == 200
        assert http(node, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        for _ in range(2):  # (fresh connections: whichever worker takes each)
            status, body, _ = http(node, "POST", f"/pub?topic={topic}&defer=60000", b"later")
            assert (status, body) == (200, b"OK")
            status, body, _ = http(node, "POST", f"/mpub?topic={topic}&binary=true", two)
            assert (status, body) == (200, b"OK")
        for index, conn in conns.items():
            status, body, headers = ask(conn, "POST", f"/pub?topic={topic}&defer=60000", b"l")
            assert (status, body, headers[WORKER]) == (200, b"OK", str(index))
            status, body, headers = ask(conn, "POST", f"/mpub?topic={topic}&binary=true", two)
            assert (status, body, headers[WORKER]) == (200, b"OK", str(index))
    doc = stats(node)
    assert sorted(t["topic_name"] for t in doc["topics"]) == sorted(topics)
    for t in doc["topics"]:
        assert t["message_count"] == 12, t
        (ch,) = t["channels"]
        assert (ch["depth"], ch["deferred_count"]) == (8, 4), t


def read_answer(f: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer read from a socket's file (its body by Content-Length)."""
    status = int(f.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline().decode().strip()) != "":
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers, f.read(int(headers["content-length"]))


def test_a_publishers_connection_moves_to_its_topics_owner(node: NsqdProcess) -> None:
    """A kept connection whose first request publishes to another worker's partition
    is moved there (nsqx.nsqd.workers.http_handoff): whichever worker took it, every
    answer on it comes from the owner, with the requests written with the first one.
    It moves once: its publishes to the other worker's topic then go over the link."""
    topics = topics_spread(10)
    topic = next(t for t in topics if owner_of(t, 0, 2) == 1)
    other = next(t for t in topics if owner_of(t, 0, 2) == 0)
    # 16 connections: without the move, about half would be answered by worker 0
    for _ in range(16):
        conn = kept(node)
        for i in range(3):
            status, body, headers = ask(conn, "POST", f"/pub?topic={topic}", f"m{i}".encode())
            assert (status, body, headers[WORKER]) == (200, b"OK", "1")
        status, body, headers = ask(conn, "POST", f"/mpub?topic={other}", b"a\nb\n")
        assert (status, body, headers[WORKER]) == (200, b"OK", "1")
        conn.close()
    # two publishes and a ping in one write: all read by the worker that took it, all
    # answered in order by the owner
    for _ in range(8):
        with socket.create_connection(("127.0.0.1", node.http_port), timeout=30) as sock:
            sent = b"".join(
                f"POST /pub?topic={topic} HTTP/1.1\r\nHost: n\r\nContent-Length: 2\r\n\r\n"
                f"p{i}".encode()
                for i in range(2)
            )
            sock.sendall(sent + b"GET /ping HTTP/1.1\r\nHost: n\r\n\r\n")
            f = sock.makefile("rb")
            for expected in (b"OK", b"OK", b"OK"):
                status, headers, body = read_answer(f)
                assert (status, body, headers[WORKER.lower()]) == (200, expected, "1")
    doc = stats(node)
    counts = {t["topic_name"]: t["message_count"] for t in doc["topics"]}
    assert (counts[topic], counts[other]) == (16 * 3 + 8 * 2, 16 * 2)


def test_producers_of_every_worker_are_listed(node: NsqdProcess) -> None:
    """Publishers of two topics owned by different workers: each connection moves to its
    topic's owner (nsqx.nsqd.workers.handoff), and /stats lists all of them, once."""
    names = topics_spread(10)
    topics = [next(t for t in names if owner_of(t, 0, 2) == w) for w in (0, 1)]

    def settled() -> tuple[dict[str, Any], dict[int, tuple[int, bytes]]] | None:
        doc = stats(node)
        local = each_worker(node, "GET", "/stats?format=json")
        held = {w: json.loads(body)["producers"] or [] for w, (_, body) in local.items()}
        if len(doc["producers"] or ()) != 16 or sorted(map(len, held.values())) != [8, 8]:
            return None
        return doc, local

    async def go() -> tuple[dict[str, Any], dict[int, tuple[int, bytes]]]:
        producers = [Producer(f"127.0.0.1:{node.tcp_port}") for _ in range(16)]
        for i, p in enumerate(producers):
            await p.connect()
            await p.publish(topics[i % 2], b"x")
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (got := await loop.run_in_executor(None, settled)) is None:
                assert loop.time() < deadline, "producers not settled on their owners"
                await asyncio.sleep(0.05)
            for p in producers:  # a moved connection goes on publishing
                await p.publish(topics[producers.index(p) % 2], b"y")
            return got
        finally:
            for p in producers:
                await p.close()

    doc, local = run(go())
    counts = sorted(tuple(sorted(c.items())) for p in doc["producers"] for c in p["pub_counts"])
    assert counts == sorted([(("count", 1), ("topic", t)) for t in topics] * 8)
    for w, (_, body) in local.items():
        # each worker holds the publishers of the topic it owns
        for prod in json.loads(body)["producers"]:
            assert [c["topic"] for c in prod["pub_counts"]] == [topics[w]]
    final = stats(node)
    assert sorted(t["message_count"] for t in final["topics"] if t["topic_name"] in topics) == [
        16,
        16,
    ]


def test_a_partitioned_topic_is_one_topic_of_the_node(node: NsqdProcess) -> None:
    name = "parts"
    assert {owner_of(name, pid, 2) for pid in range(4)} == {0, 1}
    for pid in range(4):
        status, body, _ = http(
            node, "POST", f"/topic/create?topic={name}&partition={pid}&partition_num=4"
        )
        assert status == 200, body
        for _ in range(pid + 1):
            status, body, _ = http(node, "POST", f"/pub?topic={name}&partition={pid}", b"m")
            assert (status, body) == (200, b"OK")
    # a channel in every partition, whichever worker hosts it
    assert http(node, "POST", f"/channel/create?topic={name}&channel=c")[0] == 200
    # the channel of one partition, paused in its owner only
    assert http(node, "POST", f"/channel/pause?topic={name}&channel=c&partition=2")[0] == 200

    entries = stats(node)["topics"]
    assert [(t["topic_name"], t["topic_partition"]) for t in entries] == [
        (name, str(pid)) for pid in range(4)
    ]
    for pid, t in enumerate(entries):
        assert t["partition_num"] == 4
        assert t["message_count"] == pid + 1
        [ch] = t["channels"]
        assert (ch["channel_name"], ch["depth"], ch["paused"]) == ("c", pid + 1, pid == 2)
    status, text, _ = http(node, "GET", "/stats")
    for pid in range(4):
        assert text.decode().count(f"[{name}:{pid}") == 1
    # /metrics: one topic of one channel, its partitions summed
    lines = http(node, "GET", "/metrics")[1].decode().splitlines()
    assert "nsq_topics 1.0" in lines
    assert f'nsq_topic_channels{{topic="{name}"}} 1.0' in lines
    assert f'nsq_topic_messages_total{{topic="{name}"}} 10.0' in lines
    assert f'nsq_channel_depth{{channel="c",topic="{name}"}} 10.0' in lines

    # the channel unpaused and the topic paused everywhere
    assert http(node, "POST", f"/channel/unpause?topic={name}&channel=c")[0] == 200
    assert http(node, "POST", f"/topic/pause?topic={name}")[0] == 200
    entries = stats(node)["topics"]
    assert all(t["paused"] and not t["channels"][0]["paused"] for t in entries)

    # deleted everywhere
    assert http(node, "POST", f"/topic/delete?topic={name}")[0] == 200
    assert stats(node)["topics"] == []
    assert not (node.data_path / f"{name}.topic").exists()  # (the last worker's rmdir)
    status, body, _ = http(node, "POST", f"/topic/delete?topic={name}")
    assert (status, body) == (404, b'{"message":"TOPIC_NOT_FOUND"}')


def test_channel_actions_reach_the_owner(node: NsqdProcess) -> None:
    topics = topics_spread(10)
    for topic in topics:
        assert http(node, "POST", f"/pub?topic={topic}", b"m")[0] == 200
        assert http(node, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
    for topic in topics:
        assert http(node, "POST", f"/channel/pause?topic={topic}&channel=c")[0] == 200
    assert all(t["channels"][0]["paused"] for t in stats(node)["topics"])
    for topic in topics:
        assert http(node, "POST", f"/channel/empty?topic={topic}&channel=c")[0] == 200
        assert http(node, "POST", f"/channel/unpause?topic={topic}&channel=c")[0] == 200
    for t in stats(node)["topics"]:
        assert (t["channels"][0]["paused"], t["channels"][0]["depth"]) == (False, 0)
    for topic in topics:
        assert http(node, "POST", f"/channel/delete?topic={topic}&channel=c")[0] == 200
        assert http(node, "POST", f"/topic/empty?topic={topic}")[0] == 200
    assert all(t["channels"] == [] and t["depth"] == 0 for t in stats(node)["topics"])


def test_peeks_reach_the_owner(node: NsqdProcess) -> None:
    for topic in topics_spread(10):
        assert http(node, "POST", f"/pub?topic={topic}", f"{topic}-m".encode())[0] == 200
        assert http(node, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        assert http(node, "POST", f"/pub?topic={topic}", f"{topic}-p".encode())[0] == 200
        status, body, _ = http(node, "GET", f"/channel/peek?topic={topic}&channel=c")
        assert status == 200, body
        assert [m["body"] for m in json.loads(body)["messages"]][-1] == f"{topic}-p"
        status, body, _ = http(node, "GET", f"/topic/peek?topic={topic}")
        assert status == 200, body
        assert [m["body"] for m in json.loads(body)["messages"]] == [f"{topic}-m", f"{topic}-p"]


def test_dead_letters_reach_the_dead_letter_topics_owner(node: NsqdProcess) -> None:
    topic = next(f"dq{i}" for i in range(100) if owner_of(f"dq{i}", 0, 2) == 0)
    dead = next(f"dd{i}" for i in range(100) if owner_of(f"dd{i}", 0, 2) == 1)
    assert http(node, "POST", f"/topic/create?topic={topic}")[0] == 200
    assert http(node, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
    q = f"topic={topic}&channel=c&max_attempts=1&dead_letter_topic={dead}"
    status, body, _ = http(node, "POST", f"/channel/config?{q}")
    assert status == 200, body
    status, body, _ = http(node, "GET", f"/channel/config?topic={topic}&channel=c")
    assert json.loads(body)["dead_letters_to"] == dead
    assert http(node, "POST", f"/pub?topic={topic}", b"poison")[0] == 200

    async def fail_once() -> bytes:
        raw = await Raw.connect(node.tcp_address)
        await raw.subscribe(topic, "c", rdy=1)
        m = await raw.message()
        raw.send(c.req(m.id, 0))
        await raw.close()
        return bytes(m.id)

    mid = run(fail_once())

    def dead_letters() -> list[dict[str, Any]]:
        status, body, _ = http(node, "GET", f"/topic/peek?topic={dead}")
        return (
            [json.loads(m["body"]) for m in json.loads(body)["messages"]] if status == 200 else []
        )

    wait_for(lambda: dead_letters(), what="the dead letter at the other worker")
    (letter,) = dead_letters()
    assert (letter["topic"], letter["id"], letter["body"]) == (topic, mid.decode(), "poison")
    channel = next(t for t in stats(node)["topics"] if t["topic_name"] == topic)["channels"][0]
    assert (channel["dead_letter_count"], channel["depth"]) == (1, 0)
    # replay needs the dead-letter topic in the channel's worker: a clear refusal
    status, body, _ = http(node, "POST", f"/channel/deadletter/replay?topic={topic}&channel=c")
    assert (status, json.loads(body)["message"]) == (400, "DEAD_LETTER_TOPIC_ON_ANOTHER_WORKER")


#: requests whose refusals a node of workers must answer as a single nsqd does
BAD_REQUESTS = [
    ("POST", "/pub?topic=bad!name", b"m"),
    ("POST", "/pub?topic=ht0", b""),
    ("POST", "/pub?topic=ht0&partition=abc", b"m"),
    ("POST", "/pub?topic=nosuch&partition=3", b"m"),
    ("POST", "/pub", b"m"),
    ("POST", "/pub?topic=ht0&defer=-1", b"m"),
    ("POST", "/mpub?topic=ht0&binary=true", b"\x00\x00"),
    ("POST", "/topic/delete?topic=nosuch", None),
    ("POST", "/topic/pause?topic=nosuch", None),
    ("POST", "/topic/empty?topic=nosuch", None),
    ("POST", "/channel/pause?topic=nosuch&channel=c", None),
    ("POST", "/channel/pause?topic=ht1&channel=nosuch", None),
    ("POST", "/channel/delete?topic=ht1&channel=nosuch&partition=0", None),
    ("POST", "/channel/create?topic=ht1&channel=bad!", None),
    ("POST", "/channel/setoffset?topic=nosuch&channel=c", b"special:-1"),
    ("GET", "/message/get?topic=nosuch&search_mode=count&search_pos=1", None),
    ("GET", "/range?topic=nosuch", None),
    ("GET", "/channel/peek?topic=nosuch&channel=c", None),
    ("GET", "/channel/peek?topic=ht0&channel=c&n=0", None),
    ("GET", "/topic/peek?topic=nosuch", None),
    ("GET", "/topic/peek?topic=ht0&sequence=-1", None),
    ("POST", "/channel/config?topic=nosuch&channel=c&max_attempts=2", None),
    ("GET", "/channel/config?topic=ht1&channel=nosuch", None),
    ("POST", "/channel/deadletter/replay?topic=nosuch&channel=c", None),
    ("GET", "/partition/state?topic=nosuch&partition=0", None),
    ("POST", "/topic/create?topic=ht1&partition=5&partition_num=2", None),
    ("PUT", "/config/log_level", b"loud"),
    ("PUT", "/config/nosuch", b"1"),
    ("GET", "/nosuch", None),
    ("GET", "/pub", None),
]


def test_refusals_are_a_single_nsqds(node: NsqdProcess, single: NsqdProcess) -> None:
    for target in (node, single):
        for topic in ("ht0", "ht1"):
            assert http(target, "POST", f"/pub?topic={topic}", b"m")[0] == 200
    for method, path, body in BAD_REQUESTS:
        want = http(single, method, path, body)[:2]
        assert want[0] >= 400, (path, want)
        for _ in range(4):  # (on fresh connections: whichever worker takes it)
            assert http(node, method, path, body)[:2] == want, (method, path)


def test_ping_info_and_config_speak_for_every_worker(node: NsqdProcess) -> None:
    assert http(node, "GET", "/ping")[:2] == (200, b"OK")
    own = {i: json.loads(body) for i, (_, body) in each_worker(node, "GET", "/info").items()}
    status, body, _ = http(node, "GET", "/info")
    info = json.loads(body)
    assert status == 200 and info["http_port"] == node.http_port
    assert info["start_time"] == min(i["start_time"] for i in own.values())
    assert set(info) == set(own[0])
    status, body, _ = http(node, "PUT", "/config/log_level", b"debug")
    assert (status, json.loads(body)) == (200, 1)
    for status, body in each_worker(node, "GET", "/config/log_level").values():
        assert (status, json.loads(body)) == (200, 1)
    addresses = json.dumps(["127.0.0.1:1"]).encode()
    assert http(node, "PUT", "/config/nsqlookupd_tcp_addresses", addresses)[0] == 200
    for status, body in each_worker(node, "GET", "/config/nsqlookupd_tcp_addresses").values():
        assert (status, json.loads(body)) == (200, ["127.0.0.1:1"])


def test_a_forwarded_request_is_answered_where_it_lands(node: NsqdProcess) -> None:
    """With the forwarded header, a worker answers a publish itself, even to a topic
    another worker owns (it is never forwarded again)."""
    topic = "fwd"
    seen = each_worker(node, "POST", f"/pub?topic={topic}", b"m")
    assert all(answer == (200, b"OK") for answer in seen.values())
    # each worker made the topic itself: the node's /stats lists both
    assert [t["topic_name"] for t in stats(node)["topics"]] == [topic, topic]


def test_a_replication_stream_reaches_the_partitions_owner(node: NsqdProcess) -> None:
    """A follower's WebSocket to any worker is carried to the partition's owner: its
    leader answers (here: refuses a node that holds no replica), not "not the leader"
    from a worker without the partition."""
    spread = topics_spread(10)
    topics = [t for w in (0, 1) for t in [x for x in spread if owner_of(x, 0, 2) == w][:2]]
    for topic in topics:
        assert http(node, "POST", f"/pub?topic={topic}", b"m")[0] == 200
        state = json.loads(http(node, "GET", f"/partition/state?topic={topic}&partition=0")[1])
        me = state["node"]
        role = {"epoch": 1, "replica": 2, "leader": me, "isr": [me], "replicas": [me, "other"]}
        path = f"/partition/role?topic={topic}&partition=0"
        assert http(node, "POST", path, json.dumps(role).encode())[0] == 200

    async def go() -> list[object]:
        out = []
        connector = aiohttp.TCPConnector(force_close=True)  # a connection per stream
        async with aiohttp.ClientSession(connector=connector) as session:
            for topic in topics:
                for _ in range(3):
                    url = f"{node.http_url}/replication/stream?node=n&topic={topic}&partition=0"
                    async with session.ws_connect(url) as ws:
                        await ws.send_bytes(rp.encode_hello(rp.Hello(topic, 0, "n", 1, 0, 0, [])))
                        msg = await ws.receive(timeout=10)
                        out.append(rp.decode(msg.data))
        return out

    answers = run(go())
    assert len(answers) == 12
    for answer in answers:
        assert isinstance(answer, rp.Refused) and answer.error == "E_NOT_REPLICA", answer


def test_admin_actions_from_an_allowed_address_reach_every_worker(tmp_path: Path) -> None:
    """--http-admin-allow is checked against the client's address, not the worker that
    forwarded the request."""
    allowed = start_nsqd(tmp_path / "a", "--workers=2", HTTP, "--http-admin-allow=127.0.0.1/32")
    refused = start_nsqd(tmp_path / "r", "--workers=2", HTTP, "--http-admin-allow=10.0.0.0/8")
    try:
        internal_ports(allowed)
        internal_ports(refused)
        topics = topics_spread(10)
        for topic in topics:
            assert http(allowed, "POST", f"/pub?topic={topic}", b"m")[0] == 200
            assert http(allowed, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
            assert http(allowed, "POST", f"/topic/pause?topic={topic}")[0] == 200
            assert http(refused, "POST", f"/pub?topic={topic}", b"m")[0] == 200
            status, body, _ = http(refused, "POST", f"/topic/pause?topic={topic}")
            assert (status, body) == (403, b'{"message":"FORBIDDEN"}')
        assert all(t["paused"] for t in stats(allowed)["topics"])
        assert not any(t["paused"] for t in stats(refused)["topics"])
    finally:
        allowed.stop()
        refused.stop()


def test_https_with_tls_required_is_forwarded_over_loopback(tmp_path: Path) -> None:
    """With --tls-required=true, a request over HTTPS reaches the owner through its
    loopback port (the worker it reached checked TLS); plain HTTP is refused."""
    certs = make_certs(tmp_path / "certs")
    node = start_nsqd(
        tmp_path / "node",
        "--workers=2",
        HTTP,
        "--https-address=127.0.0.1:0",
        "--tls-required=true",
        *certs.nsqd_flags(),
    )
    try:
        internal_ports(node)
        https_re = re.compile(r"\bw\d+: .*HTTPS: listening on 127\.0\.0\.1:(\d+)")
        deadline = time.monotonic() + 20
        while not (found := [m for ln in list(node.log) if (m := https_re.search(ln))]):
            assert time.monotonic() < deadline, "".join(node.log)
            time.sleep(0.05)
        base = f"https://127.0.0.1:{found[0].group(1)}"
        topics = topics_spread(10)

        async def go() -> tuple[dict[str, Any], set[str], int]:
            ctx = certs.client_context()
            workers: set[str] = set()
            connector = aiohttp.TCPConnector(force_close=True)  # a connection per request
            async with aiohttp.ClientSession(connector=connector) as session:
                for topic in topics:
                    for _ in range(2):
                        url = f"{base}/pub?topic={topic}"
                        async with session.post(url, data=b"m", ssl=ctx) as resp:
                            assert (resp.status, await resp.read()) == (200, b"OK")
                            workers.add(resp.headers[WORKER])
                async with session.get(f"{base}/stats?format=json", ssl=ctx) as resp:
                    doc = json.loads(await resp.read())
                async with session.get(f"{node.http_url}/ping") as resp:
                    plain = resp.status
            return doc, workers, plain

        doc, workers, plain = run(go())
    finally:
        node.stop()
    assert workers == {"0", "1"}
    assert [(t["topic_name"], t["depth"]) for t in doc["topics"]] == [
        (t, 2) for t in sorted(topics)
    ]
    assert plain == 403


def test_a_range_read_streams_from_the_owner(node: NsqdProcess) -> None:
    topics = topics_spread(10)
    bodies = b"\n".join(b"%04d" % i + b"x" * 1000 for i in range(200))
    for topic in topics:
        assert http(node, "POST", f"/mpub?topic={topic}", bodies)[0] == 200
    ports = internal_ports(node)
    for topic in topics:
        owner = owner_of(topic, 0, 2)
        path = f"/range?topic={topic}&partition=0&max_messages=150"
        url = f"http://127.0.0.1:{ports[owner]}{path}"
        want = http(node, "GET", path, None, {FORWARDED: node_token(node)}, url)
        assert want[0] == 200 and len(want[1]) > 150_000
        for _ in range(3):
            status, body, headers = http(node, "GET", path)
            assert (status, body) == want[:2]
            assert headers["Content-Type"] == "application/octet-stream"


def test_bytes_that_start_no_request_get_an_answer_at_once(node: NsqdProcess) -> None:
    """What cannot be an HTTP request (a TLS hello on the plain port, a line that never
    ends) is refused by either worker as by a single nsqd (400), with no wait for a
    line's end, and the node goes on serving."""
    for junk in (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"BREW /pot"):
        for _ in range(4):  # (on whichever worker each lands)
            with socket.create_connection(("127.0.0.1", node.http_port), timeout=30) as sock:
                sock.sendall(junk)
                assert re.match(rb"HTTP/1\.[01] 400 ", sock.recv(4096))
    assert http(node, "POST", "/pub?topic=after", b"m")[:2] == (200, b"OK")
