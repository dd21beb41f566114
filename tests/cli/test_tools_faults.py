"""The tools when something goes wrong while they run, as an operator sees it: an nsqd
killed, stopped (``kill -STOP``) or not there, Ctrl-C and SIGTERM with stdout in a file,
progress over time. Real `nsqx <tool>` processes against real nsqd; the checks are on
what they print (its structure, never wall-clock numbers)."""

from __future__ import annotations

import http.server
import io
import json
import logging
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from nsqx.cli.toolbase import Progress, StatusEvery, ToolLog

from lookupdproc import http_request, wait_until
from nsqdproc import NsqdProcess
from toolproc import Running, nsqx, start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp(n: NsqdProcess) -> str:
    return f"127.0.0.1:{n.tcp_port}"


def message_count(n: NsqdProcess, topic: str) -> int:
    status, _, body = http_request(f"{n.http_url}/stats?format=json&topic={topic}")
    assert status == 200
    topics = json.loads(body)["topics"] or []
    return int(topics[0]["message_count"]) if topics else 0


@pytest.fixture
def two(nsqd_factory: Callable[..., NsqdProcess]) -> Iterator[tuple[NsqdProcess, NsqdProcess]]:
    a = nsqd_factory("--http-address=127.0.0.1:0")
    b = nsqd_factory("--http-address=127.0.0.1:0")
    yield a, b
    if b.alive():
        b.proc.send_signal(signal.SIGCONT)  # the factory's SIGKILL works either way


def noise(stderr: str) -> list[str]:
    """What a tool printed that shows a traceback or asyncio's complaints."""
    bad = ("Traceback", "never retrieved", "Task was destroyed", 'File "')
    return [line for line in stderr.splitlines() if any(b in line for b in bad)]


@contextmanager
def feeding(tool: Running, lines_per_tick: int = 100) -> Iterator[None]:
    """Write numbered lines to the tool's stdin (about 10,000 a second) until it exits
    or the block ends."""
    stop = threading.Event()

    def feed() -> None:
        assert tool.proc.stdin is not None
        i = 0
        try:
            while not stop.is_set() and tool.proc.poll() is None:
                tool.proc.stdin.write(b"".join(b"m%d\n" % (i + k) for k in range(lines_per_tick)))
                tool.proc.stdin.flush()
                i += lines_per_tick
                time.sleep(0.01)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the tool exited

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        with suppress(OSError):
            tool.proc.stdin.close()  # type: ignore[union-attr]


SUMMARY = re.compile(
    r"nsqx pub: published ([\d,]+) messages to (\S+) on (\d+) nsqd"
    r"(?: \(([\d,]+) on (\S+), ([\d,]+) on (\S+)\))?"
)
PROGRESS = re.compile(r"nsqx pub: ([\d,]+) published \(([\d,]+)/s\)(?:; (.*))?")


def number(text: str) -> int:
    return int(text.replace(",", ""))


def summary_counts(stderr: str, a: str, b: str) -> tuple[int, int, int]:
    """(published everywhere, acknowledged by a, acknowledged by b) from pub's summary."""
    found = [m for m in map(SUMMARY.fullmatch, stderr.splitlines()) if m]
    assert len(found) == 1, stderr
    m = found[0]
    if m.group(4) is None:
        n = number(m.group(1))
        return n, n, n
    per = {m.group(5): number(m.group(4)), m.group(7): number(m.group(6))}
    return number(m.group(1)), per[a], per[b]


# -- nsqx pub with one of two nsqd gone -------------------------------------------------------


def test_pub_with_a_killed_nsqd_stops_with_one_line_and_true_counts(
    two: tuple[NsqdProcess, NsqdProcess],
) -> None:
    a, b = two
    pub = start("pub", "--topic=t", f"--nsqd-tcp-address={tcp(a)}", f"--nsqd-tcp-address={tcp(b)}",
                "--progress-interval=0", stdin=subprocess.PIPE)  # fmt: skip
    with feeding(pub):
        wait_until(lambda: message_count(b, "t") >= 500, what="messages on both nsqd")
        b.stop(signal.SIGKILL)
        rc = pub.proc.wait(30)
    err = pub.stderr
    assert rc == 1, err
    assert not noise(err), err
    lines = err.strip().splitlines()
    # the summary, the reason, and at most a few of the client's one-line warnings
    assert len(lines) <= 5, err
    assert lines[-1].startswith(f"nsqx pub: lost the connection to nsqd at {tcp(b)}: "), err
    everywhere, on_a, on_b = summary_counts(err, tcp(a), tcp(b))
    assert on_a == message_count(a, "t")  # what a acknowledged is what a has
    assert everywhere == min(on_a, on_b) >= 500


def test_pub_names_each_nsqd_it_cannot_use(two: tuple[NsqdProcess, NsqdProcess]) -> None:
    a, b = two
    b.proc.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does), never answers
    nobody = f"127.0.0.1:{free_port()}"
    r = nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(a)}", f"--nsqd-tcp-address={tcp(b)}",
             f"--nsqd-tcp-address={nobody}", stdin=b"x\n", timeout=30)  # fmt: skip
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert err.count("\n") == 1 and not noise(err), err
    assert err.startswith("nsqx pub: cannot connect to nsqd at "), err
    assert f"{tcp(b)}: no answer within 5s" in err and f"{nobody}: Connection refused" in err
    assert tcp(a) not in err
    assert message_count(a, "t") == 0  # nothing published before the check failed


def test_pub_with_a_stopped_nsqd_shows_it_and_stops(two: tuple[NsqdProcess, NsqdProcess]) -> None:
    a, b = two
    pub = start("pub", "--topic=t", f"--nsqd-tcp-address={tcp(a)}", f"--nsqd-tcp-address={tcp(b)}",
                "--progress-interval=200ms", "--producer-opt=heartbeat_interval,1s",
                "--producer-opt=read_timeout,3s", stdin=subprocess.PIPE)  # fmt: skip
    with feeding(pub):
        wait_until(lambda: message_count(b, "t") >= 500, what="messages on both nsqd")
        b.proc.send_signal(signal.SIGSTOP)
        rc = pub.proc.wait(30)
    err = pub.stderr
    assert rc == 1, err
    assert not noise(err), err
    lines = err.strip().splitlines()
    assert lines[-1] == (
        f"nsqx pub: no answer from nsqd at {tcp(b)} for 3s (is it stopped or hung?)"
    ), err
    progress = [m for m in map(PROGRESS.fullmatch, lines) if m]
    assert len(lines) - len(progress) <= 5, err  # summary, reason, a few warnings
    everywhere, on_a, on_b = summary_counts(err, tcp(a), tcp(b))
    assert on_a == message_count(a, "t")
    # every progress line is true: per nsqd, what it acknowledged by then (never more
    # than in the end, never less than before), and the headline is what both did
    seen = {tcp(a): 0, tcp(b): 0}
    stalled = False
    for m in progress:
        per = dict(re.findall(r"(127\.0\.0\.1:\d+): ([\d,]+)", m.group(3) or ""))
        assert set(per) == set(seen), m.group(0)
        counts = {k: number(v) for k, v in per.items()}
        assert number(m.group(1)) == min(counts.values()), m.group(0)
        for k, v in counts.items():
            assert seen[k] <= v
            seen[k] = v
        stalled = stalled or f"{tcp(b)}: {counts[tcp(b)]:,} (no answer for" in m.group(0)
    assert seen[tcp(a)] <= on_a and seen[tcp(b)] <= on_b
    assert stalled, err  # the stopped nsqd was named while the tool waited for it
    assert everywhere == min(on_a, on_b)


# -- nsqx tail's summary with stdout in a file ------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tail_to_a_file_prints_its_summary_when_stopped(
    nsqd_factory: Callable[..., NsqdProcess], tmp_path: Path, sig: int
) -> None:
    n = nsqd_factory()
    assert (
        nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(n)}", stdin=b"1\n2\n3\n").returncode == 0
    )
    out = tmp_path / "tail.out"
    tail = start("tail", "--topic=t", f"--nsqd-tcp-address={tcp(n)}", stdout=out)
    wait_until(lambda: out.read_bytes() == b"1\n2\n3\n", what="the three messages in the file")
    assert tail.stop(sig=sig) == 0
    err = tail.stderr
    assert re.search(r"^nsqx tail: 3 messages in [\d.]+s$", err, re.M), err
    assert err.strip().splitlines()[-1].startswith("nsqx tail: 3 messages in"), err
    assert not noise(err), err


def test_tail_with_n_to_a_file_prints_its_summary(
    nsqd_factory: Callable[..., NsqdProcess],
) -> None:
    n = nsqd_factory()
    assert nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(n)}", stdin=b"1\n2\n").returncode == 0
    r = nsqx("tail", "--topic=t", f"--nsqd-tcp-address={tcp(n)}", "--n=2")
    assert r.returncode == 0 and r.stdout == b"1\n2\n"
    assert re.search(r"^nsqx tail: 2 messages in [\d.]+s$", r.stderr.decode(), re.M)


# -- nsqx to-nsq: progress by time, Go's status lines, a destination that goes away -----------

STATUS = re.compile(
    r"nsqx to-nsq: \[aggregate\]: finished 250 - 99th: [\d.]+ms - 95th: [\d.]+ms - avg: [\d.]+ms"
)
RELAYED = re.compile(r"nsqx to-nsq: ([\d,]+) relayed \(([\d,]+)/s\)")


def test_to_nsq_progress_is_by_time_and_status_lines_are_gos(
    two: tuple[NsqdProcess, NsqdProcess],
) -> None:
    src, dst = two
    lines = b"".join(b"m%d\n" % i for i in range(1000))
    assert nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(src)}", stdin=lines).returncode == 0
    interval = 0.2
    tool = start("to-nsq", "--topic=t", f"--nsqd-tcp-address={tcp(src)}",
                 f"--destination-nsqd-tcp-address={tcp(dst)}", "--progress-interval=200ms")  # fmt: skip
    try:
        wait_until(lambda: message_count(dst, "t") == 1000, what="all relayed")
        # two more progress lines once everything is relayed
        wait_until(
            lambda: len(re.findall(r"^nsqx to-nsq: 1,000 relayed", tool.stderr, re.M)) >= 2,
            what="progress lines after the relay",
        )
    finally:
        assert tool.stop() == 0
    err = tool.stderr
    assert not noise(err), err
    lines_ = err.strip().splitlines()
    # --status-every=250 (the default): Go's latency line after each 250, nothing else
    assert sum(1 for line in lines_ if STATUS.fullmatch(line)) == 4, err
    progress = [m for m in map(RELAYED.fullmatch, lines_) if m]
    assert progress, err
    previous = 0
    for m in progress:
        count, rate = number(m.group(1)), number(m.group(2))
        assert count >= previous, err  # counts only grow
        # the rate is over a window of at least one interval, never over a burst
        assert rate <= (count - previous) / (interval * 0.95) + 1, err
        previous = count
    assert re.search(r"^nsqx to-nsq: relayed 1,000 messages in [\d.]+s$", err, re.M), err


def test_to_nsq_with_a_dead_destination_says_so_in_a_few_lines(
    two: tuple[NsqdProcess, NsqdProcess],
) -> None:
    src, dst = two
    tool = start("to-nsq", "--topic=t", f"--nsqd-tcp-address={tcp(src)}",
                 f"--destination-nsqd-tcp-address={tcp(dst)}", "--progress-interval=0",
                 "--consumer-opt=max_backoff_duration,0")  # fmt: skip
    try:
        wait_until(lambda: _subscribed(src), what="to-nsq subscribed")
        dst.stop(signal.SIGKILL)
        lines = b"".join(b"m%d\n" % i for i in range(300))
        assert (
            nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(src)}", stdin=lines).returncode == 0
        )
        wait_until(lambda: "handler failed on message" in tool.stderr, what="the failure said")
        # the messages come back (requeued) and fail again, many times over
        wait_until(lambda: _requeued(src) >= 300, what="300 requeues", timeout=30)
    finally:
        assert tool.stop() == 0
    err = tool.stderr
    assert not noise(err), err
    failed = [line for line in err.splitlines() if "handler failed on message" in line]
    # once, then the repeats counted (in the next line, or the last one at exit)
    assert 1 <= len(failed) <= 3, err
    assert any(re.search(r"\((and )?[\d,]+ (more like it|times)", line) for line in failed), err
    assert len(err.splitlines()) <= 12, err


def _channels(n: NsqdProcess) -> list[dict[str, Any]]:
    _, _, body = http_request(f"{n.http_url}/stats?format=json&topic=t")
    topics = json.loads(body)["topics"] or []
    return list(topics[0]["channels"] or []) if topics else []


def _subscribed(n: NsqdProcess) -> bool:
    return any(c["channel_name"] == "nsq_to_nsq" and c["clients"] for c in _channels(n))


def _requeued(n: NsqdProcess) -> int:
    return sum(int(c["requeue_count"]) for c in _channels(n))


def test_to_http_with_a_failing_endpoint_says_so_in_a_few_lines(
    nsqd_factory: Callable[..., NsqdProcess],
) -> None:
    n = nsqd_factory()
    hits: list[int] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hits.append(1)
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lines = b"".join(b"m%d\n" % i for i in range(20))
    assert nsqx("pub", "--topic=t", f"--nsqd-tcp-address={tcp(n)}", stdin=lines).returncode == 0
    tool = start("to-http", "--topic=t", f"--nsqd-tcp-address={tcp(n)}",
                 f"--post=http://127.0.0.1:{server.server_address[1]}/", "--progress-interval=0",
                 "--n=4", "--max-in-flight=4", "--consumer-opt=max_attempts,0",
                 "--consumer-opt=max_backoff_duration,0", "--consumer-opt=default_requeue_delay,0")  # fmt: skip
    try:
        # every message fails, is requeued and fails again
        wait_until(lambda: len(hits) >= 100, what="100 failed requests", timeout=30)
    finally:
        assert tool.stop() == 0
        server.shutdown()
        server.server_close()
    err = tool.stderr
    assert not noise(err), err
    failed = [line for line in err.splitlines() if "got status code 500" in line]
    assert 1 <= len(failed) <= 3, err
    assert failed[0].startswith("nsqx to-http: handler failed on message "), err
    assert len(err.splitlines()) <= 6, err


# -- the pieces, in this process --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_rate_is_over_the_time_since_the_last_line() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("nsqx x", "things", 5.0, stream=out, clock=clock, detail=lambda: "")
    p.add(100)
    clock.now += 5
    p.report()
    p.add(1)
    clock.now += 5
    p.report()
    assert out.getvalue().splitlines() == [
        "nsqx x: 100 things (20/s)",
        "nsqx x: 101 things (0/s)",
    ]


def test_tool_log_is_one_line_each_and_holds_back_repeats(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    tool_log = ToolLog("nsqx x", window=10.0, clock=clock)
    tool_log.install()
    log = logging.getLogger("nsqx.client")
    try:
        for i in range(50):
            try:
                raise RuntimeError(f"no\nway {i % 2}")
            except RuntimeError:
                log.exception("handler failed on message %016x", i)
        log.info("not shown")
        clock.now += 11
        log.warning("handler failed on message %016x: %s", 99, "again")
    finally:
        tool_log.uninstall()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == "nsqx x: handler failed on message 0000000000000000: RuntimeError: no way 0"
    assert lines[1] == "nsqx x: handler failed on message 0000000000000001: RuntimeError: no way 1"
    assert lines[2] == ("nsqx x: handler failed on message 0000000000000063: again")
    # the held back repeats, once each, with their count
    assert sorted(lines[3:]) == [
        "nsqx x: handler failed on message 0000000000000030: RuntimeError: no way 0 "
        "(24 times in the last 11s)",
        "nsqx x: handler failed on message 0000000000000031: RuntimeError: no way 1 "
        "(24 times in the last 11s)",
    ]
    assert logging.getLogger("nsqx").propagate


def test_status_every_is_gos_latency_line() -> None:
    out = io.StringIO()
    s = StatusEvery("nsqx x", "[aggregate]", 4, stream=out)
    for ms in (1, 2, 3):
        s.record(ms / 1000)
    assert out.getvalue() == ""
    s.record(0.010)
    assert out.getvalue() == (
        "nsqx x: [aggregate]: finished 4 - 99th: 10.00ms - 95th: 10.00ms - avg: 4.00ms\n"
    )
