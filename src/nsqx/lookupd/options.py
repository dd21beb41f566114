"""nsqlookupd's options: NSQ 1.3's flags and defaults (durations in seconds)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from nsqx.lookupd.etcd_store import check_cluster_id
from nsqx.wire.auth import ADMIN, READ, parse_http_auth

#: what nsqlookupd's --http-auth may name (it has nothing to publish)
HTTP_AUTH_CLASSES = (READ, ADMIN)


@dataclass
class LookupdOptions:
    """Every nsqlookupd option, with NSQ 1.3's defaults.

    Attribute names are the config-file names (flag names with ``_``).
    """

    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = field(default_factory=socket.gethostname)
    #: A producer whose last PING (or IDENTIFY) is older than this is left out of
    #: /lookup and /nodes.
    inactive_producer_timeout: float = 300.0
    #: A producer tombstoned for a topic is left out of that topic's /lookup this long.
    tombstone_lifetime: float = 45.0
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    #: Directory of the meta file of partitioned topics; empty: in memory only.
    data_path: str = ""
    #: Timeouts of the calls lookupd makes to nsqd's HTTP API (partition placement).
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    #: etcd v3 endpoints (comma-separated URLs) of a meta store shared by several
    #: nsqlookupd; empty: the embedded store (``data_path``).
    etcd_endpoints: str = ""
    #: Separates nsqx clusters that share one etcd (the keys' ``/nsqx/<id>/`` prefix).
    cluster_id: str = "nsqx"
    #: TTL of the etcd lease of this nsqlookupd's session and leadership (seconds).
    etcd_lease_ttl: float = 5.0
    #: A partition-aware nsqd silent this long is lost (nsqx.lookupd.liveness).
    node_timeout: float = 2.0
    #: Members of the cluster send it; cluster and topic-admin endpoints refuse
    #: callers without it (nsqx.wire.members; empty: open).
    cluster_secret: str = field(default="", repr=False)
    #: a file whose first line is the secret (read at start; beats cluster_secret)
    cluster_secret_file: str = ""
    #: [nsqx] auth servers (host:port or URL, NSQ's protocol) --http-auth asks
    auth_http_addresses: list[str] = field(default_factory=list)
    #: [nsqx] which HTTP requests need ``Authorization: Bearer <secret>``: off, all, or
    #: a comma list of read, admin (docs/http-auth.md)
    http_auth: str = "off"

    def etcd_endpoint_list(self) -> list[str]:
        """``etcd_endpoints`` split at commas."""
        return [e.strip() for e in self.etcd_endpoints.split(",") if e.strip()]

    def validate(self) -> None:
        """Refuse values nsqlookupd cannot run with; raises ValueError naming the flag."""
        if not self.tcp_address:
            raise ValueError("--tcp-address must not be empty")
        if not self.http_address:
            raise ValueError("--http-address must not be empty")
        if self.inactive_producer_timeout < 0:
            raise ValueError("--inactive-producer-timeout must not be negative")
        if self.tombstone_lifetime < 0:
            raise ValueError("--tombstone-lifetime must not be negative")
        if self.http_client_connect_timeout <= 0:
            raise ValueError("--http-client-connect-timeout must be positive")
        if self.http_client_request_timeout <= 0:
            raise ValueError("--http-client-request-timeout must be positive")
        for endpoint in self.etcd_endpoint_list():
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"--etcd-endpoints: {endpoint!r} is not an http(s):// URL")
        if self.etcd_endpoints:
            check_cluster_id(self.cluster_id)
        if not 2 <= self.etcd_lease_ttl <= 3600 or self.etcd_lease_ttl != int(self.etcd_lease_ttl):
            raise ValueError("--etcd-lease-ttl must be whole seconds from 2s to 1h")
        if not 0.2 <= self.node_timeout <= 600:
            raise ValueError("--node-timeout must be from 200ms to 10m")
        if self.etcd_endpoints and self.node_timeout / 4 >= self.etcd_lease_ttl / 2:
            # a node's lease must end well within this nsqlookupd's own etcd lease
            raise ValueError("--node-timeout must be below twice --etcd-lease-ttl")
        if parse_http_auth(self.http_auth, HTTP_AUTH_CLASSES) and not self.auth_http_addresses:
            raise ValueError("--http-auth needs an --auth-http-address to ask")
        if self.log_level not in ("debug", "info", "warn", "error", "fatal"):
            raise ValueError(
                f"--log-level must be debug|info|warn|error|fatal, got {self.log_level}"
            )
