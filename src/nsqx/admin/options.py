"""AdminOptions: nsqadmin's settings (NSQ 1.3's names and defaults) plus nsqx's history.

Durations are seconds. :meth:`AdminOptions.validate` refuses what nsqadmin refuses
(no cluster address, both kinds, a half TLS pair, a bad CIDR) with a message that
names the flag.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
from dataclasses import dataclass, field

from nsqx.admin.upstream_auth import check_secret

__all__ = ["AdminOptions", "normalize_base_path"]


def normalize_base_path(path: str) -> str:
    """``/`` for empty; a leading ``/``; cleaned like Go's ``path.Clean``."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path).replace("//", "/")


@dataclass
class AdminOptions:
    """Everything ``nsqx nsqadmin`` takes; field names are NSQ's config-file keys."""

    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    #: accepted for compatibility; nsqx's admin draws rates from its own samples
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0
    nsqlookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""
    acl_http_header: str = "X-Forwarded-User"
    admin_users: list[str] = field(default_factory=list)
    dev_static_dir: str = ""
    # -- nsqx --
    #: how often the admin samples every nsqd's /stats for rates and history
    history_interval: float = 5.0
    #: how much history is kept (in memory)
    history_length: float = 900.0
    #: how often the page asks for fresh numbers
    refresh_interval: float = 2.0
    #: how long a page waits for one nsqd or nsqlookupd before showing it as not
    #: answering (it is then probed in the background, not asked by every page)
    node_timeout: float = 1.0
    #: sent to nsqlookupd and nsqd as a member of the cluster (nsqx.wire.members), for
    #: the actions a cluster with --cluster-secret keeps to its members
    cluster_secret: str = field(default="", repr=False)
    #: a file whose first line is the secret (read at start; beats cluster_secret)
    cluster_secret_file: str = ""
    #: sent as ``Authorization: Bearer`` to nsqd and nsqlookupd with --http-auth
    #: (nsqx.admin.upstream_auth)
    http_auth_secret: str = field(default="", repr=False)
    #: a file whose first line is that secret (read at start; beats http_auth_secret)
    http_auth_secret_file: str = ""
    #: a request's own ``Authorization: Bearer`` secret goes on the calls made for it
    http_auth_forward: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the flag that is wrong."""
        if not self.nsqd_http_addresses and not self.nsqlookupd_http_addresses:
            raise ValueError("--nsqd-http-address or --lookupd-http-address required")
        if self.nsqd_http_addresses and self.nsqlookupd_http_addresses:
            raise ValueError("use --nsqd-http-address or --lookupd-http-address not both")
        for flag, addresses in (
            ("--lookupd-http-address", self.nsqlookupd_http_addresses),
            ("--nsqd-http-address", self.nsqd_http_addresses),
        ):
            for address in addresses:
                _check_address(flag, address)
        if bool(self.http_client_tls_cert) != bool(self.http_client_tls_key):
            raise ValueError(
                "--http-client-tls-cert and --http-client-tls-key must be given together"
            )
        for flag, path in (
            ("--http-client-tls-root-ca-file", self.http_client_tls_root_ca_file),
            ("--http-client-tls-cert", self.http_client_tls_cert),
            ("--http-client-tls-key", self.http_client_tls_key),
        ):
            if path and not os.path.isfile(path):
                raise ValueError(f"{flag}: no such file {path!r}")
        if self.allow_config_from_cidr:
            try:
                ipaddress.ip_network(self.allow_config_from_cidr, strict=False)
            except ValueError:
                raise ValueError(
                    f"failed to parse --allow-config-from-cidr ({self.allow_config_from_cidr})"
                ) from None
        if self.notification_http_endpoint and not self.notification_http_endpoint.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                "--notification-http-endpoint must be a full URL (http://host:port/path)"
            )
        for flag, value in (
            ("--http-client-connect-timeout", self.http_client_connect_timeout),
            ("--http-client-request-timeout", self.http_client_request_timeout),
            ("--history-interval", self.history_interval),
            ("--refresh-interval", self.refresh_interval),
            ("--node-timeout", self.node_timeout),
        ):
            if value <= 0:
                raise ValueError(f"{flag} must be positive")
        check_secret(self.http_auth_secret, "--http-auth-secret")
        if self.history_length < self.history_interval:
            raise ValueError("--history-length must be at least --history-interval")
        if self.history_length / self.history_interval > 100_000:
            raise ValueError("--history-length / --history-interval: at most 100000 samples")
        self.base_path = normalize_base_path(self.base_path)


def _check_address(flag: str, address: str) -> None:
    text = address.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag}: {address!r} is not host:port")
