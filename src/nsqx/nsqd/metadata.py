"""nsqd's metadata file and data-directory lock.

``nsqd.dat`` lists the (non-ephemeral) topics and channels and their paused state, in
Go nsqd's JSON shape, so a restart brings them back. Partitioned topics (Youzan's
extension) add their settings and, per local partition, its channels; the top-level
``channels`` are then the default partition's, so the file still reads as NSQ's. It is written whole to a temporary
file, fsynced and renamed over the old one: a crash leaves the old or the new file,
never half of one.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nsqx.store.durable_file import write_durable

METADATA_FILE = "nsqd.dat"
LOCK_FILE = "nsqd.lock"


@dataclass
class ChannelMetadata:
    name: str
    paused: bool = False
    #: made ordered by SUB_ORDERED (sticky until /channel/setorder)
    ordered: bool = False
    #: its policy's settings that are not the default (nsqx.nsqd.channel_policy)
    policy: dict[str, Any] = field(default_factory=dict)
    #: how far /channel/deadletter/replay has looked in each dead-letter topic and
    #: partition ("topic:partition" -> [next sequence, publish time of the one before])
    replay_marks: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: the one mark of a file written before marks were kept per dead-letter topic
    #: (``replay_mark``: in the topic the channel's policy named); read, never written
    legacy_replay_mark: int = 0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "paused": self.paused}
        if self.ordered:
            doc["ordered"] = True
        if self.policy:
            doc["policy"] = self.policy
        if self.replay_marks:
            doc["replay_marks"] = {k: list(v) for k, v in self.replay_marks.items()}
        return doc

    @classmethod
    def from_json(cls, c: dict[str, Any]) -> ChannelMetadata:
        policy = c.get("policy")
        marks: dict[str, tuple[int, int]] = {}
        for key, value in (c.get("replay_marks") or {}).items():
            if isinstance(value, list) and len(value) == 2:
                marks[str(key)] = (int(value[0]), int(value[1]))
        return cls(
            str(c["name"]),
            bool(c.get("paused", False)),
            bool(c.get("ordered", False)),
            dict(policy) if isinstance(policy, dict) else {},
            marks,
            int(c.get("replay_mark", 0) or 0),
        )


@dataclass
class TopicMetadata:
    name: str
    paused: bool = False
    channels: list[ChannelMetadata] = field(default_factory=list)
    #: the topic's TopicMeta as JSON (None: an NSQ 1.3 topic)
    settings: dict[str, Any] | None = None
    #: local partition id -> its channels (None: partition 0 only, with ``channels``)
    partitions: dict[int, list[ChannelMetadata]] | None = None
    #: one shard per worker (--worker-shards): ``partitions`` are its shards
    sharded: bool = False


def write_metadata(data_path: str, topics: list[TopicMetadata], version: str) -> None:
    """Atomically replace ``nsqd.dat`` with ``topics``."""
    docs = []
    for t in topics:
        doc: dict[str, Any] = {
            "name": t.name,
            "paused": t.paused,
            "channels": [c.to_json() for c in t.channels],
        }
        if t.settings is not None:
            doc["settings"] = t.settings
        if t.sharded:
            doc["worker_shards"] = True
        if t.partitions is not None:
            doc["partitions"] = [
                {"id": pid, "channels": [c.to_json() for c in chans]}
                for pid, chans in t.partitions.items()
            ]
        docs.append(doc)
    body: dict[str, Any] = {"topics": docs, "version": version}
    write_durable(os.path.join(data_path, METADATA_FILE), json.dumps(body).encode())


#: the settings of a partitioned topic as nsqd.dat first kept them (nsqx 516d1c3 to
#: ff30352: TopicSettings): the names that are TopicMeta's now
_FIRST_SHAPE_NAMES = {"sync_disk": "sync_every"}


def settings_of_first_shape(old: dict[str, Any]) -> dict[str, Any]:
    """A partitioned topic's settings as nsqd.dat kept them first (``sync_disk`` for
    ``sync_every``, no ``suggest_lf``), in TopicMeta's shape (the one read now); the
    upgrade fixture upgrade_partitions holds such a file."""
    new = {_FIRST_SHAPE_NAMES.get(k, k): v for k, v in old.items()}
    new.setdefault("suggest_lf", 0)
    return new


def read_metadata(data_path: str) -> list[TopicMetadata]:
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
        channels = [ChannelMetadata.from_json(c) for c in t.get("channels") or []]
        partitions = None
        if isinstance(t.get("partitions"), list):
            partitions = {
                int(p["id"]): [ChannelMetadata.from_json(c) for c in p.get("channels") or []]
                for p in t["partitions"]
            }
        settings = t.get("settings") if isinstance(t.get("settings"), dict) else None
        if settings is not None and "sync_disk" in settings:
            settings = settings_of_first_shape(settings)
        topics.append(
            TopicMetadata(
                str(t["name"]),
                bool(t.get("paused", False)),
                channels,
                settings,
                partitions,
                bool(t.get("worker_shards", False)),
            )
        )
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

    def fileno(self) -> int:
        """The locked file's descriptor (-1: not held). A child process given it holds
        the lock with this one until both closed it: a node's workers do, so that the
        directory is not free while any of them runs."""
        return -1 if self._fd is None else self._fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


#: the lock the workers of one node take to rewrite nsqd.dat (each its own partitions)
MERGE_LOCK_FILE = "nsqd.dat.lock"


class MetadataMergeLock:
    """Held while a worker reads, merges and rewrites ``nsqd.dat`` (a blocking flock:
    rewrites are rare and take a millisecond)."""

    def __init__(self, data_path: str) -> None:
        self.path = os.path.join(data_path, MERGE_LOCK_FILE)
        self._fd: int | None = None

    def __enter__(self) -> MetadataMergeLock:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def merge_metadata(
    existing: list[TopicMetadata],
    mine: list[TopicMetadata],
    owns: Callable[[str, int], bool],
) -> list[TopicMetadata]:
    """nsqd.dat after one worker's rewrite: ``existing`` without the partitions this
    worker owns (``owns(topic, partition)``), plus ``mine`` (what it hosts now). A topic
    of NSQ 1.3 (one partition, 0) is its owner's entry; a partitioned topic's entry
    gathers every worker's partitions, with the settings of the last writer (the same
    in every worker)."""
    merged: dict[str, TopicMetadata] = {}
    for t in existing:
        if t.partitions is None:
            if not owns(t.name, 0):
                merged[t.name] = t
            continue
        kept = {pid: chans for pid, chans in t.partitions.items() if not owns(t.name, pid)}
        if kept:
            merged[t.name] = TopicMetadata(t.name, t.paused, [], t.settings, kept, t.sharded)
    for t in mine:
        other = merged.get(t.name)
        if other is None or other.partitions is None or t.partitions is None:
            merged[t.name] = t
            continue
        partitions = dict(other.partitions)
        partitions.update(t.partitions)
        merged[t.name] = TopicMetadata(
            t.name,
            t.paused,
            [],
            t.settings,
            dict(sorted(partitions.items())),
            t.sharded or other.sharded,
        )
    for t in merged.values():
        # the top-level channels are the lowest partition's, so the file still reads as NSQ's
        if t.partitions:
            t.channels = t.partitions[min(t.partitions)]
    return list(merged.values())
