"""gnsq 1.0.2's NsqdHTTPClient against our nsqd's HTTP API (a client nobody here wrote)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).parent / "clients" / "gnsq_http_driver.py"


def test_gnsq_http_client(nsqd_factory: Any) -> None:
    nsqd = nsqd_factory("--http-address=127.0.0.1:0")
    proc = subprocess.run(
        [sys.executable, str(DRIVER), f"127.0.0.1:{nsqd.http_port}", "compat_gnsq_http"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr + "".join(nsqd.log)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ping"] == "OK"
    assert out["info"]["http_port"] == nsqd.http_port
    assert out["info"]["tcp_port"] == nsqd.tcp_port
    for call in ("publish", "publish_defer", "mpub_text", "mpub_binary"):
        assert out[call] == "OK", call
    for call in ("create_topic", "create_channel", "pause_channel", "unpause_channel"):
        assert out[call] == "", call  # NSQ 1.x answers actions with an empty body
    (topic,) = out["stats"]["topics"]
    assert topic["topic_name"] == "compat_gnsq_http"
    assert topic["message_count"] == 6
    (ch,) = topic["channels"]
    assert ch["paused"] is True
    assert ch["depth"] == 5 and ch["deferred_count"] == 1  # as NSQ counts a DPUB
    assert "[compat_gnsq_http]" in out["stats_text"]
    after = out["stats_after_empty"]["topics"][0]["channels"][0]
    assert after["depth"] == 0
    assert out["delete_again"] == "http error <404>"
