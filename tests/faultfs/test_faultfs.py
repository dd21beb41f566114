"""faultfs loses exactly what POSIX lets a kernel lose at a power cut, and keeps what it
must: fsynced data, names made durable by an fsync of their directory. Reads before the
cut see everything. Its corruption does what it says. Needs FUSE (skips without it)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultfs import FaultFS, FaultFSError, unavailable


@pytest.fixture
def ffs(tmp_path: Path) -> Iterator[FaultFS]:
    why = unavailable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    fs = FaultFS(tmp_path / "disk", tmp_path / "mnt")
    fs.mount()
    try:
        yield fs
    finally:
        fs.close()


def write(path: Path, data: bytes, sync: bool = False, flags: int = os.O_TRUNC) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def append(path: Path, data: bytes, sync: bool = False) -> None:
    write(path, data, sync, os.O_APPEND)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk(fs: FaultFS) -> dict[str, bytes]:
    """Every file under the backing directory: relative path -> bytes."""
    out = {}
    for root, _dirs, files in os.walk(fs.backing):
        for name in files:
            p = Path(root) / name
            out[str(p.relative_to(fs.backing))] = p.read_bytes()
    return out


def test_fsynced_data_survives_and_unsynced_appends_vanish(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "log", b"durable", sync=True)
    fsync_dir(m)
    append(m / "log", b"+pending")
    # reads see everything before the cut (the page cache)
    assert (m / "log").read_bytes() == b"durable+pending"
    report = ffs.cut("all")
    assert report["files"]["/log"] == {"size": 15, "now": 7}
    assert disk(ffs) == {"log": b"durable"}
    ffs.mount()
    assert (m / "log").read_bytes() == b"durable"


def test_what_was_on_the_disk_before_the_mount_is_durable(tmp_path: Path) -> None:
    why = unavailable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    (tmp_path / "disk" / "a" / "b").mkdir(parents=True)
    (tmp_path / "disk" / "a" / "b" / "seg").write_bytes(b"old")
    (tmp_path / "disk" / "top").write_bytes(b"top")
    fs = FaultFS(tmp_path / "disk", tmp_path / "mnt")
    try:
        for touch in (False, True):
            fs.mount()
            if touch:  # a file deep down changed, nothing else read
                append(fs.mountpoint / "a" / "b" / "seg", b"+new")
            fs.cut()
            assert disk(fs) == {"a/b/seg": b"old", "top": b"top"}
    finally:
        fs.close()


def test_a_clean_unmount_keeps_everything(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    (m / "d").mkdir()
    write(m / "d" / "f", b"never fsynced")
    ffs.unmount()
    assert disk(ffs) == {"d/f": b"never fsynced"}
    assert not (ffs.backing / ".faultfs-attic").exists()


def test_fdatasync_is_as_good_as_fsync(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    fd = os.open(m / "f", os.O_CREAT | os.O_WRONLY)
    os.write(fd, b"abc")
    os.fdatasync(fd)
    os.close(fd)
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {"f": b"abc"}


def test_a_file_created_and_fsynced_vanishes_without_its_directorys_fsync(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "new", b"data", sync=True)
    ffs.cut()
    assert disk(ffs) == {}


def test_a_created_file_whose_directory_was_fsynced_comes_back_empty(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "new", b"data")
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {"new": b""}


def test_a_rename_without_the_directorys_fsync_vanishes(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "state", b"old", sync=True)
    fsync_dir(m)
    write(m / "state.tmp", b"new", sync=True)
    os.rename(m / "state.tmp", m / "state")
    assert (m / "state").read_bytes() == b"new"
    ffs.cut()
    assert disk(ffs) == {"state": b"old"}


def test_a_rename_followed_by_the_directorys_fsync_stays(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "state", b"old", sync=True)
    fsync_dir(m)
    write(m / "state.tmp", b"new", sync=True)
    os.rename(m / "state.tmp", m / "state")
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {"state": b"new"}


def test_a_rename_of_unsynced_data_leaves_an_empty_file(ffs: FaultFS) -> None:
    """The classic: data not fsynced before the rename, directory fsynced after."""
    m = ffs.mountpoint
    write(m / "state", b"old", sync=True)
    fsync_dir(m)
    write(m / "state.tmp", b"new")
    os.rename(m / "state.tmp", m / "state")
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {"state": b""}


def test_a_rename_across_directories_needs_both_fsynced(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    (m / "a").mkdir()
    (m / "b").mkdir()
    write(m / "a" / "f", b"x", sync=True)
    fsync_dir(m / "a")
    fsync_dir(m / "b")
    fsync_dir(m)
    os.rename(m / "a" / "f", m / "b" / "f")
    fsync_dir(m / "b")
    ffs.cut()
    # the removal from a was never made durable: two names for one file
    assert disk(ffs) == {"a/f": b"x", "b/f": b"x"}


def test_an_unlink_without_the_directorys_fsync_comes_back(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "seg", b"records", sync=True)
    fsync_dir(m)
    append(m / "seg", b"+more")
    os.unlink(m / "seg")
    assert not (m / "seg").exists()
    ffs.cut()
    assert disk(ffs) == {"seg": b"records"}


def test_an_unlink_made_durable_stays(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "seg", b"records", sync=True)
    fsync_dir(m)
    os.unlink(m / "seg")
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {}


def test_an_open_unlinked_file_keeps_working(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    fd = os.open(m / "f", os.O_CREAT | os.O_RDWR)
    os.unlink(m / "f")
    os.write(fd, b"still here")
    os.fsync(fd)
    assert os.pread(fd, 100, 0) == b"still here"
    os.close(fd)
    fsync_dir(m)
    ffs.cut()
    assert disk(ffs) == {}


def test_a_directory_whose_parent_was_not_fsynced_vanishes(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    (m / "topic").mkdir()
    write(m / "topic" / "seg", b"r", sync=True)
    fsync_dir(m / "topic")
    ffs.cut()
    assert disk(ffs) == {}
    assert sorted(os.listdir(ffs.backing)) == []


def test_a_directory_made_durable_keeps_its_durable_entries(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    (m / "topic").mkdir()
    write(m / "topic" / "seg", b"r", sync=True)
    fsync_dir(m / "topic")
    fsync_dir(m)
    write(m / "topic" / "other", b"o", sync=True)
    ffs.cut()
    assert disk(ffs) == {"topic/seg": b"r"}


def test_rmdir_without_the_parents_fsync_brings_the_directory_back(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    (m / "d").mkdir()
    write(m / "d" / "f", b"f", sync=True)
    fsync_dir(m / "d")
    fsync_dir(m)
    os.unlink(m / "d" / "f")
    os.rmdir(m / "d")
    ffs.cut()
    assert disk(ffs) == {"d/f": b"f"}


def test_a_truncate_not_fsynced_is_undone(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    data = bytes(random.Random(1).randbytes(20000))
    write(m / "f", data, sync=True)
    fsync_dir(m)
    os.truncate(m / "f", 5000)
    append(m / "f", b"tail")
    assert (m / "f").read_bytes() == data[:5000] + b"tail"
    ffs.cut()
    assert disk(ffs) == {"f": data}


def test_a_truncate_fsynced_stays(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "f", b"0123456789", sync=True)
    fsync_dir(m)
    fd = os.open(m / "f", os.O_WRONLY)
    os.ftruncate(fd, 4)
    os.fsync(fd)
    os.close(fd)
    ffs.cut()
    assert disk(ffs) == {"f": b"0123"}


def test_an_overwrite_inside_durable_data_is_undone(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    data = random.Random(2).randbytes(3 * 4096 + 100)
    write(m / "f", data, sync=True)
    fsync_dir(m)
    fd = os.open(m / "f", os.O_WRONLY)
    os.pwrite(fd, b"X" * 5000, 4000)  # across three pages
    os.pwrite(fd, b"Y" * 10, 12300)  # past the end
    os.close(fd)
    ffs.cut()
    assert disk(ffs) == {"f": data}


def test_o_trunc_not_fsynced_is_undone(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "f", b"precious", sync=True)
    fsync_dir(m)
    with open(m / "f", "wb") as f:
        f.write(b"x")
    ffs.cut()
    assert disk(ffs) == {"f": b"precious"}


def test_the_durable_file_pattern_survives(ffs: FaultFS) -> None:
    """nsqx's small files: temp file, fsync, rename, fsync of the directory."""
    from nsqx.store.durable_file import write_durable

    m = ffs.mountpoint
    write_durable(str(m / "meta.json"), b'{"v": 1}')
    write_durable(str(m / "meta.json"), b'{"v": 2}')
    ffs.cut()
    assert disk(ffs) == {"meta.json": b'{"v": 2}'}


def test_torn_keeps_a_prefix_of_the_pending_bytes(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    writes = [bytes([65 + i]) * (50 + i) for i in range(20)]
    pending = b"".join(writes)
    lengths = set()
    for seed in range(8):
        write(m / "log", b"D" * 100, sync=True)
        fsync_dir(m)
        for w in writes:
            append(m / "log", w)
        ffs.cut("torn", seed=seed)
        got = (ffs.backing / "log").read_bytes()
        assert got[:100] == b"D" * 100
        assert pending.startswith(got[100:]), got[100:]
        lengths.add(len(got) - 100)
        ffs.mount()
    # cut at different bytes (inside writes: no write is 1 byte long)
    assert len(lengths) > 4


def test_torn_last_cuts_only_the_last_write(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "log", b"", sync=True)
    fsync_dir(m)
    append(m / "log", b"a" * 100)
    append(m / "log", b"b" * 100)
    append(m / "log", b"c" * 1000)
    ffs.cut("torn-last", seed=3)
    got = (ffs.backing / "log").read_bytes()
    assert got.startswith(b"a" * 100 + b"b" * 100)
    assert set(got[200:]) <= {ord("c")}
    assert len(got) < 1200


def test_reorder_keeps_any_subset_of_the_writes(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "log", b"", sync=True)
    fsync_dir(m)
    seen: set[tuple[bool, ...]] = set()
    for seed in range(6):
        fd = os.open(m / "log", os.O_WRONLY)
        for i in range(8):
            os.pwrite(fd, bytes([65 + i]) * 10, i * 10)
        os.close(fd)
        ffs.cut("reorder", seed=seed)
        got = (ffs.backing / "log").read_bytes()
        kept = []
        for i in range(8):
            chunk = got[i * 10 : i * 10 + 10]
            # each write reached the disk whole or not at all (zeros: a hole before a
            # later write that did)
            assert chunk in (bytes([65 + i]) * 10, bytes(10), b""), (seed, got)
            kept.append(chunk == bytes([65 + i]) * 10)
        seen.add(tuple(kept))
        ffs.mount()
        fd = os.open(m / "log", os.O_WRONLY)
        os.ftruncate(fd, 0)
        os.fsync(fd)
        os.close(fd)
    assert len(seen) > 1


def test_flip_bit_flips_exactly_one_bit(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    data = random.Random(4).randbytes(10000)
    write(m / "seg", data, sync=True)
    fsync_dir(m)
    fd = os.open(m / "seg", os.O_RDONLY)  # a reader holding it open sees the flip too
    assert os.pread(fd, 10000, 0) == data
    ffs.flip_bit("seg", offset=5000, bit=3)
    got = os.pread(fd, 10000, 0)
    os.close(fd)
    assert got[5000] == data[5000] ^ 8
    assert got[:5000] == data[:5000] and got[5001:] == data[5001:]
    ffs.cut()  # the disk's damage is durable
    assert (ffs.backing / "seg").read_bytes() == got
    report = ffs.flip_bit("seg", seed=9)  # unmounted: on the backing file
    again = (ffs.backing / "seg").read_bytes()
    diff = [i for i in range(10000) if again[i] != got[i]]
    assert diff == [report["offset"]]
    assert bin(again[diff[0]] ^ got[diff[0]]).count("1") == 1


def test_flip_bit_in_an_overwritten_page_is_durable_too(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "f", b"\0" * 8192, sync=True)
    fsync_dir(m)
    fd = os.open(m / "f", os.O_WRONLY)
    os.pwrite(fd, b"\xff" * 10, 0)
    os.close(fd)
    ffs.flip_bit("f", offset=100, bit=0)
    ffs.cut()
    got = (ffs.backing / "f").read_bytes()
    assert got == b"\0" * 100 + b"\x01" + b"\0" * 8091


def test_truncate_cuts_a_file_on_the_disk(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "seg", b"0123456789", sync=True)
    fsync_dir(m)
    ffs.truncate("seg", 6)
    assert (m / "seg").read_bytes() == b"012345"
    ffs.cut()
    assert disk(ffs) == {"seg": b"012345"}


def test_a_cut_filesystem_refuses_everything_until_unmounted(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "f", b"x", sync=True)
    fd = os.open(m / "f", os.O_RDWR)
    ffs._ask({"op": "cut", "mode": "all"})
    with pytest.raises(OSError):
        os.write(fd, b"late")
    with pytest.raises(OSError):
        os.listdir(m)
    with pytest.raises(FaultFSError):
        ffs._ask({"op": "cut", "mode": "all"})
    os.close(fd)
    ffs.unmount()
    assert disk(ffs) == {}


def test_bad_commands_get_an_error_and_harm_nothing(ffs: FaultFS) -> None:
    m = ffs.mountpoint
    write(m / "f", b"x", sync=True)
    for req in (
        {"op": "nope"},
        {"op": "cut", "mode": "sideways"},
        {"op": "flip", "path": "/missing"},
        {"op": "flip", "path": "/f", "offset": 10},
    ):
        with pytest.raises(FaultFSError):
            ffs._ask(req)
    assert (m / "f").read_bytes() == b"x"
    assert not os.path.exists(m / ".faultfs-attic")
    with pytest.raises(OSError):
        (m / ".faultfs-attic").mkdir()
