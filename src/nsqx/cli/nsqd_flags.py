"""nsqd's command line: NSQ 1.3's flags, its config file, and the resulting NsqdOptions.

The caller (``nsqx.cli.main``) is expected to do::

    if wants_help(argv):
        print(nsqd_usage()); exit 0
    if wants_version(argv):
        print(version); exit 0
    try:
        opts = parse_nsqd_args(argv)
    except FlagError as e:
        print(e); exit 2

Precedence is NSQ's: a flag on the command line beats the ``--config`` TOML file, which
beats the defaults. Config keys are the :class:`~nsqx.nsqd.options.NsqdOptions` attribute
names, i.e. NSQ's own config names (``nsqlookupd_tcp_addresses``, ``auth_http_addresses``,
``e2e_processing_latency_percentiles``), except that the node id is ``id`` as in NSQ
(``node_id`` is accepted too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nsqx.cli.cluster_secret import secret_flags
from nsqx.cli.goflags import FlagError, FlagSet, FlagSpec, HelpRequested, Kind
from nsqx.nsqd.options import NsqdOptions

__all__ = [
    "NSQD_FLAGS",
    "NSQD_FLAGSET",
    "FlagError",
    "HelpRequested",
    "nsqd_usage",
    "parse_nsqd_args",
    "wants_help",
    "wants_version",
]

log = logging.getLogger("nsqx.cli")

LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")
TLS_VERSIONS = ("tls1.0", "tls1.1", "tls1.2", "tls1.3")


def _log_level(text: str) -> str:
    level = text.lower()
    if level not in LOG_LEVELS:
        raise ValueError("must be debug, info, warn, error or fatal")
    return level


def _tls_required(text: str) -> str:
    """true/false (any Go boolean spelling) or tcp-https, normalised to lower case."""
    value = text.lower()
    if value == "tcp-https":
        return value
    if value in ("1", "t", "true"):
        return "true"
    if value in ("0", "f", "false"):
        return "false"
    raise ValueError("must be true, false or tcp-https")


def _tls_min_version(text: str) -> str:
    value = text.lower()
    if value == "":
        # NSQ treats an empty value as "keep the default"
        return "tls1.0"
    if value == "ssl3.0":
        # listed in NSQ's help text, but NSQ 1.3 refuses it
        raise ValueError("ssl3.0 is not supported; use tls1.0, tls1.1, tls1.2 or tls1.3")
    if value not in TLS_VERSIONS:
        raise ValueError("must be tls1.0, tls1.1, tls1.2 or tls1.3")
    return value


_S = Kind.STR
_I = Kind.INT
_B = Kind.BOOL
_D = Kind.DURATION

#: nsqd's flags (NSQ 1.3.0), defaults equal to NsqdOptions' (durations in seconds).
NSQD_FLAGS: tuple[FlagSpec, ...] = (
    # -- basics
    FlagSpec("version", _B, "", False, "print the version and exit"),
    FlagSpec(
        "config",
        _S,
        "",
        "",
        "path to a TOML config file (keys are option names: tcp_address, ...)",
        metavar="path",
    ),
    FlagSpec(
        "log-level",
        _S,
        "log_level",
        "info",
        "log verbosity: debug, info, warn, error or fatal",
        convert=_log_level,
        metavar="level",
    ),
    FlagSpec("log-prefix", _S, "log_prefix", "[nsqd] ", "prefix for log lines"),
    FlagSpec("verbose", _B, "", False, "[deprecated] same as --log-level=debug"),
    FlagSpec(
        "node-id",
        _I,
        "node_id",
        None,
        "this node's part of message IDs, in [0,1024)",
        config_key="id",
        config_aliases=("node_id",),
        default_text="crc32(md5(hostname)) % 1024",
    ),
    FlagSpec("worker-id", _B, "", False, "[deprecated] has no effect; use --node-id"),
    # -- network
    FlagSpec(
        "tcp-address",
        _S,
        "tcp_address",
        "0.0.0.0:4150",
        "host:port (or unix socket path) for the TCP protocol",
        metavar="addr",
    ),
    FlagSpec(
        "http-address",
        _S,
        "http_address",
        "0.0.0.0:4151",
        'host:port (or unix socket path) for the HTTP API; "" disables it',
        metavar="addr",
    ),
    FlagSpec(
        "https-address",
        _S,
        "https_address",
        "0.0.0.0:4152",
        "host:port for the HTTPS API (used only with --tls-cert/--tls-key)",
        metavar="addr",
    ),
    FlagSpec(
        "broadcast-address",
        _S,
        "broadcast_address",
        None,
        "address this node registers with nsqlookupd",
        default_text="the OS hostname",
        metavar="host",
    ),
    FlagSpec(
        "broadcast-tcp-port",
        _I,
        "broadcast_tcp_port",
        0,
        "TCP port registered with nsqlookupd (0: the port actually listened on)",
    ),
    FlagSpec(
        "broadcast-http-port",
        _I,
        "broadcast_http_port",
        0,
        "HTTP port registered with nsqlookupd (0: the port actually listened on)",
    ),
    FlagSpec(
        "lookupd-tcp-address",
        Kind.STR_LIST,
        "nsqlookupd_tcp_addresses",
        [],
        "nsqlookupd TCP address to register with",
        metavar="addr",
    ),
    FlagSpec(
        "auth-http-address",
        Kind.STR_LIST,
        "auth_http_addresses",
        [],
        "auth server to query, host:port or URL",
        metavar="addr",
    ),
    FlagSpec(
        "http-auth",
        _S,
        "http_auth",
        "off",
        "[nsqx] HTTP requests that need 'Authorization: Bearer <secret>' checked against"
        " --auth-http-address: off, all, or a comma list of publish (/pub, /mpub), read"
        " (/stats, peeks...), admin (create, delete, pause, PUT /config...); /ping stays open",
        metavar="classes",
    ),
    *secret_flags("nsqd"),
    FlagSpec(
        "http-admin-allow",
        Kind.STR_LIST,
        "http_admin_allow",
        [],
        "[nsqx] network (CIDR, repeatable) the HTTP API's admin actions (topic and "
        "channel create/delete/empty/pause, setoffset, PUT /config...) are taken from; "
        "others get 403 (default: from anywhere, as NSQ)",
        metavar="cidr",
    ),
    FlagSpec(
        "http-client-connect-timeout",
        _D,
        "http_client_connect_timeout",
        2.0,
        "connect timeout for outgoing HTTP (auth) requests",
    ),
    FlagSpec(
        "http-client-request-timeout",
        _D,
        "http_client_request_timeout",
        5.0,
        "total timeout for outgoing HTTP (auth) requests",
    ),
    # -- storage
    FlagSpec(
        "data-path",
        _S,
        "data_path",
        "",
        "directory for disk-backed queues and metadata (empty: the working directory)",
        metavar="dir",
    ),
    FlagSpec(
        "mem-queue-size",
        _I,
        "mem_queue_size",
        10000,
        "messages kept in memory per topic/channel before spilling to disk",
    ),
    FlagSpec(
        "max-bytes-per-file",
        _I,
        "max_bytes_per_file",
        100 * 1024 * 1024,
        "size at which a disk queue file is rolled",
    ),
    FlagSpec("sync-every", _I, "sync_every", 2500, "messages written between disk queue fsyncs"),
    FlagSpec("sync-timeout", _D, "sync_timeout", 2.0, "longest time between disk queue fsyncs"),
    # nsqx's own flags (not in Go nsqd)
    FlagSpec(
        "sync-before-ack",
        _B,
        "sync_before_ack",
        False,
        "[nsqx] fsync (group-committed) before answering PUB/MPUB/DPUB: survives power loss",
    ),
    FlagSpec(
        "retention",
        _D,
        "retention",
        0.0,
        "[nsqx] keep consumed log segments this long before deleting them (replay window)",
    ),
    FlagSpec(
        "replication-lag-timeout",
        _D,
        "replication_lag_timeout",
        2.5,
        "[nsqx] an in-sync replica behind the leader this long leaves the ISR",
    ),
    FlagSpec(
        "replication-ack",
        _S,
        "replication_ack",
        "durable",
        "[nsqx] when a replicated publish is answered: durable (every in-sync replica"
        " holds it and a majority of the replicas has it fsynced) or written (every"
        " in-sync replica wrote it, not fsynced: faster, lost if every replica loses"
        " power at once); a topic's replication_ack overrides it",
    ),
    FlagSpec(
        "replication-address",
        _S,
        "replication_address",
        "",
        "[nsqx] host:port where followers reach this node's HTTP API for replication"
        " (default: the broadcast address and HTTP port)",
    ),
    FlagSpec(
        "workers",
        _I,
        "workers",
        1,
        "[nsqx] worker processes sharing the node's addresses, partitions spread over"
        " them (1: one process)",
    ),
    FlagSpec(
        "worker-handoff",
        _B,
        "worker_handoff",
        True,
        "[nsqx] with --workers: move a plain TCP connection to the worker that owns the"
        " topic it publishes or subscribes to, and an HTTP one to the owner of its first"
        " request's publish (false: forward its publishes, proxy its subscription)",
    ),
    FlagSpec(
        "worker-shards",
        _B,
        "worker_shards",
        False,
        "[nsqx] with --workers: give a topic of NSQ 1.3 one shard per worker, publishes"
        " written where they arrive, a consumer naming no partition fed from every shard",
    ),
    FlagSpec(
        "busy-poll",
        _D,
        "busy_poll",
        0.0002,
        "[nsqx] after a read with publishes, keep polling this long without sleeping"
        " while one client connection is active (a lone request/response publisher);"
        " 0: off",
    ),
    FlagSpec(
        "drain-timeout",
        _D,
        "drain_timeout",
        5.0,
        "[nsqx] on SIGTERM/SIGINT, drain this long before closing: no new deliveries,"
        " consumers told with CLOSE_WAIT, messages in flight answered (0: close at once)",
    ),
    FlagSpec(
        "queue-scan-worker-pool-max",
        _I,
        "queue_scan_worker_pool_max",
        4,
        "most workers scanning channels for in-flight and deferred timeouts",
    ),
    FlagSpec(
        "queue-scan-selection-count",
        _I,
        "queue_scan_selection_count",
        20,
        "channels sampled per scan cycle (every 100ms)",
    ),
    # -- message timeouts and sizes
    FlagSpec(
        "msg-timeout",
        _D,
        "msg_timeout",
        60.0,
        "default time a client has to FIN a message before it is requeued",
    ),
    FlagSpec(
        "max-msg-timeout",
        _D,
        "max_msg_timeout",
        15 * 60.0,
        "longest message timeout a client may negotiate",
    ),
    FlagSpec("max-msg-size", _I, "max_msg_size", 1048576, "largest message body, in bytes"),
    FlagSpec(
        "max-req-timeout",
        _D,
        "max_req_timeout",
        3600.0,
        "longest REQ/DPUB delay",
    ),
    FlagSpec(
        "max-dpub-timeout",
        _D,
        "max_dpub_timeout",
        0.0,
        "[nsqx] longest DPUB (and HTTP /pub?defer) delay, apart from REQ's (0:"
        " --max-req-timeout's, as NSQ 1.3)",
    ),
    FlagSpec(
        "max-body-size",
        _I,
        "max_body_size",
        5242880,
        "largest command body (MPUB, IDENTIFY, AUTH), in bytes",
    ),
    # -- limits clients can negotiate
    FlagSpec(
        "max-heartbeat-interval",
        _D,
        "max_heartbeat_interval",
        60.0,
        "longest heartbeat interval a client may negotiate",
    ),
    FlagSpec("max-rdy-count", _I, "max_rdy_count", 2500, "largest RDY count a client may set"),
    FlagSpec(
        "max-output-buffer-size",
        _I,
        "max_output_buffer_size",
        65536,
        "largest output buffer a client may negotiate, in bytes",
    ),
    FlagSpec(
        "max-output-buffer-timeout",
        _D,
        "max_output_buffer_timeout",
        30.0,
        "longest output flush interval a client may negotiate",
    ),
    FlagSpec(
        "min-output-buffer-timeout",
        _D,
        "min_output_buffer_timeout",
        0.025,
        "shortest output flush interval a client may negotiate",
    ),
    FlagSpec(
        "output-buffer-timeout",
        _D,
        "output_buffer_timeout",
        0.25,
        "default output flush interval",
    ),
    FlagSpec(
        "max-channel-consumers",
        _I,
        "max_channel_consumers",
        0,
        "most consumers per channel on this node (0: unlimited)",
    ),
    # -- Youzan's extensions
    FlagSpec(
        "allow-ext-compatible",
        _B,
        "allow_ext_compatible",
        False,
        "accept ext headers with only ## keys on topics without ext support (dropping them)",
    ),
    FlagSpec(
        "allow-sub-ext-compatible",
        _B,
        "allow_sub_ext_compatible",
        False,
        "let consumers without extend_support subscribe to ext topics (vanilla frames)",
    ),
    # -- statsd
    FlagSpec(
        "statsd-address",
        _S,
        "statsd_address",
        "",
        "UDP host:port of a statsd daemon to push stats to",
        metavar="addr",
    ),
    FlagSpec("statsd-interval", _D, "statsd_interval", 60.0, "time between statsd pushes"),
    FlagSpec(
        "statsd-mem-stats",
        _B,
        "statsd_mem_stats",
        True,
        "also push memory and GC stats to statsd",
    ),
    FlagSpec(
        "statsd-prefix",
        _S,
        "statsd_prefix",
        "nsq.%s",
        "prefix for statsd keys (%s becomes the host)",
    ),
    FlagSpec(
        "statsd-udp-packet-size",
        _I,
        "statsd_udp_packet_size",
        508,
        "largest statsd UDP packet, in bytes",
    ),
    FlagSpec(
        "statsd-exclude-ephemeral",
        _B,
        "statsd_exclude_ephemeral",
        False,
        "leave #ephemeral topics and channels out of statsd",
    ),
    # -- end-to-end latency
    FlagSpec(
        "e2e-processing-latency-percentile",
        Kind.FLOAT_LIST,
        "e2e_processing_latency_percentiles",
        [],
        "end-to-end latency percentile to track, in (0, 1]",
        metavar="float",
    ),
    FlagSpec(
        "e2e-processing-latency-window-time",
        _D,
        "e2e_processing_latency_window_time",
        600.0,
        "window over which end-to-end latency percentiles are computed",
    ),
    # -- TLS
    FlagSpec("tls-cert", _S, "tls_cert", "", "certificate file (PEM)", metavar="path"),
    FlagSpec("tls-key", _S, "tls_key", "", "private key file (PEM)", metavar="path"),
    FlagSpec(
        "tls-client-auth-policy",
        _S,
        "tls_client_auth_policy",
        "",
        "client certificates: require or require-verify (either implies --tls-required)",
        metavar="policy",
    ),
    FlagSpec(
        "tls-root-ca-file",
        _S,
        "tls_root_ca_file",
        "",
        "CA file used to verify client certificates",
        metavar="path",
    ),
    FlagSpec(
        "tls-required",
        _S,
        "tls_required",
        "false",
        "require TLS: true, false, or tcp-https (TCP clients and plain HTTP refused)",
        bool_style=True,
        convert=_tls_required,
        metavar="true|false|tcp-https",
    ),
    FlagSpec(
        "tls-min-version",
        _S,
        "tls_min_version",
        "tls1.0",
        "oldest TLS version accepted: tls1.0, tls1.1, tls1.2 or tls1.3",
        convert=_tls_min_version,
        metavar="version",
    ),
    # -- compression
    FlagSpec("deflate", _B, "deflate", True, "let clients negotiate deflate compression"),
    FlagSpec(
        "max-deflate-level",
        _I,
        "max_deflate_level",
        6,
        "highest deflate level a client may negotiate (1-9; higher costs more CPU)",
    ),
    FlagSpec("snappy", _B, "snappy", True, "let clients negotiate snappy compression"),
)

#: The flag set built from :data:`NSQD_FLAGS`.
NSQD_FLAGSET = FlagSet(
    "nsqd",
    NSQD_FLAGS,
    summary="nsqd receives, queues and delivers messages (NSQ 1.3 compatible).",
)


def nsqd_usage() -> str:
    """The ``--help`` text for nsqd: every flag with its default and help."""
    return NSQD_FLAGSET.usage()


def wants_help(argv: Sequence[str]) -> bool:
    """True if ``argv`` asks for help (``-h``/``-help``/``--help`` before any bad flag)."""
    return NSQD_FLAGSET.wants_help(argv)


def wants_version(argv: Sequence[str]) -> bool:
    """True if ``argv`` parses and sets ``--version``.

    Checked before the config file is read, as NSQ does. A malformed ``argv`` gives
    False; :func:`parse_nsqd_args` then reports the error.
    """
    try:
        parsed = NSQD_FLAGSET.parse(argv)
    except FlagError:
        return False
    return bool(parsed.get("version", False))


def parse_nsqd_args(argv: Sequence[str]) -> NsqdOptions:
    """Parse nsqd's command line (without the program name) into validated options.

    Reads ``--config`` if given; flags override it. ``--version`` is accepted but not
    acted on here (see :func:`wants_version`). Deprecated flags: ``--verbose`` sets the
    log level to debug unless ``--log-level`` is also given; ``--worker-id`` is accepted
    and ignored, as in NSQ 1.3. A client auth policy turns ``tls_required`` on, as NSQ
    does.

    Raises FlagError for anything nsqd would refuse (HelpRequested for ``-h``).
    """
    res = NSQD_FLAGSET.parse_and_resolve(argv)
    parsed, values = res.parsed, res.values

    if parsed.get("verbose", False):
        log.warning("--verbose is deprecated; use --log-level=debug")
        if not parsed.is_set("log-level"):
            values["log_level"] = "debug"
    if parsed.is_set("worker-id"):
        log.warning("--worker-id is deprecated and has no effect; use --node-id")
    if parsed.is_set("e2e-processing-latency-percentile"):
        # NSQ keeps command-line percentiles sorted, highest first
        values["e2e_processing_latency_percentiles"].sort(reverse=True)

    opts = NsqdOptions(**values)
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"
    if opts.tls_client_auth_policy not in ("", "require", "require-verify"):
        log.warning(
            "unknown --tls-client-auth-policy %r: client certificates will not be requested",
            opts.tls_client_auth_policy,
        )
    try:
        opts.validate()
    except ValueError as e:
        raise FlagError(str(e)) from None
    return opts
