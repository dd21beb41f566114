"""Small durable files: replaced whole and atomically, on disk when the call returns.

nsqd's and nsqlookupd's small state files (metadata, channel cursors, a partition's
state, the node id, replica roles, the lookupd meta store) are written the way
go-diskqueue writes its metadata: the new content goes to a temporary file beside the
old one, which is fsynced, renamed over the old one, and then the directory is fsynced
(the rename is an entry of the directory: without that fsync a power loss can bring
the old file back, or leave none). A reader sees the old file or the new one, never a
mix, and once :func:`write_durable` returns the new one survives a power loss.
Every step blocks on the disk: callers on the event loop run it in a thread.
"""

from __future__ import annotations

import os

__all__ = ["fsync_dir", "makedirs_durable", "write_durable"]


def write_durable(path: str, data: bytes) -> None:
    """Replace the file at ``path`` with ``data``: atomically, and durably on return.

    The temporary file is ``path + ".tmp"`` (one writer per file at a time; a crash's
    leftover is overwritten by the next write). An OSError leaves the old file as it
    was.
    """
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    """fsync a directory (its entries: files created, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each directory it makes fsynced into its
    parent: a directory's entry is the parent's data, so without that fsync a power
    cut can take a new directory away with every file written and fsynced in it."""
    path = os.path.abspath(path)
    missing: list[str] = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass  # (made meanwhile by another: its fsync may not have happened yet)
        fsync_dir(os.path.dirname(directory))
