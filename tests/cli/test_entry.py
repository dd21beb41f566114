"""``nsqx`` as a first-time user types it: ``--version`` everywhere the Go daemons and
tools take it, and a closed pipe (``nsqx nsqd --help | head``) ends any command quietly,
never with a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from nsqx import NSQ_VERSION, __version__
from nsqx.cli.main import main

from toolproc import ENV

#: every command of ``nsqx``, as `nsqx --help` lists them, and the Go program it stands for
COMMANDS = {
    "nsqd": "nsqd",
    "nsqlookupd": "nsqlookupd",
    "nsqadmin": "nsqadmin",
    "up": "nsqx up",
    "tail": "nsq_tail",
    "pub": "to_nsq",
    "to-file": "nsq_to_file",
    "to-http": "nsq_to_http",
    "to-nsq": "nsq_to_nsq",
    "stat": "nsq_stat",
    "bench": "nsqx bench",
    "replicas": "nsqx replicas",
}

# Go's shape: `nsqd v1.3.0 (built w/go1.19.8)`; ours names Python and whether it is compiled
VERSION_LINE = rf"v{re.escape(NSQ_VERSION)} \(built w/python\d+\.\d+\.\d+; [^)]+\)\n"


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_usage_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "--help")
    assert rc == 0
    listed = set(re.findall(r"^  ([a-z-]+) ", out, re.M))
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("flag", ["--version", "-version", "version"])
def test_nsqx_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, flag)
    assert (rc, err) == (0, "")
    want = (
        rf"nsqx {re.escape(__version__)} \(NSQ v{re.escape(NSQ_VERSION)}; built w/python[^)]+\)\n"
    )
    assert re.fullmatch(want, out), out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_version(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, command, "--version")
    assert (rc, err) == (0, "")
    assert re.fullmatch(re.escape(COMMANDS[command]) + " " + VERSION_LINE, out), out


def closed_pipe_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``nsqx <args>`` with stdout a pipe whose reader is gone (as ``| head`` after its
    lines): every write to it fails with EPIPE, whenever it happens."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "nsqx", *args],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=ENV,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [("--help",), ("--version",), *((c, "--help") for c in COMMANDS), ("nsqd", "--version")],
    ids=lambda a: " ".join(a),
)
def test_a_closed_pipe_ends_quietly(args: tuple[str, ...]) -> None:
    done = closed_pipe_run(*args)
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_closed_pipe_stops_a_tool_quietly(
    nsqd_factory: Callable[..., object],
) -> None:
    """A tool whose output goes to a closed pipe (``nsqx tail ... | head -1`` once head
    has its line) stops at the first write, without a traceback or a repeated line."""
    node = nsqd_factory()
    address = f"127.0.0.1:{node.tcp_port}"  # type: ignore[attr-defined]
    pub = subprocess.run(
        [sys.executable, "-m", "nsqx", "pub", "--topic=t", f"--nsqd-tcp-address={address}"],
        input=b"one\ntwo\n",
        capture_output=True,
        env=ENV,
        timeout=60,
    )
    assert pub.returncode == 0, pub.stderr
    done = closed_pipe_run("tail", "--topic=t", f"--nsqd-tcp-address={address}")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
