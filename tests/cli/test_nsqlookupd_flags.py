"""nsqlookupd's flag table (NSQ 1.3) and the `nsqx nsqlookupd` command."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nsqx.cli.goflags import FlagError, HelpRequested
from nsqx.cli.nsqlookupd_flags import (
    NSQLOOKUPD_FLAGS,
    nsqlookupd_usage,
    parse_nsqlookupd_args,
    wants_help,
    wants_version,
)
from nsqx.lookupd.options import LookupdOptions


def test_defaults_are_nsq_13s() -> None:
    opts = parse_nsqlookupd_args([])
    assert dataclasses.asdict(opts) == {
        "tcp_address": "0.0.0.0:4160",
        "http_address": "0.0.0.0:4161",
        "broadcast_address": socket.gethostname(),
        "inactive_producer_timeout": 300.0,
        "tombstone_lifetime": 45.0,
        "log_level": "info",
        "log_prefix": "[nsqlookupd] ",
        # nsqx's, for partitioned topics
        "data_path": "",
        "http_client_connect_timeout": 2.0,
        "http_client_request_timeout": 5.0,
        # nsqx's, for several nsqlookupd over etcd
        "etcd_endpoints": "",
        "cluster_id": "nsqx",
        "etcd_lease_ttl": 5.0,
        # nsqx's, for failover by time and members-only endpoints
        "node_timeout": 2.0,
        "cluster_secret": "",
        "cluster_secret_file": "",
        # nsqx's authenticated HTTP (docs/http-auth.md)
        "auth_http_addresses": [],
        "http_auth": "off",
    }
    # the table's defaults are the options' defaults
    defaults = LookupdOptions()
    for spec in NSQLOOKUPD_FLAGS:
        if spec.dest and spec.default is not None:
            assert getattr(defaults, spec.dest) == spec.default, spec.name


def test_go_syntax_and_durations() -> None:
    opts = parse_nsqlookupd_args(
        [
            "-tcp-address=127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
            "-broadcast-address=lk.example",
            "--inactive-producer-timeout=1m30s",
            "--tombstone-lifetime=250ms",
            "--verbose",
        ]
    )
    assert (opts.tcp_address, opts.http_address) == ("127.0.0.1:0", "127.0.0.1:0")
    assert opts.broadcast_address == "lk.example"
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (90.0, 0.25)
    assert opts.log_level == "debug"  # --verbose, as nsqd's
    assert parse_nsqlookupd_args(["--verbose", "--log-level=warn"]).log_level == "warn"


def test_partition_flags(tmp_path: Path) -> None:
    opts = parse_nsqlookupd_args(
        [
            f"--data-path={tmp_path}",
            "--http-client-connect-timeout=500ms",
            "-http-client-request-timeout=3s",
        ]
    )
    assert opts.data_path == str(tmp_path)
    assert (opts.http_client_connect_timeout, opts.http_client_request_timeout) == (0.5, 3.0)


def test_etcd_flags(tmp_path: Path) -> None:
    opts = parse_nsqlookupd_args(
        [
            "--etcd-endpoints=http://10.0.0.1:2379, https://10.0.0.2:2379,",
            "--cluster-id=prod-1",
            "--etcd-lease-ttl=10s",
        ]
    )
    assert opts.etcd_endpoint_list() == ["http://10.0.0.1:2379", "https://10.0.0.2:2379"]
    assert (opts.cluster_id, opts.etcd_lease_ttl) == ("prod-1", 10.0)
    cfg = tmp_path / "lookupd.toml"
    cfg.write_text('etcd_endpoints = "http://127.0.0.1:2379"\ncluster_id = "c"\n')
    opts = parse_nsqlookupd_args([f"--config={cfg}"])
    assert (opts.etcd_endpoints, opts.cluster_id) == ("http://127.0.0.1:2379", "c")


def test_config_file_and_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "lookupd.toml"
    cfg.write_text(
        'tcp_address = "127.0.0.1:5160"\n'
        'inactive_producer_timeout = "10s"\n'
        "tombstone_lifetime = 2000\n"  # integer milliseconds, as NSQ's config reader
        'log_level = "error"\n'
    )
    opts = parse_nsqlookupd_args([f"--config={cfg}", "--log-level=debug"])
    assert opts.tcp_address == "127.0.0.1:5160"
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (10.0, 2.0)
    assert opts.log_level == "debug"


@pytest.mark.parametrize(
    "argv",
    [
        ["--tcp-address"],
        ["--nope=1"],
        ["--tombstone-lifetime=soon"],
        ["--log-level=loud"],
        ["--tcp-address="],
        ["--inactive-producer-timeout=-1s"],
        ["--http-client-request-timeout=0s"],
        ["--http-client-connect-timeout=-1s"],
        ["--etcd-endpoints=127.0.0.1:2379"],
        ["--etcd-endpoints=http://127.0.0.1:2379", "--cluster-id="],
        ["--etcd-endpoints=http://127.0.0.1:2379", "--cluster-id=a/b"],
        ["--etcd-lease-ttl=1s"],
        ["--etcd-lease-ttl=2500ms"],
        ["positional"],
    ],
)
def test_refused(argv: list[str]) -> None:
    with pytest.raises(FlagError):
        parse_nsqlookupd_args(argv)


def test_help_and_version() -> None:
    assert wants_help(["--help"]) and wants_help(["-h"])
    with pytest.raises(HelpRequested):
        parse_nsqlookupd_args(["-help"])
    assert wants_version(["--version"]) and not wants_version([])
    usage = nsqlookupd_usage()
    for flag in (
        "--tcp-address",
        "--inactive-producer-timeout",
        "--tombstone-lifetime",
        "--data-path",
    ):
        assert flag in usage
    assert "(default: 5m0s)" in usage and "(default: 45s)" in usage


def test_command_version_and_bad_flag() -> None:
    run = [sys.executable, "-m", "nsqx", "nsqlookupd"]
    done = subprocess.run([*run, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.startswith("nsqlookupd v1.3.0")
    done = subprocess.run([*run, "--bogus"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "flag provided but not defined: -bogus" in done.stderr


def test_command_refuses_an_unreadable_meta_file(tmp_path: Path) -> None:
    (tmp_path / "nsqlookupd.meta.json").write_text("{torn")
    cmd = [sys.executable, "-m", "nsqx", "nsqlookupd", f"--data-path={tmp_path}"]
    cmd += ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "not a valid nsqlookupd meta file" in done.stderr
