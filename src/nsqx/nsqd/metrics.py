"""Prometheus metrics for GET /metrics, collected from the live objects at scrape time.

Nothing is updated per message: a custom Collector reads the counters topics, channels
and clients keep anyway, so an unscraped nsqd pays nothing. Names are listed in
docs/metrics.md.

A node of several workers (``--workers``) answers as one node: every worker's series
merged by :func:`merge_exposition`, the values of a series (same name, same labels)
summed across workers, except where a sum means nothing: start times take the
earliest, and maxima, flags, infos, epochs, ISR sizes and latency quantiles the
largest. No ``worker`` label: a dashboard of a node does not change with its workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from nsqx import NSQ_VERSION
from nsqx.nsqd.loop_monitor import Histogram
from nsqx.nsqd.stats import ChannelStats, GcPauses, TopicStats, get_stats

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD

_T = ["topic"]
_TC = ["topic", "channel"]
_TP = ["topic", "partition"]


class NsqdCollector(Collector):
    """Yields every nsqd metric family from one stats snapshot per scrape."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def collect(self) -> Iterator[Metric]:
        nsqd = self.nsqd
        stats = get_stats(nsqd, include_clients=False)
        info = GaugeMetricFamily("nsq_info", "nsqd version", labels=["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info
        yield GaugeMetricFamily(
            "nsq_start_time_seconds", "when nsqd started (unix time)", value=nsqd.start_time
        )
        yield GaugeMetricFamily("nsq_clients", "TCP client connections", value=len(nsqd.clients))
        yield GaugeMetricFamily("nsq_topics", "topics", value=len(nsqd.topics))

        t_depth = GaugeMetricFamily("nsq_topic_depth", "messages no channel saw yet", labels=_T)
        t_msgs = CounterMetricFamily("nsq_topic_messages", "messages published", labels=_T)
        t_bytes = CounterMetricFamily(
            "nsq_topic_message_bytes", "bytes of message bodies published", labels=_T
        )
        t_paused = GaugeMetricFamily("nsq_topic_paused", "1 while the topic is paused", labels=_T)
        t_chans = GaugeMetricFamily("nsq_topic_channels", "channels of the topic", labels=_T)
        c_depth = GaugeMetricFamily("nsq_channel_depth", "messages waiting", labels=_TC)
        c_inflight = GaugeMetricFamily(
            "nsq_channel_in_flight", "messages sent and not yet finished", labels=_TC
        )
        c_deferred = GaugeMetricFamily(
            "nsq_channel_deferred", "messages deferred (DPUB, REQ with delay)", labels=_TC
        )
        c_msgs = CounterMetricFamily(
            "nsq_channel_messages", "messages handed to clients", labels=_TC
        )
        c_req = CounterMetricFamily("nsq_channel_requeued", "messages requeued (REQ)", labels=_TC)
        c_timeout = CounterMetricFamily(
            "nsq_channel_timed_out", "messages that timed out in flight", labels=_TC
        )
        c_clients = GaugeMetricFamily("nsq_channel_clients", "subscribed clients", labels=_TC)
        c_dead = CounterMetricFamily(
            "nsq_channel_dead_letters", "messages sent to the dead-letter topic", labels=_TC
        )
        c_expired = CounterMetricFamily(
            "nsq_channel_expired", "messages skipped for their time-to-live", labels=_TC
        )
        c_dropped = CounterMetricFamily(
            "nsq_channel_dropped", "messages dropped at the channel's max depth", labels=_TC
        )
        c_paused = GaugeMetricFamily(
            "nsq_channel_paused", "1 while the channel is paused", labels=_TC
        )
        # quantiles over --e2e-processing-latency-window-time (only when configured)
        t_e2e = GaugeMetricFamily(
            "nsq_topic_e2e_processing_latency_seconds",
            "publish-to-FIN latency percentile over the window, all channels",
            labels=[*_T, "quantile"],
        )
        c_e2e = GaugeMetricFamily(
            "nsq_channel_e2e_processing_latency_seconds",
            "publish-to-FIN latency percentile over the window",
            labels=[*_TC, "quantile"],
        )
        c_e2e_count = GaugeMetricFamily(
            "nsq_channel_e2e_processing_latency_count",
            "FINs in the latency window",
            labels=_TC,
        )
        # a partitioned topic's partitions are summed under its name (labels stay NSQ's);
        # nsq_partition_* have them one by one
        p_depth = GaugeMetricFamily(
            "nsq_partition_depth", "messages no channel saw yet, by partition", labels=_TP
        )
        p_msgs = CounterMetricFamily(
            "nsq_partition_messages", "messages published, by partition", labels=_TP
        )
        # replicated partitions (docs/replication.md)
        r_leader = GaugeMetricFamily(
            "nsq_partition_is_leader", "1 if this node leads the replicated partition", labels=_TP
        )
        r_isr = GaugeMetricFamily(
            "nsq_partition_isr_size", "in-sync replicas of a replicated partition", labels=_TP
        )
        r_epoch = GaugeMetricFamily(
            "nsq_partition_epoch", "the replicated partition's epoch", labels=_TP
        )
        r_lag = GaugeMetricFamily(
            "nsq_partition_follower_lag",
            "records a follower lacks (on the leader)",
            labels=[*_TP, "follower"],
        )
        topics: dict[str, list[TopicStats]] = {}
        for t in stats.topics or ():
            topics.setdefault(t.topic_name, []).append(t)
            if t.partition is not None:
                pl = [t.topic_name, str(t.partition.partition)]
                p_depth.add_metric(pl, t.depth)
                p_msgs.add_metric(pl, t.message_count)
                repl = t.partition.replication
                if repl is not None:
                    r_leader.add_metric(pl, int(repl["role"] == "leader"))
                    r_isr.add_metric(pl, len(repl["isr"]))
                    r_epoch.add_metric(pl, repl["epoch"])
                    for node, f in repl.get("followers", {}).items():
                        r_lag.add_metric([*pl, node], f["lag"])
        for name, parts in topics.items():
            tl = [name]
            t_depth.add_metric(tl, sum(t.depth for t in parts))
            t_msgs.add_metric(tl, sum(t.message_count for t in parts))
            t_bytes.add_metric(tl, sum(t.message_bytes for t in parts))
            t_paused.add_metric(tl, int(parts[0].paused))
            channels: dict[str, list[ChannelStats]] = {}
            for t in parts:
                for c in t.channels:
                    channels.setdefault(c.channel_name, []).append(c)
            t_chans.add_metric(tl, len(channels))
            for q, v in parts[0].e2e.percentiles or ():
                t_e2e.add_metric([*tl, _quantile_label(q)], v / 1e9)
            for cname, cs in channels.items():
                cl = [name, cname]
                c_depth.add_metric(cl, sum(c.depth for c in cs))
                c_inflight.add_metric(cl, sum(c.in_flight_count for c in cs))
                c_deferred.add_metric(cl, sum(c.deferred_count for c in cs))
                c_msgs.add_metric(cl, sum(c.message_count for c in cs))
                c_req.add_metric(cl, sum(c.requeue_count for c in cs))
                c_timeout.add_metric(cl, sum(c.timeout_count for c in cs))
                c_clients.add_metric(cl, sum(c.client_count for c in cs))
                c_dead.add_metric(cl, sum(c.dead_letter_count for c in cs))
                c_expired.add_metric(cl, sum(c.expired_count for c in cs))
                c_dropped.add_metric(cl, sum(c.dropped_count for c in cs))
                c_paused.add_metric(cl, int(cs[0].paused))
                c = cs[0]
                if c.e2e.percentiles is not None:
                    c_e2e_count.add_metric(cl, c.e2e.count)
                    for q, v in c.e2e.percentiles:
                        c_e2e.add_metric([*cl, _quantile_label(q)], v / 1e9)
        yield from (t_depth, t_msgs, t_bytes, t_paused, t_chans)
        yield from (c_depth, c_inflight, c_deferred, c_msgs, c_req, c_timeout, c_clients)
        yield from (c_paused, c_dead, c_expired, c_dropped)
        yield from (p_depth, p_msgs, r_leader, r_isr, r_epoch, r_lag)
        if nsqd.options.e2e_processing_latency_percentiles:
            yield from (t_e2e, c_e2e, c_e2e_count)
        yield from loop_metrics(nsqd)


def _histogram(name: str, doc: str, h: Histogram) -> Iterator[Metric]:
    yield HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.seconds)
    yield GaugeMetricFamily(
        name.removesuffix("_seconds") + "_max_seconds",
        f"the longest over the last 10-20 s: {doc}",
        value=h.recent_max,
    )


def loop_metrics(nsqd: NSQD) -> Iterator[Metric]:
    """The event loop's turns, timer lateness and scan rounds, and the garbage
    collections by generation (nsqx.nsqd.loop_monitor): what makes the latency tail."""
    mon = nsqd.loop_monitor
    mon.snapshot()  # (brings the compiled LoopTurn's turn counts)
    yield from _histogram(
        "nsq_loop_turn_seconds",
        "event-loop turns that read from clients, first read to the group commit's end",
        mon.turns,
    )
    yield from _histogram(
        "nsq_loop_timer_lateness_seconds",
        "how late a probe timer fired (every turn's length shows here; 1 ms resolution)",
        mon.lateness,
    )
    yield from _histogram(
        "nsq_loop_timer_lateness_running_seconds",
        "probe timer lateness less the time the loop's thread waited for a CPU (Linux)",
        mon.lateness_running,
    )
    yield CounterMetricFamily(
        "nsq_loop_cpu_wait_seconds",
        "time the loop's thread was runnable but waited for a CPU (Linux; the machine's)",
        value=mon.cpu_wait.seconds,
    )
    yield from _histogram(
        "nsq_loop_scan_seconds",
        "the scan loop's rounds (timeouts, deferred, heartbeats, checkpoints, reclaims)",
        mon.scans,
    )
    gen = ["generation"]
    runs = CounterMetricFamily(
        "nsq_gc_collections", "cyclic garbage collections since start", labels=gen
    )
    took = CounterMetricFamily(
        "nsq_gc_pause_seconds", "time in cyclic garbage collections (the loop stops)", labels=gen
    )
    longest = GaugeMetricFamily(
        "nsq_gc_pause_max_seconds", "the longest collection since start", labels=gen
    )
    for g in range(3):
        label = [str(g)]
        runs.add_metric(label, GcPauses.gen_runs[g])
        took.add_metric(label, GcPauses.gen_ns[g] / 1e9)
        longest.add_metric(label, GcPauses.gen_max_ns[g] / 1e9)
    yield from (runs, took, longest)


def _quantile_label(q: float) -> str:
    return repr(float(q))


class Metrics:
    """One nsqd's registry (not the global one: several nsqd may share a process):
    its own collector plus prometheus-client's process and runtime collectors."""

    def __init__(self, nsqd: NSQD) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NsqdCollector(nsqd))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _combiner(name: str, labels: dict[str, str]) -> Callable[[Iterable[float]], float]:
    """How the workers' values of one series make the node's (see the module's doc)."""
    if name.endswith("start_time_seconds"):
        return min
    if (
        "quantile" in labels
        or name.endswith(("_max_seconds", "_max_fds", "_info", "_paused", "_epoch"))
        or name in ("nsq_partition_is_leader", "nsq_partition_isr_size")
    ):
        return max
    return sum


def _count_distinct(
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]],
) -> None:
    """The counts of topics and of a topic's channels, counted again over the node: a
    partitioned topic hosted by two workers is one topic, its channel one channel."""
    topics = values.get("nsq_topic_messages")
    if "nsq_topics" in values and topics is not None:
        values["nsq_topics"] = {("nsq_topics", ()): [float(len(topics))]}
    chans = values.get("nsq_channel_depth")
    if "nsq_topic_channels" in values and chans is not None:
        per_topic: dict[str, int] = {}
        for _, labels in chans:
            topic = dict(labels)["topic"]
            per_topic[topic] = per_topic.get(topic, 0) + 1
        counts = values["nsq_topic_channels"]
        for key in counts:
            counts[key] = [float(per_topic.get(dict(key[1])["topic"], 0))]


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_exposition(texts: list[str]) -> bytes:
    """One node's /metrics from its workers' (Prometheus text, each a whole nsqd's)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name not in families:
                families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                values[fam.name] = {}
            series = values[fam.name]
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                series.setdefault(key, []).append(sample.value)
    _count_distinct(values)
    for name, fam in families.items():
        for (sample_name, labels), vs in values[name].items():
            label_dict = dict(labels)
            fam.add_sample(sample_name, label_dict, _combiner(sample_name, label_dict)(vs))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)
