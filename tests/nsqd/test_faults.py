"""What nsqd survives: a full disk, a data directory that refuses new files, the clock
jumping, nsqlookupd going away and coming back, damaged segments at start.

The disk-full and read-only cases need root (a size-limited tmpfs mount, an nsqd run as
another user); they skip otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeclock import JumpingClock
from nsqx.wire import FRAME_ERROR, FRAME_MESSAGE, decode_message
from nsqx.wire import commands as c

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run, wait_for
from rawnsq import start_nsqd as start_inproc


def _http(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: a disk that fills up."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path, leave: int) -> None:
    """Fill the filesystem of ``path`` but ``leave`` bytes (a file named filler)."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with open(path / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


async def _publish_until_refused(
    nsqd: NsqdProcess, topic: str, acked: list[bytes], start: int
) -> tuple[int, bytes]:
    """MPUB batches of 50 x 1 KiB until nsqd refuses one; returns (next index, error)."""
    pub = await Raw.connect(nsqd.tcp_address)
    i = start
    while True:
        batch = [b"%08d" % (i + k) + b"x" * 1016 for k in range(50)]
        pub.send(c.mpub(topic, batch))
        ftype, data = await pub.frame()
        if ftype == FRAME_ERROR:
            assert await pub.closed(), "E_MPUB_FAILED is fatal: nsqd closes the connection"
            return i + 50, data
        assert data == b"OK"
        acked += batch
        i += 50


async def _consume_all(nsqd: NsqdProcess, topic: str, n: int) -> list[bytes]:
    sub = await Raw.connect(nsqd.tcp_address)
    await sub.subscribe(topic, "c", rdy=200)
    got: list[bytes] = []
    while len(got) < n:
        ftype, data = await sub.frame()
        assert ftype == FRAME_MESSAGE, data
        m = decode_message(data)
        got.append(m.body)
        sub.send(c.fin(m.id))
    assert await sub.nothing_for(0.3)
    await sub.close()
    return got


def test_disk_full(small_disk: Path) -> None:
    """The disk fills up: publishes get E_MPUB_FAILED (HTTP 500), /ping says NOK, nothing
    acknowledged is lost; once space is back, publishing resumes by itself."""
    nsqd = start_nsqd(
        small_disk / "data",
        "--http-address=127.0.0.1:0",
        "--max-bytes-per-file=262144",
        "--mem-queue-size=100",
    )

    async def body() -> None:
        acked: list[bytes] = []
        setup = await Raw.connect(nsqd.tcp_address)
        await setup.subscribe("t", "c")  # the channel exists: messages wait for it
        await setup.close()
        _fill(small_disk, leave=600_000)
        nxt, err = await _publish_until_refused(nsqd, "t", acked, 0)
        assert err.startswith(b"E_MPUB_FAILED MPUB failed"), err
        assert b"No space left" in err or b"disk full" in err, err
        assert len(acked) >= 300
        status, text = _http(nsqd.http_url + "/ping")
        assert status == 500 and text.startswith(b"NOK - failed to write to topic t"), text
        status, text = _http(nsqd.http_url + "/pub?topic=t", b"r" * 200_000)
        assert status == 500 and b"PUB_FAILED" in text, text
        # what was acknowledged before is all there (read while the disk is still full)
        got = await _consume_all(nsqd, "t", len(acked))
        assert got == acked
        # space comes back: nothing to do but publish
        (small_disk / "filler").unlink()
        after: list[bytes] = []
        pub = await Raw.connect(nsqd.tcp_address)
        for k in range(10):
            body_ = b"after-%d" % k
            pub.send(c.pub("t", body_))
            assert await pub.response() == b"OK"
            after.append(body_)
        status, text = _http(nsqd.http_url + "/ping")
        assert (status, text) == (200, b"OK")
        assert await _consume_all(nsqd, "t", len(after)) == after
        assert nxt > 0

    try:
        run(body())
        # and a restart finds everything in order (nothing half-written stays behind)
        assert nsqd.stop() == 0
        assert not any("Traceback" in line for line in nsqd.log), "".join(nsqd.log)
        again = start_nsqd(small_disk / "data", "--http-address=127.0.0.1:0")
        try:
            _, text = _http(again.http_url + "/stats?format=json&topic=t")
            ch = json.loads(text)["topics"][0]["channels"][0]
            assert ch["depth"] == 0 and ch["in_flight_count"] == 0
        finally:
            again.stop()
    finally:
        nsqd.stop(signal.SIGKILL)


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """``chattr -R +i`` a directory: every write is refused (EPERM), even through files
    already open, even for root: a data directory gone read-only under nsqd."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    frozen: list[Path] = []
    yield frozen
    for path in frozen:
        subprocess.run(["chattr", "-R", "-i", str(path)], check=False)


def _chattr(flag: str, path: Path) -> None:
    proc = subprocess.run(["chattr", "-R", flag, str(path)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"chattr {flag} is not supported here: {proc.stderr.decode().strip()}")


def test_read_only_data_directory(tmp_path: Path, immutable: list[Path]) -> None:
    """The data directory refuses every write (as a filesystem remounted read-only
    after an error): publishes get E_PUB_FAILED, /ping says NOK, consumers go on with
    what was acknowledged; once writable again, publishing resumes by itself and a
    restart finds everything."""
    data = tmp_path / "data"
    nsqd = start_nsqd(data, "--http-address=127.0.0.1:0", "--sync-timeout=200ms")

    async def body() -> None:
        setup = await Raw.connect(nsqd.tcp_address)
        await setup.subscribe("t", "c")
        await setup.close()
        pub = await Raw.connect(nsqd.tcp_address)
        acked = [b"before-%d" % i for i in range(20)]
        await pub.publish("t", *acked)
        immutable.append(data)
        _chattr("+i", data)
        pub.send(c.pub("t", b"refused"))
        err = await pub.error()
        assert err.startswith(b"E_PUB_FAILED PUB failed"), err
        assert await pub.closed()
        status, text = _http(nsqd.http_url + "/ping")
        assert status == 500 and text.startswith(b"NOK - "), text
        status, text = _http(nsqd.http_url + "/pub?topic=t", b"refused too")
        assert status == 500 and b"PUB_FAILED" in text, text
        # a new topic cannot be made either: a clear error, not a dropped connection
        other = await Raw.connect(nsqd.tcp_address)
        other.send(c.pub("new_topic", b"x"))
        assert (await other.error()).startswith(b"E_PUB_FAILED"), "new topic"
        # consumers go on (their cursors are written once the directory is writable)
        assert await _consume_all(nsqd, "t", len(acked)) == acked
        _chattr("-i", data)
        immutable.remove(data)
        pub = await Raw.connect(nsqd.tcp_address)
        await pub.publish("t", b"after")
        status, text = _http(nsqd.http_url + "/ping")
        assert (status, text) == (200, b"OK")
        assert await _consume_all(nsqd, "t", 1) == [b"after"]

    try:
        run(body())
        assert nsqd.stop() == 0
        assert not any("Traceback" in line for line in nsqd.log), "".join(nsqd.log)
        again = start_nsqd(data, "--http-address=127.0.0.1:0")
        try:
            _, text = _http(again.http_url + "/stats?format=json&topic=t")
            ch = json.loads(text)["topics"][0]["channels"][0]
            # everything was finished before the stop: nothing comes again
            assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)
        finally:
            again.stop()
    finally:
        nsqd.stop(signal.SIGKILL)


def test_the_wall_clock_jumping_changes_no_deadline(tmp_path: Path) -> None:
    """The wall clock is set back an hour, then forward two: REQ delays, DPUB delays and
    message timeouts still count real time (nsqd measures them on the monotonic clock);
    a deferred message waits its real remaining time across a restart too."""

    async def body() -> None:
        with JumpingClock() as clk:
            nsqd = await start_inproc(data_path=str(tmp_path))
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "c", rdy=5, msg_timeout=1000)
            pub = await Raw.connect(nsqd)
            await pub.publish("t", b"a")
            m = await sub.message()
            sub.send(c.req(m.id, 300))
            pub.send(c.dpub("t", 300, b"d"))
            assert await pub.response() == b"OK"
            clk.jump_wall(-3600)  # while both wait
            again = await sub.message(timeout=5)  # not an hour later
            assert (again.id, again.attempts) == (m.id, 2)
            assert (await sub.message(timeout=5)).body == b"d"
            # no FIN: the 1 s timeout redelivers both, in real time
            both = await sub.messages(2, timeout=5)
            assert sorted((x.body, x.attempts) for x in both) == [(b"a", 3), (b"d", 2)]
            for x in both:
                sub.send(c.fin(x.id))
            pub.send(c.dpub("t", 1500, b"later"))
            assert await pub.response() == b"OK"
            clk.jump_wall(+7200)
            assert await sub.nothing_for(0.5)  # not released by the jump
            await sub.close()
            await pub.close()
            await nsqd.close()
            # the deferred message keeps its real remaining time across a restart
            nsqd = await start_inproc(data_path=str(tmp_path))
            sub = await Raw.connect(nsqd)
            await sub.subscribe("t", "c", rdy=5)
            later = await sub.message(timeout=5)
            assert later.body == b"later"
            await nsqd.close()

    run(body())


def test_nsqlookupd_down_and_back(tmp_path: Path) -> None:
    """nsqlookupd is killed and started again on its port: nsqd re-registers its topics
    and channels by itself, and a consumer that found nsqd through nsqlookupd keeps its
    one connection and its messages all along."""
    from nsqx.client import Consumer

    from lookupdproc import start_lookupd, wait_until

    lookupd = start_lookupd()
    tcp, http = lookupd.tcp_port, lookupd.http_port
    nsqd = start_nsqd(
        tmp_path, f"--lookupd-tcp-address=127.0.0.1:{tcp}", "--broadcast-address=127.0.0.1"
    )

    def registered(channels: list[str]) -> bool:
        try:
            doc = lookupd.json("/lookup?topic=t")
        except (AssertionError, OSError):
            return False
        return bool(doc.get("producers")) and doc.get("channels") == channels

    failed_polls: list[str] = []

    class Polls(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "query for 't' failed" in record.getMessage():
                failed_polls.append(record.getMessage())

    async def body() -> None:
        nonlocal lookupd
        got: list[bytes] = []
        consumer = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            lookupd_http_addresses=[f"127.0.0.1:{http}"],
            lookupd_poll_interval=0.2,
        )
        pub = await Raw.connect(nsqd.tcp_address)
        await pub.publish("t", b"first")
        await asyncio.get_running_loop().run_in_executor(None, wait_until, lambda: registered([]))
        await consumer.start()
        await wait_for(lambda: got == [b"first"], what="the first message")
        conns = list(consumer.connections)
        lookupd.stop(signal.SIGKILL)
        for i in range(5):  # polls fail meanwhile; messages keep flowing
            await pub.publish("t", b"during-%d" % i)
        await wait_for(lambda: len(got) == 6, what="messages during the outage")
        # a few polls of the dead nsqlookupd fail: the connection stays
        await wait_for(lambda: len(failed_polls) >= 3, what="failed lookupd polls")
        assert list(consumer.connections) == conns
        lookupd = start_lookupd(
            f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"
        )
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_until(lambda: registered(["c"]), timeout=30, what="re-registration")
        )
        await pub.publish("t", b"after")
        await wait_for(lambda: len(got) == 7, what="the message after")
        assert got == [b"first", *(b"during-%d" % i for i in range(5)), b"after"]
        assert list(consumer.connections) == conns
        await consumer.close()
        await pub.close()

    handler = Polls()
    client_log = logging.getLogger("nsqx.client")
    level = client_log.level
    client_log.setLevel(logging.WARNING)
    client_log.addHandler(handler)
    try:
        run(body())
    finally:
        client_log.removeHandler(handler)
        client_log.setLevel(level)
        nsqd.stop(signal.SIGKILL)
        lookupd.stop(signal.SIGKILL)


def test_damaged_segments_at_start(tmp_path: Path) -> None:
    """nsqd is killed; then its newest segment loses its tail (a power loss) and a
    sealed one gets a flipped byte. The restart sets the damage aside (logged, .bad
    files), serves every other message (the two batches hit are lost, no more), and
    never gives an id seen before the crash to another message."""
    nsqd = start_nsqd(tmp_path, "--max-bytes-per-file=4096", "--mem-queue-size=10")
    seen: dict[bytes, bytes] = {}

    async def before() -> None:
        sub = await Raw.connect(nsqd.tcp_address)
        await sub.subscribe("t", "c", rdy=500)
        pub = await Raw.connect(nsqd.tcp_address)
        for i in range(0, 300, 10):
            pub.send(c.mpub("t", [b"msg-%04d" % k + b"." * 40 for k in range(i, i + 10)]))
            assert await pub.response() == b"OK"
        for m in await sub.messages(300):  # seen, not finished
            seen[m.id] = m.body

    run(before())
    nsqd.stop(signal.SIGKILL)
    part = tmp_path / "t.topic" / "p0"
    segs = sorted(part.glob("*.seg"))
    assert len(segs) >= 4
    newest, sealed = segs[-1], segs[1]
    newest.write_bytes(newest.read_bytes()[:-25])
    data = bytearray(sealed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sealed.write_bytes(bytes(data))

    nsqd = start_nsqd(tmp_path, "--max-bytes-per-file=4096", "--mem-queue-size=10")

    async def after() -> None:
        sub = await Raw.connect(nsqd.tcp_address)
        await sub.subscribe("t", "c", rdy=500)
        pub = await Raw.connect(nsqd.tcp_address)
        await pub.publish("t", *(b"new-%d" % k for k in range(5)))
        got: dict[bytes, bytes] = {}
        while not await sub.nothing_for(0.5):
            for ftype, payload in sub.frames:
                assert ftype == FRAME_MESSAGE
                m = decode_message(payload)
                assert m.id not in got, "an id twice"
                got[m.id] = m.body
                sub.send(c.fin(m.id))
            sub.frames.clear()
        old = {i: b for i, b in got.items() if not b.startswith(b"new-")}
        new = {i: b for i, b in got.items() if b.startswith(b"new-")}
        assert len(new) == 5 and not set(new) & set(seen), "an id reused"
        assert all(seen[i] == b for i, b in old.items()), "a message under another's id"
        lost = len(seen) - len(old)
        assert 0 < lost <= 20, lost  # the two MPUBs of 10 that were hit, no more

    try:
        run(after())
        log = "".join(nsqd.log)
        assert "setting aside" in log and "are skipped" in log, log
        assert list(part.glob("*.bad"))
    finally:
        nsqd.stop(signal.SIGKILL)
