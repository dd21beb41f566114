"""NSQ 1.3 clients (pynsq 0.9.1, gnsq 1.0.2) and a draining nsqd (docs/drain.md).

The drain's notice is a CLOSE_WAIT response the client did not ask for: pynsq and gnsq
ignore it (gnsq signals it as a response). It must break nothing: no exception, no
error frame, no redelivery; the messages the client holds are finished on the draining
nsqd (which waits for them), and consumption from the other nsqd goes on. The driver
is clients/drain_driver.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lookupdproc import wait_until
from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run

DRIVER = Path(__file__).parent / "clients" / "drain_driver.py"


def publish(nsqd: NsqdProcess, topic: str, *bodies: bytes) -> None:
    async def body() -> None:
        r = await Raw.connect(nsqd.tcp_address)
        await r.publish(topic, *bodies)
        await r.close()

    run(body())


@pytest.mark.parametrize("client", ["pynsq", "gnsq"])
def test_drain_notice_breaks_no_nsq13_client(client: str, tmp_path: Path) -> None:
    a = start_nsqd(tmp_path / "a", "--drain-timeout=60s")
    b = start_nsqd(tmp_path / "b")
    topic = f"drain_{client}"
    work = tmp_path / "work"
    work.mkdir()
    publish(a, topic, b"a-0")
    publish(b, topic, *[b"b-%d" % i for i in range(5)])
    addr = [f"127.0.0.1:{n.tcp_port}" for n in (a, b)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), client, *addr, topic, str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_until(
            lambda: (work / "holding").exists() or proc.poll() is not None,
            timeout=30,
            what="the client to hold a's messages",
        )
        assert proc.poll() is None, proc.communicate()
        a.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: any("NSQ: draining" in line for line in a.log), what="the drain")
        (work / "finish").touch()
        assert a.proc.wait(30) == 0  # it waited for the client's FINs, not the deadline
        assert any("NSQ: drained: nothing in flight" in line for line in a.log), a.log
        publish(b, topic, b"b-late")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        b.stop(signal.SIGKILL)
    assert proc.returncode == 0, err
    s = json.loads(out.strip().splitlines()[-1])
    expected = {"a-0", "b-late"} | {f"b-{i}" for i in range(5)}
    assert set(s["deliveries"]) == expected, (s, err)
    assert all(attempts == [1] for attempts in s["deliveries"].values()), s
    # nothing went wrong while the client held messages and got the notice; what comes
    # after is the client noticing that A is gone (a reconnection that fails)
    assert s["early_errors"] == [], (s, err)
    assert not [e for e in s["errors"] if "E_" in e], s
