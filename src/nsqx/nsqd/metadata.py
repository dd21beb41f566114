"""nsqd's metadata file and data-directory lock.

``nsqd.dat`` lists the (non-ephemeral) topics and channels and their paused state, in
Go nsqd's JSON shape, so a restart brings them back. It is written whole to a temporary
file, fsynced and renamed over the old one: a crash leaves the old or the new file,
never half of one.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import Any

from nsqx.store.disklog import fsync_dir

METADATA_FILE = "nsqd.dat"
LOCK_FILE = "nsqd.lock"


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)


def write_metadata(data_path: str, topics: list[TopicMeta], version: str) -> None:
    """Atomically replace ``nsqd.dat`` with ``topics``."""
    doc: dict[str, Any] = {
        "topics": [
            {
                "name": t.name,
                "paused": t.paused,
                "channels": [{"name": c.name, "paused": c.paused} for c in t.channels],
            }
            for t in topics
        ],
        "version": version,
    }
    path = os.path.join(data_path, METADATA_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(data_path)


def read_metadata(data_path: str) -> list[TopicMeta]:
    """The topics of ``nsqd.dat``; none if the file does not exist."""
    path = os.path.join(data_path, METADATA_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return []
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    topics = []
    for t in doc.get("topics") or []:
        channels = [
            ChannelMeta(str(c["name"]), bool(c.get("paused", False)))
            for c in t.get("channels") or []
        ]
        topics.append(TopicMeta(str(t["name"]), bool(t.get("paused", False)), channels))
    return topics


class DataDirLock:
    """An exclusive lock on the data directory, so two nsqd never share it."""

    def __init__(self, data_path: str) -> None:
        self.path = os.path.join(data_path, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RuntimeError(
                f"--data-path={os.path.dirname(self.path) or '.'} in use "
                "(possibly by another instance of nsqd)"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
