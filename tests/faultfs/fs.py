"""The filesystem that forgets: FUSE operations over a backing directory, with every
change that was not made durable remembered, so that a "power cut" can take it back.

Changes go through to the backing directory at once (so reads see everything, as they
see the page cache on a real kernel), and what a cut must restore is kept beside them:

- a file's durable state is its size at its last fsync (or at mount) and, for every
  4 KiB page of that size overwritten or cut off since, the page's old bytes (copied into
  an undo file in the attic before the change); its changes since are a log of writes
  (offset, length) and truncates;
- a directory's durable state is a snapshot of its entries taken at its first change
  since its last fsync; its changes since are a log of name operations (set a name to
  a node, remove a name), each with a number shared by the two halves of a rename;
- a file or directory that loses its last name is moved into the attic
  (``<backing>/.faultfs-attic/<ino>``), not deleted, while a durable entry or a pending
  operation still names it.

fsync (or fdatasync) of a file makes its data and size durable; fsync of a directory
makes its entries durable. Nothing else does (POSIX promises nothing more, and a kernel
may write back any of the rest before a power cut or not).

A cut (:meth:`ForgetfulFS.cut`) rebuilds the backing directory from the durable state
plus, by mode, none of the pending changes (``all``: a power cut), an independent random
subset of them (``reorder``), or a random prefix of them in the order they were made
(``torn``: each file keeps a prefix of its pending bytes cut at any byte, the namespace a
prefix of its pending name operations; ``torn-last``: each file keeps all its pending
writes but the last, which is cut at any byte). Then the filesystem answers every call
with EIO until it is unmounted: the processes that used it are dead (the caller
SIGKILLed them first), and a fresh mount over the backing directory starts from what
was durable.

A kept write brings the bytes the file held at the cut in its range (what writeback
would have written); bytes a later truncate had cut away come back as zeros. File
metadata (mode, owner, times) changes at once and is not forgotten. Regular files and
directories only: no links, symlinks or special files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
import threading
from typing import Any

import mfusepy

PAGE = 4096
#: where nodes that lost their names and the undo copies of overwritten pages live;
#: hidden from the mount
ATTIC = ".faultfs-attic"
WRITE, TRUNCATE = 0, 1
MODES = ("all", "reorder", "torn", "torn-last")


def _err(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


class Node:
    """A file or directory, whatever its names (hard links aside: none)."""

    __slots__ = ("ino", "opens")

    def __init__(self, ino: int) -> None:
        self.ino = ino
        #: open handles (a file in the attic is kept while one is open)
        self.opens = 0


class FileNode(Node):
    __slots__ = ("durable_size", "ops", "saved", "undo_fd")

    def __init__(self, ino: int, durable_size: int) -> None:
        super().__init__(ino)
        self.durable_size = durable_size
        #: pages of the durable content whose old bytes are in the undo file
        self.saved: set[int] = set()
        self.undo_fd = -1
        #: changes since the last fsync, in order: (WRITE, offset, length) or
        #: (TRUNCATE, size, 0)
        self.ops: list[tuple[int, int, int]] = []


class DirNode(Node):
    __slots__ = ("durable", "entries", "mode", "ops")

    def __init__(self, ino: int, mode: int, entries: dict[str, Node] | None) -> None:
        super().__init__(ino)
        self.mode = mode
        #: the current entries; None: not read yet (untouched since the mount, so durable)
        self.entries = entries
        #: the durable entries when they differ from the current ones (None: the same)
        self.durable: dict[str, Node] | None = None
        #: name operations since the last fsync: (number, name, node or None: removed)
        self.ops: list[tuple[int, str, Node | None]] = []


class ForgetfulFS(mfusepy.Operations):  # type: ignore[misc]
    """The FUSE operations (mfusepy's high-level API, one thread) and the cut."""

    use_ns = True

    def __init__(self, backing: str) -> None:
        self.backing = os.path.abspath(backing)
        self.attic = os.path.join(self.backing, ATTIC)
        # a leftover attic (a daemon that died) holds nothing the visible tree needs
        shutil.rmtree(self.attic, ignore_errors=True)
        os.mkdir(self.attic, 0o700)
        self.mutex = threading.Lock()
        self._ino = 1
        self._op = 0
        self.root = DirNode(self._next_ino(), os.stat(self.backing).st_mode, None)
        #: open file handles (the backing fd) -> node; open directories -> node
        self.files: dict[int, FileNode] = {}
        self.dirs: dict[int, DirNode] = {}
        self._dir_fh = 1 << 40
        #: directories whose entries differ from their durable ones
        self.changed: set[DirNode] = set()
        #: nodes in the attic
        self.in_attic: set[Node] = set()
        self.dead = ""
        self.mounted = threading.Event()
        #: the struct fuse pointer, for invalidating the kernel's cache of a path
        self.fuse_ptr: int | None = None
        self.counts = {"write": 0, "read": 0, "fsync": 0, "fsyncdir": 0, "names": 0}

    # -- the model ------------------------------------------------------------------------

    def _next_ino(self) -> int:
        self._ino += 1
        return self._ino

    def _bpath(self, path: str) -> str:
        return self.backing if path == "/" else self.backing + path

    def _entries(self, d: DirNode, bpath: str) -> dict[str, Node]:
        if d.entries is None:
            entries: dict[str, Node] = {}
            with os.scandir(bpath) as it:
                for e in it:
                    if d is self.root and e.name == ATTIC:
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        entries[e.name] = DirNode(self._next_ino(), st.st_mode, None)
                    else:
                        entries[e.name] = FileNode(self._next_ino(), st.st_size)
            d.entries = entries
        return d.entries

    def _lookup(self, path: str) -> Node:
        node: Node = self.root
        if path == "/":
            return node
        at = self.backing
        for part in path[1:].split("/"):
            if not isinstance(node, DirNode):
                raise _err(errno.ENOTDIR)
            child = self._entries(node, at).get(part)
            if child is None:
                raise _err(errno.ENOENT)
            node = child
            at = at + "/" + part
        return node

    def _parent(self, path: str) -> tuple[DirNode, str, dict[str, Node]]:
        head, _, name = path.rpartition("/")
        if name == ATTIC and not head:
            raise _err(errno.EPERM)
        parent = self._lookup(head or "/")
        if not isinstance(parent, DirNode):
            raise _err(errno.ENOTDIR)
        return parent, name, self._entries(parent, self._bpath(head or "/"))

    def _change(self, d: DirNode) -> None:
        """Before a change of ``d``'s entries: its durable ones are what it has now."""
        if d.durable is None:
            assert d.entries is not None
            d.durable = dict(d.entries)
            self.changed.add(d)

    def _name_op(self) -> int:
        self._op += 1
        self.counts["names"] += 1
        return self._op

    def _to_attic(self, node: Node, bpath: str) -> None:
        os.rename(bpath, os.path.join(self.attic, str(node.ino)))
        self.in_attic.add(node)

    def _referenced(self, node: Node) -> bool:
        if node.opens:
            return True
        for d in self.changed:
            assert d.durable is not None
            if any(n is node for n in d.durable.values()):
                return True
            if any(n is node for _, _, n in d.ops):
                return True
        return False

    def _collect(self, nodes: list[Node]) -> None:
        """Delete attic nodes nothing can bring back any more."""
        for node in nodes:
            if node in self.in_attic and not self._referenced(node):
                self.in_attic.discard(node)
                at = os.path.join(self.attic, str(node.ino))
                if isinstance(node, DirNode) and node.entries is None:
                    shutil.rmtree(at, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(at)
                if isinstance(node, FileNode):
                    self._forget_undo(node)

    def _undo_path(self, node: FileNode) -> str:
        return os.path.join(self.attic, f"{node.ino}.undo")

    def _forget_undo(self, node: FileNode) -> None:
        node.saved.clear()
        if node.undo_fd >= 0:
            os.close(node.undo_fd)
            node.undo_fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._undo_path(node))

    def _save(self, node: FileNode, fd: int, lo: int, hi: int) -> None:
        """Keep the durable bytes of every page in [lo, hi) before they change."""
        hi = min(hi, node.durable_size)
        if lo >= hi:
            return
        if node.undo_fd < 0:
            node.undo_fd = os.open(self._undo_path(node), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        page = lo // PAGE
        last = (hi - 1) // PAGE
        while page <= last:
            if page in node.saved:
                page += 1
                continue
            run = page
            while run <= last and run not in node.saved:
                node.saved.add(run)
                run += 1
            start, end = page * PAGE, min(run * PAGE, node.durable_size)
            _copy(fd, node.undo_fd, start, end - start)
            page = run

    def _durable(self, node: FileNode, fd: int) -> None:
        node.durable_size = os.fstat(fd).st_size
        node.ops.clear()
        self._forget_undo(node)

    def _check(self) -> None:
        if self.dead:
            raise _err(errno.EIO)

    # -- FUSE operations ------------------------------------------------------------------

    def init_with_config(self, conn_info: Any, config: Any) -> None:
        ctx = mfusepy._libfuse.fuse_get_context()
        self.fuse_ptr = ctx.contents.fuse
        self.mounted.set()

    def destroy(self, path: str) -> None:
        self.mounted.clear()

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        self._check()
        if fh is not None and fh in self.files:
            st = os.fstat(fh)
        elif path is None:
            raise _err(errno.ENOENT)
        else:
            if path == "/" + ATTIC:
                raise _err(errno.ENOENT)
            st = os.lstat(self._bpath(path))
        return {
            "st_mode": st.st_mode,
            "st_ino": st.st_ino,
            "st_nlink": st.st_nlink,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_size": st.st_size,
            "st_blocks": st.st_blocks,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.backing)
        return {
            k: getattr(sv, k)
            for k in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    def opendir(self, path: str) -> int:
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if not isinstance(node, DirNode):
                raise _err(errno.ENOTDIR)
            self._dir_fh += 1
            self.dirs[self._dir_fh] = node
            node.opens += 1
            return self._dir_fh

    def readdir(self, path: str | None, fh: int) -> list[str]:
        with self.mutex:
            self._check()
            node = self.dirs.get(fh)
            if node is None or path is None:
                raise _err(errno.EBADF)
            names = list(self._entries(node, self._bpath(path)))
        return [".", "..", *names]

    def releasedir(self, path: str | None, fh: int) -> int:
        with self.mutex:
            node = self.dirs.pop(fh, None)
            if node is not None:
                node.opens -= 1
                if not self.dead:
                    self._collect([node])
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            node = self.dirs.get(fh)
            if node is None:
                raise _err(errno.EBADF)
            self.counts["fsyncdir"] += 1
            if node.durable is not None:
                gone = [*node.durable.values(), *(n for _, _, n in node.ops if n is not None)]
                node.durable = None
                node.ops.clear()
                self.changed.discard(node)
                self._collect(gone)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self._check()
            parent, name, entries = self._parent(path)
            os.mkdir(self._bpath(path), mode)
            node = DirNode(self._next_ino(), os.lstat(self._bpath(path)).st_mode, {})
            node.durable = {}  # a new directory's durable entries: none
            self.changed.add(node)
            self._change(parent)
            entries[name] = node
            parent.ops.append((self._name_op(), name, node))
        return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self._check()
            parent, name, entries = self._parent(path)
            node = entries.get(name)
            if not isinstance(node, DirNode):
                raise _err(errno.ENOTDIR if node is not None else errno.ENOENT)
            if self._entries(node, self._bpath(path)):
                raise _err(errno.ENOTEMPTY)
            os.rmdir(self._bpath(path))
            self._change(parent)
            del entries[name]
            # (its durable entries may still name files in the attic: the node stays in
            # the parent's durable entries, and a cut makes the directory anew)
            parent.ops.append((self._name_op(), name, None))
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._check()
            parent, name, entries = self._parent(path)
            node = entries.get(name)
            if node is None:
                raise _err(errno.ENOENT)
            if isinstance(node, DirNode):
                raise _err(errno.EISDIR)
            self._to_attic(node, self._bpath(path))
            self._change(parent)
            del entries[name]
            parent.ops.append((self._name_op(), name, None))
            self._collect([node])
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        with self.mutex:
            self._check()
            if flags & ~1:  # RENAME_NOREPLACE only (no RENAME_EXCHANGE, no whiteouts)
                raise _err(errno.EINVAL)
            src, a, src_entries = self._parent(old)
            dst, b, dst_entries = self._parent(new)
            node = src_entries.get(a)
            if node is None:
                raise _err(errno.ENOENT)
            replaced = dst_entries.get(b)
            if replaced is node:
                return 0
            if replaced is not None and flags & 1:
                raise _err(errno.EEXIST)
            if isinstance(replaced, DirNode):
                if not isinstance(node, DirNode):
                    raise _err(errno.EISDIR)
                if self._entries(replaced, self._bpath(new)):
                    raise _err(errno.ENOTEMPTY)
            elif replaced is not None and isinstance(node, DirNode):
                raise _err(errno.ENOTDIR)
            if isinstance(replaced, FileNode):
                self._to_attic(replaced, self._bpath(new))
                try:
                    os.rename(self._bpath(old), self._bpath(new))
                except OSError:
                    os.rename(os.path.join(self.attic, str(replaced.ino)), self._bpath(new))
                    self.in_attic.discard(replaced)
                    raise
            else:
                os.rename(self._bpath(old), self._bpath(new))
            self._change(src)
            self._change(dst)
            number = self._name_op()
            del src_entries[a]
            src.ops.append((number, a, None))
            dst_entries[b] = node
            dst.ops.append((number, b, node))
            if replaced is not None:
                self._collect([replaced])
        return 0

    def _open_backing(self, path: str, flags: int, mode: int = 0o644) -> int:
        # always readable: overwritten pages are copied out first; never O_APPEND (the
        # kernel gives every write its offset, and pwrite on an O_APPEND fd ignores it)
        acc = os.O_RDWR if flags & (os.O_WRONLY | os.O_RDWR) else os.O_RDONLY
        keep = flags & (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
        return os.open(self._bpath(path), acc | keep, mode)

    def create(self, path: str, mode: int, flags: int) -> int:
        with self.mutex:
            self._check()
            parent, name, entries = self._parent(path)
            node = entries.get(name)
            if node is not None:
                if flags & os.O_EXCL:
                    raise _err(errno.EEXIST)
                return self._open(path, node, flags)
            fd = self._open_backing(path, flags | os.O_CREAT | os.O_EXCL, mode)
            fnode = FileNode(self._next_ino(), 0)
            self._change(parent)
            entries[name] = fnode
            parent.ops.append((self._name_op(), name, fnode))
            fnode.opens += 1
            self.files[fd] = fnode
            return fd

    def _open(self, path: str, node: Node, flags: int) -> int:
        if not isinstance(node, FileNode):
            raise _err(errno.EISDIR)
        fd = self._open_backing(path, flags & ~(os.O_CREAT | os.O_EXCL))
        if flags & os.O_TRUNC:
            self._truncate(node, fd, 0)
        node.opens += 1
        self.files[fd] = node
        return fd

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self._check()
            return self._open(path, self._lookup(path), flags)

    def release(self, path: str | None, fh: int) -> int:
        with self.mutex:
            node = self.files.pop(fh, None)
            if node is not None:
                node.opens -= 1
                os.close(fh)
                if not self.dead:
                    self._collect([node])
        return 0

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        if self.dead:
            raise _err(errno.EIO)
        self.counts["read"] += 1
        return os.pread(fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self._check()
            node = self.files[fh]
            if offset < node.durable_size:
                self._save(node, fh, offset, offset + len(data))
            n = os.pwrite(fh, data, offset)
            node.ops.append((WRITE, offset, n))
            self.counts["write"] += 1
            return n

    def _truncate(self, node: FileNode, fd: int, length: int) -> None:
        if length < node.durable_size:
            self._save(node, fd, length, node.durable_size)
        os.ftruncate(fd, length)
        node.ops.append((TRUNCATE, length, 0))

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            if fh is not None and fh in self.files:
                self._truncate(self.files[fh], fh, length)
                return 0
            if path is None:
                raise _err(errno.EBADF)
            node = self._lookup(path)
            if not isinstance(node, FileNode):
                raise _err(errno.EISDIR)
            fd = os.open(self._bpath(path), os.O_RDWR)
            try:
                self._truncate(node, fd, length)
            finally:
                os.close(fd)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            self.counts["fsync"] += 1
            self._durable(self.files[fh], fh)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._check()
        os.chmod(self._bpath(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._check()
        os.chown(self._bpath(path), uid, gid, follow_symlinks=False)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._check()
        os.utime(self._bpath(path), ns=times)
        return 0

    # -- corruption (the disk's, under both the durable and the current state) ----------

    def flip_bit(
        self, path: str, offset: int | None, bit: int | None, seed: int | None
    ) -> dict[str, Any]:
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if not isinstance(node, FileNode):
                raise _err(errno.EISDIR)
            rng = random.Random(seed)
            fd = os.open(self._bpath(path), os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                if offset is None:
                    if size == 0:
                        raise _err(errno.EINVAL)
                    offset = rng.randrange(size)
                if not 0 <= offset < size:
                    raise _err(errno.EINVAL)
                if bit is None:
                    bit = rng.randrange(8)
                _flip(fd, offset, bit)
                if offset // PAGE in node.saved:
                    _flip(node.undo_fd, offset, bit)
            finally:
                os.close(fd)
        self._invalidate(path)
        return {"path": path, "offset": offset, "bit": bit, "size": size}

    def cut_file(self, path: str, length: int) -> dict[str, Any]:
        """Truncate a file on the disk: its durable and its current size."""
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if not isinstance(node, FileNode):
                raise _err(errno.EISDIR)
            size = os.stat(self._bpath(path)).st_size
            if length < size:
                os.truncate(self._bpath(path), length)
            node.durable_size = min(node.durable_size, length)
        self._invalidate(path)
        return {"path": path, "length": length, "size": size}

    def _invalidate(self, path: str) -> None:
        """Drop the kernel's cached pages and attributes of ``path`` (best effort)."""
        fn = getattr(mfusepy._libfuse, "fuse_invalidate_path", None)
        if fn is not None and self.fuse_ptr:
            with contextlib.suppress(Exception):
                fn.argtypes = [mfusepy.ctypes.c_void_p, mfusepy.ctypes.c_char_p]
                fn(self.fuse_ptr, path.encode())

    # -- the cut --------------------------------------------------------------------------

    def cut(self, mode: str = "all", seed: int | None = None, p: float = 0.5) -> dict[str, Any]:
        """Lose what was not durable (see the module's docstring for ``mode``), rebuild
        the backing directory, and refuse every call from now on."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        with self.mutex:
            if self.dead:
                raise RuntimeError(f"already cut ({self.dead})")
            self.dead = mode
            rng = random.Random(seed)
            # the root's entries: every directory below that was never read is moved
            # back whole, as it was
            self._entries(self.root, self.backing)
            numbers = sorted({n for d in self.changed for n, _, _ in d.ops})
            if mode == "reorder":
                kept = {n for n in numbers if rng.random() < p}
            elif mode == "torn":
                kept = set(numbers[: rng.randint(0, len(numbers))])
            else:
                kept = set()
            plan: list[tuple[str, Node]] = []
            self._plan(self.root, "", kept, plan, set())
            where = self._locations()
            images: dict[FileNode, list[tuple[int, int, bytes]]] = {}
            report: dict[str, Any] = {
                "mode": mode,
                "names_pending": len(numbers),
                "names_kept": len(kept),
                "files": {},
            }
            for _, node in plan:
                if isinstance(node, FileNode) and node not in images and node in where:
                    images[node] = self._image(node, where[node], mode, rng, p)
            for fd in list(self.files):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.files.clear()
            self._evacuate()
            placed: dict[Node, str] = {}
            for path, node in plan:
                target = self.backing + path
                if isinstance(node, DirNode) and node.entries is not None:
                    os.mkdir(target, stat.S_IMODE(node.mode))
                    continue
                if node in placed:
                    if isinstance(node, FileNode):
                        os.link(placed[node], target)
                    continue
                os.rename(os.path.join(self.attic, str(node.ino)), target)
                placed[node] = target
                if isinstance(node, FileNode):
                    before = where.get(node, ("", -1))[1]
                    after = self._restore(node, target, images.get(node, []))
                    if before != after or node.ops:
                        report["files"][path] = {"size": before, "now": after}
            for node in (n for n in where if isinstance(n, FileNode)):
                if node.undo_fd >= 0:
                    os.close(node.undo_fd)
                    node.undo_fd = -1
            shutil.rmtree(self.attic, ignore_errors=True)
            report["lost_names"] = sorted(
                p for p, _ in self._current_paths() if p not in {q for q, _ in plan}
            )[:50]
            return report

    def _plan(
        self, d: DirNode, path: str, kept: set[int], plan: list[tuple[str, Node]], seen: set[Node]
    ) -> None:
        """The durable tree under ``d`` (with the kept name operations), parents first."""
        if d.entries is None:
            return
        entries = dict(d.durable if d.durable is not None else d.entries)
        for number, name, node in d.ops:
            if number in kept:
                if node is None:
                    entries.pop(name, None)
                else:
                    entries[name] = node
        for name in sorted(entries):
            child = entries[name]
            at = f"{path}/{name}"
            if isinstance(child, DirNode):
                if child in seen:  # a directory in two places: a directory has one name
                    continue
                seen.add(child)
                plan.append((at, child))
                self._plan(child, at, kept, plan, seen)
            else:
                plan.append((at, child))

    def _current_paths(self) -> list[tuple[str, Node]]:
        out: list[tuple[str, Node]] = []

        def walk(d: DirNode, path: str) -> None:
            for name, child in (d.entries or {}).items():
                out.append((f"{path}/{name}", child))
                if isinstance(child, DirNode):
                    walk(child, f"{path}/{name}")

        walk(self.root, "")
        return out

    def _locations(self) -> dict[Node, tuple[str, int]]:
        """Where every file's bytes are now (backing path, size)."""
        out: dict[Node, tuple[str, int]] = {}
        for path, node in self._current_paths():
            if isinstance(node, FileNode):
                at = self.backing + path
                out[node] = (at, os.lstat(at).st_size)
        for node in self.in_attic:
            if isinstance(node, FileNode):
                at = os.path.join(self.attic, str(node.ino))
                out[node] = (at, os.lstat(at).st_size)
        return out

    def _image(
        self, node: FileNode, where: tuple[str, int], mode: str, rng: random.Random, p: float
    ) -> list[tuple[int, int, bytes]]:
        """The pending changes of ``node`` that reach the disk, with their bytes as the
        file holds them now: (WRITE, offset, bytes) or (TRUNCATE, size, b"")."""
        ops = node.ops
        if mode == "all" or not ops:
            return []
        if mode == "reorder":
            chosen = [(op, op[2]) for op in ops if rng.random() < p]
        elif mode == "torn":
            total = sum(n for kind, _, n in ops if kind == WRITE)
            budget = rng.randint(0, total)
            chosen = []
            for op in ops:
                if op[0] == TRUNCATE:
                    chosen.append((op, 0))
                    continue
                if budget <= 0:
                    break
                chosen.append((op, min(op[2], budget)))
                budget -= op[2]
        else:  # torn-last: every pending change, the last write cut at any byte
            chosen = [(op, op[2]) for op in ops]
            writes = [i for i, op in enumerate(ops) if op[0] == WRITE]
            if writes:
                last = ops[writes[-1]]
                chosen[writes[-1]] = (last, rng.randint(0, last[2]))
        out: list[tuple[int, int, bytes]] = []
        fd = os.open(where[0], os.O_RDONLY)
        try:
            for (kind, at, _), n in chosen:
                if kind == TRUNCATE:
                    out.append((TRUNCATE, at, b""))
                elif n:
                    data = os.pread(fd, n, at)
                    out.append((WRITE, at, data + bytes(n - len(data))))
        finally:
            os.close(fd)
        return out

    def _restore(self, node: FileNode, target: str, image: list[tuple[int, int, bytes]]) -> int:
        """Bring the file at ``target`` back to its durable state plus ``image``."""
        fd = os.open(target, os.O_RDWR)
        try:
            if node.ops or node.saved:
                os.ftruncate(fd, node.durable_size)
                for page in sorted(node.saved):
                    start = page * PAGE
                    n = min(PAGE, node.durable_size - start)
                    if n > 0:
                        os.pwrite(fd, os.pread(node.undo_fd, n, start), start)
                for kind, at, data in image:
                    if kind == TRUNCATE:
                        os.ftruncate(fd, at)
                    else:
                        os.pwrite(fd, data, at)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _evacuate(self) -> None:
        """Move every file (and every directory never read) of the visible tree into the
        attic by its number, and remove the directories: the durable tree is built anew."""

        def walk(d: DirNode, bpath: str) -> None:
            assert d.entries is not None
            for name, child in d.entries.items():
                at = f"{bpath}/{name}"
                if isinstance(child, DirNode) and child.entries is not None:
                    walk(child, at)
                    try:
                        os.rmdir(at)
                    except OSError:  # something made behind the mount's back: set aside
                        os.rename(at, os.path.join(self.attic, f"junk-{child.ino}"))
                else:
                    self._to_attic(child, at)

        walk(self.root, self.backing)


def _copy(src: int, dst: int, at: int, n: int) -> None:
    """Copy ``n`` bytes at offset ``at`` of ``src`` to the same offset of ``dst``."""
    done = 0
    while done < n:
        try:
            k = os.copy_file_range(src, dst, n - done, at + done, at + done)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            data = os.pread(src, n - done, at + done)
            k = os.pwrite(dst, data, at + done) if data else 0
        if k == 0:
            break
        done += k


def _flip(fd: int, offset: int, bit: int) -> None:
    old = os.pread(fd, 1, offset)
    os.pwrite(fd, bytes([old[0] ^ (1 << bit)]), offset)
