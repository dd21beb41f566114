"""MetaStore: where nsqlookupd keeps topic records (settings and placements).

The coordinator reads and writes records only through :class:`MetaStore`, so that a
shared backend (etcd, for several lookupds) can replace the embedded one without
touching it. The methods are coroutines because such a backend is remote.

Two embedded implementations, for a single nsqlookupd:

* :class:`MemoryMetaStore`: a dict; the records die with the process (no
  ``--data-path``).
* :class:`FileMetaStore`: the same dict, written after every change to one JSON file
  by temp file + fsync + rename (+ fsync of the directory), so a crash or a power cut
  leaves either the old file or the new one, never a torn one; ``put`` returns once the
  new one is on the disk, and the coordinator tells nodes of a decision (a new epoch)
  only after that, so no node ever holds an epoch that a power cut of nsqlookupd could
  take back (and give again, to another decision). The file is small (a few hundred
  bytes per topic) and changes only on administrative calls, so rewriting it whole
  is simpler than any log and costs nothing that matters.

A shared store (:class:`~nsqx.lookupd.etcd_store.EtcdMetaStore`) is written by the one
nsqlookupd that leads; the others :meth:`~MetaStore.follow` it. Its writes can fail in
ways the embedded ones cannot: :class:`NotLeaderError`, :class:`ConflictError`,
:class:`MetaStoreUnavailable`.
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
from collections.abc import Callable, Mapping

from nsqx.lookupd.topic_record import TopicRecord
from nsqx.store.durable_file import fsync_dir, write_durable

#: The file FileMetaStore keeps in ``--data-path``.
META_FILE = "nsqlookupd.meta.json"
_FORMAT_VERSION = 1

#: Called with (topic, record) when a record changed in a shared store, None when it
#: was deleted.
RecordHook = Callable[[str, TopicRecord | None], None]


class MetaStoreError(Exception):
    """A write the store could not make; the record is unchanged."""


class NotLeaderError(MetaStoreError):
    """This nsqlookupd does not lead (any more): only the leader writes a shared store."""


class ConflictError(MetaStoreError):
    """The record changed in the store since this nsqlookupd read it; read, then retry."""


class MetaStoreUnavailable(MetaStoreError):
    """The store cannot be reached."""


class MetaStore(abc.ABC):
    """Topic records by topic name. Implementations are used from one event loop."""

    #: True for a store that several nsqlookupd share: one of them leads and writes,
    #: the others follow. An embedded store has one writer, which always leads.
    shared = False

    @abc.abstractmethod
    async def get(self, topic: str) -> TopicRecord | None:
        """The topic's record, or None."""

    @abc.abstractmethod
    async def put(self, topic: str, record: TopicRecord) -> None:
        """Store (create or replace) the topic's record; durable when it returns."""

    @abc.abstractmethod
    async def delete(self, topic: str) -> None:
        """Forget the topic (no error if it is unknown); durable when it returns."""

    @abc.abstractmethod
    async def list(self) -> dict[str, TopicRecord]:
        """Every stored topic with its record."""

    async def close(self) -> None:  # noqa: B027 - most stores have nothing to release
        """Release what the store holds."""

    def follow(self, hook: RecordHook) -> None:  # noqa: B027 - one writer: nothing to follow
        """Call ``hook`` for each record that someone else changes in the store (a shared
        store's watch); an embedded store has no other writer."""

    @property
    @abc.abstractmethod
    def durable(self) -> bool:
        """True if the records survive a restart."""


class MemoryMetaStore(MetaStore):
    """Records in memory only (nsqlookupd without ``--data-path``, and tests)."""

    def __init__(self, records: Mapping[str, TopicRecord] | None = None) -> None:
        self._records: dict[str, TopicRecord] = dict(records or {})

    async def get(self, topic: str) -> TopicRecord | None:
        return self._records.get(topic)

    async def put(self, topic: str, record: TopicRecord) -> None:
        self._records[topic] = record

    async def delete(self, topic: str) -> None:
        self._records.pop(topic, None)

    async def list(self) -> dict[str, TopicRecord]:
        return dict(self._records)

    @property
    def durable(self) -> bool:
        return False


class FileMetaStore(MetaStore):
    """Records in one JSON file under a directory, rewritten atomically on each change.

    Open it with :meth:`open`, which reads the file (a missing file is an empty store;
    an unreadable one is an error, so nsqlookupd refuses to start rather than forget
    every topic's placement).
    """

    def __init__(self, directory: str, records: Mapping[str, TopicRecord]) -> None:
        self.directory = directory
        self.path = os.path.join(directory, META_FILE)
        self._records: dict[str, TopicRecord] = dict(records)
        # one write at a time, in order: a later state never loses to an earlier one
        self._write_lock = asyncio.Lock()

    @classmethod
    def open(cls, directory: str) -> FileMetaStore:
        """Read ``directory``'s meta file (creating the directory if needed).

        Raises ValueError naming the file if it is not a valid meta file.
        """
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            # (its entry in the parent: a power cut must not take the directory away
            # with the records written in it)
            fsync_dir(os.path.dirname(os.path.abspath(directory)))
        return cls(directory, read_meta_file(os.path.join(directory, META_FILE)))

    async def get(self, topic: str) -> TopicRecord | None:
        return self._records.get(topic)

    async def put(self, topic: str, record: TopicRecord) -> None:
        old = self._records.get(topic)
        self._records[topic] = record
        try:
            await self._flush()
        except BaseException:
            # not stored: a later write must not store it either (the coordinator acts
            # as if it never was, and may decide otherwise in the same epoch)
            if self._records.get(topic) is record:
                if old is None:
                    del self._records[topic]
                else:
                    self._records[topic] = old
            raise

    async def delete(self, topic: str) -> None:
        old = self._records.pop(topic, None)
        if old is not None:
            try:
                await self._flush()
            except BaseException:
                self._records.setdefault(topic, old)
                raise

    async def list(self) -> dict[str, TopicRecord]:
        return dict(self._records)

    @property
    def durable(self) -> bool:
        return True

    async def _flush(self) -> None:
        async with self._write_lock:
            # the document is built after taking the lock, so it holds every change
            # made before this write started
            doc = _encode(self._records)
            # fsync blocks; it runs in a thread so the event loop keeps serving
            await asyncio.to_thread(write_durable, self.path, doc)


def _encode(records: Mapping[str, TopicRecord]) -> bytes:
    topics = {name: records[name].to_json() for name in sorted(records)}
    doc = {"version": _FORMAT_VERSION, "topics": topics}
    return json.dumps(doc, indent=1, sort_keys=False).encode()


def read_meta_file(path: str) -> dict[str, TopicRecord]:
    """The records of a meta file; empty if it does not exist; ValueError if invalid."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("version") != _FORMAT_VERSION:
            raise ValueError(f"unknown format version {doc.get('version')!r}")
        topics = doc.get("topics")
        if not isinstance(topics, dict):
            raise ValueError("no topics object")
        return {name: TopicRecord.from_json(rec) for name, rec in topics.items()}
    except ValueError as err:
        raise ValueError(f"{path} is not a valid nsqlookupd meta file: {err}") from None
