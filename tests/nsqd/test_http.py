"""nsqd's HTTP API against a real aiohttp server on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

NSQ_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")


@asynccontextmanager
async def served(**opts: Any) -> AsyncIterator[tuple[NSQD, aiohttp.ClientSession, str]]:
    """An nsqd with its HTTP API on port 0, and a client session."""
    nsqd = await start_nsqd(http_address="127.0.0.1:0", **opts)
    assert nsqd.http_address is not None
    base = f"http://127.0.0.1:{nsqd.http_address[1]}"
    try:
        async with aiohttp.ClientSession() as session:
            yield nsqd, session, base
    finally:
        await nsqd.close()


async def call(
    session: aiohttp.ClientSession, method: str, url: str, data: bytes | None = None, **kw: Any
) -> tuple[int, bytes, aiohttp.ClientResponse]:
    async with session.request(method, url, data=data, **kw) as resp:
        return resp.status, await resp.read(), resp


def test_ping_and_info() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            status, text, resp = await call(s, "GET", base + "/ping")
            assert (status, text) == (200, b"OK")
            assert resp.headers[NSQ_HEADER[0]] == NSQ_HEADER[1]
            assert resp.headers["Content-Type"].startswith("text/plain")
            status, text, resp = await call(s, "GET", base + "/info")
            info = json.loads(text)
            assert resp.headers["Content-Type"].startswith("application/json")
            assert info["tcp_port"] == nsqd.tcp_address[1]  # type: ignore[index]
            assert info["http_port"] == nsqd.http_address[1]  # type: ignore[index]
            assert info["max_heartbeat_interval"] == 60 * 10**9  # ns, as NSQ
            assert info["max_output_buffer_timeout"] == 30 * 10**9
            assert set(info) == {
                "version",
                "broadcast_address",
                "hostname",
                "http_port",
                "tcp_port",
                "start_time",
                "max_heartbeat_interval",
                "max_output_buffer_size",
                "max_output_buffer_timeout",
                "max_deflate_level",
                "build",  # nsqx's own: compiled or pure Python
            }
            # the Accept header of old clients changes nothing (no envelope)
            for accept in ("application/vnd.nsq; version=1.0", "application/vnd.nsq version=1.0"):
                _, again, _ = await call(s, "GET", base + "/info", headers={"Accept": accept})
                assert json.loads(again) == info
            nsqd.health_error = "disk full"
            status, text, _ = await call(s, "GET", base + "/ping")
            assert (status, text) == (500, b"NOK - disk full")

    run(body())


def test_pub_mpub_defer_are_delivered_over_tcp() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=100)
            status, text, _ = await call(s, "POST", base + "/pub?topic=t&defer=200", b"later")
            assert (status, text) == (200, b"OK")
            assert (await call(s, "POST", base + "/pub?topic=t", b"one"))[:2] == (200, b"OK")
            text_body = b"two\n\nthree\n"  # empty lines are dropped
            assert (await call(s, "POST", base + "/mpub?topic=t", text_body))[0] == 200
            binary = struct.pack(">i", 2) + b"".join(
                struct.pack(">i", len(m)) + m for m in (b"four\n", b"five")
            )
            status, _, _ = await call(s, "POST", base + "/mpub?topic=t&binary=true", binary)
            assert status == 200
            got = await sub.messages(6)
            assert [m.body for m in got] == [b"one", b"two", b"three", b"four\n", b"five", b"later"]
            assert nsqd.topics["t"].message_count == 6
            sub.send(c.fin_many([m.id for m in got]))
            ch = nsqd.topics["t"].channels["ch"]
            await wait_for(lambda: ch.in_flight_count == 0, what="FINs")

    run(body())


def test_pub_auto_creates_topic_and_mpub_empty_text_creates_it_too() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            assert (await call(s, "POST", base + "/pub?topic=auto", b"x"))[0] == 200
            assert "auto" in nsqd.topics
            assert (await call(s, "POST", base + "/mpub?topic=blank", b"\n\n"))[0] == 200
            assert nsqd.topics["blank"].message_count == 0

    run(body())


BAD: list[tuple[str, str, bytes | None, int, str]] = [
    ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/pub?topic=a/b", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=" + "x" * 65, b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("POST", "/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=soon", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t", b"x" * 101, 413, "MSG_TOO_BIG"),
    ("POST", "/pub?topic=t%zz", b"x", 400, "INVALID_REQUEST"),
    ("POST", "/mpub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/mpub?topic=t", b"x" * 101, 413, "MSG_TOO_BIG"),
    ("POST", "/mpub?topic=t", b"x\n" * 150, 413, "BODY_TOO_BIG"),
    ("POST", "/mpub?topic=t&binary=1", b"", 413, "BAD_BODY"),
    ("POST", "/mpub?topic=t&binary=1", struct.pack(">ii", 1, 0), 413, "BAD_MESSAGE"),
    ("POST", "/mpub?topic=t&binary=1", struct.pack(">ii", 1, 500) + b"x", 413, "BAD_MESSAGE"),
    ("POST", "/mpub?topic=t&binary=1", struct.pack(">ii", 2, 1) + b"x", 413, "BAD_MESSAGE"),
    ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
    ("POST", "/stats", b"", 405, "METHOD_NOT_ALLOWED"),
    ("DELETE", "/config/msg_timeout", None, 405, "METHOD_NOT_ALLOWED"),
    ("GET", "/nope", None, 404, "NOT_FOUND"),
    ("GET", "/config/", None, 404, "NOT_FOUND"),
    ("GET", "/put?topic=t", None, 404, "NOT_FOUND"),  # pre-1.0 routes are gone
    ("POST", "/topic/create", None, 400, "MISSING_ARG_TOPIC"),
    ("POST", "/topic/create?topic=bad!", None, 400, "INVALID_TOPIC"),
    ("POST", "/topic/delete?topic=none", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/topic/empty?topic=none", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/topic/pause?topic=none", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/topic/unpause", None, 400, "MISSING_ARG_TOPIC"),
    ("POST", "/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=t!&channel=c", None, 400, "INVALID_ARG_TOPIC"),
    ("POST", "/channel/create?topic=t&channel=c!", None, 400, "INVALID_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=none&channel=c", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/channel/delete?topic=exists&channel=none", None, 404, "CHANNEL_NOT_FOUND"),
    ("POST", "/channel/empty?topic=exists&channel=none", None, 404, "CHANNEL_NOT_FOUND"),
    ("POST", "/channel/pause?topic=exists&channel=none", None, 404, "CHANNEL_NOT_FOUND"),
    ("GET", "/config/queue_scan_interval", None, 400, "INVALID_OPTION"),
    ("GET", "/config/no_such_option", None, 400, "INVALID_OPTION"),
    ("PUT", "/config/msg_timeout", b"1", 400, "INVALID_OPTION"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b"", 413, "INVALID_VALUE"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b"not json", 400, "INVALID_VALUE"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b'"a:1"', 400, "INVALID_VALUE"),
    ("PUT", "/config/log_level", b"loud", 400, "INVALID_VALUE"),
]


def test_bad_input_gets_nsq_status_and_message() -> None:
    async def body() -> None:
        async with served(max_msg_size=100, max_body_size=200) as (nsqd, s, base):
            nsqd.get_topic("exists")
            for method, path, data, want_status, want_message in BAD:
                status, text, resp = await call(s, method, base + path, data)
                where = f"{method} {path}"
                assert status == want_status, (where, status, text)
                assert json.loads(text) == {"message": want_message}, where
                assert resp.headers[NSQ_HEADER[0]] == NSQ_HEADER[1], where
            # nothing bad was published, and no topic was made by a bad request
            assert set(nsqd.topics) == {"exists"}
            status, _, resp = await call(s, "OPTIONS", base + "/pub")
            assert status == 200 and "POST" in resp.headers["Allow"]

    run(body())


async def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[bytes, bool]:
    """Send a request by hand; returns the whole answer and whether the server closed."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(head + body)
    await w.drain()
    answer = b""
    closed = False
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        chunk = await asyncio.wait_for(r.read(65536), 10)
        if not chunk:
            closed = True
            break
        answer += chunk
    if not closed:
        closed = await asyncio.wait_for(r.read(1), 10) == b""
    w.close()
    return answer, closed


def test_oversized_body_is_refused_before_it_is_read() -> None:
    async def body() -> None:
        async with served(max_msg_size=1000, max_body_size=5000) as (nsqd, _, _):
            assert nsqd.http_address is not None
            port = nsqd.http_address[1]
            # Content-Length says too much: 413 at once, though no byte of body was sent
            head = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"
            answer, closed = await raw_request(port, head)
            assert answer.startswith(b"HTTP/1.1 413"), answer
            assert answer.endswith(b'{"message":"MSG_TOO_BIG"}')
            assert closed  # the unread body makes the connection useless
            head = b"POST /mpub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"
            answer, _ = await raw_request(port, head)
            assert answer.endswith(b'{"message":"BODY_TOO_BIG"}')
            # chunked, no length: refused once the limit is passed, the body still open
            head = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            chunk = b"%x\r\n%s\r\n" % (600, b"y" * 600)
            answer, _ = await raw_request(port, head, chunk * 2)
            assert answer.startswith(b"HTTP/1.1 413"), answer
            assert answer.endswith(b'{"message":"MSG_TOO_BIG"}')
            assert "t" not in nsqd.topics

    run(body())


def test_topic_and_channel_admin() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            post = lambda path: call(s, "POST", base + path)  # noqa: E731
            status, text, _resp = await post("/topic/create?topic=t")
            assert (status, text) == (200, b"")  # NSQ answers actions with an empty body
            status, _, _ = await post("/channel/create?topic=t&channel=a")
            assert status == 200
            await post("/channel/create?topic=t&channel=b")
            assert set(nsqd.topics["t"].channels) == {"a", "b"}
            await call(s, "POST", base + "/mpub?topic=t", b"1\n2\n3")
            assert nsqd.topics["t"].channels["a"].depth == 3
            await post("/channel/empty?topic=t&channel=a")
            assert nsqd.topics["t"].channels["a"].depth == 0
            assert nsqd.topics["t"].channels["b"].depth == 3
            await post("/channel/delete?topic=t&channel=b")
            assert set(nsqd.topics["t"].channels) == {"a"}
            # a topic without channels holds messages; /topic/empty drops them
            await post("/topic/create?topic=held")
            await call(s, "POST", base + "/mpub?topic=held", b"1\n2")
            assert nsqd.topics["held"].depth == 2
            await post("/topic/empty?topic=held")
            assert nsqd.topics["held"].depth == 0
            await post("/channel/create?topic=held&channel=late")
            assert nsqd.topics["held"].channels["late"].depth == 0
            await post("/topic/delete?topic=held")
            assert "held" not in nsqd.topics
            with open(os.path.join(nsqd.data_path, "nsqd.dat")) as f:
                saved = json.load(f)
            assert [t["name"] for t in saved["topics"]] == ["t"]

    run(body())


def test_pause_stops_delivery_and_survives_restart(tmp_path: Any) -> None:
    async def body() -> None:
        data = str(tmp_path)
        async with served(data_path=data) as (nsqd, s, base):
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=10)
            await call(s, "POST", base + "/channel/pause?topic=t&channel=ch")
            await call(s, "POST", base + "/pub?topic=t", b"held")
            assert await sub.nothing_for(0.2)
            await call(s, "POST", base + "/channel/unpause?topic=t&channel=ch")
            assert (await sub.message()).body == b"held"
            await call(s, "POST", base + "/topic/pause?topic=t")
            await call(s, "POST", base + "/pub?topic=t", b"topic-held")
            assert await sub.nothing_for(0.2)
            assert nsqd.topics["t"].depth == 1
            await call(s, "POST", base + "/channel/pause?topic=t&channel=ch")
            stats = json.loads((await call(s, "GET", base + "/stats?format=json"))[1])
            assert stats["topics"][0]["paused"] is True
            assert stats["topics"][0]["channels"][0]["paused"] is True
            await call(s, "POST", base + "/topic/unpause?topic=t")
            await call(s, "POST", base + "/channel/unpause?topic=t&channel=ch")
            assert (await sub.message()).body == b"topic-held"
            await call(s, "POST", base + "/topic/pause?topic=t")
            await call(s, "POST", base + "/channel/pause?topic=t&channel=ch")
        again = await start_nsqd(data_path=data)
        try:
            assert again.topics["t"].paused
            assert again.topics["t"].channels["ch"].paused
        finally:
            await again.close()

    run(body())


def test_stats_json_shape_and_filters() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=5, client_id="cid", hostname="h1", user_agent="ua")
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a", b"b")
            await pub.publish("u", b"c")
            await sub.messages(2)
            await call(s, "POST", base + "/channel/create?topic=t&channel=other")

            async def stats(query: str) -> dict[str, Any]:
                status, text, _ = await call(s, "GET", base + "/stats?format=json" + query)
                assert status == 200
                return json.loads(text)  # type: ignore[no-any-return]

            full = await stats("")
            # NSQ 1.3's keys, and nsqx's event_loop (nsqx.nsqd.loop_monitor)
            nsq = {"version", "health", "start_time", "topics", "memory", "producers"}
            assert set(full) == nsq | {"event_loop"}
            assert full["health"] == "OK"
            assert [t["topic_name"] for t in full["topics"]] == ["t", "u"]
            t = full["topics"][0]
            assert t["message_count"] == 2 and t["message_bytes"] == 2
            assert t["e2e_processing_latency"] == {"count": 0, "percentiles": None}
            assert [c["channel_name"] for c in t["channels"]] == ["ch", "other"]
            ch = t["channels"][0]
            assert ch["in_flight_count"] == 2 and ch["client_count"] == 1
            assert ch["message_count"] == 2 and ch["depth"] == 0
            client = ch["clients"][0]
            assert client["client_id"] == "cid" and client["hostname"] == "h1"
            assert client["user_agent"] == "ua" and client["version"] == "V2"
            assert client["state"] == 3  # Go's stateSubscribed
            assert client["ready_count"] == 5 and client["in_flight_count"] == 2
            assert "pub_counts" not in client
            assert t["channels"][1]["clients"] == []
            assert set(full["memory"]) == {
                "heap_objects",
                "heap_idle_bytes",
                "heap_in_use_bytes",
                "heap_released_bytes",
                "gc_pause_usec_100",
                "gc_pause_usec_99",
                "gc_pause_usec_95",
                "next_gc_bytes",
                "gc_total_runs",
            }
            (producer,) = full["producers"]
            assert sorted(producer["pub_counts"], key=lambda p: p["topic"]) == [
                {"topic": "t", "count": 2},
                {"topic": "u", "count": 1},
            ]
            lean = await stats("&include_clients=false&include_mem=0")
            assert "memory" not in lean and lean["producers"] is None
            assert lean["topics"][0]["channels"][0]["clients"] is None
            assert lean["topics"][0]["channels"][0]["client_count"] == 1
            one = await stats("&topic=t&channel=other")
            assert [t["topic_name"] for t in one["topics"]] == ["t"]
            assert [c["channel_name"] for c in one["topics"][0]["channels"]] == ["other"]
            assert one["producers"][0]["pub_counts"] == [{"topic": "t", "count": 2}]
            none = await stats("&topic=nothing")
            assert none["topics"] is None and none["producers"] is None

            _status, text, resp = await call(s, "GET", base + "/stats")
            out = text.decode()
            assert resp.headers["Content-Type"].startswith("text/plain")
            assert out.startswith("nsqd v") and "\nHealth: OK\n" in out
            assert "\nMemory:\n" in out and "\nTopics:" in out
            assert "   [t              ] depth: 0     be-depth: 0     msgs: 2 " in out
            assert "      [ch                       ] depth: 0     be-depth: 0     inflt: 2 " in out
            assert "state: 3 inflt: 2    rdy: 5 " in out
            assert "\nProducers:\n   [V2 " in out and "topics: " in out
            _, empty, _ = await call(s, "GET", base + "/stats?topic=nothing&include_mem=false")
            assert b"\nTopics: None\n" in empty and b"Memory" not in empty

    run(body())


def test_config_get_and_put() -> None:
    async def body() -> None:
        async with served(msg_timeout=30.0) as (nsqd, s, base):
            get = lambda opt: call(s, "GET", base + "/config/" + opt)  # noqa: E731
            assert json.loads((await get("msg_timeout"))[1]) == 30 * 10**9
            assert json.loads((await get("max_msg_size"))[1]) == 1048576
            assert json.loads((await get("tcp_address"))[1]) == "127.0.0.1:0"
            assert json.loads((await get("nsqlookupd_tcp_addresses"))[1]) == []
            assert json.loads((await get("id"))[1]) == nsqd.options.node_id
            assert json.loads((await get("log_level"))[1]) == 2  # lg.INFO
            seen: list[list[str]] = []
            nsqd.on_lookupd_addresses_changed.append(seen.append)
            new = b'["127.0.0.1:4160","127.0.0.1:4161"]'
            status, text, _ = await call(s, "PUT", base + "/config/nsqlookupd_tcp_addresses", new)
            assert status == 200
            assert json.loads(text) == ["127.0.0.1:4160", "127.0.0.1:4161"]
            assert seen == [["127.0.0.1:4160", "127.0.0.1:4161"]]
            assert nsqd.options.nsqlookupd_tcp_addresses == ["127.0.0.1:4160", "127.0.0.1:4161"]
            level = logging.getLogger("nsqx").level
            try:
                status, text, _ = await call(s, "PUT", base + "/config/log_level", b"debug")
                assert (status, json.loads(text)) == (200, 1)
                assert logging.getLogger("nsqx").level == logging.DEBUG
                assert nsqd.options.log_level == "debug"
            finally:
                logging.getLogger("nsqx").setLevel(level)

    run(body())


def test_publish_while_exiting_is_refused() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            nsqd._exiting = True
            status, text, _ = await call(s, "POST", base + "/pub?topic=t", b"x")
            nsqd._exiting = False
            assert (status, json.loads(text)) == (503, {"message": "EXITING"})

    run(body())


@pytest.mark.parametrize("unix", [False, True])
def test_listener_address_forms(tmp_path: Any, unix: bool) -> None:
    async def body() -> None:
        if unix:
            path = str(tmp_path / "nsqd-http.sock")
            nsqd = await start_nsqd(http_address=path)
            try:
                assert nsqd.http_address is None
                conn = aiohttp.UnixConnector(path=path)
                async with aiohttp.ClientSession(connector=conn) as s:
                    _status, text, _ = await call(s, "GET", "http://nsqd/info")
                    assert json.loads(text)["http_port"] == -1
            finally:
                await nsqd.close()
            assert not os.path.exists(path)
        else:
            async with served() as (_, s, base):
                assert (await call(s, "GET", base + "/ping"))[0] == 200

    run(body())


def test_topic_empty_while_paused_drops_what_channels_did_not_see() -> None:
    async def body() -> None:
        async with served() as (nsqd, s, base):
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=10)
            await call(s, "POST", base + "/pub?topic=t", b"seen")
            assert (await sub.message()).body == b"seen"
            await call(s, "POST", base + "/topic/pause?topic=t")
            await call(s, "POST", base + "/mpub?topic=t", b"held1\nheld2")
            assert nsqd.topics["t"].depth == 2
            status, _, _ = await call(s, "POST", base + "/topic/empty?topic=t")
            assert status == 200 and nsqd.topics["t"].depth == 0
            await call(s, "POST", base + "/topic/unpause?topic=t")
            await call(s, "POST", base + "/pub?topic=t", b"after")
            assert (await sub.message()).body == b"after"

    run(body())


def test_range_reads_and_setoffset() -> None:
    """GET /range reads a partition by position without touching channels; bad requests
    get NSQ-style errors; /channel/setoffset moves a channel's cursor (its depth shows)."""
    from nsqx.wire.range import decode_range

    async def body() -> None:
        async with served(max_bytes_per_file=4096) as (nsqd, s, base):
            for i in range(30):  # one MPUB of 5 per round, then a PUB of another size
                data = struct.pack(">i", 5) + b"".join(
                    struct.pack(">i", 6) + b"m%02d-%02d" % (i, k) for k in range(5)
                )
                assert (await call(s, "POST", f"{base}/mpub?topic=r&binary=true", data))[0] == 200
                assert (await call(s, "POST", f"{base}/pub?topic=r", b"p%d" % i))[0] == 200
            await call(s, "POST", f"{base}/channel/create?topic=r&channel=c")
            status, raw, resp = await call(s, "GET", f"{base}/range?topic=r&start=0&end=180")
            assert status == 200 and resp.headers["Content-Type"] == "application/octet-stream"
            res = decode_range(raw)
            assert res.end_sequence == 180 and res.next_sequence == 180
            assert [r.sequence for r in res.records] == list(range(180))
            assert res.records[6].body == b"m01-00" and res.records[5].body == b"p0"
            # offsets lead back to the same records; budgets bound a read
            mid = res.records[77]
            at = decode_range(
                (await call(s, "GET", f"{base}/range?topic=r&start_offset={mid.offset}"))[1]
            )
            assert at.records[0] == mid
            few = decode_range(
                (await call(s, "GET", f"{base}/range?topic=r&start=10&max_messages=4"))[1]
            )
            assert [r.sequence for r in few.records] == [10, 11, 12, 13]
            one = decode_range(
                (await call(s, "GET", f"{base}/range?topic=r&start=3&max_bytes=1"))[1]
            )
            assert [r.sequence for r in one.records] == [3]
            assert nsqd.topics["r"].channels["c"].depth == 180  # a range read consumes nothing
            status, _, _ = await call(
                s, "POST", f"{base}/channel/setoffset?topic=r&channel=c&sequence=150"
            )
            assert status == 200 and nsqd.topics["r"].channels["c"].depth == 30
            nsqd.get_topic("e#ephemeral")
            for path, want in (
                ("/range?topic=nope", (404, "TOPIC_NOT_FOUND")),
                ("/range?topic=r&partition=1", (404, "PARTITION_NOT_FOUND")),
                ("/range?topic=r&start=x", (400, "INVALID_START")),
                ("/range?topic=r&max_messages=-1", (400, "INVALID_MAX_MESSAGES")),
                ("/range?topic=e%23ephemeral", (400, "TOPIC_NOT_DURABLE")),
            ):
                status, text, _ = await call(s, "GET", base + path)
                assert status == want[0] and json.loads(text or b"null") == {"message": want[1]}, (
                    path,
                    status,
                    text,
                )
            # no sequence: Youzan's form, whose position is the body
            status, text, _ = await call(s, "POST", f"{base}/channel/setoffset?topic=r&channel=c")
            assert (status, json.loads(text)["message"]) == (406, "MSG_EMPTY")

    run(body())


def test_ping_reports_failed_writes_and_fsyncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """/ping answers 500 NOK after a failed write until a write succeeds (as nsqd), and
    for good after a failed fsync (a later one could succeed without the lost pages)."""
    import nsqx.store.disklog as disklog

    real_writev, real_fsync = os.writev, os.fsync

    def disk_full(fd: int, buffers: list[bytes]) -> int:
        raise OSError(28, "No space left on device")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def body() -> None:
        async with served() as (nsqd, s, base):
            assert (await call(s, "POST", f"{base}/pub?topic=h", b"one"))[0] == 200
            monkeypatch.setattr(disklog.os, "writev", disk_full)
            status, text, _ = await call(s, "POST", f"{base}/pub?topic=h", b"two")
            assert status == 500 and json.loads(text) == {"message": "PUB_FAILED"}
            status, text, _ = await call(s, "GET", f"{base}/ping")
            assert status == 500 and b"NOK - failed to write to topic h" in text
            monkeypatch.setattr(disklog.os, "writev", real_writev)
            assert (await call(s, "POST", f"{base}/pub?topic=h", b"three"))[0] == 200
            assert (await call(s, "GET", f"{base}/ping"))[:2] == (200, b"OK")
            monkeypatch.setattr(disklog.os, "fsync", broken)
            with pytest.raises(OSError):
                await nsqd.sync_partitions({("h", 0)})
            monkeypatch.setattr(disklog.os, "fsync", real_fsync)
            status, text, _ = await call(s, "GET", f"{base}/ping")
            assert status == 500 and b"fsync of topic h failed" in text
            assert (await call(s, "POST", f"{base}/pub?topic=h", b"four"))[0] == 200
            assert (await call(s, "GET", f"{base}/ping"))[0] == 500  # still

    run(body())
