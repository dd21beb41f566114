"""Property tests of faultfs: random sequences of file and directory operations, run
through a real mount and through a plain model of POSIX durability (whole contents:
each file's bytes now and at its last fsync, each directory's entries now and at its
last fsync). Before the cut the mount shows the model's current state; after a power cut
("all") the backing directory holds exactly the model's durable state; after a torn cut
a file holds its durable bytes plus a prefix of its pending writes.

``NSQX_FAULTFS_EXAMPLES=300`` for a longer run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultfs import FaultFS, unavailable

EXAMPLES = int(os.environ.get("NSQX_FAULTFS_EXAMPLES", "25"))
NAMES = ("a", "b", "c")
DIRS = ("", "d")


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    why = unavailable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    yield tmp_path


@dataclass(eq=False)
class MFile:
    cur: bytearray = field(default_factory=bytearray)
    dur: bytes = b""


@dataclass(eq=False)
class MDir:
    cur: dict[str, MFile | MDir] = field(default_factory=dict)
    dur: dict[str, MFile | MDir] = field(default_factory=dict)


def tree(d: MDir, durable: bool, prefix: str = "") -> dict[str, bytes | None]:
    """path -> bytes (a file) or None (a directory)."""
    out: dict[str, bytes | None] = {}
    seen: set[int] = set()

    def walk(d: MDir, prefix: str) -> None:
        for name, node in sorted((d.dur if durable else d.cur).items()):
            path = f"{prefix}{name}"
            if isinstance(node, MDir):
                if id(node) in seen:
                    continue
                seen.add(id(node))
                out[path] = None
                walk(node, path + "/")
            else:
                out[path] = node.dur if durable else bytes(node.cur)

    walk(d, prefix)
    return out


def on_disk(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in dirs:
            if name != ".faultfs-attic":
                out[str(rel / name).removeprefix("./")] = None
        dirs[:] = [d for d in dirs if d != ".faultfs-attic"]
        for name in files:
            out[str(rel / name).removeprefix("./")] = (Path(dirpath) / name).read_bytes()
    return out


def pwrite(buf: bytearray, offset: int, data: bytes) -> None:
    if len(buf) < offset:
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


op = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(
        st.just("write"),
        st.sampled_from(DIRS),
        st.sampled_from(NAMES),
        st.integers(0, 9000),
        st.binary(min_size=1, max_size=5000),
    ),
    st.tuples(
        st.just("truncate"), st.sampled_from(DIRS), st.sampled_from(NAMES), st.integers(0, 9000)
    ),
    st.tuples(st.just("fsync"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("fsyncdir"), st.sampled_from(DIRS)),
    st.tuples(
        st.just("rename"),
        st.sampled_from(DIRS),
        st.sampled_from(NAMES),
        st.sampled_from(DIRS),
        st.sampled_from(NAMES),
    ),
    st.tuples(st.just("unlink"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("mkdir")),
    st.tuples(st.just("rmdir")),
)


def run_op(m: Path, root: MDir, o: tuple) -> None:  # type: ignore[type-arg]
    """Apply ``o`` to the model and to the mount, when the model says it is valid."""
    sub = root.cur.get("d")
    dirs: dict[str, MDir | None] = {"": root, "d": sub if isinstance(sub, MDir) else None}
    kind = o[0]
    if kind == "mkdir":
        if "d" not in root.cur:
            os.mkdir(m / "d")
            root.cur["d"] = MDir()
        return
    if kind == "rmdir":
        if isinstance(sub, MDir) and not sub.cur:
            os.rmdir(m / "d")
            del root.cur["d"]
        return
    d = dirs[o[1]]
    if d is None:
        return
    path = m / o[1] / o[2] if kind != "fsyncdir" else m / o[1]
    if kind == "fsyncdir":
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
        d.dur = dict(d.cur)
        return
    node = d.cur.get(o[2])
    if kind == "create":
        if node is None:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            d.cur[o[2]] = MFile()
        return
    if not isinstance(node, MFile):
        return
    if kind == "write":
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, o[4], o[3])
        os.close(fd)
        pwrite(node.cur, o[3], o[4])
    elif kind == "truncate":
        os.truncate(path, o[3])
        if o[3] < len(node.cur):
            del node.cur[o[3] :]
        else:
            node.cur.extend(bytes(o[3] - len(node.cur)))
    elif kind == "fsync":
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        node.dur = bytes(node.cur)
    elif kind == "unlink":
        os.unlink(path)
        del d.cur[o[2]]
    elif kind == "rename":
        dst = dirs[o[3]]
        if dst is None or isinstance(dst.cur.get(o[4]), MDir):
            return
        os.rename(path, m / o[3] / o[4])
        del d.cur[o[2]]
        dst.cur[o[4]] = node


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, max_size=40))
def test_a_power_cut_leaves_exactly_the_durable_state(base: Path, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    where = Path(tempfile.mkdtemp(dir=base))
    fs = FaultFS(where / "disk", where / "mnt")
    fs.mount()
    try:
        root = MDir()
        for o in ops:
            run_op(fs.mountpoint, root, o)
        # reads see everything before the cut
        assert on_disk(fs.mountpoint) == tree(root, durable=False)
        fs.cut("all")
        assert on_disk(fs.backing) == tree(root, durable=True)
    finally:
        fs.close()


writes = st.lists(
    st.tuples(st.integers(0, 300), st.binary(min_size=1, max_size=120)), min_size=1, max_size=12
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(durable=st.binary(max_size=200), pending=writes, seed=st.integers(0, 2**32))
def test_a_torn_cut_keeps_a_prefix_of_the_pending_writes(
    base: Path, durable: bytes, pending: list[tuple[int, bytes]], seed: int
) -> None:
    where = Path(tempfile.mkdtemp(dir=base))
    fs = FaultFS(where / "disk", where / "mnt")
    fs.mount()
    try:
        m = fs.mountpoint / "f"
        fd = os.open(m, os.O_CREAT | os.O_WRONLY)
        os.write(fd, durable)
        os.fsync(fd)
        now = bytearray(durable)
        for offset, data in pending:
            os.pwrite(fd, data, offset)
            pwrite(now, offset, data)
        os.close(fd)
        dfd = os.open(fs.mountpoint, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        fs.cut("torn", seed=seed)
        got = (fs.backing / "f").read_bytes()
    finally:
        fs.close()
    # every cut point: the writes before it whole, the one it falls in cut there; a
    # kept range holds what the file held at the cut (what writeback writes)
    images = set()
    total = sum(len(d) for _, d in pending)
    for budget in range(total + 1):
        img = bytearray(durable)
        left = budget
        for offset, data in pending:
            if left <= 0:
                break
            n = min(len(data), left)
            pwrite(img, offset, bytes(now[offset : offset + n]))
            left -= n
        images.add(bytes(img))
    assert got in images
