"""`nsqx up` with free ports: it starts, prints the addresses (the admin's too), nsqd is
registered with the lookupd, the printed tool examples work as printed, and SIGINT stops
it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from lookupdproc import http_request, wait_until


def test_up_starts_prints_and_stops_on_sigint(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "nsqx", "up", f"--data-dir={data}"]
    cmd += ["--nsqd-tcp-port=0", "--nsqd-http-port=0"]
    cmd += ["--lookupd-tcp-port=0", "--lookupd-http-port=0", "--admin-http-port=0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
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
        assert lookupd_http and nsqd_tcp, text
        assert re.search(r"nsqlookupd TCP +127\.0\.0\.1:\d+", text), text
        assert str(data) in text
        admin = re.search(r"nsqadmin +http://(127\.0\.0\.1:\d+)/", text)
        assert admin, text
        assert http_request(f"http://{admin.group(1)}/ping")[2] == b"OK"
        publish = re.search(r"publish: +(echo hello \| nsqx pub .*)", text)
        tail = re.search(r"tail: +(nsqx tail .*)", text)
        assert publish and tail, text
        assert f"--nsqd-tcp-address={nsqd_tcp.group(1)}" in publish.group(1)
        # the examples work as printed (nsqx run as this interpreter's module)
        nsqx = f"{sys.executable} -m nsqx"
        subprocess.run(publish.group(1).replace("nsqx", nsqx), shell=True, check=True, timeout=60)
        shown = subprocess.run(
            tail.group(1).replace("nsqx", nsqx) + " --n=1 --channel=example",
            shell=True,
            check=True,
            timeout=60,
            capture_output=True,
        )
        assert shown.stdout == b"hello\n"

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
