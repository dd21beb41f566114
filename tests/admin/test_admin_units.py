"""The admin's pure parts: adding nodes' /stats up (partitions too), latency merging, and
the history's rates; no I/O, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from nsqx.admin.history import History, Sample, sample_from_rows
from nsqx.clusterinfo.aggregate import aggregate_topic, merge_e2e, node_topics
from nsqx.clusterinfo.info import NodeHealth


def chan(name: str, depth: int, clients: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"channel_name": name, "depth": depth, "backend_depth": 0, "in_flight_count": 1,
            "deferred_count": 0, "message_count": 10, "requeue_count": 2, "timeout_count": 0,
            "client_count": len(clients or []), "clients": clients or [], "paused": False,
            "e2e_processing_latency": {"count": 4, "percentiles": [{"quantile": 0.99, "value": 100}]}}  # fmt: skip


def topic(name: str, depth: int, channels: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"topic_name": name, "depth": depth, "backend_depth": 0, "message_count": 20,
            "message_bytes": 200, "paused": False, "channels": channels,
            "e2e_processing_latency": {"count": 0, "percentiles": None}, **extra}  # fmt: skip


def test_a_partitioned_topic_is_one_row_per_node_with_its_partitions() -> None:
    stats = {
        "topics": [
            topic("t", 1, [chan("c", 3)], topic_partition="0", partition_num=4, is_leader=True),
            topic("t", 2, [chan("c", 5)], topic_partition="2", partition_num=4, end_offset=99),
            topic("other", 7, []),
        ]
    }
    (row,) = node_topics(stats, "n1:4151", "h1", "t", now=1000)
    assert (row["depth"], row["message_count"], row["partition_num"]) == (3, 40, 4)
    assert [p["partition"] for p in row["partitions"]] == [0, 2]
    assert row["partitions"][1]["end_offset"] == 99 and row["partitions"][0]["is_leader"]
    (c,) = row["channels"]
    assert (c["depth"], c["message_count"], c["in_flight_count"]) == (8, 20, 2)
    assert [(p["partition"], p["depth"]) for p in c["partitions"]] == [(0, 3), (2, 5)]


def test_topics_and_channels_add_up_over_nodes() -> None:
    client = {"client_id": "x", "hostname": "<b>h</b>", "connect_ts": 990}
    rows = node_topics({"topics": [topic("t", 1, [chan("c", 3, [client])])]}, "a:1", "ha", now=1000)
    rows += node_topics(
        {"topics": [topic("t", 2, [chan("c", 4), chan("d", 1)])]}, "b:1", "hb", now=1000
    )
    t = aggregate_topic("t", rows)
    assert (t["node"], t["depth"], t["message_count"]) == ("*", 3, 40)
    assert [n["node"] for n in t["nodes"]] == ["a:1", "b:1"]
    c, d = t["channels"]
    assert (c["channel_name"], c["depth"], c["requeue_count"], len(c["nodes"])) == ("c", 7, 4, 2)
    assert c["clients"][0]["connected"] == 10 * 10**9 and c["clients"][0]["node"] == "a:1"
    assert (d["channel_name"], d["depth"]) == ("d", 1)
    assert t["partitions"] == [] and t["partition_num"] == 0


def test_latency_percentiles_merge_by_weight() -> None:
    total: dict[str, Any] = {"count": 0, "percentiles": []}
    for count, value in ((1, 100.0), (3, 200.0)):
        merge_e2e(total, {"count": count, "percentiles": [
            {"quantile": 0.99, "value": value, "min": value, "max": value, "average": value,
             "count": count}]})  # fmt: skip
    (p,) = total["percentiles"]
    assert (p["min"], p["max"], p["average"], p["count"]) == (100.0, 200.0, 175.0, 4)


def test_latency_min_and_max_name_their_node_and_skip_nodes_without_samples() -> None:
    def stats(count: int, value: float) -> dict[str, Any]:
        e2e = {"count": count, "percentiles": [{"quantile": 0.99, "value": value}]}
        return {"topics": [topic("t", 0, [], e2e_processing_latency=e2e)]}

    rows = node_topics(stats(3, 200.0), "a:1", "ha")
    rows += node_topics(stats(0, 0.0), "b:1", "hb")  # nsqd says 0 when it has no sample
    rows += node_topics(stats(1, 600.0), "c:1", "hc")
    (p,) = aggregate_topic("t", rows)["e2e_processing_latency"]["percentiles"]
    assert (p["min"], p["min_node"], p["max"], p["max_node"]) == (200.0, "a:1", 600.0, "c:1")
    assert (p["average"], p["count"]) == (300.0, 4)
    # a node alone without samples has no values at all
    (only,) = aggregate_topic("t", node_topics(stats(0, 0.0), "b:1", "hb"))[
        "e2e_processing_latency"
    ]["percentiles"]
    assert only["min"] is None and only["min_node"] == "" and only["count"] == 0


def test_garbage_stats_are_ignored_not_fatal() -> None:
    assert node_topics({"topics": "nope"}, "a:1", "h") == []
    rows = node_topics(
        {"topics": [{"topic_name": "t", "depth": "x", "channels": [None]}]}, "a:1", "h"
    )
    assert rows[0]["depth"] == 0 and rows[0]["channels"][0]["channel_name"] == ""


def row(
    node: str, ts: float, count: int, channel: int | None = None, paused: bool = False
) -> dict[str, Any]:
    """One node's row for topic t (and channel c), as ClusterInfo.node_stats gives."""
    channels = []
    if channel is not None:
        channels = [{"channel_name": "c", "message_count": channel, "paused": paused}]
    return {"topic_name": "t", "node": node, "ts": ts, "message_count": count, "depth": 1,
            "channels": channels}  # fmt: skip


def test_history_keeps_its_length_and_charts_rates_per_node() -> None:
    h = History(interval=1.0, length=3.0)
    for ts, count in ((0.0, 0), (1.0, 10), (2.0, 30), (3.0, 5), (4.0, 9)):
        h.add(sample_from_rows(ts, [row("a", ts, count, channel=count)]))
    points = h.series("t")["points"]
    assert [p["ts"] for p in points] == [1.0, 2.0, 3.0, 4.0]  # only `length` is kept
    # the first point has no rate; a counter that went down (a restart) has none either
    assert [p["message_rate"] for p in points] == [None, 20.0, None, 4.0]
    assert h.series("t", "c")["points"][-1]["message_count"] == 9
    h.add(Sample(5.0, {}))
    assert h.series("t")["points"][-1]["ts"] == 4.0
    with pytest.raises(ValueError):
        History(interval=0, length=1)


def test_chart_rates_use_each_nodes_own_times_and_skip_incomplete_windows() -> None:
    h = History(interval=5.0, length=60.0)
    # node b answered 2 s later than a in the first sample: its window is 3 s, not 5
    h.add(sample_from_rows(0.0, [row("a", 0.0, 0), row("b", 2.0, 0)]))
    h.add(sample_from_rows(5.0, [row("a", 5.0, 50), row("b", 5.0, 30)]))
    # b did not answer: no rate rather than a drop (and no burst when it is back)
    h.add(sample_from_rows(10.0, [row("a", 10.0, 100)]))
    h.add(sample_from_rows(15.0, [row("a", 15.0, 150), row("b", 15.0, 130)]))
    # the sampler stalled for 20 s: a gap, not an average over it
    h.add(sample_from_rows(35.0, [row("a", 35.0, 160), row("b", 35.0, 140)]))
    h.add(sample_from_rows(40.0, [row("a", 40.0, 210), row("b", 40.0, 190)]))
    rates = [p["message_rate"] for p in h.series("t")["points"]]
    assert rates == [None, 20.0, None, None, None, 20.0]
    assert [p["message_count"] for p in h.series("t")["points"]][:3] == [0, 80, 100]


def test_a_pages_rate_ends_now_and_is_none_when_paused() -> None:
    h = History(interval=5.0, length=60.0)
    h.add(sample_from_rows(0.0, [row("a", 0.0, 0, channel=0)]))
    h.add(sample_from_rows(5.0, [row("a", 5.0, 400, channel=400)]))
    # the flow stopped at 5 s: a page 1 s later says 0, not the last sample's 80/s
    rates = h.live_rates([row("a", 6.0, 400, channel=400)])
    assert rates == {"t": 0.0, "t/c": 0.0}
    # it flows again: measured from the newest reading at least min_window old
    assert h.min_window == 1.0
    assert h.live_rates([row("a", 6.5, 410, channel=410)])["t"] == pytest.approx(10 / 1.5)
    assert h.live_rates([row("a", 7.0, 430, channel=430)]) == {"t": 30.0, "t/c": 30.0}
    # a paused channel has no rate (its topic still has one)
    assert h.live_rates([row("a", 8.0, 440, channel=430, paused=True)]) == {"t": 10.0, "t/c": None}
    # a node never read before has no baseline: no rate, not a made-up one
    assert h.live_rates([{**row("z", 9.0, 5), "topic_name": "new"}]) == {"new": None}
    # readings from long ago are forgotten: no rate over an empty window
    assert h.live_rates([row("a", 100.0, 500, channel=500)]) == {"t": None, "t/c": None}


def test_node_health_backs_off_and_counts_skips() -> None:
    now = [100.0]
    health = NodeHealth(clock=lambda: now[0], wall=lambda: 1e9, first_backoff=1.0, max_backoff=4.0)
    assert health.skip("http://n:1") is None
    down, new = health.failed("http://n:1", "timed out")
    assert new and down.retry_at == 101.0 and down.since == 1e9
    assert [health.failed("http://n:1", "again")[0].retry_at for _ in range(4)] == [
        102.0, 104.0, 104.0, 104.0,
    ]  # fmt: skip
    skipped = health.skip("http://n:1")
    assert skipped is not None and skipped.skipped == 1 and skipped.failures == 5
    assert skipped.to_json("n:1", "h", skipped=True)["skipped"] is True
    assert health.answered("http://n:1") and not health.answered("http://n:1")
    assert health.skip("http://n:1") is None


def test_a_silent_node_is_asked_again_by_a_page_once_a_second() -> None:
    now = [100.0]
    health = NodeHealth(
        clock=lambda: now[0], wall=lambda: 1e9, first_backoff=60.0, max_backoff=60.0
    )
    health.failed("http://n:1", "cannot connect")
    assert health.skip("http://n:1") is not None  # just tried
    now[0] += 0.5
    assert health.skip("http://n:1") is not None
    now[0] += 0.5
    assert health.skip("http://n:1") is None  # a second since: this page asks it
    assert health.skip("http://n:1") is not None  # and the others meanwhile do not
    health.failed("http://n:1", "cannot connect")  # (that ask failed too)
    now[0] += 0.9
    assert health.skip("http://n:1") is not None
    now[0] += 0.1
    assert health.skip("http://n:1") is None
    # the background probe's schedule is its own: 60 s after the last failure here
    down = health.get("http://n:1")
    assert down is not None and down.retry_at == 161.0
