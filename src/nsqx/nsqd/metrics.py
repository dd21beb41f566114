"""Prometheus metrics for GET /metrics, collected from the live objects at scrape time.

Nothing is updated per message: a custom Collector reads the counters topics, channels
and clients keep anyway, so an unscraped nsqd pays nothing. Names are listed in
docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    Metric,
)
from prometheus_client.registry import Collector

from nsqx import NSQ_VERSION
from nsqx.nsqd.stats import get_stats

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD

_T = ["topic"]
_TC = ["topic", "channel"]


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
        for t in stats.topics or ():
            tl = [t.topic_name]
            t_depth.add_metric(tl, t.depth)
            t_msgs.add_metric(tl, t.message_count)
            t_bytes.add_metric(tl, t.message_bytes)
            t_paused.add_metric(tl, int(t.paused))
            t_chans.add_metric(tl, len(t.channels))
            for q, v in t.e2e.percentiles or ():
                t_e2e.add_metric([*tl, _quantile_label(q)], v / 1e9)
            for c in t.channels:
                cl = [t.topic_name, c.channel_name]
                c_depth.add_metric(cl, c.depth)
                c_inflight.add_metric(cl, c.in_flight_count)
                c_deferred.add_metric(cl, c.deferred_count)
                c_msgs.add_metric(cl, c.message_count)
                c_req.add_metric(cl, c.requeue_count)
                c_timeout.add_metric(cl, c.timeout_count)
                c_clients.add_metric(cl, c.client_count)
                c_paused.add_metric(cl, int(c.paused))
                if c.e2e.percentiles is not None:
                    c_e2e_count.add_metric(cl, c.e2e.count)
                    for q, v in c.e2e.percentiles:
                        c_e2e.add_metric([*cl, _quantile_label(q)], v / 1e9)
        yield from (t_depth, t_msgs, t_bytes, t_paused, t_chans)
        yield from (c_depth, c_inflight, c_deferred, c_msgs, c_req, c_timeout, c_clients)
        yield c_paused
        if nsqd.options.e2e_processing_latency_percentiles:
            yield from (t_e2e, c_e2e, c_e2e_count)


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
