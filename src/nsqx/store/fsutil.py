"""Small file-system helpers of the store: unlink if there, a file's size, a free name
for what is set aside (a directory's fsync is nsqx.store.durable_file's)."""

from __future__ import annotations

import os


def remove_file(path: str) -> None:
    """Unlink ``path`` if it is there."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def file_size(path: str) -> int:
    """The size of ``path``, 0 if it cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def free_name(path: str) -> str:
    """``path``, or ``path.1``, ``path.2``...: never overwrite what was set aside."""
    name, n = path, 0
    while os.path.exists(name):
        n += 1
        name = f"{path}.{n}"
    return name
