"""Small file-system helpers of the store: unlink if there, a file's size, a free name
for what is set aside and a copy of damaged bytes (a directory's fsync is
nsqx.store.durable_file's)."""

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


def keep_bad_bytes(segment: str, pos: int, data: bytes) -> str:
    """Keep a copy of damaged bytes of ``segment`` from file position ``pos`` (the
    operator's evidence) in ``<segment>.<pos>.bad``, unless that file holds them
    already (damage left in place is found again at every start); its path."""
    base = f"{segment}.{pos}.bad"
    path, n = base, 0
    while os.path.exists(path):
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    return path
        except OSError:
            pass
        n += 1
        path = f"{base}.{n}"
    with open(path, "wb") as f:
        f.write(data)
    return path
