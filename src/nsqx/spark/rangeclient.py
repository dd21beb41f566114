"""Blocking HTTP calls to nsqd's range-read API and nsqlookupd, for Spark tasks.

Plain ``http.client`` keeps this importable anywhere Spark runs Python (no event loop,
nothing to install beyond nsqx). One keep-alive connection per nsqd per process.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlencode

from nsqx.wire.range import RangeFrames, decode_range_frames


class NsqHttpError(Exception):
    """nsqd or nsqlookupd answered with an error (or could not be reached)."""


class NsqUnreachable(NsqHttpError):
    """nsqd or nsqlookupd could not be reached (no answer at all)."""


_local = threading.local()


def _conn(address: str, timeout: float) -> http.client.HTTPConnection:
    pool: dict[str, http.client.HTTPConnection] = getattr(_local, "pool", None) or {}
    _local.pool = pool
    conn = pool.get(address)
    if conn is None:
        host, _, port = address.rpartition(":")
        conn = pool[address] = http.client.HTTPConnection(host, int(port), timeout=timeout)
    return conn


def request(
    address: str, method: str, path: str, params: dict[str, Any], timeout: float = 30.0
) -> bytes:
    """One HTTP request; retried once on a dropped keep-alive connection."""
    url = f"{path}?{urlencode(params)}" if params else path
    for attempt in (1, 2):
        conn = _conn(address, timeout)
        try:
            conn.request(method, url)
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            _local.pool.pop(address, None)
            if attempt == 2:
                raise NsqUnreachable(f"{method} http://{address}{path}: {err}") from err
            continue
        if resp.status != 200:
            try:
                message = json.loads(body).get("message", body.decode(errors="replace"))
            except ValueError:
                message = body.decode(errors="replace")
            raise NsqHttpError(f"{method} http://{address}{path}: {resp.status} {message}")
        return body
    raise AssertionError("unreachable")


def fetch_range(
    address: str,
    topic: str,
    partition: int,
    start: int,
    end: int | None = None,
    max_messages: int = 10_000,
    max_bytes: int = 8 * 1024 * 1024,
) -> RangeFrames:
    """Records of ``topic``/``partition`` on the nsqd at ``address`` from sequence
    ``start`` (below ``end``): their frames and tables, and the partition's current end."""
    params: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "start": start,
        "max_messages": max_messages,
        "max_bytes": max_bytes,
    }
    if end is not None:
        params["end"] = end
    return decode_range_frames(request(address, "GET", "/range", params))


def bounds(address: str, topic: str, partition: int) -> tuple[int, int]:
    """(earliest, end) sequences of a partition."""
    res = fetch_range(address, topic, partition, 0, max_messages=0)
    return res.start_sequence, res.end_sequence


def sequence_at_time(address: str, topic: str, partition: int, ms: int) -> int:
    """The first sequence published at or after ``ms`` (epoch milliseconds)."""
    params = {
        "topic": topic,
        "partition": partition,
        "start_time": ms * 1_000_000,
        "max_messages": 0,
    }
    return decode_range_frames(request(address, "GET", "/range", params)).start_sequence


def set_channel_offset(address: str, topic: str, channel: str, partition: int, seq: int) -> None:
    """Advance ``channel`` so that everything below ``seq`` counts as consumed."""
    request(
        address,
        "POST",
        "/channel/setoffset",
        {"topic": topic, "channel": channel, "partition": partition, "sequence": seq},
    )


def local_partitions(address: str, topic: str) -> dict[int, dict[str, Any] | None]:
    """The partitions of ``topic`` that the nsqd at ``address`` hosts (empty if none),
    each with its replication state (role, epoch, ...; None if not replicated).

    Asked of nsqd's own /stats, which works with any lookupd or none: a partitioned
    topic has one entry per local partition with its ``topic_partition``; an NSQ 1.3
    topic's entry has no such field and is partition 0; a topic sharded over an nsqd's
    workers (``--worker-shards``) is one entry with each shard's under ``shards``.
    """
    params = {"format": "json", "topic": topic, "include_clients": "false", "include_mem": "false"}
    data = json.loads(request(address, "GET", "/stats", params))
    if isinstance(data.get("data"), dict):  # the V1 envelope of older servers
        data = data["data"]
    found: dict[int, dict[str, Any] | None] = {}
    entries = []
    for t in data.get("topics") or ():
        shards = t.get("shards")
        entries.extend(shards if isinstance(shards, list) else [t])
    for t in entries:
        if t.get("topic_name") == topic:
            replication = t.get("replication")
            found[int(t.get("topic_partition") or 0)] = (
                replication if isinstance(replication, dict) else None
            )
    return dict(sorted(found.items()))


def lookup(lookupd: str, topic: str) -> list[dict[str, Any]]:
    """The nsqd that serve ``topic`` according to one nsqlookupd (empty if none): its
    producers, plus the nodes of its partitions map where the lookupd has one
    (Youzan's), each once."""
    try:
        body = request(lookupd, "GET", "/lookup", {"topic": topic, "access": "r"})
    except NsqHttpError as err:
        if "404" in str(err):
            return []
        raise
    data = json.loads(body)
    if isinstance(data.get("data"), dict):  # the V1 envelope
        data = data["data"]
    peers = list(data.get("producers") or [])
    partitions = data.get("partitions")
    if isinstance(partitions, dict):
        peers += partitions.values()
    seen: set[tuple[str, int]] = set()
    out = []
    for p in peers:
        node = (p["broadcast_address"], p["http_port"])
        if node not in seen:
            seen.add(node)
            out.append(p)
    return out


def holders(lookupd: str, topic: str) -> list[dict[str, Any]]:
    """Every nsqd that holds a partition of ``topic`` by one nsqlookupd's /nodes (the
    partitions each node registered): with replicated topics, /lookup lists only the
    leaders, and a reader also wants the other replicas to fall back on. Empty from a
    lookupd without that map (NSQ 1.3's)."""
    data = json.loads(request(lookupd, "GET", "/nodes", {}))
    if isinstance(data.get("data"), dict):  # the V1 envelope
        data = data["data"]
    return [
        p
        for p in data.get("producers") or ()
        if isinstance(p.get("partitions"), dict) and topic in p["partitions"]
    ]
