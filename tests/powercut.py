"""What a power cut leaves of a directory tree, recorded in this process.

:class:`PowerCut` wraps ``os.fsync`` and ``os.fdatasync`` while a test runs an nsqd (or
a log) in this process: each call records what it makes durable under ``root``, as
POSIX promises it: a file's bytes as they were when its fsync began (by inode: a file
written, fsynced, then renamed keeps them), and a directory's entries (names and the
inodes they name) when the directory is fsynced. :meth:`PowerCut.cut` stops recording
(the power is gone: what the process does after does not count), and
:meth:`PowerCut.leave` writes into another directory the tree a restart would find:
only entries made durable, each file with the bytes made durable (none if it never
was), and with ``torn`` each file that had grown by appending also keeps a random
prefix of the bytes appended since its last fsync (a torn write). Entries and bytes
that were there when recording began count as durable.

It is an in-process model for the single node's tests: the fault suite's filesystem
(docs/reliability.md) does the same to real processes below them.
"""

from __future__ import annotations

import os
import random
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

Entries = dict[str, tuple[int, bool]]


class PowerCut:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, fsync_delay: float = 0.0):
        self.root = str(root)
        self._lock = threading.Lock()
        self._recording = True
        #: durable bytes by inode
        self.content: dict[int, bytes] = {}
        #: durable entries by directory path
        self.entries: dict[str, Entries] = {}
        self.fsyncs = 0
        self._delay = fsync_delay
        for dirpath, _dirs, _files in os.walk(self.root):
            self._record_dir(dirpath)
            for name, (ino, is_dir) in self.entries[dirpath].items():
                if not is_dir:
                    self.content[ino] = Path(dirpath, name).read_bytes()
        real_fsync, real_fdatasync = os.fsync, os.fdatasync
        monkeypatch.setattr(os, "fsync", self._wrap(real_fsync))
        monkeypatch.setattr(os, "fdatasync", self._wrap(real_fdatasync))

    def _record_dir(self, path: str) -> None:
        out: Entries = {}
        for name in os.listdir(path):
            try:
                st = os.lstat(os.path.join(path, name))
            except FileNotFoundError:
                continue
            out[name] = (st.st_ino, stat.S_ISDIR(st.st_mode))
        self.entries[path] = out

    def _wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def synced(fd: int) -> None:
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if path.startswith(self.root):
                st = os.fstat(fd)
                with self._lock:
                    if self._recording:
                        if stat.S_ISDIR(st.st_mode):
                            self._record_dir(path)
                        else:
                            # what the file holds now, when its fsync begins: what is
                            # written during the fsync may or may not be covered
                            with open(path, "rb") as f:
                                self.content[st.st_ino] = f.read()
                        self.fsyncs += 1
                if self._delay:
                    time.sleep(self._delay)  # a slow disk
            real(fd)

        return synced

    def undurable(self, path: str) -> int:
        """How many bytes of the file at ``path`` a cut now would lose (or would not
        find durable yet)."""
        with self._lock:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return 0
            return st.st_size - len(self.content.get(st.st_ino, b""))

    def cut(self) -> None:
        """The power goes: nothing from now on is recorded."""
        with self._lock:
            self._recording = False

    def leave(self, dest: Path, torn: random.Random | None = None) -> None:
        """Write into ``dest`` the tree a restart after the cut finds."""
        self.cut()
        self._leave(self.root, str(dest), torn)

    def _leave(self, src: str, dst: str, torn: random.Random | None) -> None:
        os.makedirs(dst, exist_ok=True)
        for name, (ino, is_dir) in self.entries.get(src, {}).items():
            if is_dir:
                self._leave(os.path.join(src, name), os.path.join(dst, name), torn)
                continue
            data = self.content.get(ino, b"")
            if torn is not None:
                try:
                    now = Path(src, name).read_bytes()
                except OSError:
                    now = b""
                if len(now) > len(data) and now.startswith(data):
                    data = now[: len(data) + torn.randint(0, len(now) - len(data))]
            Path(dst, name).write_bytes(data)
