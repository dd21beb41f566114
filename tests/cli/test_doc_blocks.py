"""Every shell block of README.md and docs/*.md runs as pasted (issue 28).

A block fenced as sh, bash, shell or console runs as ``bash -euo pipefail -c BLOCK``
in a network namespace of its own (the blocks use NSQ's fixed ports, 4150-4171, which
tests must never bind on the shared loopback), with the venv's bin first on the PATH
(``nsqx``, ``python``), in an empty temporary directory, and with ``curl`` failing on an
HTTP error (``--fail-with-body``): a documented request that is refused is a broken
doc. Whatever is left running in the namespace (daemons started with ``&``) is killed
and the namespace deleted afterwards.

HTML comments on the lines right before a block say how it runs; without one it runs
as above:

- ``<!-- not run: REASON -->``: skipped, saying REASON (a listing of output,
  placeholders, a Spark cluster or Go's binaries, a benchmark of minutes).
- ``<!-- run with: nsqx up -->``: ``nsqx up`` (NSQ's default ports, data in ./data)
  serves before the block runs, as the text around such blocks assumes.
- ``<!-- run each: daemon -->``: each command of the block alone, one after the other
  (lines of alternatives: daemons in the foreground, tools that run until stopped): it
  must exit 0, or listen on a new TCP port, or still run after RUNS_FOR seconds; then
  it is killed. With ``run with`` too, the setup serves for all of them.
- ``<!-- needs: CMD -->``: skipped unless CMD is on the PATH (etcd).
- ``<!-- prints: the block below -->``: the last line of the block's output that is JSON
  is the JSON of the fenced block that follows it (the answer the text shows is the one
  a user who pastes the block gets).

Needs root and ``ip netns`` (iproute2); skips, saying why, without them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
SHELL = {"sh", "bash", "shell", "console"}
MARK = re.compile(r"^<!--\s*(not run|run with|run each|needs|prints):\s*(.*?)\s*-->\s*$")
#: what ``run with`` can start, and the URLs that answer once it serves
SETUPS = {
    "nsqx up": (
        "http://127.0.0.1:4151/ping",
        "http://127.0.0.1:4161/ping",
        "http://127.0.0.1:4171/ping",
    ),
}
#: curl fails on HTTP errors (a 4xx is a broken doc): --fail-with-body, unless the
#: block says -f (--fail) itself, which curl does not take with it
PREAMBLE = r"""curl() {
  local a
  for a in "$@"; do
    case "$a" in --fail|--fail-with-body|-[!-]*f*) command curl "$@"; return;; esac
  done
  command curl --fail-with-body "$@"
}
"""
BLOCK_TIMEOUT = 90.0
#: a command of a "run each" block that still runs after this long has started fine
RUNS_FOR = 5.0
PREFIX = "nsqxdoc"


@dataclass
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    body: str
    marks: dict[str, str] = field(default_factory=dict)
    #: with ``prints``: the text of the block that follows
    shows: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def scan(path: Path) -> tuple[list[Block], list[str]]:
    """The shell blocks of ``path`` with their marks, and the problems found: a mark
    that is not right before a shell block, or one that says nothing known."""
    rel = str(path.relative_to(REPO))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used: set[int] = set()
    i = 0
    while i < len(lines):
        opening = lines[i]
        if not opening.startswith("```"):
            i += 1
            continue
        info = opening[3:].strip().split()
        lang = info[0] if info else ""
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if lang in SHELL:
            block = Block(rel, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n")
            j = i - 1
            while j >= 0 and (m := MARK.match(lines[j])):
                block.marks[m.group(1)] = m.group(2)
                used.add(j)
                j -= 1
            if "prints" in block.marks:
                nxt = next((k for k in range(end + 1, len(lines)) if lines[k].startswith("```")), 0)
                stop = next(
                    (k for k in range(nxt + 1, len(lines)) if lines[k].startswith("```")), 0
                )
                block.shows = "\n".join(lines[nxt + 1 : stop]) if nxt and stop else ""
            blocks.append(block)
        i = end + 1
    for n, text in enumerate(lines):
        m = MARK.match(text)
        if m and n not in used:
            problems.append(f"{rel}:{n + 1}: a mark not right before a shell block: {text}")
        elif "<!--" in text and re.search(r"not run|run with|run each|needs", text) and not m:
            problems.append(f"{rel}:{n + 1}: not a mark this test knows: {text}")
    for block in blocks:
        setup = block.marks.get("run with")
        if setup is not None and setup not in SETUPS:
            problems.append(f"{block.id}: run with {setup!r}: only {sorted(SETUPS)}")
        if block.marks.get("run each", "daemon") != "daemon":
            problems.append(f"{block.id}: run each {block.marks['run each']!r}: only 'daemon'")
        if "not run" in block.marks and not block.marks["not run"]:
            problems.append(f"{block.id}: not run, and no reason given")
        if "prints" in block.marks:
            try:
                json.loads(block.shows)
            except ValueError:
                problems.append(f"{block.id}: prints, and no JSON block follows")
    return blocks, problems


BLOCKS = [b for doc in DOCS for b in scan(doc)[0]]


# -- network namespaces ----------------------------------------------------------------


class Netns:
    """A network namespace of this test (``nsqxdoc<pid>-<n>``) with its loopback up."""

    _count = itertools.count()

    def __init__(self) -> None:
        self.name = f"{PREFIX}{os.getpid()}-{next(self._count)}"
        _ip("netns", "add", self.name)
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            _ip("netns", "del", self.name)
            raise

    def cmd(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def listeners(self) -> set[str]:
        """The local addresses listening on TCP in this namespace."""
        out = subprocess.run(
            self.cmd("cat", "/proc/net/tcp", "/proc/net/tcp6"), capture_output=True, text=True
        ).stdout
        rows = (line.split() for line in out.splitlines())
        return {row[1] for row in rows if len(row) > 3 and row[3] == "0A"}

    def close(self) -> None:
        """Kill what runs in the namespace (all of it started here), then delete it."""
        kill_in(self.name)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def kill_in(name: str) -> None:
    for _ in range(50):
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True
        ).stdout.split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.1)


def remove_leftovers() -> None:
    """Namespaces of this test left by a run that died (its pid is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\d+)", listed, re.M):
        ns, pid = name
        if int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            kill_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@functools.cache
def unavailable() -> str | None:
    """Why blocks cannot run here, or None."""
    if os.geteuid() != 0:
        return "running the docs' blocks needs root (a network namespace per block)"
    for tool in ("ip", "curl", "bash"):
        if shutil.which(tool) is None:
            return f"running the docs' blocks needs {tool}"
    try:
        remove_leftovers()
        Netns().close()
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        return f"ip netns does not work here: {err} {detail.decode(errors='replace').strip()}"
    return None


@contextlib.contextmanager
def netns() -> Iterator[Netns]:
    ns = Netns()
    try:
        yield ns
    finally:
        ns.close()


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")])
    return env


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def wait_serving(ns: Netns, urls: tuple[str, ...], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for url in urls:
        while subprocess.run(ns.cmd("curl", "-sf", "-o", "/dev/null", url)).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer in {timeout}s\n{tail(log)}")
            time.sleep(0.2)


def commands(body: str) -> list[str]:
    """The block's commands: lines, joined where one ends with a backslash; blank and
    comment lines left out."""
    out: list[str] = []
    current = ""
    for line in body.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        if not line.rstrip().endswith("\\"):
            out.append(current)
            current = ""
    if current:
        out.append(current)
    return out


def run_each(ns: Netns, command: str, cwd: Path, log: Path, timeout: float = 60) -> None:
    """``command`` alone (a daemon, or a tool that runs until stopped): it passes if it
    exits 0, listens on a TCP port that was not listened on before, or still runs after
    RUNS_FOR seconds; then it is killed, with what it started."""
    before = ns.listeners()
    with log.open("w") as out:
        proc = subprocess.Popen(
            ns.cmd("bash", "-euo", "pipefail", "-c", PREAMBLE + command),
            cwd=cwd,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        while True:
            rc = proc.poll()
            if rc is not None:
                assert rc == 0, f"exit {rc}: {command}\n{tail(log)}"
                return
            if ns.listeners() - before:
                time.sleep(0.3)  # and still there a moment later
                assert proc.poll() in (None, 0), f"{command}\n{tail(log)}"
                return
            if time.monotonic() - started > RUNS_FOR:
                return
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- the tests -------------------------------------------------------------------------


def test_the_blocks_are_found_and_marked_well() -> None:
    """Every mark is known and sits right before a shell block, and the blocks that
    issue 28 found broken are among those that run."""
    problems = [p for doc in DOCS for p in scan(doc)[1]]
    assert not problems, "\n".join(problems)
    assert len(BLOCKS) >= 20
    run = [b for b in BLOCKS if "not run" not in b.marks]
    (replication,) = [
        b for b in run if b.path == "docs/replication.md" and "topic/create" in b.body
    ]
    assert not replication.marks, "docs/replication.md's Running it must run as pasted"
    assert not any("/var/lib" in b.body for b in run), "data under /var/lib: use ./data"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    if "not run" in block.marks:
        pytest.skip(f"{block.id}: not run: {block.marks['not run']}")
    needs = block.marks.get("needs")
    if needs and shutil.which(needs) is None:
        pytest.skip(f"{block.id}: needs {needs}, which is not on the PATH")
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    log = tmp_path / "block.log"
    setup_proc = None
    with netns() as ns:
        setup = block.marks.get("run with")
        if setup is not None:
            setup_log = tmp_path / "setup.log"
            with setup_log.open("w") as out:
                setup_proc = subprocess.Popen(
                    ns.cmd("bash", "-c", f"exec {setup}"),
                    cwd=tmp_path,
                    env=environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            wait_serving(ns, SETUPS[setup], setup_log)
        if "run each" in block.marks:
            for n, command in enumerate(commands(block.body)):
                run_each(ns, command, tmp_path, tmp_path / f"command-{n}.log")
            done = None
        else:
            # output to a file, not a pipe: daemons started with & would hold it open
            with log.open("w") as out:
                try:
                    done = subprocess.run(
                        ns.cmd("bash", "-euo", "pipefail", "-c", PREAMBLE + block.body),
                        cwd=tmp_path,
                        env=environment(),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=BLOCK_TIMEOUT,
                    )
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{block.id} still ran after {BLOCK_TIMEOUT}s\n{tail(log)}")
    if setup_proc is not None:
        setup_proc.wait()  # killed with the namespace
    if done is not None:
        assert done.returncode == 0, f"{block.id} exited {done.returncode}\n{tail(log)}"
    if "prints" in block.marks:
        assert last_json(log.read_text()) == json.loads(block.shows), tail(log)


def last_json(output: str) -> object:
    """The last line of ``output`` that is JSON (None if none is)."""
    for line in reversed(output.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None
