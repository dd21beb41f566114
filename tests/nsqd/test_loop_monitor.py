"""The event loop's own measurements: turns, timer lateness, scan rounds and garbage
collections, in /stats (``event_loop``) and /metrics (``nsq_loop_*``, ``nsq_gc_*``)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqx.nsqd import syncer
from nsqx.nsqd.loop_monitor import (
    BUCKET_BOUNDS,
    PROBE_INTERVAL,
    Histogram,
    LoopMonitor,
    freeze_startup_heap,
)
from nsqx.nsqd.loopturn import TURN_BUCKETS, LoopTurn
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.stats import GcPauses
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd, wait_for


def test_histogram_buckets_quantiles_and_window() -> None:
    h = Histogram()
    for us in (0.5, 3, 3, 900, 5000):  # buckets <1, <4, <4, <1024, <8192 us
        h.add(us / 1e6)
    assert h.count == 5
    assert h.counts[0] == 1 and h.counts[2] == 2 and h.counts[10] == 1 and h.counts[13] == 1
    assert BUCKET_BOUNDS[2] == 4e-6 and BUCKET_BOUNDS[-1] == float("inf")
    assert len(BUCKET_BOUNDS) == TURN_BUCKETS
    assert h.quantile(0.5) == 4e-6  # the upper bound of the median's bucket
    assert h.quantile(1.0) == 0.005  # never above the longest seen
    cum = h.cumulative()
    assert cum[-1] == ("+Inf", 5.0) and cum[2] == (repr(4e-6), 3.0)
    j = h.to_json()
    assert j["count"] == 5 and j["max_us"] == 5000 and j["recent_max_us"] == 5000
    assert j["buckets"] == [[1, 1], [4, 2], [1024, 1], [8192, 1]]
    # the recent maximum spans the current and the previous half window, then goes
    h.rotate()
    assert h.recent_max == 0.005
    h.rotate()
    assert h.recent_max == 0.0 and h.to_json()["max_us"] == 5000
    h.add(-1.0)  # a timer that fired early (the clock's rounding) counts as on time
    assert h.counts[0] == 2


async def _get(nsqd: NSQD, path: str) -> Any:
    assert nsqd.http_address is not None
    url = f"http://127.0.0.1:{nsqd.http_address[1]}{path}"
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200
        if path.startswith("/stats"):
            return await resp.json()
        return await resp.text()


def test_a_stalled_loop_shows_in_stats_and_metrics() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0")
        try:
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "ch", rdy=10)
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a", b"b")
            for m in await sub.messages(2):
                sub.send(c.fin(m.id))
            ch = nsqd.topics["t"].channels["ch"]
            await wait_for(lambda: ch.in_flight_count == 0)
            mon = nsqd.loop_monitor
            await wait_for(lambda: mon.scans.count > 0, what="a scan round")
            # turns that hold the loop for 40 ms, as a long piece of periodic work would,
            # until the probe (every 100 ms while no client reads) falls in one
            while mon.lateness.recent_max < 0.035:
                asyncio.get_running_loop().call_soon(time.sleep, 0.04)
                await asyncio.sleep(0)
            gc.collect(2)
            stats = await _get(nsqd, "/stats?format=json")
            loop = stats["event_loop"]
            assert stats["version"] and "topics" in stats  # NSQ's keys stay
            # the reads of the publishes and FINs were turns, each timed
            assert loop["turns"]["count"] >= 2
            assert loop["turns"]["max_us"] > 0
            assert loop["timer_lateness"]["max_us"] >= 35_000
            assert loop["timer_lateness"]["count"] > 1
            if os.path.exists("/proc/thread-self/schedstat"):
                # the stall was nsqd's own (a sleep: not waiting for a CPU), so it stays
                # when the time spent waiting for a CPU is taken out
                assert loop["timer_lateness_running"]["max_us"] >= 30_000
                assert loop["cpu_wait"]["count"] == loop["timer_lateness"]["count"]
            assert loop["scan"]["count"] >= 1
            assert loop["gc"]["gen2"]["collections"] >= 1
            assert loop["probe_interval_us"] == 5000
            # without the memory part (include_mem=false), no event_loop either
            lean = await _get(nsqd, "/stats?format=json&include_mem=false")
            assert "event_loop" not in lean and "memory" not in lean

            text = await _get(nsqd, "/metrics")
            samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
            late = samples[("nsq_loop_timer_lateness_seconds_count", ())]
            assert late >= loop["timer_lateness"]["count"]
            assert samples[("nsq_loop_timer_lateness_max_seconds", ())] >= 0.035
            # cumulative buckets: under 16.4 ms not all, under +Inf all
            under = samples[("nsq_loop_timer_lateness_seconds_bucket", (("le", "0.016384"),))]
            assert under < late
            assert samples[("nsq_loop_timer_lateness_seconds_bucket", (("le", "+Inf"),))] == late
            assert samples[("nsq_loop_turn_seconds_count", ())] >= 2
            assert samples[("nsq_loop_scan_seconds_count", ())] >= 1
            assert ("nsq_loop_timer_lateness_running_seconds_count", ()) in samples
            assert samples[("nsq_loop_cpu_wait_seconds_total", ())] >= 0
            assert samples[("nsq_gc_collections_total", (("generation", "2"),))] >= 1
            assert samples[("nsq_gc_pause_seconds_total", (("generation", "2"),))] > 0
            assert samples[("nsq_gc_pause_max_seconds", (("generation", "2"),))] > 0
        finally:
            await nsqd.close()
        # closed: the probe timer is disarmed
        assert nsqd.loop_monitor._handle is None

    run(body())


def test_gc_pauses_by_generation() -> None:
    GcPauses.install()
    try:
        before = GcPauses.by_generation()
        gc.collect(1)
        gc.collect(2)
        after = GcPauses.by_generation()
    finally:
        GcPauses.uninstall()
    assert after["gen1"]["collections"] == before["gen1"]["collections"] + 1
    assert after["gen2"]["collections"] == before["gen2"]["collections"] + 1
    assert after["gen2"]["max_us"] >= 0 and after["gen2"]["total_us"] >= before["gen2"]["total_us"]


def test_the_start_up_heap_is_frozen_once_per_process() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        try:
            # the first nsqd of the process froze what existed after its start...
            assert gc.get_freeze_count() > 0
            # ...and no later one freezes again (tests start many in one process)
            assert freeze_startup_heap() is False
        finally:
            await nsqd.close()

    run(body())


def test_a_checkpoint_round_is_sliced_between_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    # a slice of 0 s: the round gives the loop a turn before every channel's snapshot
    monkeypatch.setattr(syncer, "CHECKPOINT_SLICE", 0.0)

    async def body() -> None:
        nsqd = await start_nsqd()
        try:
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a")
            part = nsqd.topics["t"].partitions[0]
            channels = [part.get_channel(f"c{i}") for i in range(4)]
            for ch in channels:
                ch.dirty = True
            nsqd.checkpointer.run_round()
            clean = [0]
            while clean[-1] < len(channels):
                await asyncio.sleep(0)  # one step of the round at most
                clean.append(sum(not ch.dirty for ch in channels))
            # one channel per turn of the loop, and every one of them in the end
            assert all(b - a <= 1 for a, b in itertools.pairwise(clean))
            await nsqd.checkpointer.drain()
            for ch in channels:
                assert ch.cursor_path is not None and os.path.exists(ch.cursor_path)
        finally:
            await nsqd.close()

    run(body())


def test_the_probe_is_frequent_only_while_clients_read() -> None:
    async def body() -> None:
        turn = LoopTurn(0.0)
        mon = LoopMonitor(turn)
        mon.start()
        try:
            assert mon._handle is not None
            mon._handle.cancel()
            mon._probe()  # no reading turn since the last probe: the idle interval
            assert mon._due - time.monotonic() > PROBE_INTERVAL
            assert mon._handle is not None
            mon._handle.cancel()
            turn.turn_seconds += 0.001  # a client read: often again
            mon._probe()
            assert mon._due - time.monotonic() <= PROBE_INTERVAL
        finally:
            mon.stop()
        assert mon._handle is None and mon.lateness.count == 2

    run(body())
