"""nsqd's options: NSQ 1.3's flags, their defaults, and the limits derived from them.

Attribute names are the config-file names (flag names with ``_``), durations are
seconds as floats. ``nsqx.cli`` fills this from Go-style flags and a TOML file.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import zlib
from dataclasses import dataclass, field

from nsqx import NSQ_VERSION
from nsqx.wire.auth import parse_http_auth
from nsqx.wire.commands import ParserLimits
from nsqx.wire.identify import ServerLimits
from nsqx.wire.topic_meta import REPLICATION_ACKS


def default_node_id() -> int:
    """NSQ's default: crc32(md5(hostname)) % 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


@dataclass
class NsqdOptions:
    """Every nsqd option, with NSQ 1.3's defaults."""

    # network
    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    https_address: str = "0.0.0.0:4152"
    broadcast_address: str = field(default_factory=socket.gethostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    nsqlookupd_tcp_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    node_id: int = field(default_factory=default_node_id)
    # storage
    data_path: str = ""
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 100 * 1024 * 1024
    sync_every: int = 2500
    sync_timeout: float = 2.0
    #: nsqx: fsync (group-committed) before answering PUB/MPUB/DPUB
    sync_before_ack: bool = False
    #: nsqx: keep consumed log segments this long (seconds) before deleting them
    retention: float = 0.0
    #: nsqx: an ISR member behind the leader this long (seconds) is reported to the
    #: coordinator, which takes it out of the ISR
    replication_lag_timeout: float = 2.5
    #: nsqx: when a replicated publish is answered (a topic's replication_ack overrides
    #: it): "durable", once every ISR member holds it and a write quorum of the replicas
    #: has it fsynced; "written", once every ISR member wrote it (nsqx.wire.topic_meta)
    replication_ack: str = "durable"
    #: nsqx: host:port where followers reach this node's HTTP API for replication
    #: (empty: the broadcast address and HTTP port)
    replication_address: str = ""
    #: nsqx: seconds the event loop keeps polling without sleeping after a read while a
    #: single client connection is active (0: off); see nsqx.nsqd.loopturn.LoopTurn.note_read
    busy_poll: float = 0.0002
    #: nsqx: worker processes behind the node's one address (1: a single process);
    #: see nsqx.nsqd.supervisor and docs/workers.md
    workers: int = 1
    #: nsqx: with workers, move a plain TCP connection to the worker that owns the topic
    #: it publishes or subscribes to (nsqx.nsqd.workers.handoff); false: forward/proxy
    worker_handoff: bool = True
    #: nsqx: with workers, a topic of NSQ 1.3 gets one shard (partition) per worker:
    #: publishes stay where they arrive, a consumer reads all shards (docs/workers.md)
    worker_shards: bool = False
    #: nsqx: on SIGTERM/SIGINT, how long nsqd drains before it closes: no new
    #: deliveries, consumers told (CLOSE_WAIT), waiting for their messages in flight to
    #: be answered (0: close at once, as NSQ 1.3); see docs/drain.md
    drain_timeout: float = 5.0
    queue_scan_interval: float = 0.1
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20
    # message timeouts
    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_req_timeout: float = 3600.0
    #: nsqx: longest DPUB (and HTTP /pub?defer) delay; 0: --max-req-timeout's, as NSQ 1.3
    #: (which bounds both by one flag: nsq #1499)
    max_dpub_timeout: float = 0.0
    # sizes
    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    # client-negotiable limits
    client_timeout: float = 60.0
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0
    # Youzan's extensions: accept ``##`` ext keys on a topic without ext support (dropped),
    # and consumers without extend_support on an ext topic (they get vanilla frames)
    allow_ext_compatible: bool = False
    allow_sub_ext_compatible: bool = False
    # TLS, compression, auth
    tls_cert: str = ""
    tls_key: str = ""
    tls_root_ca_file: str = ""
    tls_client_auth_policy: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    auth_http_addresses: list[str] = field(default_factory=list)
    #: [nsqx] which HTTP requests need ``Authorization: Bearer <secret>`` checked against
    #: the auth servers: off, all, or a comma list of publish, read, admin (docs/http-auth.md)
    http_auth: str = "off"
    #: [nsqx] networks (CIDR) the HTTP API's admin actions are taken from; empty: any
    http_admin_allow: list[str] = field(default_factory=list)
    #: Members of the cluster send it; /partition/role, /partition/fence and
    #: /replication/stream refuse callers without it (nsqx.wire.members; empty: open).
    cluster_secret: str = field(default="", repr=False)
    #: a file whose first line is the secret (read at start; beats cluster_secret)
    cluster_secret_file: str = ""
    # stats
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    e2e_processing_latency_percentiles: list[float] = field(default_factory=list)
    e2e_processing_latency_window_time: float = 600.0
    # logging
    log_level: str = "info"
    log_prefix: str = "[nsqd] "

    def validate(self) -> None:
        """Refuse values nsqd refuses; raises ValueError with the flag's name."""
        if not 0 <= self.node_id < 1024:
            raise ValueError(f"--node-id must be in [0,1024), got {self.node_id}")
        if not 1 <= self.max_deflate_level <= 9:
            raise ValueError("--max-deflate-level must be in [1,9]")
        for p in self.e2e_processing_latency_percentiles:
            if not 0 < p <= 1:
                raise ValueError(f"--e2e-processing-latency-percentile {p} must be in (0, 1]")
        for name in (
            "mem_queue_size",
            "max_msg_size",
            "max_body_size",
            "max_rdy_count",
            "max_output_buffer_size",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must not be negative")
        if not 1 <= self.workers <= 256:
            raise ValueError("--workers must be from 1 to 256")
        if not 0 <= self.busy_poll <= 0.01:
            raise ValueError("--busy-poll must be from 0 to 10ms")
        if self.drain_timeout < 0:
            raise ValueError("--drain-timeout must not be negative (0: no drain)")
        if self.max_dpub_timeout < 0:
            raise ValueError("--max-dpub-timeout must not be negative (0: --max-req-timeout)")
        if self.msg_timeout <= 0 or self.max_msg_timeout < self.msg_timeout:
            raise ValueError("--msg-timeout must be positive and at most --max-msg-timeout")
        if parse_http_auth(self.http_auth) and not self.auth_http_addresses:
            raise ValueError("--http-auth needs an --auth-http-address to ask")
        for net in self.http_admin_allow:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"--http-admin-allow {net!r} is not a network (CIDR)") from None
        if self.replication_ack not in REPLICATION_ACKS:
            raise ValueError(
                f"--replication-ack must be durable|written, got {self.replication_ack}"
            )
        if self.log_level not in ("debug", "info", "warn", "error", "fatal"):
            raise ValueError(
                f"--log-level must be debug|info|warn|error|fatal, got {self.log_level}"
            )

    def parser_limits(self) -> ParserLimits:
        return ParserLimits(
            max_msg_size=self.max_msg_size,
            max_body_size=self.max_body_size,
            max_rdy_count=self.max_rdy_count,
            max_req_timeout_ms=int(self.max_req_timeout * 1000),
            max_dpub_timeout_ms=int(self.dpub_limit() * 1000),
        )

    def dpub_limit(self) -> float:
        """The longest DPUB delay in seconds: --max-dpub-timeout, else --max-req-timeout."""
        return self.max_dpub_timeout or self.max_req_timeout

    def server_limits(self) -> ServerLimits:
        return ServerLimits(
            version=NSQ_VERSION,
            max_rdy_count=self.max_rdy_count,
            max_msg_timeout_ms=int(self.max_msg_timeout * 1000),
            max_heartbeat_interval_ms=int(self.max_heartbeat_interval * 1000),
            max_output_buffer_size=self.max_output_buffer_size,
            max_output_buffer_timeout_ms=int(self.max_output_buffer_timeout * 1000),
            min_output_buffer_timeout_ms=int(self.min_output_buffer_timeout * 1000),
            max_deflate_level=self.max_deflate_level,
            # as nsqd: TLS is offered when a certificate is configured, AUTH required
            # when an auth server is
            tls_available=bool(self.tls_cert or self.tls_key),
            snappy_available=self.snappy,
            deflate_available=self.deflate,
            auth_required=bool(self.auth_http_addresses),
            msg_timeout_ms=int(self.msg_timeout * 1000),
            heartbeat_interval_ms=int(self.client_timeout * 1000) // 2,
            output_buffer_size=16384,
            output_buffer_timeout_ms=int(self.output_buffer_timeout * 1000),
        )


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); an empty host means all."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
