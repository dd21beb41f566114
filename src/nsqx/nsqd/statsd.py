"""Push stats to statsd over UDP every --statsd-interval, as NSQ's nsqd does.

Metric names, types and the prefix follow NSQ 1.3 (``nsqd/statsd.go``): counters
(``|c``) carry the increase since the last push, gauges (``|g``) the current value;
lines end with ``\\n`` and are packed whole into datagrams of at most
--statsd-udp-packet-size bytes, which are spread over the interval (less one second).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nsqx.nsqd.stats import Stats, get_stats, mem_stats

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD

log = logging.getLogger("nsqx.nsqd")


def host_key(host_port: str) -> str:
    """NSQ's statsd.HostKey: dots and colons become underscores."""
    return host_port.replace(".", "_").replace(":", "_")


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """--statsd-prefix with ``%s`` replaced by this node's host key, ending in ``.``."""
    if not template:
        return ""
    host = broadcast_address
    if ":" in host:  # net.JoinHostPort brackets IPv6 hosts
        host = f"[{host}]"
    prefix = template.replace("%s", host_key(f"{host}:{http_port}"))
    return prefix if prefix.endswith(".") else prefix + "."


class StatsdReport:
    """Turns successive stats snapshots into statsd lines (remembering the last counts)."""

    def __init__(self, prefix: str, exclude_ephemeral: bool, mem: bool) -> None:
        self.prefix = prefix
        self.exclude_ephemeral = exclude_ephemeral
        self.mem = mem
        self._last_topics: dict[str, tuple[int, int]] = {}
        self._last_channels: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._last_gc_runs = 0

    def lines(self, stats: Stats, mem: dict[str, int] | None = None) -> list[str]:
        """The statsd lines for one push."""
        p = self.prefix
        out: list[str] = []
        last_topics: dict[str, tuple[int, int]] = {}
        last_channels: dict[tuple[str, str], tuple[int, int, int]] = {}
        for t in stats.topics or ():
            if self.exclude_ephemeral and t.ephemeral:
                continue
            name = t.statsd_name
            msgs, nbytes = self._last_topics.get(name, (0, 0))
            last_topics[name] = (t.message_count, t.message_bytes)
            base = f"{p}topic.{name}."
            out.append(f"{base}message_count:{t.message_count - msgs}|c")
            out.append(f"{base}message_bytes:{t.message_bytes - nbytes}|c")
            out.append(f"{base}depth:{t.depth}|g")
            out.append(f"{base}backend_depth:{t.backend_depth}|g")
            for q, v in t.e2e.percentiles or ():
                out.append(f"{base}e2e_processing_latency_{q * 100:.0f}:{v}|g")
            for c in t.channels:
                if self.exclude_ephemeral and c.ephemeral:
                    continue
                key = (name, c.channel_name)
                cm, cr, ct = self._last_channels.get(key, (0, 0, 0))
                last_channels[key] = (c.message_count, c.requeue_count, c.timeout_count)
                cb = f"{base}channel.{c.channel_name}."
                out.append(f"{cb}message_count:{c.message_count - cm}|c")
                out.append(f"{cb}depth:{c.depth}|g")
                out.append(f"{cb}backend_depth:{c.backend_depth}|g")
                out.append(f"{cb}in_flight_count:{c.in_flight_count}|g")
                out.append(f"{cb}deferred_count:{c.deferred_count}|g")
                out.append(f"{cb}requeue_count:{c.requeue_count - cr}|c")
                out.append(f"{cb}timeout_count:{c.timeout_count - ct}|c")
                out.append(f"{cb}clients:{c.client_count}|g")
                for q, v in c.e2e.percentiles or ():
                    out.append(f"{cb}e2e_processing_latency_{q * 100:.0f}:{v}|g")
        self._last_topics = last_topics
        self._last_channels = last_channels
        if self.mem and mem is not None:
            for field in (
                "heap_objects",
                "heap_idle_bytes",
                "heap_in_use_bytes",
                "heap_released_bytes",
                "gc_pause_usec_100",
                "gc_pause_usec_99",
                "gc_pause_usec_95",
                "next_gc_bytes",
            ):
                out.append(f"{p}mem.{field}:{mem[field]}|g")
            runs = mem["gc_total_runs"]
            out.append(f"{p}mem.gc_runs:{runs - self._last_gc_runs}|c")
            self._last_gc_runs = runs
        return out


def packets(lines: Iterable[str], size: int) -> list[bytes]:
    """Pack ``\\n``-terminated lines whole into datagrams of at most ``size`` bytes.

    As NSQ's boundary-buffered writer: a line that does not fit starts a new datagram
    (and a line longer than ``size`` goes alone).
    """
    out: list[bytes] = []
    buf = bytearray()
    for line in lines:
        data = line.encode() + b"\n"
        if buf and len(buf) + len(data) > size:
            out.append(bytes(buf))
            buf.clear()
        buf += data
    if buf:
        out.append(bytes(buf))
    return out


async def push(nsqd: NSQD, report: StatsdReport, spread: float) -> int:
    """One push to --statsd-address: returns the number of datagrams sent."""
    o = nsqd.options
    host, _, port_text = o.statsd_address.rpartition(":")
    loop = asyncio.get_running_loop()
    stats = get_stats(nsqd, include_clients=False)
    # with --workers each worker pushes its own partitions' figures (statsd sums the
    # counters); the memory gauges are the lead worker's alone, not overwritten in turn
    mem = o.statsd_mem_stats and (nsqd.workers is None or nsqd.workers.lead)
    lines = report.lines(stats, mem_stats() if mem else None)
    datagrams = packets(lines, o.statsd_udp_packet_size)
    transport, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, remote_addr=(host.strip("[]"), int(port_text))
    )
    try:
        log.info("STATSD: pushing stats to %s", o.statsd_address)
        pause = spread / len(datagrams) if datagrams and spread > 0 else 0.0
        for i, d in enumerate(datagrams):
            transport.sendto(d)
            if pause and i + 1 < len(datagrams):
                await asyncio.sleep(pause)
    finally:
        transport.close()
    return len(datagrams)


async def statsd_loop(nsqd: NSQD) -> None:
    """Push every --statsd-interval until cancelled (by NSQD.close)."""
    o = nsqd.options
    interval = o.statsd_interval
    port = o.broadcast_http_port or (nsqd.http_address[1] if nsqd.http_address else 0)
    report = StatsdReport(
        statsd_prefix(o.statsd_prefix, o.broadcast_address, port),
        o.statsd_exclude_ephemeral,
        o.statsd_mem_stats,
    )
    loop = asyncio.get_running_loop()
    due = loop.time()
    while True:
        # a ticker: pushes keep their cadence however long one takes to spread
        due += interval
        now = loop.time()
        if due < now:
            due = now + interval - (now - due) % interval
        await asyncio.sleep(due - now)
        try:
            # NSQ spreads one push over the interval minus a second, to avoid bursts
            await push(nsqd, report, interval - 1.0)
        except (OSError, ValueError) as err:
            log.error("failed to push stats to statsd(%s): %s", o.statsd_address, err)
