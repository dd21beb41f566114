"""End-to-end latency percentiles, statsd pushes and Prometheus /metrics."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from nsqx.nsqd.e2e import E2eResult, LatencyWindow, ns_to_human, quantiles
from nsqx.nsqd.stats import Stats, get_stats
from nsqx.nsqd.statsd import StatsdReport, host_key, packets, statsd_prefix
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for

# -- the quantile structure ------------------------------------------------------------


def test_weighted_quantiles_are_exact_on_small_data() -> None:
    data = [(v, 1.0) for v in range(1, 101)]
    assert quantiles([0.5, 0.99, 1.0], data) == [(0.5, 50), (0.99, 99), (1.0, 100)]
    # weights count: one sample standing for 9 items outweighs one standing for 1
    assert quantiles([0.5], [(1, 9.0), (100, 1.0)]) == [(0.5, 1)]
    assert quantiles([0.9], []) == [(0.9, 0)]


def test_window_sample_stays_bounded_and_accurate() -> None:
    w = LatencyWindow(600.0, [0.5, 0.99], samples=512)
    rng = random.Random(7)
    values = list(range(100_000))
    rng.shuffle(values)
    for i in range(0, len(values), 1000):  # FINs come in batches
        w.add(values[i : i + 1000])
    count, samples = w.samples()
    assert count == 100_000
    assert len(samples) <= 2 * 512
    (_q50, v50), (_q99, v99) = quantiles(w.percentiles, samples)
    # a uniform sample of 512 puts the median within a few percent of the truth
    assert abs(v50 - 50_000) < 8_000
    assert abs(v99 - 99_000) < 3_000


def test_window_forgets_old_halves() -> None:
    w = LatencyWindow(10.0, [0.5])
    w.add([5] * 10)
    w._last_move -= 6 * 10**9  # one half window went by: the samples move to "previous"
    w.add([7] * 10)
    assert w.samples()[0] == 20
    w._last_move -= 6 * 10**9  # another: the first batch is gone
    assert w.samples()[0] == 10
    w._last_move -= 60 * 10**9  # idle for long: everything is gone
    assert w.samples() == (0, [])


def test_e2e_result_rendering() -> None:
    assert E2eResult(0, None).to_json() == {"count": 0, "percentiles": None}
    r = E2eResult(3, [(0.99, 2_500_000), (0.5, 1500)])
    assert r.to_json()["percentiles"] == [
        {"quantile": 0.99, "value": 2_500_000},
        {"quantile": 0.5, "value": 1500},
    ]
    assert str(r) == "2.5ms, 1.5us"
    assert ns_to_human(2e9) == "2.0s" and ns_to_human(10) == "10.0ns"


def test_e2e_latency_in_stats_per_channel_and_topic() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(e2e_processing_latency_percentiles=[1.0, 0.5])
        try:
            subs = []
            for name in ("a", "b"):
                sub = await Raw.connect(nsqd)
                await sub.subscribe("t", name, rdy=100)
                subs.append(sub)
            pub = await Raw.connect(nsqd)
            pub.send(c.mpub("t", [b"m%d" % i for i in range(50)]))
            assert await pub.response() == b"OK"
            for sub in subs:
                msgs = await sub.messages(50)
                sub.send(c.fin_many([m.id for m in msgs]))
            t = nsqd.topics["t"]
            await wait_for(lambda: all(ch.in_flight_count == 0 for ch in t.channels.values()))
            (ts,) = get_stats(nsqd).topics or []
            for ch in ts.channels:
                assert ch.e2e.count == 50
                assert ch.e2e.percentiles is not None
                assert [q for q, _ in ch.e2e.percentiles] == [1.0, 0.5]
                assert all(v > 0 for _, v in ch.e2e.percentiles)
            assert ts.e2e.count == 100
            assert ts.e2e.percentiles is not None and ts.e2e.percentiles[0][1] > 0
            # and without the flag there is no window at all (no cost per FIN)
            assert all(ch.e2e is not None for ch in t.channels.values())
        finally:
            await nsqd.close()
        plain = await start_nsqd()
        try:
            sub = await Raw.connect(plain)
            await sub.subscribe("t", "ch")
            assert plain.topics["t"].channels["ch"].e2e is None
        finally:
            await plain.close()

    run(body())


# -- statsd ----------------------------------------------------------------------------


def test_statsd_prefix_and_host_key() -> None:
    assert host_key("10.0.0.1:4151") == "10_0_0_1_4151"
    assert statsd_prefix("nsq.%s", "host.local", 4151) == "nsq.host_local_4151."
    assert statsd_prefix("nsq.", "h", 1) == "nsq."
    assert statsd_prefix("", "h", 1) == ""


def test_statsd_lines_are_deltas_and_gauges() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        try:
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=10)
            eph = await Raw.connect(nsqd)
            await eph.subscribe("t", "tmp#ephemeral")
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"xx", b"yyy")
            await sub.messages(2)
            report = StatsdReport("nsq.h_1.", exclude_ephemeral=True, mem=True)
            mem = {
                "heap_objects": 1,
                "heap_idle_bytes": 2,
                "heap_in_use_bytes": 3,
                "heap_released_bytes": 4,
                "gc_pause_usec_100": 5,
                "gc_pause_usec_99": 6,
                "gc_pause_usec_95": 7,
                "next_gc_bytes": 8,
                "gc_total_runs": 10,
            }
            first = report.lines(get_stats(nsqd, include_clients=False), mem)
            assert "nsq.h_1.topic.t.message_count:2|c" in first
            assert "nsq.h_1.topic.t.message_bytes:5|c" in first
            assert "nsq.h_1.topic.t.depth:0|g" in first
            assert "nsq.h_1.topic.t.channel.ch.message_count:2|c" in first
            assert "nsq.h_1.topic.t.channel.ch.in_flight_count:2|g" in first
            assert "nsq.h_1.topic.t.channel.ch.clients:1|g" in first
            assert "nsq.h_1.topic.t.channel.ch.requeue_count:0|c" in first
            assert "nsq.h_1.mem.heap_objects:1|g" in first
            assert "nsq.h_1.mem.gc_runs:10|c" in first
            assert not any("ephemeral" in line for line in first)
            await pub.publish("t", b"z")
            second = report.lines(
                get_stats(nsqd, include_clients=False), dict(mem, gc_total_runs=12)
            )
            assert "nsq.h_1.topic.t.message_count:1|c" in second
            assert "nsq.h_1.mem.gc_runs:2|c" in second
            both = StatsdReport("", False, False).lines(get_stats(nsqd))
            assert "topic.t.channel.tmp#ephemeral.depth:3|g" in both
        finally:
            await nsqd.close()

    run(body())


def test_packets_keep_lines_whole() -> None:
    lines = [f"metric.{i}:{i}|g" for i in range(100)]
    out = packets(lines, 64)
    assert all(len(p) <= 64 for p in out)
    assert b"".join(out).decode().splitlines() == lines
    assert packets(["x" * 100], 10) == [b"x" * 100 + b"\n"]
    assert packets([], 10) == []
    assert Stats(None, None).topics is None


def test_statsd_pushes_over_udp() -> None:
    async def body() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        port = sock.getsockname()[1]
        nsqd = await start_nsqd(
            http_address="127.0.0.1:0",
            statsd_address=f"127.0.0.1:{port}",
            statsd_interval=0.05,
            statsd_prefix="nsq.%s",
            statsd_udp_packet_size=200,
            broadcast_address="node.example",
        )
        try:
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a")
            loop = asyncio.get_running_loop()
            assert nsqd.http_address is not None
            prefix = f"nsq.node_example_{nsqd.http_address[1]}."
            got: list[str] = []
            wanted = [prefix + "topic.t.message_count:", prefix + "mem.heap_objects:"]
            while not all(any(line.startswith(w) for line in got) for w in wanted):
                data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
                assert len(data) <= 200
                got.extend(data.decode().splitlines())
        finally:
            await nsqd.close()
            sock.close()

    run(body())


# -- Prometheus ------------------------------------------------------------------------


def test_metrics_endpoint() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(
            http_address="127.0.0.1:0", e2e_processing_latency_percentiles=[0.99]
        )
        try:
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=10)
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a", b"b", b"c")
            msgs = await sub.messages(3)
            sub.send(c.fin(msgs[0].id))
            sub.send(c.req(msgs[1].id, 0))
            ch = nsqd.topics["t"].channels["ch"]
            await wait_for(lambda: ch.requeue_count == 1 and ch.in_flight_count == 2)
            assert nsqd.http_address is not None
            url = f"http://127.0.0.1:{nsqd.http_address[1]}/metrics"
            async with aiohttp.ClientSession() as s, s.get(url) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=")
                text = await resp.text()
            samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
            tc = (("channel", "ch"), ("topic", "t"))
            q99 = ("quantile", "0.99")
            assert samples[("nsq_topic_messages_total", (("topic", "t"),))] == 3
            assert samples[("nsq_topic_message_bytes_total", (("topic", "t"),))] == 3
            assert samples[("nsq_channel_messages_total", tc)] == 3  # a requeue is no new one
            assert samples[("nsq_channel_requeued_total", tc)] == 1
            assert samples[("nsq_channel_in_flight", tc)] == 2
            assert samples[("nsq_channel_clients", tc)] == 1
            assert samples[("nsq_channel_depth", tc)] == 0
            assert samples[("nsq_channel_timed_out_total", tc)] == 0
            assert samples[("nsq_channel_deferred", tc)] == 0
            assert samples[("nsq_channel_e2e_processing_latency_count", tc)] == 1
            assert (
                samples[("nsq_channel_e2e_processing_latency_seconds", tuple(sorted((*tc, q99))))]
                > 0
            )
            assert samples[("nsq_clients", ())] == 2
            assert ("process_cpu_seconds_total", ()) in samples
        finally:
            await nsqd.close()

    run(body())


def test_http_api_in_a_real_process(nsqd_factory: Any) -> None:
    """--http-address with port 0 is logged as the TCP line is, and serves."""
    proc = nsqd_factory("--http-address=127.0.0.1:0")
    assert proc.http_port

    async def body() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.post(proc.http_url + "/pub?topic=t", data=b"hi") as r:
                assert (r.status, await r.read()) == (200, b"OK")
            async with s.post(proc.http_url + "/topic/pause?topic=t") as r:
                assert r.status == 200
            async with s.get(proc.http_url + "/stats?format=json") as r:
                stats = json.loads(await r.read())
            assert stats["topics"][0]["message_count"] == 1

    run(body())
    # paused state is on disk at once: even a kill -9 keeps it
    proc.stop(9)
    again = nsqd_factory(f"--data-path={proc.data_path}", "--http-address=127.0.0.1:0")

    async def check() -> None:
        url = again.http_url + "/stats?format=json&topic=t"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            stats = json.loads(await r.read())
        assert stats["topics"][0]["paused"] is True

    run(check())
