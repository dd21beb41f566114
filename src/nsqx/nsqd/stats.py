"""Stats: what /stats, statsd and /metrics report, read from the live objects on demand.

Nothing here is updated per message: topics, channels and clients keep their counters
and this module reads them when asked. The shapes are NSQ 1.3's (``nsqd/stats.go``):
JSON field names, ``null`` for absent lists, Go's client states, and the text format.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from nsqx import NSQ_VERSION
from nsqx.compiled import build_description
from nsqx.nsqd.client_v2 import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, ClientV2
from nsqx.nsqd.e2e import E2eResult

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition

#: our client states -> Go's (stateInit, stateDisconnected, stateConnected,
#: stateSubscribed, stateClosing = 0..4), which clients of the stats API know
GO_STATE = {STATE_INIT: 0, STATE_SUBSCRIBED: 3, STATE_CLOSING: 4}


@dataclass
class ClientStats:
    """One client connection, as NSQ's ClientV2Stats."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool
    pub_counts: list[tuple[str, int]] = field(default_factory=list)
    authed: bool = False
    auth_identity: str = ""
    auth_identity_url: str = ""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": self.version,
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        if self.pub_counts:  # omitempty in NSQ
            d["pub_counts"] = [{"topic": t, "count": n} for t, n in self.pub_counts]
        if self.authed:  # omitempty in NSQ, as the identity fields
            d["authed"] = True
            if self.auth_identity:
                d["auth_identity"] = self.auth_identity
            if self.auth_identity_url:
                d["auth_identity_url"] = self.auth_identity_url
        d.update(
            tls=self.tls,
            tls_cipher_suite=self.tls_cipher_suite,
            tls_version=self.tls_version,
            tls_negotiated_protocol=self.tls_negotiated_protocol,
            tls_negotiated_protocol_is_mutual=self.tls_negotiated_protocol_is_mutual,
        )
        return d

    def __str__(self) -> str:
        connected = go_duration(max(int(time.time()) - self.connect_ts, 0))
        port = self.remote_address.rpartition(":")[2]
        ident = f"{self.hostname}:{port} {self.user_agent}"
        if self.pub_counts:
            total = sum(n for _, n in self.pub_counts)
            topics = ",".join(f"{t}={n}" for t, n in self.pub_counts)
            return (
                f"[{self.version} {ident:<21}] msgs: {total:<8} topics: {topics} "
                f"connected: {connected}"
            )
        return (
            f"[{self.version} {ident:<21}] state: {self.state} inflt: {self.in_flight_count:<4} "
            f"rdy: {self.ready_count:<4} fin: {self.finish_count:<8} "
            f"re-q: {self.requeue_count:<8} msgs: {self.message_count:<8} "
            f"connected: {connected}"
        )


@dataclass
class ChannelStats:
    """One channel, as NSQ's ChannelStats."""

    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: list[ClientStats] | None
    paused: bool
    ephemeral: bool
    e2e: E2eResult
    #: nsqx's channel policy (nsqx.nsqd.channel_policy): messages sent to the
    #: dead-letter topic, and skipped for their TTL
    dead_letter_count: int = 0
    expired_count: int = 0
    #: dropped by a maximum depth with overflow=drop_oldest
    dropped_count: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "channel_name": self.channel_name,
            "depth": self.depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "message_count": self.message_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "client_count": self.client_count,
            "clients": None if self.clients is None else [c.to_json() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": self.e2e.to_json(),
            "dead_letter_count": self.dead_letter_count,
            "expired_count": self.expired_count,
            "dropped_count": self.dropped_count,
        }


@dataclass
class PartitionInfo:
    """What /stats adds for a partitioned topic (Youzan's TopicStats fields)."""

    partition: int
    is_leader: bool
    ordered: bool
    multipart: bool
    ext: bool
    channel_auto_create_disabled: bool
    partition_num: int
    backend_start: int
    end_offset: int
    #: a replicated partition's role, epoch, leader, ISR, commit point and (on the
    #: leader) each follower's lag; None if the topic is not replicated
    replication: dict[str, Any] | None = None


@dataclass
class TopicStats:
    """One topic (one partition of a partitioned topic), as NSQ's TopicStats."""

    topic_name: str
    channels: list[ChannelStats]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    ephemeral: bool
    e2e: E2eResult
    #: None for an NSQ 1.3 topic (one partition, no extension)
    partition: PartitionInfo | None = None
    #: a shard of a topic sharded over the workers (--worker-shards): a node's /stats
    #: shows its shards as one topic (merge_stats_json)
    sharded: bool = False

    @property
    def statsd_name(self) -> str:
        """The topic's name in statsd keys: with its partition when a node may host
        several of the topic's (ordered or multipart), as Youzan's nsqd names it."""
        p = self.partition
        if p is not None and (p.ordered or p.multipart):
            return f"{self.topic_name}.{p.partition}"
        return self.topic_name

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "topic_name": self.topic_name,
            "channels": [c.to_json() for c in self.channels],
            "depth": self.depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "message_bytes": self.message_bytes,
            "paused": self.paused,
            "e2e_processing_latency": self.e2e.to_json(),
        }
        p = self.partition
        if p is not None:
            d.update(
                {
                    "topic_partition": str(p.partition),
                    "partition_num": p.partition_num,
                    "is_leader": p.is_leader,
                    "is_multi_ordered": p.ordered,
                    "is_multi_part": p.multipart,
                    "is_ext": p.ext,
                    "is_channel_auto_create_disabled": p.channel_auto_create_disabled,
                    "backend_start": p.backend_start,
                    "end_offset": p.end_offset,
                    **({"replication": p.replication} if p.replication is not None else {}),
                    "statsd_name": self.statsd_name,
                }
            )
        if self.sharded:
            d[SHARDED_KEY] = True
        return d


@dataclass
class Stats:
    """A snapshot: topics (None when a topic filter matched nothing) and producers."""

    topics: list[TopicStats] | None
    producers: list[ClientStats] | None


def _consumer_stats(consumer: object, topic: str) -> ClientStats | None:
    """A channel's consumer's line: a connection's, or what stands for one (a
    connection of another worker subscribed here: its proxy says; None if it cannot)."""
    if isinstance(consumer, ClientV2):
        return client_stats(consumer, topic)
    fanin_client = getattr(consumer, "fanin_client", None)
    if isinstance(fanin_client, ClientV2):
        # a connection subscribed to every shard (nsqx.nsqd.fanin): this shard's counts
        line = client_stats(fanin_client, topic)
        held = consumer.channel.held_by(consumer)  # type: ignore[attr-defined]
        if held is not None:
            line.in_flight_count = len(held)
            line.finish_count = held.finish_count
            line.requeue_count = held.requeue_count
        return line
    own: Callable[[], ClientStats] | None = getattr(consumer, "client_stats", None)
    return own() if own is not None else None


def client_stats(client: ClientV2, topic: str = "") -> ClientStats:
    """A client's stats; ``pub_counts`` limited to ``topic`` when one is given."""
    s = client.settings
    tls_version = cipher = ""
    tls = False
    transport = client._transport  # TLS, when the connection was upgraded
    ssl_obj = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_obj is not None:
        tls = True
        c = ssl_obj.cipher()
        if c:
            cipher = c[0]
            tls_version = str(c[1]).replace("TLSv", "TLS")
    return ClientStats(
        client_id=s.client_id,
        hostname=s.hostname,
        version="V2",
        remote_address=client.remote_address,
        state=GO_STATE.get(client.state, client.state),
        ready_count=client.rdy,
        in_flight_count=client.in_flight_count,
        message_count=client.message_count,
        finish_count=client.finish_count,
        requeue_count=client.requeue_count,
        connect_ts=client.connect_ts,
        sample_rate=s.sample_rate,
        deflate=s.deflate,
        snappy=s.snappy,
        user_agent=s.user_agent,
        tls=tls,
        tls_cipher_suite=cipher,
        tls_version=tls_version,
        tls_negotiated_protocol="",
        tls_negotiated_protocol_is_mutual=False,
        pub_counts=[(t, n) for t, n in client.pub_counts.items() if not topic or t == topic],
        authed=client.auth_state is not None,
        auth_identity=client.auth_state.identity if client.auth_state else "",
        auth_identity_url=client.auth_state.identity_url if client.auth_state else "",
    )


_NO_E2E = E2eResult(0, None)


def channel_stats(ch: Channel, include_clients: bool = True) -> ChannelStats:
    depth, deferred = ch.reported_depths()
    return ChannelStats(
        channel_name=ch.name,
        depth=depth,
        backend_depth=0,
        in_flight_count=ch.in_flight_count,
        deferred_count=deferred,
        message_count=ch.message_count,
        requeue_count=ch.requeue_count,
        timeout_count=ch.timeout_count,
        # a connection that reads every shard of a sharded topic (nsqx.nsqd.fanin) is
        # counted on shard 0 only, so that the node's sum counts each connection once
        client_count=sum(
            1 for c in ch.clients if ch.partition.id == 0 or not getattr(c, "fans_in", False)
        ),
        clients=[
            line for c in ch.clients if (line := _consumer_stats(c, ch.topic.name)) is not None
        ]
        if include_clients
        else None,
        paused=ch.paused,
        ephemeral=ch.ephemeral,
        e2e=_NO_E2E if ch.e2e is None else E2eResult.merge([ch.e2e]),
        dead_letter_count=ch.dead_letter_count,
        expired_count=ch.expired_count,
        dropped_count=ch.dropped_count,
    )


def topic_stats(p: Partition, channels: list[ChannelStats]) -> TopicStats:
    """One partition's stats (an NSQ 1.3 topic's: its only partition's)."""
    windows = [ch.e2e for ch in p.channels.values() if ch.e2e is not None]
    t = p.topic
    info = None
    if t.meta.partitioned or list(t.partitions) != [0]:
        m = t.meta
        replica = p.replica
        info = PartitionInfo(
            partition=p.id,
            is_leader=replica is None or replica.leader is not None,
            ordered=m.ordered,
            multipart=m.multipart,
            ext=m.ext,
            channel_auto_create_disabled=m.disable_channel_auto_create,
            partition_num=m.partition_num,
            backend_start=p.log.start,
            end_offset=p.log.end_offset,
            replication=replica.stats() if replica is not None else None,
        )
    return TopicStats(
        topic_name=t.name,
        channels=channels,
        depth=p.depth,
        backend_depth=0,
        message_count=p.message_count,
        message_bytes=p.message_bytes,
        paused=p.paused,
        ephemeral=t.ephemeral,
        e2e=E2eResult.merge(windows) if windows else _NO_E2E,
        partition=info,
        sharded=t.sharded,
    )


def get_stats(
    nsqd: NSQD, topic: str = "", channel: str = "", include_clients: bool = True
) -> Stats:
    """NSQ's GetStats: topics and channels sorted by name, optionally filtered."""
    if topic:
        t = nsqd.topics.get(topic)
        if t is None:
            return Stats(None, None)
        topics = [t]
    else:
        topics = sorted(nsqd.topics.values(), key=lambda t: t.name)
    out: list[TopicStats] = []
    for t in topics:
        for part in t.partitions.values():
            if channel:
                ch = part.channels.get(channel)
                if ch is None:
                    continue
                chans = [ch]
            else:
                chans = sorted(part.channels.values(), key=lambda c: c.name)
            out.append(topic_stats(part, [channel_stats(c, include_clients) for c in chans]))
    producers: list[ClientStats] | None = None
    if include_clients:
        found = [client_stats(c, topic) for c in nsqd.clients if c.pub_counts]
        producers = found or None
    return Stats(out, producers)


# -- memory ----------------------------------------------------------------------------


class GcPauses:
    """Times garbage collections (gc.callbacks) to report pauses as NSQ reports Go's.

    Installed once per process while any nsqd runs; each collection costs two clock
    reads. Like Go's MemStats.PauseNs, only the last 256 pauses are kept.
    """

    _users = 0
    _started = 0
    pauses: deque[int] = deque(maxlen=256)
    runs = 0
    #: per generation (0, 1, 2): collections, their total and longest ns
    gen_runs = [0, 0, 0]
    gen_ns = [0, 0, 0]
    gen_max_ns = [0, 0, 0]

    @classmethod
    def _callback(cls, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            cls._started = time.perf_counter_ns()
        elif cls._started:
            took = time.perf_counter_ns() - cls._started
            cls.pauses.append(took)
            cls.runs += 1
            gen = info.get("generation", 0)
            if 0 <= gen <= 2:
                cls.gen_runs[gen] += 1
                cls.gen_ns[gen] += took
                if took > cls.gen_max_ns[gen]:
                    cls.gen_max_ns[gen] = took

    @classmethod
    def by_generation(cls) -> dict[str, dict[str, int]]:
        """Collections timed since start, by generation: count, total and longest (us)."""
        return {
            f"gen{g}": {
                "collections": cls.gen_runs[g],
                "total_us": cls.gen_ns[g] // 1000,
                "max_us": cls.gen_max_ns[g] // 1000,
            }
            for g in range(3)
        }

    @classmethod
    def install(cls) -> None:
        if cls._users == 0:
            gc.callbacks.append(cls._callback)
        cls._users += 1

    @classmethod
    def uninstall(cls) -> None:
        cls._users = max(cls._users - 1, 0)
        if cls._users == 0 and cls._callback in gc.callbacks:
            gc.callbacks.remove(cls._callback)


def _percentile(perc: float, values: list[int]) -> int:
    # NSQ's statsd percentile(): index floor(perc/100 * n + 0.5), clamped
    if not values:
        return 0
    i = min(int(perc / 100.0 * len(values) + 0.5), len(values) - 1)
    return values[i]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def mem_stats() -> dict[str, int]:
    """NSQ's memStats, mapped onto CPython: see docs/metrics.md for what each means here."""
    pauses = sorted(GcPauses.pauses)
    threshold = gc.get_threshold()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _rss_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": max(threshold - gc.get_count()[0], 0),
        "gc_total_runs": GcPauses.runs,
    }


# -- text format -----------------------------------------------------------------------


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration.String() writes it (1h2m3.5s, 250ms)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim(ns / 1e3)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_trim(ns / 1e6)}ms"
    h, rem = divmod(ns, 3600 * 10**9)
    m, rem = divmod(rem, 60 * 10**9)
    s = _trim(rem / 1e9)
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


def _trim(v: float) -> str:
    text = f"{v:.9f}".rstrip("0").rstrip(".")
    return text or "0"


def rfc3339(ts: float) -> str:
    text = datetime.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")


def version_string(app: str = "nsqd") -> str:
    """As Go's ``nsqd v1.3.0 (built w/go1.x)``, plus whether the hot path is compiled."""
    v = sys.version_info
    return (
        f"{app} v{NSQ_VERSION} (built w/python{v.major}.{v.minor}.{v.micro}; {build_description()})"
    )


def format_text(stats: Stats, mem: dict[str, int] | None, health: str, start_time: float) -> str:
    """The text /stats, line for line as NSQ's printStats."""
    out = [
        f"{version_string()}\n",
        f"start_time {rfc3339(start_time)}\n",
        f"uptime {go_duration(time.time() - start_time)}\n",
        f"\nHealth: {health}\n",
    ]
    if mem is not None:
        out.append("\nMemory:\n")
        out.extend(f"   {k:<25}\t{v}\n" for k, v in mem.items())
    topics = stats.topics or []
    out.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics:
        prefix = "*P " if t.paused else "   "
        name = t.topic_name if t.partition is None else f"{t.topic_name}:{t.partition.partition}"
        out.append(
            f"\n{prefix}[{name:<15}] depth: {t.depth:<5} be-depth: {t.backend_depth:<5} "
            f"msgs: {t.message_count:<8} e2e%: {t.e2e}\n"
        )
        for c in t.channels:
            prefix = "   *P " if c.paused else "      "
            out.append(
                f"{prefix}[{c.channel_name:<25}] depth: {c.depth:<5} "
                f"be-depth: {c.backend_depth:<5} inflt: {c.in_flight_count:<4} "
                f"def: {c.deferred_count:<4} re-q: {c.requeue_count:<5} "
                f"timeout: {c.timeout_count:<5} msgs: {c.message_count:<8} e2e%: {c.e2e}\n"
            )
            out.extend(f"        {cl}\n" for cl in c.clients or ())
    if not stats.producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        out.extend(f"   {p}\n" for p in stats.producers)
    return "".join(out)


def stats_json(
    stats: Stats,
    mem: dict[str, int] | None,
    health: str,
    start_time: float,
    event_loop: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON /stats (``format=json``); ``event_loop`` (LoopMonitor.snapshot()) is an
    addition to NSQ's shape, a key of its own."""
    d: dict[str, Any] = {
        "version": NSQ_VERSION,
        "health": health,
        "start_time": int(start_time),
        "topics": None if stats.topics is None else [t.to_json() for t in stats.topics],
    }
    if mem is not None:
        d["memory"] = mem
    d["producers"] = None if stats.producers is None else [p.to_json() for p in stats.producers]
    if event_loop is not None:
        d["event_loop"] = event_loop
    return d


# -- one node of several workers (nsqx.nsqd.workers) ----------------------------------

#: memory figures that are a worst case over the workers; the others are summed
_MEM_MAX = frozenset({"gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95"})


def _topic_key(t: dict[str, Any]) -> tuple[str, int]:
    return (t["topic_name"], int(t.get("topic_partition", 0)))


#: marks a shard's entry in a worker's part of /stats (gone from the node's answer)
SHARDED_KEY: Final = "worker_shards"
#: what a partition's entry adds to an NSQ 1.3 topic's (a sharded topic shows none)
_PARTITION_KEYS = frozenset(
    {
        "topic_partition",
        "partition_num",
        "is_leader",
        "is_multi_ordered",
        "is_multi_part",
        "is_ext",
        "is_channel_auto_create_disabled",
        "backend_start",
        "end_offset",
        "replication",
        "statsd_name",
    }
)
_CHANNEL_SUMS = (
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "dead_letter_count",
    "expired_count",
    "dropped_count",
)


def _busier_e2e(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return b if b.get("count", 0) > a.get("count", 0) else a


def _merge_shards(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A sharded topic's entries (one per shard, nsqx.nsqd.workers.shards) as the one
    topic an NSQ 1.3 client or nsqadmin expects: figures summed, channels merged by
    name, and a connection subscribed to every shard listed once (its messages in
    flight and answers summed over the shards; RDY and messages sent: the largest, its
    own worker's line)."""
    out = {k: v for k, v in entries[0].items() if k not in _PARTITION_KEYS and k != SHARDED_KEY}
    for key in ("depth", "backend_depth", "message_count", "message_bytes"):
        out[key] = sum(e.get(key, 0) for e in entries)
    out["paused"] = any(e.get("paused", False) for e in entries)
    channels: dict[str, dict[str, Any]] = {}
    for e in entries:
        out["e2e_processing_latency"] = _busier_e2e(
            out["e2e_processing_latency"], e["e2e_processing_latency"]
        )
        for ch in e["channels"]:
            name = ch["channel_name"]
            m = channels.get(name)
            if m is None:
                m = channels[name] = dict(ch)
                m["clients"] = None if ch["clients"] is None else [dict(c) for c in ch["clients"]]
                continue
            for key in _CHANNEL_SUMS:
                m[key] = m.get(key, 0) + ch.get(key, 0)
            m["paused"] = m["paused"] or ch["paused"]
            m["e2e_processing_latency"] = _busier_e2e(
                m["e2e_processing_latency"], ch["e2e_processing_latency"]
            )
            m["client_count"] += ch["client_count"]  # (each connection at its worker)
            if m["clients"] is None or ch["clients"] is None:
                continue
            by_key = {(c["client_id"], c["remote_address"]): c for c in m["clients"]}
            for c in ch["clients"]:
                have = by_key.get((c["client_id"], c["remote_address"]))
                if have is None:
                    m["clients"].append(dict(c))
                    continue
                for key in ("in_flight_count", "finish_count", "requeue_count"):
                    have[key] += c[key]
                for key in ("ready_count", "message_count"):
                    have[key] = max(have[key], c[key])
            m["client_count"] = len(m["clients"])
    out["channels"] = sorted(channels.values(), key=lambda c: str(c["channel_name"]))
    # each shard's own entry as well (nsqx's: how evenly the shards fill and drain)
    out["shards"] = [
        {**{k: v for k, v in e.items() if k != SHARDED_KEY}, "topic_partition": str(pid)}
        for e in entries
        for pid in (int(e.get("topic_partition", 0)),)
    ]
    return out


def _merge_sharded(topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every sharded topic's entries merged into one, in the first one's place."""
    if not any(t.get(SHARDED_KEY) for t in topics):
        return topics
    shards: dict[str, list[dict[str, Any]]] = {}
    for t in topics:
        if t.get(SHARDED_KEY):
            shards.setdefault(t["topic_name"], []).append(t)
    out = []
    for t in topics:
        if not t.get(SHARDED_KEY):
            out.append(t)
        elif shards[t["topic_name"]][0] is t:
            out.append(_merge_shards(shards[t["topic_name"]]))
    return out


def merge_stats_json(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's JSON /stats from its workers' own (each :func:`stats_json` of the
    partitions it hosts, in worker order): the shape of a single nsqd's. Topics (one
    entry per partition, as a single nsqd hosting them lists them) are sorted by name
    and partition, producers are every worker's, memory is summed (pauses: the
    longest), health is the first worker's that is not OK, start_time the earliest.
    ``event_loop`` is the first worker's, with every worker's under ``workers``."""
    health = next((p["health"] for p in parts if p["health"] != "OK"), "OK")
    topic_lists = [p["topics"] for p in parts if p["topics"] is not None]
    topics = (
        None
        if not topic_lists
        else _merge_sharded(sorted((t for ts in topic_lists for t in ts), key=_topic_key))
    )
    out: dict[str, Any] = {
        "version": parts[0]["version"],
        "health": health,
        "start_time": min(p["start_time"] for p in parts),
        "topics": topics,
    }
    mems = [p["memory"] for p in parts if "memory" in p]
    if mems:
        out["memory"] = {
            k: (max if k in _MEM_MAX else sum)(m.get(k, 0) for m in mems) for k in mems[0]
        }
    producers = [c for p in parts for c in p["producers"] or ()]
    out["producers"] = producers or None
    loops = [p["event_loop"] for p in parts if "event_loop" in p]
    if loops:
        out["event_loop"] = {**loops[0], "workers": loops}
    return out


def _e2e_from_json(d: dict[str, Any]) -> E2eResult:
    ps = d.get("percentiles")
    return E2eResult(
        d.get("count", 0), None if ps is None else [(p["quantile"], p["value"]) for p in ps]
    )


def _client_from_json(d: dict[str, Any]) -> ClientStats:
    return ClientStats(
        client_id=d["client_id"],
        hostname=d["hostname"],
        version=d["version"],
        remote_address=d["remote_address"],
        state=d["state"],
        ready_count=d["ready_count"],
        in_flight_count=d["in_flight_count"],
        message_count=d["message_count"],
        finish_count=d["finish_count"],
        requeue_count=d["requeue_count"],
        connect_ts=d["connect_ts"],
        sample_rate=d["sample_rate"],
        deflate=d["deflate"],
        snappy=d["snappy"],
        user_agent=d["user_agent"],
        tls=d["tls"],
        tls_cipher_suite=d["tls_cipher_suite"],
        tls_version=d["tls_version"],
        tls_negotiated_protocol=d["tls_negotiated_protocol"],
        tls_negotiated_protocol_is_mutual=d["tls_negotiated_protocol_is_mutual"],
        pub_counts=[(p["topic"], p["count"]) for p in d.get("pub_counts", ())],
        authed=d.get("authed", False),
        auth_identity=d.get("auth_identity", ""),
        auth_identity_url=d.get("auth_identity_url", ""),
    )


def _channel_from_json(d: dict[str, Any]) -> ChannelStats:
    clients = d["clients"]
    return ChannelStats(
        channel_name=d["channel_name"],
        depth=d["depth"],
        backend_depth=d["backend_depth"],
        in_flight_count=d["in_flight_count"],
        deferred_count=d["deferred_count"],
        message_count=d["message_count"],
        requeue_count=d["requeue_count"],
        timeout_count=d["timeout_count"],
        client_count=d["client_count"],
        clients=None if clients is None else [_client_from_json(c) for c in clients],
        paused=d["paused"],
        ephemeral=False,  # (not in the JSON; the text format does not show it)
        e2e=_e2e_from_json(d["e2e_processing_latency"]),
        dead_letter_count=d.get("dead_letter_count", 0),
        expired_count=d.get("expired_count", 0),
        dropped_count=d.get("dropped_count", 0),
    )


def _topic_from_json(d: dict[str, Any]) -> TopicStats:
    info = None
    if "topic_partition" in d:
        info = PartitionInfo(
            partition=int(d["topic_partition"]),
            is_leader=d["is_leader"],
            ordered=d["is_multi_ordered"],
            multipart=d["is_multi_part"],
            ext=d["is_ext"],
            channel_auto_create_disabled=d["is_channel_auto_create_disabled"],
            partition_num=d["partition_num"],
            backend_start=d["backend_start"],
            end_offset=d["end_offset"],
            replication=d.get("replication"),
        )
    return TopicStats(
        topic_name=d["topic_name"],
        channels=[_channel_from_json(c) for c in d["channels"]],
        depth=d["depth"],
        backend_depth=d["backend_depth"],
        message_count=d["message_count"],
        message_bytes=d["message_bytes"],
        paused=d["paused"],
        ephemeral=False,
        e2e=_e2e_from_json(d["e2e_processing_latency"]),
        partition=info,
    )


def stats_from_json(d: dict[str, Any]) -> Stats:
    """The snapshot a JSON /stats describes (for the text format of merged stats)."""
    topics = d["topics"]
    producers = d["producers"]
    return Stats(
        None if topics is None else [_topic_from_json(t) for t in topics],
        None if producers is None else [_client_from_json(c) for c in producers],
    )
