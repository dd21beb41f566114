"""nsqd's flag table (NSQ 1.3) and parse_nsqd_args."""

from __future__ import annotations

import dataclasses
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from nsqx.cli.goflags import FlagError, HelpRequested, Kind
from nsqx.cli.nsqd_flags import (
    NSQD_FLAGS,
    NSQD_FLAGSET,
    nsqd_usage,
    parse_nsqd_args,
    wants_help,
    wants_version,
)
from nsqx.nsqd.options import NsqdOptions, default_node_id

# NSQ 1.3.0's defaults (reference §1.1), durations in seconds.
NSQ13_DEFAULTS: dict[str, Any] = {
    "tcp_address": "0.0.0.0:4150",
    "http_address": "0.0.0.0:4151",
    "https_address": "0.0.0.0:4152",
    "broadcast_tcp_port": 0,
    "broadcast_http_port": 0,
    "nsqlookupd_tcp_addresses": [],
    "http_client_connect_timeout": 2.0,
    "http_client_request_timeout": 5.0,
    "data_path": "",
    "mem_queue_size": 10000,
    "max_bytes_per_file": 100 * 1024 * 1024,
    "sync_every": 2500,
    "sync_timeout": 2.0,
    "queue_scan_worker_pool_max": 4,
    "queue_scan_selection_count": 20,
    "msg_timeout": 60.0,
    "max_msg_timeout": 15 * 60.0,
    "max_req_timeout": 3600.0,
    "max_msg_size": 1048576,
    "max_body_size": 5242880,
    "max_heartbeat_interval": 60.0,
    "max_rdy_count": 2500,
    "max_output_buffer_size": 65536,
    "max_output_buffer_timeout": 30.0,
    "min_output_buffer_timeout": 0.025,
    "output_buffer_timeout": 0.25,
    "max_channel_consumers": 0,
    "tls_cert": "",
    "tls_key": "",
    "tls_root_ca_file": "",
    "tls_client_auth_policy": "",
    "tls_required": "false",
    "tls_min_version": "tls1.0",
    "deflate": True,
    "max_deflate_level": 6,
    "snappy": True,
    "auth_http_addresses": [],
    "statsd_address": "",
    "statsd_prefix": "nsq.%s",
    "statsd_interval": 60.0,
    "statsd_mem_stats": True,
    "statsd_udp_packet_size": 508,
    "statsd_exclude_ephemeral": False,
    "e2e_processing_latency_percentiles": [],
    "e2e_processing_latency_window_time": 600.0,
    "log_level": "info",
    "log_prefix": "[nsqd] ",
}

# Every flag NSQ 1.3.0's nsqd accepts.
NSQ13_FLAG_NAMES = {
    "version",
    "config",
    "log-level",
    "log-prefix",
    "verbose",
    "node-id",
    "worker-id",
    "tcp-address",
    "http-address",
    "https-address",
    "broadcast-address",
    "broadcast-tcp-port",
    "broadcast-http-port",
    "lookupd-tcp-address",
    "auth-http-address",
    "http-client-connect-timeout",
    "http-client-request-timeout",
    "data-path",
    "mem-queue-size",
    "max-bytes-per-file",
    "sync-every",
    "sync-timeout",
    "queue-scan-worker-pool-max",
    "queue-scan-selection-count",
    "msg-timeout",
    "max-msg-timeout",
    "max-msg-size",
    "max-req-timeout",
    "max-body-size",
    "max-heartbeat-interval",
    "max-rdy-count",
    "max-output-buffer-size",
    "max-output-buffer-timeout",
    "min-output-buffer-timeout",
    "output-buffer-timeout",
    "max-channel-consumers",
    "statsd-address",
    "statsd-interval",
    "statsd-mem-stats",
    "statsd-prefix",
    "statsd-udp-packet-size",
    "statsd-exclude-ephemeral",
    "e2e-processing-latency-percentile",
    "e2e-processing-latency-window-time",
    "tls-cert",
    "tls-key",
    "tls-client-auth-policy",
    "tls-root-ca-file",
    "tls-required",
    "tls-min-version",
    "deflate",
    "max-deflate-level",
    "snappy",
}


# -- the table -----------------------------------------------------------------


#: flags nsqx adds to NSQ's (documented in docs/nsqd.md)
NSQX_EXTRA_FLAGS = {
    "sync-before-ack",
    "retention",
    "replication-lag-timeout",
    "replication-ack",
    "http-admin-allow",
    "replication-address",
    "busy-poll",
    "workers",
    "worker-handoff",
    "worker-shards",
    "max-dpub-timeout",
    "drain-timeout",
    "cluster-secret",
    "cluster-secret-file",
    "http-auth",
    # Youzan's nsqd options
    "allow-ext-compatible",
    "allow-sub-ext-compatible",
}


def test_table_has_exactly_nsq13s_flags_plus_nsqx_ones() -> None:
    assert {s.name for s in NSQD_FLAGS} == NSQ13_FLAG_NAMES | NSQX_EXTRA_FLAGS


def test_every_destination_is_an_nsqd_option() -> None:
    fields = {f.name for f in dataclasses.fields(NsqdOptions)}
    for spec in NSQD_FLAGS:
        if spec.dest:
            assert spec.dest in fields, spec.name


def test_table_defaults_match_nsqdoptions_and_nsq13() -> None:
    opts = NsqdOptions()
    for spec in NSQD_FLAGS:
        if not spec.dest or spec.default is None:
            continue
        assert getattr(opts, spec.dest) == spec.default, spec.name
        if spec.name not in NSQX_EXTRA_FLAGS:
            assert NSQ13_DEFAULTS[spec.dest] == spec.default, spec.name


def test_no_flags_gives_nsq13_defaults() -> None:
    opts = parse_nsqd_args([])
    for name, value in NSQ13_DEFAULTS.items():
        assert getattr(opts, name) == value, name
    assert opts.broadcast_address == socket.gethostname()
    assert opts.node_id == default_node_id()
    assert 0 <= opts.node_id < 1024


def test_config_names_are_nsqs() -> None:
    keys = {k for s in NSQD_FLAGS for k in s.config_keys}
    for key in (
        "nsqlookupd_tcp_addresses",
        "auth_http_addresses",
        "e2e_processing_latency_percentiles",
        "tcp_address",
        "msg_timeout",
        "id",
        "log_level",
    ):
        assert key in keys
    assert NSQD_FLAGSET.lookup("node-id") is not None
    assert NSQD_FLAGSET.lookup("node-id").config_keys[0] == "id"  # type: ignore[union-attr]


# -- command lines that real test harnesses use -----------------------------------


def test_pynsq_reader_harness() -> None:
    opts = parse_nsqd_args(
        ["--verbose", "--snappy", "--tls-key=/t/tests/key.pem", "--tls-cert=/t/tests/cert.pem"]
    )
    assert opts.snappy is True
    assert opts.tls_key == "/t/tests/key.pem"
    assert opts.tls_cert == "/t/tests/cert.pem"
    assert opts.log_level == "debug"


def test_pynsq_deflate_and_lookupd_and_auth_harnesses() -> None:
    opts = parse_nsqd_args(["--verbose", "--deflate", "--tls-key=k", "--tls-cert=c"])
    assert opts.deflate is True
    opts = parse_nsqd_args(["--verbose", "-lookupd-tcp-address=127.0.0.1:4160"])
    assert opts.nsqlookupd_tcp_addresses == ["127.0.0.1:4160"]
    opts = parse_nsqd_args(["--verbose", "--auth-http-address=127.0.0.1:4181"])
    assert opts.auth_http_addresses == ["127.0.0.1:4181"]


def test_java_client_harness() -> None:
    opts = parse_nsqd_args(
        [
            "-lookupd-tcp-address=localhost:4160",
            "-broadcast-address=127.0.0.1",
            "-snappy=true",
            "-deflate=true",
            "-tls-cert=cert.pem",
            "-tls-key=key.pem",
        ]
    )
    assert opts.nsqlookupd_tcp_addresses == ["localhost:4160"]
    assert opts.broadcast_address == "127.0.0.1"
    assert (opts.snappy, opts.deflate) == (True, True)


def test_go_nsq_harness() -> None:
    opts = parse_nsqd_args(
        [
            "--data-path=/tmp",
            "--lookupd-tcp-address=127.0.0.1:4160",
            "--tls-cert=./test/server.pem",
            "--tls-key=./test/server.key",
            "--tls-root-ca-file=./test/ca.pem",
        ]
    )
    assert opts.data_path == "/tmp"
    assert opts.tls_root_ca_file == "./test/ca.pem"
    assert opts.tls_required == "false"


def test_gnsq_harness() -> None:
    opts = parse_nsqd_args(
        [
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
            "--data-path",
            "tmp",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
            "--https-address=127.0.0.1:0",
            "--lookupd-tcp-address",
            "127.0.0.1:4160",
        ]
    )
    assert opts.tcp_address == "127.0.0.1:0"
    assert opts.http_address == "127.0.0.1:0"
    assert opts.https_address == "127.0.0.1:0"
    assert opts.data_path == "tmp"
    assert opts.nsqlookupd_tcp_addresses == ["127.0.0.1:4160"]


def test_ansq_and_our_own_harness() -> None:
    opts = parse_nsqd_args(["-tcp-address=127.0.0.1:4150", "-http-address=127.0.0.1:4151"])
    assert (opts.tcp_address, opts.http_address) == ("127.0.0.1:4150", "127.0.0.1:4151")
    opts = parse_nsqd_args(["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=/d"])
    assert opts.http_address == ""


def test_unix_socket_addresses() -> None:
    opts = parse_nsqd_args(["--tcp-address=/tmp/nsqd.sock", "--http-address=/tmp/nsqd-http.sock"])
    assert opts.tcp_address == "/tmp/nsqd.sock"


# -- individual flags ----------------------------------------------------------------


def test_durations_and_ints() -> None:
    opts = parse_nsqd_args(
        [
            "--msg-timeout=1m30s",
            "--max-msg-timeout",
            "1h",
            "-output-buffer-timeout=100ms",
            "-max-rdy-count=10",
            "--mem-queue-size=0",
            "--sync-timeout=0",
            "--e2e-processing-latency-window-time=1.5h",
        ]
    )
    assert opts.msg_timeout == 90.0
    assert opts.max_msg_timeout == 3600.0
    assert opts.output_buffer_timeout == 0.1
    assert opts.max_rdy_count == 10
    assert opts.mem_queue_size == 0
    assert opts.sync_timeout == 0.0
    assert opts.e2e_processing_latency_window_time == 5400.0


def test_repeated_lookupd_and_auth_addresses_append() -> None:
    opts = parse_nsqd_args(
        [
            "--lookupd-tcp-address=a:4160",
            "--lookupd-tcp-address",
            "b:4160",
            "--auth-http-address=http://auth/a",
            "-auth-http-address=auth:4181",
        ]
    )
    assert opts.nsqlookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert opts.auth_http_addresses == ["http://auth/a", "auth:4181"]


def test_e2e_percentiles_comma_and_repeat_sorted_like_nsq() -> None:
    opts = parse_nsqd_args(
        [
            "--e2e-processing-latency-percentile=0.5,1.0",
            "--e2e-processing-latency-percentile",
            "0.99",
        ]
    )
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_e2e_percentile_range(value: str) -> None:
    with pytest.raises(FlagError, match="e2e-processing-latency-percentile"):
        parse_nsqd_args([f"--e2e-processing-latency-percentile={value}"])


def test_bools() -> None:
    opts = parse_nsqd_args(
        ["--snappy=false", "--deflate=0", "--statsd-mem-stats=f", "--statsd-exclude-ephemeral"]
    )
    assert (opts.snappy, opts.deflate, opts.statsd_mem_stats) == (False, False, False)
    assert opts.statsd_exclude_ephemeral is True


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tls-required"], "true"),
        (["--tls-required=true"], "true"),
        (["--tls-required=TRUE"], "true"),
        (["--tls-required=1"], "true"),
        (["--tls-required=false"], "false"),
        (["--tls-required=F"], "false"),
        (["--tls-required=tcp-https"], "tcp-https"),
        (["--tls-required=TCP-HTTPS"], "tcp-https"),
        ([], "false"),
    ],
)
def test_tls_required(argv: list[str], expected: str) -> None:
    assert parse_nsqd_args(argv).tls_required == expected


def test_tls_required_bad_value() -> None:
    with pytest.raises(FlagError, match='invalid boolean value "maybe" for -tls-required'):
        parse_nsqd_args(["--tls-required=maybe"])


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_auth_policy_forces_tls_required(policy: str) -> None:
    opts = parse_nsqd_args([f"--tls-client-auth-policy={policy}"])
    assert opts.tls_client_auth_policy == policy
    assert opts.tls_required == "true"
    # but an explicit tcp-https is kept (it already requires TLS)
    opts = parse_nsqd_args([f"--tls-client-auth-policy={policy}", "--tls-required=tcp-https"])
    assert opts.tls_required == "tcp-https"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("tls1.0", "tls1.0"),
        ("tls1.1", "tls1.1"),
        ("tls1.2", "tls1.2"),
        ("TLS1.3", "tls1.3"),
        ("", "tls1.0"),
    ],
)
def test_tls_min_version(value: str, expected: str) -> None:
    assert parse_nsqd_args([f"--tls-min-version={value}"]).tls_min_version == expected


@pytest.mark.parametrize("value", ["ssl3.0", "tls1.4", "1.2"])
def test_tls_min_version_refused(value: str) -> None:
    with pytest.raises(FlagError, match=f'invalid value "{value}" for flag -tls-min-version'):
        parse_nsqd_args([f"--tls-min-version={value}"])


def test_log_level_and_prefix() -> None:
    opts = parse_nsqd_args(["--log-level=WARN", "--log-prefix=[x] "])
    assert (opts.log_level, opts.log_prefix) == ("warn", "[x] ")
    with pytest.raises(FlagError, match='invalid value "loud" for flag -log-level'):
        parse_nsqd_args(["--log-level=loud"])


def test_verbose_is_deprecated_debug_unless_log_level_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="nsqx.cli"):
        assert parse_nsqd_args(["--verbose"]).log_level == "debug"
    assert "--verbose is deprecated" in caplog.text
    assert parse_nsqd_args(["--verbose", "--log-level=error"]).log_level == "error"
    assert parse_nsqd_args(["--log-level=error", "--verbose"]).log_level == "error"
    assert parse_nsqd_args(["--verbose=false"]).log_level == "info"


def test_worker_id_is_accepted_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="nsqx.cli"):
        opts = parse_nsqd_args(["--worker-id", "--node-id=5"])
    assert opts.node_id == 5
    assert "--worker-id is deprecated" in caplog.text
    # as in NSQ 1.3 it is a boolean flag, so it cannot carry an id
    with pytest.raises(FlagError, match='invalid boolean value "7" for -worker-id'):
        parse_nsqd_args(["--worker-id=7"])


@pytest.mark.parametrize(("value", "ok"), [("0", True), ("1023", True), ("1024", False)])
def test_node_id_range(value: str, ok: bool) -> None:
    if ok:
        assert parse_nsqd_args([f"--node-id={value}"]).node_id == int(value)
    else:
        with pytest.raises(FlagError, match=r"--node-id must be in \[0,1024\)"):
            parse_nsqd_args([f"--node-id={value}"])


@pytest.mark.parametrize(
    ("value", "seconds"), [("0", 0.0), ("200us", 0.0002), ("10ms", 0.01), ("11ms", None)]
)
def test_busy_poll_range(value: str, seconds: float | None) -> None:
    if seconds is not None:
        assert parse_nsqd_args([f"--busy-poll={value}"]).busy_poll == seconds
    else:
        with pytest.raises(FlagError, match="--busy-poll must be from 0 to 10ms"):
            parse_nsqd_args([f"--busy-poll={value}"])


def test_validation_errors_become_flag_errors() -> None:
    with pytest.raises(FlagError, match="max-deflate-level"):
        parse_nsqd_args(["--max-deflate-level=10"])
    with pytest.raises(FlagError, match="msg-timeout"):
        parse_nsqd_args(["--msg-timeout=20m"])  # beyond --max-msg-timeout


def test_error_messages() -> None:
    with pytest.raises(FlagError, match=r"^flag provided but not defined: -foo$"):
        parse_nsqd_args(["-foo"])
    with pytest.raises(
        FlagError, match=r'^invalid value "abc" for flag -max-rdy-count: parse error$'
    ):
        parse_nsqd_args(["--max-rdy-count=abc"])
    with pytest.raises(FlagError, match=r'^invalid value "60" for flag -msg-timeout: parse error$'):
        parse_nsqd_args(["--msg-timeout=60"])
    with pytest.raises(FlagError, match=r'^invalid boolean value "yes" for -snappy: parse error$'):
        parse_nsqd_args(["--snappy=yes"])
    with pytest.raises(FlagError, match=r"^flag needs an argument: -tcp-address$"):
        parse_nsqd_args(["--tcp-address"])
    with pytest.raises(FlagError, match='unexpected argument "extra"'):
        parse_nsqd_args(["--snappy", "extra"])


# -- help and version --------------------------------------------------------------------


def test_help() -> None:
    for arg in ("-h", "--help", "-help"):
        assert wants_help([arg])
        with pytest.raises(HelpRequested) as info:
            parse_nsqd_args([arg])
        assert info.value.usage == nsqd_usage()
    assert not wants_help([])
    assert not wants_help(["--bogus", "--help"])


def test_usage_lists_every_flag_with_its_default() -> None:
    text = nsqd_usage()
    for spec in NSQD_FLAGS:
        assert f"  --{spec.name}" in text, spec.name
        assert spec.help in text, spec.name
    assert '(default: "0.0.0.0:4150")' in text
    assert "(default: 1m0s)" in text
    assert "(default: 25ms)" in text
    assert "(default: 15m0s)" in text
    assert "(default: the OS hostname)" in text
    assert "(default: 2500)" in text
    assert "--snappy[=true|false]" in text


def test_version() -> None:
    assert wants_version(["--version"])
    assert wants_version(["-version", "--tcp-address=x"])
    assert not wants_version([])
    assert not wants_version(["--version=false"])
    assert not wants_version(["--version", "--bogus"])  # the bad flag is reported instead
    # accepted, and does not change the options
    assert parse_nsqd_args(["--version"]).tcp_address == "0.0.0.0:4150"


def test_version_is_checked_before_the_config_file(tmp_path: Path) -> None:
    assert wants_version(["--version", f"--config={tmp_path / 'missing.toml'}"])


# -- config file ----------------------------------------------------------------------------


def _cfg(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


def test_config_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _cfg(
        tmp_path,
        """
        id = 42
        tcp_address = "127.0.0.1:5150"
        http_address = "127.0.0.1:5151"
        nsqlookupd_tcp_addresses = ["127.0.0.1:4160", "127.0.0.1:5160"]
        auth_http_addresses = "a:1,b:2"
        msg_timeout = "30s"
        max_req_timeout = 120000
        mem_queue_size = 100
        snappy = false
        tls_required = true
        tls_min_version = "tls1.2"
        log_level = "DEBUG"
        e2e_processing_latency_percentiles = [0.5, 0.99]
        verbose = false
        queue_scan_interval = "1s"
        """,
    )
    with caplog.at_level(logging.WARNING, logger="nsqx.cli"):
        opts = parse_nsqd_args([f"--config={path}"])
    assert opts.node_id == 42
    assert opts.tcp_address == "127.0.0.1:5150"
    assert opts.http_address == "127.0.0.1:5151"
    assert opts.nsqlookupd_tcp_addresses == ["127.0.0.1:4160", "127.0.0.1:5160"]
    assert opts.auth_http_addresses == ["a:1", "b:2"]
    assert opts.msg_timeout == 30.0
    assert opts.max_req_timeout == 120.0  # integers are milliseconds, as in NSQ
    assert opts.mem_queue_size == 100
    assert opts.snappy is False
    assert opts.tls_required == "true"
    assert opts.tls_min_version == "tls1.2"
    assert opts.log_level == "debug"
    assert opts.e2e_processing_latency_percentiles == [0.5, 0.99]  # file order kept
    # keys NSQ does not know are ignored, with a warning
    assert "ignoring unknown config key 'verbose'" in caplog.text
    assert "ignoring unknown config key 'queue_scan_interval'" in caplog.text
    assert opts.queue_scan_interval == 0.1


def test_flags_override_config_which_overrides_defaults(tmp_path: Path) -> None:
    path = _cfg(
        tmp_path,
        'tcp_address = "127.0.0.1:5150"\nmax_rdy_count = 100\n'
        'nsqlookupd_tcp_addresses = ["cfg:4160"]\nlog_level = "warn"\n',
    )
    opts = parse_nsqd_args(
        ["--max-rdy-count=200", f"--config={path}", "--lookupd-tcp-address=flag:4160"]
    )
    assert opts.tcp_address == "127.0.0.1:5150"  # config
    assert opts.max_rdy_count == 200  # flag, wherever it appears relative to --config
    assert opts.nsqlookupd_tcp_addresses == ["flag:4160"]
    assert opts.http_address == "0.0.0.0:4151"  # default
    assert opts.log_level == "warn"
    # --verbose still means debug over the file's level
    assert parse_nsqd_args([f"--config={path}", "--verbose"]).log_level == "debug"


def test_config_node_id_alias(tmp_path: Path) -> None:
    assert parse_nsqd_args([f"--config={_cfg(tmp_path, 'node_id = 7')}"]).node_id == 7


def test_config_tls_values(tmp_path: Path) -> None:
    path = _cfg(
        tmp_path,
        'tls_required = "tcp-https"\ntls_min_version = ""\ntls_client_auth_policy = "require"',
    )
    opts = parse_nsqd_args([f"--config={path}"])
    assert (opts.tls_required, opts.tls_min_version) == ("tcp-https", "tls1.0")
    path = _cfg(tmp_path, 'tls_client_auth_policy = "require-verify"')
    assert parse_nsqd_args([f"--config={path}"]).tls_required == "true"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('tls_min_version = "ssl3.0"', "tls_min_version"),
        ('tls_required = "sometimes"', "tls_required"),
        ('log_level = "chatty"', "log_level"),
        ('msg_timeout = "60"', "msg_timeout"),
        ("msg_timeout = 1.5", "msg_timeout"),
        ('max_rdy_count = "lots"', "max_rdy_count"),
    ],
)
def test_config_errors(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(FlagError, match=f"for config key '{key}'"):
        parse_nsqd_args([f"--config={_cfg(tmp_path, text)}"])


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match="node-id"):
        parse_nsqd_args([f"--config={_cfg(tmp_path, 'id = 5000')}"])


def test_missing_or_malformed_config(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match="failed to load config file"):
        parse_nsqd_args([f"--config={tmp_path / 'missing.cfg'}"])
    with pytest.raises(FlagError, match="failed to load config file"):
        parse_nsqd_args(["--config", _cfg(tmp_path, "tcp_address = \n")])


def test_every_option_is_settable_from_flags_and_config(tmp_path: Path) -> None:
    # a value per kind that differs from every default
    samples: dict[Kind, tuple[str, Any, str]] = {
        Kind.INT: ("3", 3, "3"),
        Kind.DURATION: ("7s", 7.0, '"7s"'),
        Kind.BOOL: ("false", False, "false"),
        Kind.STR_LIST: ("x:1", ["x:1"], '["x:1"]'),
        Kind.FLOAT_LIST: ("0.5", [0.5], "[0.5]"),
    }
    str_samples = {
        "log-level": "error",
        "tls-required": "tcp-https",
        "tls-min-version": "tls1.3",
        "tls-client-auth-policy": "require",
        "http-auth": "publish,admin",
        "replication-ack": "written",
    }
    argv: list[str] = []
    lines: list[str] = []
    expected: dict[str, Any] = {}
    for spec in NSQD_FLAGS:
        if not spec.dest:
            continue
        if spec.kind is Kind.STR:
            text = str_samples.get(spec.name, "s-" + spec.name)
            value: Any = text
            toml = f'"{text}"'
        else:
            text, value, toml = samples[spec.kind]
        if spec.name == "http-admin-allow":
            text, value, toml = "10.0.0.0/8", ["10.0.0.0/8"], '["10.0.0.0/8"]'
        if spec.name in ("msg-timeout", "max-msg-timeout"):
            text, value, toml = "30s", 30.0, '"30s"'
        if spec.name == "busy-poll":
            text, value, toml = "7ms", 0.007, '"7ms"'
        argv.append(f"--{spec.name}={text}")
        lines.append(f"{spec.config_keys[0]} = {toml}")
        expected[spec.dest] = value
    from_flags = parse_nsqd_args(argv)
    from_config = parse_nsqd_args([f"--config={_cfg(tmp_path, chr(10).join(lines))}"])
    for dest, value in expected.items():
        assert getattr(from_flags, dest) == value, dest
        assert getattr(from_config, dest) == value, dest


@pytest.mark.parametrize("value", ["0", "257", "-1"])
def test_workers_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(FlagError, match="--workers must be from 1 to 256"):
        parse_nsqd_args([f"--workers={value}"])


def test_workers_default_is_one_process() -> None:
    assert parse_nsqd_args([]).workers == 1
    assert parse_nsqd_args(["--workers=4"]).workers == 4


def test_worker_handoff_is_on_unless_turned_off() -> None:
    assert parse_nsqd_args(["--workers=4"]).worker_handoff is True
    assert parse_nsqd_args(["--workers=4", "--worker-handoff=false"]).worker_handoff is False
