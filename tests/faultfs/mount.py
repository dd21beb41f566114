"""The test's side of faultfs: mount a forgetting filesystem over a backing directory (a
daemon process of its own), cut its power, corrupt its files, unmount it.

    fs = FaultFS(backing, mountpoint)
    fs.mount()
    ...                       # processes use the mountpoint
    node.kill()               # SIGKILL everything that has files open there, first
    fs.cut("all")             # what was not fsynced is gone from the backing directory
    fs.mount()                # a fresh mount over what was durable
    fs.unmount()              # a clean unmount keeps everything

:func:`unavailable` says why FUSE cannot be used here (tests skip with it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DAEMON = Path(__file__).with_name("daemon.py")
#: the mounts of this process, unmounted at its exit if the test did not (a daemon runs
#: in a session of its own and would outlive it)
_LIVE: set[FaultFS] = set()


@atexit.register
def _unmount_all() -> None:
    for fs in list(_LIVE):
        with contextlib.suppress(Exception):
            fs.close()


class FaultFSError(RuntimeError):
    pass


class FaultFS:
    """One forgetting mount: ``backing`` (the disk) seen at ``mountpoint``."""

    def __init__(self, backing: Path, mountpoint: Path, log: Path | None = None) -> None:
        self.backing = Path(backing).absolute()
        self.mountpoint = Path(mountpoint).absolute()
        self.log = (
            Path(log)
            if log is not None
            else self.backing.with_name(self.backing.name + ".faultfs.log")
        )
        # a short path: a unix socket's name has a 108-byte limit
        self._dir = tempfile.mkdtemp(prefix="faultfs-")
        self.control = os.path.join(self._dir, "control")
        self.proc: subprocess.Popen[bytes] | None = None
        #: every cut's and corruption's answer, in order
        self.history: list[dict[str, Any]] = []

    @property
    def mounted(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def mount(self, timeout: float = 30.0) -> None:
        """Start the daemon and wait until the kernel has the mount."""
        if self.mounted:
            raise FaultFSError(f"{self.mountpoint} is mounted already")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(DAEMON),
                    str(self.backing),
                    str(self.mountpoint),
                    "--control",
                    self.control,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise FaultFSError(f"faultfs exited {self.proc.returncode}: {self._tail()}")
            with contextlib.suppress(OSError, FaultFSError):
                if self._ask({"op": "ping"}, timeout=2.0).get("mounted") and _is_mount(
                    self.mountpoint
                ):
                    return
            if time.monotonic() > deadline:
                self._stop()
                raise FaultFSError(f"faultfs did not mount {self.mountpoint}: {self._tail()}")
            time.sleep(0.02)

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-2000:]
        return ""

    def _ask(self, req: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.control)
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise FaultFSError("faultfs closed the control connection")
                buf += chunk
        answer: dict[str, Any] = json.loads(buf)
        if not answer.pop("ok", False):
            raise FaultFSError(answer.get("error", "failed"))
        return answer

    def stats(self) -> dict[str, Any]:
        return self._ask({"op": "stats"})

    def cut(
        self, mode: str = "all", seed: int | None = None, p: float = 0.5, remount: bool = False
    ) -> dict[str, Any]:
        """The power cut: lose what was not durable (``mode``: all, reorder, torn,
        torn-last; see faultfs/fs.py), then unmount. Every process with files open
        there must be dead first. ``remount``: mount again at once."""
        report = self._ask({"op": "cut", "mode": mode, "seed": seed, "p": p})
        self.history.append({"cut": report})
        self.unmount(grace=0.2)  # nothing left to write back: no need to wait
        if remount:
            self.mount()
        return report

    def flip_bit(
        self,
        path: str,
        offset: int | None = None,
        bit: int | None = None,
        seed: int | None = None,
    ) -> dict[str, Any]:
        """Flip one bit of a file (``path`` relative to the mount); a random byte and bit
        where not given. Mounted or not."""
        rel = "/" + str(path).lstrip("/")
        if self.mounted:
            report = self._ask(
                {"op": "flip", "path": rel, "offset": offset, "bit": bit, "seed": seed}
            )
        else:
            report = flip_bit_at_rest(self.backing / rel[1:], offset, bit, seed)
        self.history.append({"flip": report})
        return report

    def truncate(self, path: str, length: int) -> dict[str, Any]:
        """Cut a file at ``length`` bytes on the disk (durable and current)."""
        rel = "/" + str(path).lstrip("/")
        if self.mounted:
            report = self._ask({"op": "truncate", "path": rel, "length": length})
        else:
            size = (self.backing / rel[1:]).stat().st_size
            os.truncate(self.backing / rel[1:], min(length, size))
            report = {"path": rel, "length": length, "size": size}
        self.history.append({"truncate": report})
        return report

    def unmount(self, timeout: float = 30.0, grace: float = 2.0) -> None:
        """Unmount (the daemon exits); after a cut, the backing directory holds the
        durable state only; otherwise everything.

        Processes started since the mount in other mount namespaces (``ip netns exec``
        makes one) hold copies of it that an unmount here does not remove, and that
        keep the daemon's connection open: the daemon is then told to stop (SIGTERM,
        libfuse ends its loop), which ends the connection for every copy."""
        if self.proc is None:
            return
        if _is_mount(self.mountpoint):
            r = subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
            if r.returncode:
                # busy: something still has files open there (it outlived its SIGKILL,
                # or was never killed); detach it, the daemon is stopped below
                subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._stop()
                raise FaultFSError(f"faultfs did not unmount {self.mountpoint}") from None
        if _is_mount(self.mountpoint):
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        self.proc = None

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if _is_mount(self.mountpoint):
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)

    def close(self) -> None:
        """Unmount if mounted (cleanly), and remove the control socket's folder."""
        try:
            self.unmount()
        finally:
            self._stop()
            self.proc = None
            _LIVE.discard(self)
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FaultFS:
        if not self.mounted:
            self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_mount(path: Path) -> bool:
    """Whether ``path`` is a mount point, by the kernel's table (a stat of a cut mount
    fails, so os.path.ismount cannot tell)."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def flip_bit_at_rest(
    path: Path, offset: int | None = None, bit: int | None = None, seed: int | None = None
) -> dict[str, Any]:
    """Flip one bit of a file that no mount holds (a random byte and bit where not given)."""
    import random

    rng = random.Random(seed)
    size = path.stat().st_size
    if offset is None:
        offset = rng.randrange(size)
    if bit is None:
        bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ (1 << bit)]))
    return {"path": str(path), "offset": offset, "bit": bit, "size": size}


@functools.cache
def unavailable() -> str | None:
    """Why a faultfs mount cannot be made here (None: it can): tried for real once."""
    if sys.platform != "linux":
        return "FUSE tests run on Linux only"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import importlib.util

        if importlib.util.find_spec("mfusepy") is None:
            return "mfusepy is not installed (pip install mfusepy)"
    except ImportError:
        return "mfusepy is not installed"
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; os.environ.setdefault('FUSE_LIBRARY_NAME', 'fuse3'); import mfusepy",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        return (
            "libfuse 3 not found (apt-get install fuse3): "
            + probe.stderr.strip().splitlines()[-1:][0]
            if probe.stderr.strip()
            else "mfusepy does not import"
        )
    if os.geteuid() != 0:
        return "faultfs mounts as root (allow_other, umount)"
    base = Path(tempfile.mkdtemp(prefix="faultfs-probe-"))
    fs = FaultFS(base / "disk", base / "mnt", log=base / "log")
    try:
        fs.mount(timeout=15)
        (fs.mountpoint / "probe").write_bytes(b"x")
        fs.unmount()
    except (FaultFSError, OSError) as err:
        return f"a FUSE mount failed here: {err}"
    finally:
        fs.close()
        shutil.rmtree(base, ignore_errors=True)
    return None
