"""Cluster-wide topic and channel stats from each nsqd's ``/stats``: pure functions.

nsqadmin shows a topic as the sum over the nodes that have it, with each node's own
row below (``nodes``), and a channel likewise; this module builds those JSON objects
in nsqadmin's shape (``internal/clusterinfo`` of NSQ 1.3: ``node``, ``hostname``,
``memory_depth``, ``nodes``, ``channels``, ``clients`` with ``connected``, latency
percentiles merged across nodes).

Youzan's partitioned topics (nsqx, Youzan's nsqd) appear in a node's ``/stats`` as one
entry per local partition (``topic_partition``); they are merged into the node's row
and also kept, one per partition, under ``partitions``, so that the admin can show
where each partition lives and how far behind each channel is on it.

No I/O: :mod:`nsqx.clusterinfo.info` fetches, this module adds up.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Any

__all__ = [
    "aggregate_channels",
    "aggregate_topic",
    "empty_channel",
    "merge_e2e",
    "node_topics",
]

_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count", "message_bytes")
_CHANNEL_SUMS = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
    "dead_letter_count",
    "expired_count",
    "dropped_count",
)
_PARTITION_FLAGS = (
    "is_leader",
    "is_multi_ordered",
    "is_multi_part",
    "is_ext",
    "is_channel_auto_create_disabled",
)
_PARTITION_CHANNEL_FIELDS = (
    "depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
)


def _num(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# -- end-to-end latency ----------------------------------------------------------------


def _e2e_from_nsqd(raw: Any, topic: str, channel: str, node: str) -> dict[str, Any]:
    """nsqd's ``{count, percentiles:[{quantile, value}]}`` in nsqadmin's aggregate form.

    Each percentile gets ``min``/``max`` and the node they come from (``min_node``,
    ``max_node``), ``average`` and ``count``. A node with no sample in its window
    (``count`` 0; nsqd then reports every percentile as 0) has no values (None), so
    that it cannot pass for the fastest node.
    """
    raw = _as_dict(raw)
    count = _num(raw.get("count"))
    percentiles = []
    for p in _as_list(raw.get("percentiles")):
        p = _as_dict(p)
        try:
            quantile = float(p.get("quantile", 0))
            value: float | None = float(p.get("value", 0))
        except (TypeError, ValueError):
            continue
        if not count:
            value = None
        percentiles.append(
            {
                "quantile": quantile,
                "value": value,
                "min": value,
                "max": value,
                "average": value,
                "count": count,
                "min_node": node if count else "",
                "max_node": node if count else "",
            }
        )
    return {
        "count": count,
        "percentiles": percentiles,
        "topic": topic,
        "channel": channel,
        "host": node,
    }


def merge_e2e(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Add ``other``'s percentiles to ``into``: min, max and a count-weighted average.

    nsqd reports percentiles per node; they cannot be combined exactly, so nsqadmin
    shows, per quantile, the range over nodes (with the node of each end) and the mean
    weighted by each node's number of samples. A node without samples adds nothing.
    (NSQ 1.3 computes ``min`` from the maxima; here it is the minimum.)
    """
    into["host"] = "*"
    into["count"] = _num(into.get("count")) + _num(other.get("count"))
    mine: list[dict[str, Any]] = into.setdefault("percentiles", [])
    for value in other.get("percentiles") or []:
        slot = next((p for p in mine if p["quantile"] == value["quantile"]), None)
        if slot is None:
            mine.append(dict(value))
            continue
        if not value.get("count") or value.get("average") is None:
            continue
        if not slot.get("count") or slot.get("average") is None:
            slot.update(value)
            continue
        if value["max"] > slot["max"]:
            slot["max"], slot["max_node"] = value["max"], value.get("max_node", "")
        if value["min"] < slot["min"]:
            slot["min"], slot["min_node"] = value["min"], value.get("min_node", "")
        total = slot["count"] + value["count"]
        slot["average"] = (
            slot["average"] * slot["count"] + value["average"] * value["count"]
        ) / total
        slot["count"] = total
        slot["value"] = slot["average"]
    mine.sort(key=lambda p: -p["quantile"])


# -- one node ---------------------------------------------------------------------------


def _client(raw: Any, node: str, now: float) -> dict[str, Any]:
    c = dict(_as_dict(raw))
    c["node"] = node
    # nsqadmin's "connected": nanoseconds since connect_ts
    c["connected"] = max(0, int(now) - _num(c.get("connect_ts"))) * 1_000_000_000
    return c


def _node_channel(
    raw: Any, topic: str, node: str, hostname: str, now: float, partition: int | None
) -> dict[str, Any]:
    raw = _as_dict(raw)
    name = str(raw.get("channel_name", ""))
    ch: dict[str, Any] = {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": name,
    }
    for key in _CHANNEL_SUMS:
        ch[key] = _num(raw.get(key))
    ch["memory_depth"] = ch["depth"] - ch["backend_depth"]
    ch["paused"] = bool(raw.get("paused"))
    clients = raw.get("clients")
    ch["clients"] = [_client(c, node, now) for c in _as_list(clients)]
    ch["e2e_processing_latency"] = _e2e_from_nsqd(
        raw.get("e2e_processing_latency"), topic, name, node
    )
    ch["partitions"] = []
    if partition is not None:
        ch["partitions"].append(
            {"partition": partition, "node": node, "paused": ch["paused"]}
            | {k: ch[k] for k in _PARTITION_CHANNEL_FIELDS}
        )
    return ch


def _add_channel(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Sum ``other`` (one node's or partition's channel) into ``into``."""
    for key in _CHANNEL_SUMS:
        into[key] = into.get(key, 0) + other.get(key, 0)
    into["paused"] = bool(into.get("paused")) or bool(other.get("paused"))
    into.setdefault("clients", []).extend(other.get("clients") or [])
    into["clients"].sort(key=lambda c: str(c.get("hostname", "")))
    merge_e2e(into.setdefault("e2e_processing_latency", {}), other["e2e_processing_latency"])
    into.setdefault("partitions", []).extend(other.get("partitions") or [])
    into["partitions"].sort(key=lambda p: (p["partition"], p["node"]))


def node_topics(
    stats: dict[str, Any],
    node: str,
    hostname: str,
    selected_topic: str = "",
    now: float | None = None,
) -> list[dict[str, Any]]:
    """One node's ``/stats`` answer as nsqadmin's per-node topic rows.

    Each row has ``node`` (the nsqd's HTTP address), ``hostname``, the topic's counts,
    ``channels`` (per-node channel rows with their clients) and, for a partitioned
    topic, ``partitions`` (one per local partition) and ``partition_num``.
    """
    now = time.time() if now is None else now
    rows: dict[str, dict[str, Any]] = {}
    for raw in _as_list(stats.get("topics")):
        raw = _as_dict(raw)
        name = str(raw.get("topic_name", ""))
        if not name or (selected_topic and name != selected_topic):
            continue
        partition: int | None = None
        if "topic_partition" in raw:
            partition = _num(raw.get("topic_partition"))
        entry: dict[str, Any] = {"node": node, "hostname": hostname, "topic_name": name}
        for key in _TOPIC_SUMS:
            entry[key] = _num(raw.get(key))
        entry["memory_depth"] = entry["depth"] - entry["backend_depth"]
        entry["paused"] = bool(raw.get("paused"))
        entry["e2e_processing_latency"] = _e2e_from_nsqd(
            raw.get("e2e_processing_latency"), name, "", node
        )
        entry["channels"] = [
            _node_channel(c, name, node, hostname, now, partition)
            for c in _as_list(raw.get("channels"))
        ]
        entry["partitions"] = []
        entry["partition_num"] = 0
        if partition is not None:
            entry["partition_num"] = _num(raw.get("partition_num"))
            part = {
                "partition": partition,
                "node": node,
                "hostname": hostname,
                "depth": entry["depth"],
                "message_count": entry["message_count"],
                "message_bytes": entry["message_bytes"],
                "paused": entry["paused"],
                "backend_start": _num(raw.get("backend_start")),
                "end_offset": _num(raw.get("end_offset")),
                "channels": [
                    {"channel_name": c["channel_name"], "paused": c["paused"]}
                    | {k: c[k] for k in _PARTITION_CHANNEL_FIELDS}
                    for c in entry["channels"]
                ],
            }
            for flag in _PARTITION_FLAGS:
                part[flag] = bool(raw.get(flag))
            entry["partitions"].append(part)
        row = rows.get(name)
        if row is None:
            rows[name] = entry
            continue
        # another partition of a topic already seen on this node: add it to the row
        for key in _TOPIC_SUMS:
            row[key] += entry[key]
        row["paused"] = row["paused"] or entry["paused"]
        row["partition_num"] = max(row["partition_num"], entry["partition_num"])
        merge_e2e(row["e2e_processing_latency"], entry["e2e_processing_latency"])
        row["e2e_processing_latency"]["host"] = node
        row["partitions"].extend(entry["partitions"])
        by_name = {c["channel_name"]: c for c in row["channels"]}
        for ch in entry["channels"]:
            known = by_name.get(ch["channel_name"])
            if known is None:
                row["channels"].append(ch)
                by_name[ch["channel_name"]] = ch
            else:
                _add_channel(known, ch)
                known["e2e_processing_latency"]["host"] = node
    for row in rows.values():
        row["partitions"].sort(key=lambda p: p["partition"])
        row["channels"].sort(key=lambda c: c["channel_name"])
    return list(rows.values())


# -- the cluster ------------------------------------------------------------------------


def empty_channel(topic: str, channel: str) -> dict[str, Any]:
    """A channel summed over no node: every count 0 (``nodes`` empty)."""
    return {
        "node": "*",
        "hostname": "",
        "topic_name": topic,
        "channel_name": channel,
        **{k: 0 for k in _CHANNEL_SUMS},
        "paused": False,
        "nodes": [],
        "clients": [],
        "partitions": [],
        "e2e_processing_latency": {
            "count": 0,
            "percentiles": [],
            "topic": topic,
            "channel": channel,
            "host": "*",
        },
    }


def aggregate_channels(node_rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Channel name -> the channel summed over nodes (``node`` "*", ``nodes`` each)."""
    out: dict[str, dict[str, Any]] = {}
    for row in node_rows:
        for ch in row.get("channels") or []:
            total = out.get(ch["channel_name"])
            if total is None:
                total = out[ch["channel_name"]] = empty_channel(
                    ch["topic_name"], ch["channel_name"]
                )
            _add_channel(total, ch)
            node_copy = copy.copy(ch)
            node_copy.pop("clients", None)
            total["nodes"].append(node_copy)
            total["nodes"].sort(key=lambda n: (n["hostname"], n["node"]))
    return out


def aggregate_topic(topic: str, node_rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The topic summed over nodes, nsqadmin's ``/api/topics/:topic`` object.

    Adds ``partitions`` (every partition of the topic, by number then node) and
    ``partition_num`` (0 for an NSQ 1.3 topic).
    """
    rows = [r for r in node_rows if r["topic_name"] == topic]
    total: dict[str, Any] = {
        "node": "*",
        "hostname": "",
        "topic_name": topic,
        **{k: 0 for k in _TOPIC_SUMS},
        "paused": False,
        "nodes": [],
        "channels": [],
        "partitions": [],
        "partition_num": 0,
        "e2e_processing_latency": {
            "count": 0,
            "percentiles": [],
            "topic": topic,
            "channel": "",
            "host": "*",
        },
    }
    for row in rows:
        for key in _TOPIC_SUMS:
            total[key] += row[key]
        total["paused"] = total["paused"] or row["paused"]
        total["partition_num"] = max(total["partition_num"], row.get("partition_num", 0))
        merge_e2e(total["e2e_processing_latency"], row["e2e_processing_latency"])
        total["partitions"].extend(row.get("partitions") or [])
        node_copy = copy.copy(row)
        node_copy["channels"] = [
            {k: v for k, v in c.items() if k != "clients"} for c in row.get("channels") or []
        ]
        total["nodes"].append(node_copy)
    total["nodes"].sort(key=lambda n: (n["hostname"], n["node"]))
    total["partitions"].sort(key=lambda p: (p["partition"], p["node"]))
    total["channels"] = sorted(
        aggregate_channels(rows).values(), key=lambda c: str(c["channel_name"])
    )
    return total
