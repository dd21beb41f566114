"""The tools on a secured cluster: an nsqd that asks for AUTH (``--auth-http-address``)
and, with nsqlookupd, a bearer secret on every HTTP request (``--http-auth=all``), all
asking one real auth server (tests/authserver.py). Every tool takes the secret the same
way (``--auth-secret``, ``--auth-secret-file``, ``$NSQX_AUTH_SECRET``) and uses it for
TCP AUTH and HTTP alike; without it, or with one that is refused, a tool says so in one
line and exits 1 instead of retrying forever."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_tools import Sink, sinks  # noqa: F401 - a fixture

from authserver import AuthServer, auth_server, grant
from lookupdproc import LookupdProcess, http_request, start_lookupd, wait_until
from nsqdproc import NsqdProcess, start_nsqd
from toolproc import ENV, start

ROOT = "root-secret"
SECRETS: dict[str, dict[str, Any]] = {
    ROOT: grant(
        {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish", "admin"]}
    ),
    # may publish, but not subscribe
    "publisher": grant({"topic": ".*", "channels": [".*"], "permissions": ["publish"]}),
}
HINT = "--auth-secret, --auth-secret-file or $NSQX_AUTH_SECRET"


@dataclass
class Secured:
    auth: AuthServer
    lookupd: LookupdProcess
    nsqd: NsqdProcess
    #: an nsqlookupd without --http-auth that the nsqd registers with too
    open_lookupd: LookupdProcess

    @property
    def tcp(self) -> str:
        return f"127.0.0.1:{self.nsqd.tcp_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.nsqd.http_port}"

    def get(self, path: str) -> Any:
        status, _, body = http_request(
            f"{self.nsqd.http_url}{path}", headers={"Authorization": f"Bearer {ROOT}"}
        )
        assert status == 200, body
        return json.loads(body)

    def post(self, path: str, data: bytes = b"") -> None:
        req = urllib.request.Request(
            f"{self.nsqd.http_url}{path}",
            data=data,
            method="POST",
            headers={"Authorization": f"Bearer {ROOT}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200

    def message_count(self, topic: str) -> int:
        topics = self.get(f"/stats?format=json&topic={topic}")["topics"] or []
        return sum(int(t["message_count"]) for t in topics)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with auth_server() as auth:
        auth.answers.update(SECRETS)
        flags = [f"--auth-http-address={auth.address}", "--http-auth=all"]
        lookupd = start_lookupd(*flags)
        open_lookupd = start_lookupd()
        try:
            nsqd = start_nsqd(
                tmp_path_factory.mktemp("nsqd"),
                "--http-address=127.0.0.1:0",
                "--broadcast-address=127.0.0.1",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                f"--lookupd-tcp-address={open_lookupd.tcp_address}",
                *flags,
            )
        except BaseException:
            lookupd.stop(signal.SIGKILL)
            open_lookupd.stop(signal.SIGKILL)
            raise
        try:
            yield Secured(auth, lookupd, nsqd, open_lookupd)
        finally:
            nsqd.stop(signal.SIGKILL)
            lookupd.stop(signal.SIGKILL)
            open_lookupd.stop(signal.SIGKILL)


def nsqx(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqx", *args],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=60,
        env=env or ENV,
    )


def one_line_failure(done: subprocess.CompletedProcess[str], tool: str) -> str:
    """The last line of a tool that stopped with status 1, no traceback."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"nsqx {tool}: "), done.stderr
    return last


def without_secret(s: Secured, tmp: Path) -> dict[str, list[str]]:
    """A command line of each tool against the secured cluster, with no secret."""
    return {
        "tail": ["--topic=t", f"--nsqd-tcp-address={s.tcp}"],
        "tail (lookupd)": ["--topic=t", f"--lookupd-http-address={s.lookupd.http_address}"],
        "pub": ["--topic=t", f"--nsqd-tcp-address={s.tcp}"],
        "to-file": ["--topic=t", f"--nsqd-tcp-address={s.tcp}", f"--output-dir={tmp}"],
        "to-http": ["--topic=t", f"--nsqd-tcp-address={s.tcp}", "--post=http://127.0.0.1:1/"],
        "to-nsq": ["--topic=t", f"--nsqd-tcp-address={s.tcp}",
                   f"--destination-nsqd-tcp-address={s.tcp}"],
        "stat": ["--topic=t", "--channel=c", f"--nsqd-http-address={s.http}"],
        "bench": [f"--nsqd-tcp-address={s.tcp}", "--runfor=1s"],
        "replicas": [f"--lookupd-http-address={s.lookupd.http_address}"],
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["tail", "tail (lookupd)", "pub", "to-file", "to-http", "to-nsq", "stat", "bench", "replicas"],
)
def test_without_a_secret_each_tool_says_so_in_one_line(
    case: str, secured: Secured, tmp_path: Path
) -> None:
    env = {k: v for k, v in ENV.items() if k != "NSQX_AUTH_SECRET"}
    tool = case.split()[0]
    done = nsqx(tool, *without_secret(secured, tmp_path)[case], env=env)
    last = one_line_failure(done, tool)
    assert "AUTH_REQUIRED" in last or "requires AUTH" in last, last
    assert last.endswith(f"(give it with {HINT})"), last


def test_a_refused_secret_is_one_line(secured: Secured) -> None:
    done = nsqx("pub", "--topic=t", f"--nsqd-tcp-address={secured.tcp}", "--auth-secret=guess")
    last = one_line_failure(done, "pub")
    assert "the secret was refused: E_AUTH_FAILED" in last, last


def test_the_nsqd_an_open_nsqlookupd_lists_are_checked_at_the_start(
    secured: Secured, tmp_path: Path
) -> None:
    """nsqlookupd asks for no secret, its nsqd does: a secret missing or refused is
    found at the start, on the nsqd that nsqlookupd lists for the topic."""
    s = secured
    s.post("/topic/create?topic=listed")
    wait_until(
        lambda: s.open_lookupd.get("/lookup?topic=listed")[0] == 200, what="the topic listed"
    )
    source = f"--lookupd-http-address={s.open_lookupd.http_address}"
    env = {k: v for k, v in ENV.items() if k != "NSQX_AUTH_SECRET"}
    last = one_line_failure(nsqx("tail", "--topic=listed", source, env=env), "tail")
    assert "nsqd requires AUTH and no secret was given" in last and HINT in last, last
    for tool, *more in (["tail"], ["to-file", f"--output-dir={tmp_path}"]):
        done = nsqx(tool, "--topic=listed", source, "--auth-secret=guess", *more)
        last = one_line_failure(done, tool)
        assert f"{s.tcp}: the secret was refused: E_AUTH_FAILED" in last, last
    assert not list(tmp_path.iterdir())  # nothing consumed, nothing written


def test_a_secret_without_subscribe_stops_tail_with_one_line(secured: Secured) -> None:
    """nsqd accepts the secret (AUTH) but refuses its SUB: retrying cannot help, so the
    tail stops instead of repeating the refusal."""
    for source in (
        f"--nsqd-tcp-address={secured.tcp}",
        f"--lookupd-http-address={secured.lookupd.http_address}",
    ):
        done = nsqx("tail", "--topic=t", source, "--auth-secret=publisher")
        last = one_line_failure(done, "tail")
        assert "UNAUTHORIZED" in last, last


def test_the_secret_from_a_flag_a_file_or_the_environment(secured: Secured, tmp_path: Path) -> None:
    s = secured
    secret_file = tmp_path / "secret"
    secret_file.write_text(ROOT + "\n")
    pub = nsqx("pub", "--topic=events", f"--nsqd-tcp-address={s.tcp}", f"--auth-secret={ROOT}",
               stdin=b"one\ntwo\nthree\n")  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    assert s.message_count("events") == 3
    # tail through nsqlookupd (its /lookup asks for the bearer secret), from $NSQX_AUTH_SECRET
    s.post("/channel/create?topic=events&channel=reader")
    tail = nsqx("tail", "--topic=events", "--channel=reader", "--n=3",
                f"--lookupd-http-address={s.lookupd.http_address}",
                env=dict(ENV, NSQX_AUTH_SECRET=ROOT))  # fmt: skip
    assert (tail.returncode, tail.stdout) == (0, "one\ntwo\nthree\n"), tail.stderr
    # stat's HTTP calls carry it, from a file
    stat = nsqx("stat", "--topic=events", "--channel=reader", "--count=1", "--interval=100ms",
                f"--lookupd-http-address={s.lookupd.http_address}",
                f"--auth-secret-file={secret_file}")  # fmt: skip
    assert stat.returncode == 0, stat.stderr
    assert "ingress" in stat.stdout
    bench = nsqx("bench", "--mode=writer", f"--nsqd-tcp-address={s.tcp}", "--runfor=200ms",
                 "--topic=bench", f"--auth-secret-file={secret_file}")  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    replicas = nsqx("replicas", f"--lookupd-http-address={s.lookupd.http_address}",
                    f"--auth-secret={ROOT}")  # fmt: skip
    assert replicas.returncode == 0 and replicas.stdout.startswith("topic "), replicas.stderr
    # go-nsq's option still works for the consumer alone
    s.post("/pub?topic=events", b"four")
    tail = nsqx("tail", "--topic=events", "--channel=reader", "--n=1",
                f"--nsqd-tcp-address={s.tcp}", f"--consumer-opt=auth_secret,{ROOT}")  # fmt: skip
    assert (tail.returncode, tail.stdout) == (0, "four\n"), tail.stderr


def test_bad_secret_values_are_refused(secured: Secured, tmp_path: Path) -> None:
    done = nsqx("pub", "--topic=t", f"--nsqd-tcp-address={secured.tcp}", "--auth-secret=a b")
    assert "--auth-secret: the secret must be printable ASCII" in one_line_failure(done, "pub")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = nsqx("pub", "--topic=t", f"--nsqd-tcp-address={secured.tcp}",
                f"--auth-secret-file={empty}")  # fmt: skip
    assert "has no secret on its first line" in one_line_failure(done, "pub")


def test_relays_and_archives_with_the_secret(
    secured: Secured,
    tmp_path: Path,
    sinks: Callable[..., Sink],  # noqa: F811
) -> None:
    """to-file (topics found through nsqlookupd), to-http and to-nsq consume with the
    secret; to-http never sends it to its endpoints."""
    s = secured
    for topic in ("archived", "posted", "relayed"):
        s.post(f"/topic/create?topic={topic}")
    archive = tmp_path / "archive"
    sink = sinks()
    env = dict(ENV, NSQX_AUTH_SECRET=ROOT)
    tools = [
        start("to-file", "--topic-pattern=^archived$", f"--output-dir={archive}",
              f"--lookupd-http-address={s.lookupd.http_address}", "--topic-refresh=200ms",
              env=env),
        start("to-http", "--topic=posted", f"--nsqd-tcp-address={s.tcp}", f"--post={sink.url}/",
              env=env),
        start("to-nsq", "--topic=relayed", f"--nsqd-tcp-address={s.tcp}",
              f"--destination-nsqd-tcp-address={s.tcp}", "--destination-topic=copy", env=env),
    ]  # fmt: skip
    try:
        for topic in ("archived", "posted", "relayed"):
            # each tool's channel, before the message it must see
            wait_until(
                lambda topic=topic: any(
                    t["channels"] for t in s.get(f"/stats?format=json&topic={topic}")["topics"]
                ),
                timeout=30,
                what=f"a channel on {topic}",
            )
            s.post(f"/pub?topic={topic}", topic.encode())

        def archived() -> bytes:
            return b"".join(f.read_bytes() for f in archive.glob("*") if f.is_file())

        wait_until(lambda: archived() == b"archived\n", timeout=30, what="the archive")
        wait_until(lambda: len(sink.requests) == 1, timeout=30, what="the POST")
        wait_until(lambda: s.message_count("copy") == 1, timeout=30, what="the relay")
    finally:
        codes = [t.stop() for t in tools]
    assert codes == [0, 0, 0], [t.stderr for t in tools]
    (_, _, body, headers) = sink.requests[0]
    assert body == b"posted" and "Authorization" not in headers
