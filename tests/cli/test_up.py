"""`nsqx up` with free ports: it starts, prints the addresses (the admin's too), nsqd is
registered with the lookupd, the printed tool examples do what they say pasted in the
order printed (into a shell without the venv on its PATH, as after `make up`; those
that run until Ctrl-C say so), and SIGINT stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookupdproc import http_request, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_up_starts_prints_and_stops_on_sigint(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # a shell as after `make up`: the venv's bin is not on the PATH
    venv_bin = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    shell_env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    shell_env["PATH"] = os.pathsep.join(path)
    cmd = [sys.executable, "-m", "nsqx", "up", f"--data-dir={data}"]
    cmd += ["--nsqd-tcp-port=0", "--nsqd-http-port=0"]
    cmd += ["--lookupd-tcp-port=0", "--lookupd-http-port=0", "--admin-http-port=0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,  # as make up runs it
        env=dict(shell_env, PYTHONUNBUFFERED="1"),
    )
    out: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        out.extend(proc.stdout)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("lookup:" in line for line in out), what="the banner")
        text = "".join(out)
        lookupd_http = re.search(r"nsqlookupd HTTP +http://(127\.0\.0\.1:\d+)", text)
        nsqd_tcp = re.search(r"nsqd TCP +(127\.0\.0\.1:(\d+))", text)
        nsqd_http = re.search(r"nsqd HTTP +http://(127\.0\.0\.1:\d+)", text)
        assert lookupd_http and nsqd_tcp and nsqd_http, text
        assert re.search(r"nsqlookupd TCP +127\.0\.0\.1:\d+", text), text
        assert str(data) in text
        admin = re.search(r"nsqadmin +http://(127\.0\.0\.1:\d+)/", text)
        assert admin, text
        assert http_request(f"http://{admin.group(1)}/ping")[2] == b"OK"
        # every example runs as printed, pasted into a shell whose PATH does not have
        # the venv (make up does not activate it), from where nsqx up ran
        examples = dict(re.findall(r"^  (\w+): +(.*)$", text, re.M))
        assert set(examples) >= {"publish", "tail", "stats", "archive", "http", "lookup"}
        assert "source .venv/bin/activate" in text, text
        assert f"--nsqd-tcp-address={nsqd_tcp.group(1)}" in examples["publish"]

        def sh(line: str, **kw: Any) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["bash", "-c", line], cwd=REPO, env=shell_env, text=True, timeout=60, **kw
            )

        assert sh("command -v nsqx", capture_output=True).returncode != 0  # not on PATH
        assert examples["publish"].startswith("echo hello | .venv/bin/nsqx pub ")
        # pasted in the order printed, each line does what it says; those that run until
        # Ctrl-C say so, and are stopped with it once they did
        for name in ("tail", "stats", "archive"):
            _, _, comment = examples[name].partition("  # ")  # (a shell comment: pasteable)
            assert "runs until Ctrl-C" in comment, examples[name]
        sh(examples["publish"], check=True)

        def until_ctrl_c(line: str, done: Callable[[list[str]], bool], what: str) -> None:
            running = subprocess.Popen(
                ["bash", "-c", "exec " + line],
                cwd=REPO,
                env=shell_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            lines: list[str] = []
            threading.Thread(target=lambda: lines.extend(running.stdout or ()), daemon=True).start()
            try:
                wait_until(lambda: done(lines), timeout=30, what=what)
                running.send_signal(signal.SIGINT)
                assert running.wait(30) == 0
            finally:
                if running.poll() is None:
                    running.kill()
                    running.wait()

        until_ctrl_c(examples["tail"], lambda out: out == ["hello\n"], "the tail's hello")
        # stat reads the channel the tail read (a named one, still there)
        until_ctrl_c(examples["stats"], lambda out: len(out) >= 3, "a row of stats")
        # the archive goes under the cluster's data, not into the current directory, and
        # has the hello published before it started (its channel was there already)
        archive = data / "archive"
        assert f"--output-dir={archive}" in examples["archive"]

        def archived() -> bytes:
            return b"".join(f.read_bytes() for f in archive.glob("**/*") if f.is_file())

        until_ctrl_c(examples["archive"], lambda _: archived() == b"hello\n", "the archive")
        sh(examples["http"], check=True, capture_output=True)
        command = examples["tail"].split("  # ")[0]  # (without its comment)
        shown = sh(command + " --n=1", check=True, capture_output=True)
        assert shown.stdout == "world\n"
        assert '"producers"' in sh(examples["lookup"], check=True, capture_output=True).stdout

        def nodes() -> list[dict[str, object]]:
            status, _, body = http_request(f"http://{lookupd_http.group(1)}/nodes")
            return json.loads(body)["producers"] if status == 200 else []  # type: ignore[no-any-return]

        (node,) = wait_until(nodes, what="nsqd registered with the lookupd")
        status, _, body = http_request(f"http://{admin.group(1)}/api/nodes")
        assert status == 200 and json.loads(body)["nodes"][0]["health"] == "OK"
        assert node["tcp_port"] == int(nsqd_tcp.group(2))
        assert node["broadcast_address"] == "127.0.0.1"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        reader.join(5)
        assert proc.stderr is not None
        assert "stopped" in proc.stderr.read()
        assert (data / "nsqd" / "nsqd.dat").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
