"""The command-line tools as operators use them: real `nsqx <tool>` processes against real
nsqd processes on free loopback ports, checked by what they print, write and send."""

from __future__ import annotations

import gzip
import http.server
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqx.cli.main import main

from lookupdproc import http_request, wait_until
from nsqdproc import NsqdProcess
from toolproc import nsqx, start

TOOLS = ["tail", "pub", "to-file", "to-http", "to-nsq", "stat", "bench", "replicas"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(nsqd_factory: Callable[..., NsqdProcess]) -> NsqdProcess:
    return nsqd_factory("--http-address=127.0.0.1:0")


def tcp(n: NsqdProcess) -> str:
    return f"127.0.0.1:{n.tcp_port}"


def http_addr(n: NsqdProcess) -> str:
    return f"127.0.0.1:{n.http_port}"


def stats(n: NsqdProcess, topic: str) -> dict[str, Any]:
    status, _, body = http_request(f"{n.http_url}/stats?format=json&topic={topic}")
    assert status == 200
    topics = json.loads(body)["topics"] or []
    return topics[0] if topics else {}


def channel_stats(n: NsqdProcess, topic: str, channel: str) -> dict[str, Any]:
    for ch in stats(n, topic).get("channels") or []:
        if ch["channel_name"] == channel:
            return ch  # type: ignore[no-any-return]
    return {}


# -- help, flags and bad input (no server needed) -------------------------------------------
# These call nsqx's main in this process (the same code as the command, without paying
# an interpreter start per case); the real processes below show the rest.


class Result:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.returncode, self.out, self.err = rc, out, err


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    def call(*args: str) -> Result:
        rc = main(list(args))
        out, err = capsys.readouterr()
        return Result(rc, out, err)

    return call


@pytest.mark.parametrize("tool", TOOLS)
def test_help_has_flags_and_examples(tool: str, run: Callable[..., Result]) -> None:
    r = run(tool, "--help")
    assert r.returncode == 0
    text = r.out
    assert f"Usage: nsqx {tool}" in text and "Examples:" in text
    assert f"nsqx {tool} --" in text  # examples are runnable command lines


@pytest.mark.parametrize("tool", TOOLS)
def test_bad_flag_is_one_line_and_exit_2(tool: str, run: Callable[..., Result]) -> None:
    r = run(tool, "--no-such-flag=1")
    assert r.returncode == 2
    err = r.err
    assert err.count("\n") == 1 and "flag provided but not defined: -no-such-flag" in err


UNREACHABLE = {
    "tail": ["--topic=t", "--nsqd-tcp-address=127.0.0.1:{port}"],
    "pub": ["--topic=t", "--nsqd-tcp-address=127.0.0.1:{port}"],
    "to-file": ["--topic=t", "--nsqd-tcp-address=127.0.0.1:{port}", "--output-dir={tmp}"],
    "to-http": ["--topic=t", "--nsqd-tcp-address=127.0.0.1:{port}", "--post=http://127.0.0.1:1/"],
    "to-nsq": ["--topic=t", "--nsqd-tcp-address=127.0.0.1:{port}",
               "--destination-nsqd-tcp-address=127.0.0.1:{port}"],
    "stat": ["--topic=t", "--channel=c", "--nsqd-http-address=127.0.0.1:{port}"],
    "bench": ["--nsqd-tcp-address=127.0.0.1:{port}", "--runfor=1s"],
    "replicas": ["--topic=t", "--lookupd-http-address=127.0.0.1:{port}"],
}  # fmt: skip


@pytest.mark.parametrize("tool", TOOLS)
def test_unreachable_server_is_one_line_and_exit_1(
    tool: str, tmp_path: Path, run: Callable[..., Result]
) -> None:
    port = free_port()  # nothing listens there
    args = [a.format(port=port, tmp=tmp_path) for a in UNREACHABLE[tool]]
    r = run(tool, *args)
    assert r.returncode == 1, r.err
    err = r.err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"nsqx {tool}: ") and str(port) in last, err


@pytest.mark.parametrize("tool", TOOLS)
def test_bad_topic_name_is_refused(tool: str, tmp_path: Path, run: Callable[..., Result]) -> None:
    args = [a.format(port=1, tmp=tmp_path) for a in UNREACHABLE[tool]]
    args = [a for a in args if not a.startswith("--topic=")] + ["--topic=no<good>"]
    r = run(tool, *args)
    assert r.returncode == 1
    err = r.err
    assert "Traceback" not in err and "'no<good>' is not a valid topic name" in err


def test_consumer_opt_errors_are_clear(run: Callable[..., Result]) -> None:
    r = run("tail", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=bogus,1")
    assert r.returncode == 1 and "--consumer-opt: unknown option 'bogus'" in r.err
    r = run("tail", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=max_in_flight,x")
    assert r.returncode == 1 and "max_in_flight" in r.err


def test_a_real_process_fails_the_same_way() -> None:
    r = nsqx("tail", "--topic=t", f"--nsqd-tcp-address=127.0.0.1:{free_port()}")
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1
    assert "cannot connect to nsqd" in r.stderr.decode()
    assert nsqx("pub", "--bad").returncode == 2


def test_tools_need_a_source(run: Callable[..., Result]) -> None:
    r = run("tail", "--topic=t")
    assert r.returncode == 1
    assert r.err.strip() == ("nsqx tail: --nsqd-tcp-address or --lookupd-http-address required")


# -- pub and tail ---------------------------------------------------------------------------


def test_pub_then_tail(node: NsqdProcess) -> None:
    r = nsqx("pub", "--topic=lines", f"--nsqd-tcp-address={tcp(node)}", stdin=b"one\n\ntwo\nthree")
    assert r.returncode == 0, r.stderr
    # the empty line is skipped; the last line keeps its last byte without a newline
    assert "published 3 messages to lines" in r.stderr.decode()
    r = nsqx("tail", "--topic=lines", f"--nsqd-tcp-address={tcp(node)}", "--n=3")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"one\ntwo\nthree\n"


def test_pub_file_delimiter_and_print_topic(node: NsqdProcess, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(b"a,b,c,")
    r = nsqx(
        "pub", "--topic=t1", "--delimiter=,", f"--file={src}", f"--nsqd-tcp-address={tcp(node)}"
    )
    assert r.returncode == 0, r.stderr
    r = nsqx("pub", "--topic=t2", f"--nsqd-tcp-address={tcp(node)}", stdin=b"z\n")
    assert r.returncode == 0
    r = nsqx(
        "tail", "--topic=t1", "--topic=t2", "--print-topic", "--n=4",
        f"--nsqd-tcp-address={tcp(node)}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [b"t1 | a", b"t1 | b", b"t1 | c", b"t2 | z"]


def test_pub_refuses_a_long_delimiter_and_a_missing_file(tmp_path: Path) -> None:
    r = nsqx("pub", "--topic=t", "--delimiter=ab", "--nsqd-tcp-address=127.0.0.1:1")
    assert r.returncode == 1 and "single byte" in r.stderr.decode()
    r = nsqx("pub", "--topic=t", f"--file={tmp_path}/nope", "--nsqd-tcp-address=127.0.0.1:1")
    assert r.returncode == 1 and "cannot read" in r.stderr.decode()


def test_tail_through_lookupd_shows_progress(
    nsqd_factory: Callable[..., NsqdProcess], lookupd_factory: Callable[..., Any]
) -> None:
    lookupd = lookupd_factory()
    n = nsqd_factory(
        f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1"
    )
    assert (
        nsqx("pub", "--topic=lk", f"--nsqd-tcp-address={tcp(n)}", stdin=b"1\n2\n").returncode == 0
    )
    wait_until(lambda: lookupd.get("/lookup?topic=lk")[0] == 200, what="lookupd knows lk")
    tail = start("tail", "--topic=lk", f"--lookupd-http-address={lookupd.http_address}",
                 "--progress-interval=100ms")  # fmt: skip
    try:
        wait_until(lambda: tail.stdout == b"1\n2\n", what="the two messages")
        # stdout is a pipe, so progress (count and rate) goes to stderr
        wait_until(lambda: "nsqx tail: 2 messages (" in tail.stderr, what="a progress line")
    finally:
        assert tail.stop() == 0


# -- to-file --------------------------------------------------------------------------------


def test_to_file_rotates_gzips_and_names_files_as_go(node: NsqdProcess, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    lines = b"".join(b"message-%05d\n" % i for i in range(3000))
    assert (
        nsqx("pub", "--topic=arch", f"--nsqd-tcp-address={tcp(node)}", stdin=lines).returncode == 0
    )
    tool = start(
        "to-file", "--topic=arch", f"--nsqd-tcp-address={tcp(node)}", f"--output-dir={out}",
        f"--work-dir={work}", "--gzip", "--rotate-size=10000", "--progress-interval=100ms",
    )  # fmt: skip
    try:
        wait_until(lambda: channel_stats(node, "arch", "nsq_to_file").get("depth") == 0
                   and channel_stats(node, "arch", "nsq_to_file").get("in_flight_count") == 0,
                   timeout=30, what="every message written and finished")  # fmt: skip
        wait_until(lambda: "messages (" in tool.stderr, what="a progress line")
    finally:
        assert tool.stop() == 0
    assert "wrote 3,000 messages" in tool.stderr
    files = sorted(out.iterdir())
    host = socket.gethostname().split(".")[0]
    pattern = re.compile(rf"arch\.{re.escape(host)}-(\d{{6}})\.\d{{4}}-\d\d-\d\d_\d\d\.log\.gz")
    assert len(files) >= 3 and all(pattern.fullmatch(f.name) for f in files), files
    revs = [int(pattern.fullmatch(f.name).group(1)) for f in files]  # type: ignore[union-attr]
    assert revs == list(range(len(files)))
    assert list(work.iterdir()) == []  # closed files were moved out of the work dir
    got = b"".join(gzip.decompress(f.read_bytes()) for f in files)
    assert got == lines


def test_to_file_refuses_rotation_without_rev(tmp_path: Path) -> None:
    r = nsqx("to-file", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", f"--output-dir={tmp_path}",
             "--gzip", "--filename-format=<TOPIC>.log")  # fmt: skip
    assert r.returncode == 1 and "missing <REV>" in r.stderr.decode()


# -- to-http --------------------------------------------------------------------------------


class Sink:
    """A real HTTP server on a free port that records requests (and can fail them)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        self.fail_left = fail_first
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with lock:
                    failing = sink.fail_left > 0
                    sink.fail_left -= failing
                    if not failing:
                        sink.requests.append((self.command, self.path, body, dict(self.headers)))
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sinks() -> Iterator[Callable[..., Sink]]:
    made: list[Sink] = []

    def make(fail_first: int = 0) -> Sink:
        made.append(Sink(fail_first))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_to_http_post_round_robin_with_headers(
    node: NsqdProcess, sinks: Callable[..., Sink]
) -> None:
    a, b = sinks(), sinks()
    body = b"".join(b"m%d\n" % i for i in range(10))
    assert nsqx("pub", "--topic=web", f"--nsqd-tcp-address={tcp(node)}", stdin=body).returncode == 0
    tool = start(
        "to-http", "--topic=web", f"--nsqd-tcp-address={tcp(node)}", "--mode=round-robin",
        f"--post={a.url}/in", f"--post={b.url}/in", "--header=X-Source: nsq",
        "--content-type=text/plain",
    )  # fmt: skip
    try:
        wait_until(lambda: len(a.requests) + len(b.requests) == 10, what="10 requests")
    finally:
        assert tool.stop() == 0
    assert len(a.requests) == len(b.requests) == 5
    got = sorted(r[2] for r in a.requests + b.requests)
    assert got == sorted(body.split())
    method, path, _, headers = a.requests[0]
    assert (method, path) == ("POST", "/in")
    assert headers["X-Source"] == "nsq" and headers["Content-Type"] == "text/plain"


def test_to_http_get_fans_out_and_retries_failures(
    node: NsqdProcess, sinks: Callable[..., Sink]
) -> None:
    a, b = sinks(fail_first=1), sinks()
    msgs = b"a b\nc&d\n"
    assert nsqx("pub", "--topic=fan", f"--nsqd-tcp-address={tcp(node)}", stdin=msgs).returncode == 0
    tool = start(
        "to-http", "--topic=fan", f"--nsqd-tcp-address={tcp(node)}", "--mode=all",
        f"--get={a.url}/e?data=%s", f"--get={b.url}/e?data=%s",
        "--consumer-opt=max_backoff_duration,0", "--consumer-opt=default_requeue_delay,0",
    )  # fmt: skip
    try:
        # a's first answer is a 500: that message is requeued and sent again
        wait_until(lambda: len(a.requests) == 2, timeout=20, what="a got both")
        wait_until(lambda: len(b.requests) >= 2, what="b got both")
    finally:
        assert tool.stop() == 0
    assert sorted(r[1] for r in a.requests) == ["/e?data=a+b", "/e?data=c%26d"]
    assert {r[1] for r in b.requests} == {"/e?data=a+b", "/e?data=c%26d"}


def test_to_http_refuses_bad_urls() -> None:
    r = nsqx(
        "to-http", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--get=http://x/no-placeholder"
    )
    assert r.returncode == 1 and "%s exactly once" in r.stderr.decode()
    r = nsqx(
        "to-http", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--post=http://x/", "--mode=x"
    )
    assert r.returncode == 1 and "--mode must be one of" in r.stderr.decode()


# -- to-nsq ---------------------------------------------------------------------------------


def test_to_nsq_relays_with_json_filters(nsqd_factory: Callable[..., NsqdProcess]) -> None:
    src, dst = (
        nsqd_factory("--http-address=127.0.0.1:0"),
        nsqd_factory("--http-address=127.0.0.1:0"),
    )
    docs = [{"id": 1, "c": "NL", "x": 1}, {"id": 2, "c": "DE"}, {"id": 3, "c": "NL", "y": 2}]
    lines = b"".join(json.dumps(d).encode() + b"\n" for d in docs) + b"not json\n"
    assert (
        nsqx("pub", "--topic=orders", f"--nsqd-tcp-address={tcp(src)}", stdin=lines).returncode == 0
    )
    tool = start(
        "to-nsq", "--topic=orders", f"--nsqd-tcp-address={tcp(src)}",
        f"--destination-nsqd-tcp-address={tcp(dst)}", "--destination-topic=nl",
        "--require-json-field=c", "--require-json-value=NL", "--whitelist-json-field=id",
    )  # fmt: skip
    try:
        wait_until(lambda: stats(dst, "nl").get("message_count") == 2, what="two relayed")
        wait_until(lambda: channel_stats(src, "orders", "nsq_to_nsq").get("depth") == 0
                   and channel_stats(src, "orders", "nsq_to_nsq").get("in_flight_count") == 0,
                   what="the source drained")  # fmt: skip
    finally:
        assert tool.stop() == 0
    r = nsqx("tail", "--topic=nl", f"--nsqd-tcp-address={tcp(dst)}", "--n=2")
    assert sorted(r.stdout.splitlines()) == [b'{"id":1}', b'{"id":3}']


# -- stat and bench -------------------------------------------------------------------------


def test_stat_prints_go_table(node: NsqdProcess) -> None:
    assert (
        nsqx("pub", "--topic=st", f"--nsqd-tcp-address={tcp(node)}", stdin=b"1\n2\n3\n").returncode
        == 0
    )
    http_request(f"{node.http_url}/channel/create?topic=st&channel=c", method="POST")
    r = nsqx("stat", "--topic=st", "--channel=c", f"--nsqd-http-address={http_addr(node)}",
             "--interval=100ms", "--count=2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("------rate------+")
    assert lines[1].split() == ["ingress", "egress", "|", "total", "mem", "disk", "inflt", "def",
                                "|", "req", "t-o", "msgs", "clients"]  # fmt: skip
    assert len(lines) == 4
    fields = lines[3].split()
    depth = channel_stats(node, "st", "c")["depth"]
    assert fields[3] == str(depth) == "3"  # total depth, as /stats says
    r = nsqx("stat", "--topic=st", "--channel=nope", f"--nsqd-http-address={http_addr(node)}")
    assert r.returncode == 1
    assert "failed to find channel(nope) in stats metadata for topic(st)" in r.stderr.decode()


def test_bench_both_prints_go_lines(node: NsqdProcess) -> None:
    r = nsqx("bench", "--mode=both", f"--nsqd-tcp-address={tcp(node)}", "--runfor=500ms",
             "--size=100", "--batch-size=50", "--progress-interval=100ms")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    line = r"duration: [\d.]+s - [\d.]+mb/s - [\d.]+ops/s - [\d.]+us/op"
    assert re.fullmatch("writer: " + line, out[0]) and re.fullmatch("reader: " + line, out[1])
    assert "nsqx bench (both): " in r.stderr.decode()  # progress: count and rate
