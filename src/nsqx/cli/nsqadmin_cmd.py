"""``nsqx nsqadmin``: the web admin, with NSQ 1.3 nsqadmin's flags and config file."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from nsqx.admin import AdminOptions, NSQAdmin
from nsqx.cli.cluster_secret import secret_flags
from nsqx.cli.daemon import install_event_loop_policy, setup_logging, wait_for_termination
from nsqx.cli.goflags import FlagError, FlagSet, FlagSpec, HelpRequested, Kind
from nsqx.cli.nsqd_flags import _log_level
from nsqx.cli.version import version_line

__all__ = ["NSQADMIN_FLAGSET", "parse_nsqadmin_args", "run_nsqadmin"]

log = logging.getLogger("nsqx.admin")

_S, _B, _D, _L = Kind.STR, Kind.BOOL, Kind.DURATION, Kind.STR_LIST

#: nsqadmin's flags (NSQ 1.3.0), then nsqx's; defaults equal AdminOptions'.
NSQADMIN_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("version", _B, "", False, "print the version and exit"),
    FlagSpec("config", _S, "", "", "path to a TOML config file", metavar="path"),
    FlagSpec(
        "log-level",
        _S,
        "log_level",
        "info",
        "log verbosity: debug, info, warn, error or fatal",
        convert=_log_level,
        metavar="level",
    ),
    FlagSpec("log-prefix", _S, "log_prefix", "[nsqadmin] ", "prefix for log lines"),
    FlagSpec("verbose", _B, "", False, "[deprecated] has no effect, use --log-level"),
    FlagSpec(
        "http-address",
        _S,
        "http_address",
        "0.0.0.0:4171",
        "<addr>:<port> to listen on for HTTP clients (port 0: a free one)",
        metavar="addr",
    ),
    FlagSpec("base-path", _S, "base_path", "/", "URL base path", metavar="path"),
    FlagSpec("dev-static-dir", _S, "dev_static_dir", "", "(development use only)"),
    FlagSpec("graphite-url", _S, "graphite_url", "", "accepted, not used (see docs/admin.md)"),
    FlagSpec("proxy-graphite", _B, "proxy_graphite", False, "accepted, not used"),
    FlagSpec(
        "statsd-counter-format",
        _S,
        "statsd_counter_format",
        "stats.counters.%s.count",
        "accepted, not used (Graphite names)",
    ),
    FlagSpec(
        "statsd-gauge-format",
        _S,
        "statsd_gauge_format",
        "stats.gauges.%s",
        "accepted, not used (Graphite names)",
    ),
    FlagSpec("statsd-prefix", _S, "statsd_prefix", "nsq.%s", "accepted, not used"),
    FlagSpec("statsd-interval", _D, "statsd_interval", 60.0, "accepted, not used"),
    FlagSpec(
        "notification-http-endpoint",
        _S,
        "notification_http_endpoint",
        "",
        "HTTP endpoint (fully qualified) to which POST notifications of admin actions are sent",
        metavar="url",
    ),
    FlagSpec(
        "http-client-connect-timeout",
        _D,
        "http_client_connect_timeout",
        2.0,
        "timeout for HTTP connect",
    ),
    FlagSpec(
        "http-client-request-timeout",
        _D,
        "http_client_request_timeout",
        5.0,
        "timeout for HTTP request",
    ),
    FlagSpec(
        "http-client-tls-insecure-skip-verify",
        _B,
        "http_client_tls_insecure_skip_verify",
        False,
        "skip verification of TLS certificates (HTTPS nsqd/lookupd)",
    ),
    FlagSpec(
        "http-client-tls-root-ca-file",
        _S,
        "http_client_tls_root_ca_file",
        "",
        "path to CA file for the HTTP client",
    ),
    FlagSpec("http-client-tls-cert", _S, "http_client_tls_cert", "", "certificate file"),
    FlagSpec("http-client-tls-key", _S, "http_client_tls_key", "", "key file"),
    FlagSpec(
        "allow-config-from-cidr",
        _S,
        "allow_config_from_cidr",
        "127.0.0.1/8",
        "a CIDR from which to allow HTTP requests to the /config endpoint",
    ),
    FlagSpec(
        "acl-http-header",
        _S,
        "acl_http_header",
        "X-Forwarded-User",
        "HTTP header to check for authenticated admin users",
    ),
    FlagSpec(
        "lookupd-http-address",
        _L,
        "nsqlookupd_http_addresses",
        [],
        "lookupd HTTP address",
        config_key="nsqlookupd_http_addresses",
        metavar="addr",
    ),
    FlagSpec(
        "nsqd-http-address",
        _L,
        "nsqd_http_addresses",
        [],
        "nsqd HTTP address",
        config_key="nsqd_http_addresses",
        metavar="addr",
    ),
    FlagSpec(
        "admin-user",
        _L,
        "admin_users",
        [],
        "admin user (if given, only these users may act; --acl-http-header names them)",
        config_key="admin_users",
        metavar="user",
    ),
    FlagSpec(
        "history-interval",
        _D,
        "history_interval",
        5.0,
        "[nsqx] how often to sample every nsqd's /stats for rates and history",
    ),
    FlagSpec(
        "history-length",
        _D,
        "history_length",
        900.0,
        "[nsqx] how much history to keep in memory for the charts",
    ),
    FlagSpec(
        "refresh-interval",
        _D,
        "refresh_interval",
        2.0,
        "[nsqx] how often the page refreshes its numbers",
    ),
    FlagSpec(
        "node-timeout",
        _D,
        "node_timeout",
        1.0,
        "[nsqx] how long a page waits for one nsqd or nsqlookupd before showing it as "
        "not answering (it is then probed in the background)",
    ),
    *secret_flags("nsqadmin"),
    FlagSpec(
        "http-auth-secret",
        _S,
        "http_auth_secret",
        "",
        "[nsqx] secret sent as 'Authorization: Bearer' to nsqd and nsqlookupd that run"
        " with --http-auth (docs/http-auth.md)",
        metavar="secret",
    ),
    FlagSpec(
        "http-auth-secret-file",
        _S,
        "http_auth_secret_file",
        "",
        "[nsqx] read --http-auth-secret from this file (its first line)",
        metavar="path",
    ),
    FlagSpec(
        "http-auth-forward",
        _B,
        "http_auth_forward",
        False,
        "[nsqx] a request's own 'Authorization: Bearer <secret>' (the user's) goes on the"
        " calls to nsqd and nsqlookupd made for it, instead of --http-auth-secret",
    ),
)

NSQADMIN_FLAGSET = FlagSet(
    "nsqx nsqadmin",
    NSQADMIN_FLAGS,
    summary="A web page of an NSQ cluster (nsqx's or NSQ 1.3's) and its JSON API.",
)

EXAMPLES = """
Examples:
  nsqx nsqadmin --lookupd-http-address=127.0.0.1:4161
  nsqx nsqadmin --nsqd-http-address=10.0.0.1:4151 --nsqd-http-address=10.0.0.2:4151
  nsqx nsqadmin --lookupd-http-address=127.0.0.1:4161 --admin-user=alice \\
                --acl-http-header=X-Forwarded-User --notification-http-endpoint=http://hooks/nsq
"""


def parse_nsqadmin_args(argv: Sequence[str]) -> AdminOptions:
    """The command line (and ``--config``) as valid AdminOptions; FlagError if not."""
    res = NSQADMIN_FLAGSET.parse_and_resolve(argv)
    if res.parsed.get("verbose", False):
        log.warning("--verbose is deprecated and has no effect; use --log-level")
    options = AdminOptions(**res.values)
    try:
        options.validate()
    except ValueError as err:
        raise FlagError(str(err)) from None
    return options


async def serve(options: AdminOptions) -> int:
    """Run the admin until SIGINT/SIGTERM; 1 if it cannot start."""
    admin = NSQAdmin(options)
    try:
        await admin.start()
    except OSError as err:
        log.critical("failed to start: listen (%s) failed - %s", options.http_address, err)
        return 1
    except ValueError as err:
        log.critical("failed to start: %s", err)
        return 1
    await wait_for_termination()
    log.info("NSQADMIN: shutting down")
    await admin.close()
    return 0


def run_nsqadmin(argv: list[str]) -> int:
    """``nsqx nsqadmin``'s main."""
    try:
        parsed = NSQADMIN_FLAGSET.parse(argv)
    except HelpRequested as req:
        print(req.usage + EXAMPLES)
        return 0
    except FlagError as err:
        print(f"nsqadmin: {err}\n(run `nsqx nsqadmin --help` for the flags)", file=sys.stderr)
        return 2
    if parsed.get("version", False):
        print(version_line("nsqadmin"))
        return 0
    try:
        options = parse_nsqadmin_args(argv)
    except FlagError as err:
        print(f"nsqadmin: {err}\n(run `nsqx nsqadmin --help` for the flags)", file=sys.stderr)
        return 2
    setup_logging(options.log_level, options.log_prefix)
    install_event_loop_policy()
    return asyncio.run(serve(options))
