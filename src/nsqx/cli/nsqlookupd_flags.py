"""nsqlookupd's command line: NSQ 1.3's flags, its config file, and LookupdOptions.

Same conventions as :mod:`nsqx.cli.nsqd_flags`: Go flag syntax, ``--config`` TOML whose
keys are the option names (``tcp_address``, ``inactive_producer_timeout``...), flags
beating the file, the file beating the defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nsqx.cli.cluster_secret import secret_flags
from nsqx.cli.goflags import FlagError, FlagSet, FlagSpec, Kind
from nsqx.cli.nsqd_flags import _log_level
from nsqx.lookupd.options import LookupdOptions

__all__ = [
    "NSQLOOKUPD_FLAGS",
    "NSQLOOKUPD_FLAGSET",
    "nsqlookupd_usage",
    "parse_nsqlookupd_args",
    "wants_help",
    "wants_version",
]

log = logging.getLogger("nsqx.cli")

#: nsqlookupd's flags (NSQ 1.3.0, then nsqx's for partitioned topics), defaults equal to
#: LookupdOptions' (durations in seconds).
NSQLOOKUPD_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("version", Kind.BOOL, "", False, "print the version and exit"),
    FlagSpec(
        "config",
        Kind.STR,
        "",
        "",
        "path to a TOML config file (keys are option names: tcp_address, ...)",
        metavar="path",
    ),
    FlagSpec(
        "log-level",
        Kind.STR,
        "log_level",
        "info",
        "log verbosity: debug, info, warn, error or fatal",
        convert=_log_level,
        metavar="level",
    ),
    FlagSpec("log-prefix", Kind.STR, "log_prefix", "[nsqlookupd] ", "prefix for log lines"),
    FlagSpec("verbose", Kind.BOOL, "", False, "[deprecated] same as --log-level=debug"),
    FlagSpec(
        "tcp-address",
        Kind.STR,
        "tcp_address",
        "0.0.0.0:4160",
        "host:port to listen on for nsqd (TCP protocol V1)",
        metavar="addr",
    ),
    FlagSpec(
        "http-address",
        Kind.STR,
        "http_address",
        "0.0.0.0:4161",
        "host:port to listen on for HTTP clients",
        metavar="addr",
    ),
    FlagSpec(
        "broadcast-address",
        Kind.STR,
        "broadcast_address",
        None,
        "address of this lookupd node (returned to nsqd in IDENTIFY)",
        default_text="the OS hostname",
        metavar="host",
    ),
    FlagSpec(
        "inactive-producer-timeout",
        Kind.DURATION,
        "inactive_producer_timeout",
        300.0,
        "how long a producer stays in /lookup and /nodes after its last ping",
    ),
    FlagSpec(
        "tombstone-lifetime",
        Kind.DURATION,
        "tombstone_lifetime",
        45.0,
        "how long a tombstoned producer stays out of its topic's /lookup",
    ),
    FlagSpec(
        "data-path",
        Kind.STR,
        "data_path",
        "",
        "directory for the meta of partitioned topics (empty: kept in memory only)",
        metavar="dir",
    ),
    FlagSpec(
        "http-client-connect-timeout",
        Kind.DURATION,
        "http_client_connect_timeout",
        2.0,
        "connect timeout for calls to nsqd's HTTP API (placing partitions)",
    ),
    FlagSpec(
        "http-client-request-timeout",
        Kind.DURATION,
        "http_client_request_timeout",
        5.0,
        "total timeout for calls to nsqd's HTTP API (placing partitions)",
    ),
    FlagSpec(
        "etcd-endpoints",
        Kind.STR,
        "etcd_endpoints",
        "",
        "etcd v3 URLs, comma-separated (http://127.0.0.1:2379,...): keep the meta in etcd,"
        " shared by several nsqlookupd of which one leads (empty: the embedded store)",
        metavar="urls",
    ),
    FlagSpec(
        "cluster-id",
        Kind.STR,
        "cluster_id",
        "nsqx",
        "the cluster's name in etcd (keys under /nsqx/<cluster-id>/)",
        metavar="id",
    ),
    FlagSpec(
        "etcd-lease-ttl",
        Kind.DURATION,
        "etcd_lease_ttl",
        5.0,
        "TTL of this nsqlookupd's etcd lease: a dead leader is replaced within it",
    ),
    FlagSpec(
        "node-timeout",
        Kind.DURATION,
        "node_timeout",
        2.0,
        "a partition-aware nsqd silent this long (stopped, hung, cut off) is lost and its"
        " partitions fail over; it PINGs every tenth of it, and a partition leader"
        " acknowledges writes only within a lease of a quarter of it",
    ),
    *secret_flags("nsqlookupd"),
    FlagSpec(
        "auth-http-address",
        Kind.STR_LIST,
        "auth_http_addresses",
        [],
        "[nsqx] auth server (NSQ's protocol, as nsqd's) that --http-auth asks, host:port or URL",
        metavar="addr",
    ),
    FlagSpec(
        "http-auth",
        Kind.STR,
        "http_auth",
        "off",
        "[nsqx] HTTP requests that need 'Authorization: Bearer <secret>' checked against"
        " --auth-http-address: off, all, or a comma list of read (/lookup, /topics,"
        " /nodes...), admin (create, delete, tombstone...); /ping stays open",
        metavar="classes",
    ),
)

#: The flag set built from :data:`NSQLOOKUPD_FLAGS`.
NSQLOOKUPD_FLAGSET = FlagSet(
    "nsqlookupd",
    NSQLOOKUPD_FLAGS,
    summary=(
        "nsqlookupd tracks which nsqd has which topic (NSQ 1.3 compatible) and places"
        " the partitions of partitioned topics (Youzan's extension)."
    ),
)


def nsqlookupd_usage() -> str:
    """The ``--help`` text."""
    return NSQLOOKUPD_FLAGSET.usage()


def wants_help(argv: Sequence[str]) -> bool:
    """True if ``argv`` asks for help before any bad flag."""
    return NSQLOOKUPD_FLAGSET.wants_help(argv)


def wants_version(argv: Sequence[str]) -> bool:
    """True if ``argv`` parses and sets ``--version`` (checked before the config file)."""
    try:
        parsed = NSQLOOKUPD_FLAGSET.parse(argv)
    except FlagError:
        return False
    return bool(parsed.get("version", False))


def parse_nsqlookupd_args(argv: Sequence[str]) -> LookupdOptions:
    """Parse nsqlookupd's command line (without the program name) into valid options.

    ``--verbose`` sets the log level to debug unless ``--log-level`` is given too.
    Raises FlagError (HelpRequested for ``-h``).
    """
    res = NSQLOOKUPD_FLAGSET.parse_and_resolve(argv)
    parsed, values = res.parsed, res.values
    if parsed.get("verbose", False):
        log.warning("--verbose is deprecated; use --log-level=debug")
        if not parsed.is_set("log-level"):
            values["log_level"] = "debug"
    opts = LookupdOptions(**values)
    try:
        opts.validate()
    except ValueError as e:
        raise FlagError(str(e)) from None
    return opts
