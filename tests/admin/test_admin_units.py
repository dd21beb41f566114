"""The admin's pure parts: adding nodes' /stats up (partitions too), latency merging, and
the history's rates; no I/O, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from nsqx.admin.aggregate import aggregate_topic, merge_e2e, node_topics
from nsqx.admin.history import History, Sample, sample_from_topics


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


def test_garbage_stats_are_ignored_not_fatal() -> None:
    assert node_topics({"topics": "nope"}, "a:1", "h") == []
    rows = node_topics(
        {"topics": [{"topic_name": "t", "depth": "x", "channels": [None]}]}, "a:1", "h"
    )
    assert rows[0]["depth"] == 0 and rows[0]["channels"][0]["channel_name"] == ""


def test_history_rates_and_resets() -> None:
    h = History(interval=1.0, length=3.0)
    for ts, count in ((0.0, 0), (1.0, 10), (2.0, 30), (3.0, 5), (4.0, 9)):
        h.add(sample_from_topics(ts, [{"topic_name": "t", "message_count": count, "depth": 1,
                                       "channels": [{"channel_name": "c", "message_count": count}]}]))  # fmt: skip
    points = h.series("t")["points"]
    assert [p["ts"] for p in points] == [1.0, 2.0, 3.0, 4.0]  # only `length` is kept
    # the first point has no rate; a counter that went down (a restart) has none either
    assert [p["message_rate"] for p in points] == [None, 20.0, None, 4.0]
    assert h.series("t", "c")["points"][-1]["message_count"] == 9
    assert h.rates() == {"t": 4.0, "t/c": 4.0}
    h.add(Sample(5.0, {}))
    assert h.series("t")["points"][-1]["ts"] == 4.0
    with pytest.raises(ValueError):
        History(interval=0, length=1)
