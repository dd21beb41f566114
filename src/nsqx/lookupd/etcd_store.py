"""EtcdMetaStore: topic records in etcd v3, shared by several nsqlookupd.

Layout, under ``/nsqx/<cluster-id>/`` (:class:`EtcdKeys`)::

    topics/<topic>       one topic's TopicRecord, as JSON (what to_json() gives)
    lookupd/leader       the leading nsqlookupd, held by its lease (leadership.py)
    lookupd/nodes/<id>   every running nsqlookupd, held by its lease

The record is stored as the JSON document the record makes of itself; this module
never looks inside it, so fields added to TopicRecord travel with it.

Who writes: only the leading nsqlookupd. Every put and delete is one etcd transaction
that compares (1) the leader key's create revision with the one this nsqlookupd got
when it won (the *fence*: a deposed leader's late write fails, even if it does not yet
know it lost) and (2) the topic key's mod revision with the one this store last saw (a
change made meanwhile by anyone else is not overwritten). A failed compare raises
:class:`~nsqx.lookupd.meta_store.NotLeaderError` or
:class:`~nsqx.lookupd.meta_store.ConflictError`; etcd out of reach raises
:class:`~nsqx.lookupd.meta_store.MetaStoreUnavailable`.

Who reads: every nsqlookupd keeps all records in memory (a few hundred bytes a topic)
and in step with etcd by watching the ``topics/`` prefix (:meth:`EtcdMetaStore.follow`);
each change made by another nsqlookupd is handed to the hook (the coordinator's
``record_changed``). After any break of the watch (etcd restarted, unreachable, or the
watched revision compacted) the store lists the prefix again and hands over what
differs, then watches from the listed revision on. The etcd client is
:class:`~nsqx.lookupd.etcd_client.EtcdClient` (etcd's JSON gateway over aiohttp; its
docstring says why).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from nsqx.lookupd.etcd_client import (
    EtcdClient,
    EtcdError,
    KeyValue,
    cmp_create_revision,
    cmp_mod_revision,
    op_delete,
    op_put,
    op_range,
    prefix_end,
)
from nsqx.lookupd.meta_store import (
    ConflictError,
    MetaStore,
    MetaStoreUnavailable,
    NotLeaderError,
    RecordHook,
)
from nsqx.lookupd.topic_record import TopicRecord

log = logging.getLogger("nsqx.lookupd")

#: What a cluster id may be: it is a path segment of every key.
_CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")

#: Longest pause between two attempts to watch again while etcd is away.
RESYNC_DELAY_MAX = 2.0

#: While this nsqlookupd leads: the create revision of the leader key it holds (the
#: fence its writes compare); None when it does not lead.
Fence = Callable[[], int | None]


def check_cluster_id(cluster_id: str) -> str:
    """``cluster_id`` if it can be a key segment; ValueError otherwise."""
    if not _CLUSTER_ID_RE.match(cluster_id):
        raise ValueError(
            f"--cluster-id must be 1-64 letters, digits, '.', '_' or '-', got {cluster_id!r}"
        )
    return cluster_id


@dataclass(frozen=True)
class EtcdKeys:
    """The keys of one nsqx cluster in etcd."""

    cluster_id: str

    @property
    def root(self) -> bytes:
        return f"/nsqx/{self.cluster_id}/".encode()

    @property
    def topics_prefix(self) -> bytes:
        return self.root + b"topics/"

    def topic(self, name: str) -> bytes:
        return self.topics_prefix + name.encode()

    @property
    def leader(self) -> bytes:
        return self.root + b"lookupd/leader"

    @property
    def nodes_prefix(self) -> bytes:
        return self.root + b"lookupd/nodes/"

    def node(self, node_id: str) -> bytes:
        return self.nodes_prefix + node_id.encode()

    @property
    def node_sessions_prefix(self) -> bytes:
        """nsqd nodes' sessions (nsqx.lookupd.node_sessions)."""
        return self.root + b"nodes/"

    def node_session(self, node_id: str, lookupd_id: str) -> bytes:
        return self.node_sessions_prefix + f"{node_id}/{lookupd_id}".encode()


def _decode(kv: KeyValue) -> TopicRecord | None:
    try:
        return TopicRecord.from_json(json.loads(kv.value))
    except ValueError as err:
        log.error("META: etcd key %s is not a topic record (left alone): %s", kv.key, err)
        return None


class EtcdMetaStore(MetaStore):
    """Topic records in etcd, cached in memory and kept in step by a watch.

    ``fence`` says whether this nsqlookupd leads (see :data:`Fence`); writes are
    refused with NotLeaderError when it returns None. Without a fence (a store used by
    a single writer, as in tests) writes compare the record's revision only.
    """

    shared = True

    def __init__(self, client: EtcdClient, keys: EtcdKeys, fence: Fence | None = None) -> None:
        self.client = client
        self.keys = keys
        self.fence = fence
        self._records: dict[str, TopicRecord] = {}
        # topic -> (revision, record or None): the newest state known of each key, a
        # deletion included, so that an older event (or listing) never undoes a newer
        # one, whichever arrives first
        self._known: dict[str, tuple[int, TopicRecord | None]] = {}
        self._hook: RecordHook | None = None
        # topic -> what this store is writing now: the watch may bring the change back
        # before the write's answer does, and it must not pass for someone else's
        self._writing: dict[str, TopicRecord | None] = {}
        self._task: asyncio.Task[None] | None = None
        # one write at a time: each compares the revision the previous one produced
        self._write = asyncio.Lock()
        #: Set once the first listing is in (records are then as etcd has them).
        self.synced = asyncio.Event()

    @property
    def durable(self) -> bool:
        return True

    # -- reads ------------------------------------------------------------------------

    async def get(self, topic: str) -> TopicRecord | None:
        return self._records.get(topic)

    async def list(self) -> dict[str, TopicRecord]:
        """Every record, read from etcd now (a new leader starts from this)."""
        try:
            await self._load(notify=False)
        except EtcdError as err:
            raise MetaStoreUnavailable(str(err)) from None
        return dict(self._records)

    # -- writes -----------------------------------------------------------------------

    async def put(self, topic: str, record: TopicRecord) -> None:
        value = json.dumps(record.to_json(), separators=(",", ":")).encode()
        await self._write_txn(topic, op_put(self.keys.topic(topic), value), record)

    async def delete(self, topic: str) -> None:
        await self._write_txn(topic, op_delete(self.keys.topic(topic)), None)

    async def _write_txn(
        self, topic: str, operation: dict[str, object], record: TopicRecord | None
    ) -> None:
        key = self.keys.topic(topic)
        async with self._write:
            compare = []
            fence: int | None = None
            if self.fence is not None:
                fence = self.fence()
                if fence is None:
                    raise NotLeaderError("this nsqlookupd does not lead")
                compare.append(cmp_create_revision(self.keys.leader, fence))
            rev, old = self._known.get(topic, (0, None))
            compare.append(cmp_mod_revision(key, rev if old is not None else 0))
            self._writing[topic] = record
            try:
                res = await self.client.txn(
                    compare, [operation], [op_range(self.keys.leader), op_range(key)]
                )
            except EtcdError as err:
                raise MetaStoreUnavailable(str(err)) from None
            finally:
                del self._writing[topic]
            if res.succeeded:
                # our own change: the watch will bring it back, and skip it
                self._apply(topic, record, res.revision, notify=False)
                return
            leader = res.range_kvs(0)
            if fence is not None and (not leader or leader[0].create_revision != fence):
                raise NotLeaderError("this nsqlookupd no longer leads")
            found = res.range_kvs(1)
            if found:
                self._apply(topic, _decode(found[0]), found[0].mod_revision, notify=False)
            else:
                self._apply(topic, None, res.revision, notify=False)
            # the writer learns the record as it is (even if the watch brought it first)
            self._notify(topic, self._records.get(topic))
            raise ConflictError(f"topic {topic}'s record changed meanwhile; try again")

    # -- following --------------------------------------------------------------------

    def follow(self, hook: RecordHook) -> None:
        """Load the records and keep them in step, calling ``hook`` for each change."""
        self._hook = hook
        if self._task is None:
            self._task = asyncio.create_task(self._sync_loop(), name="lookupd-etcd-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sync_loop(self) -> None:
        prefix = self.keys.topics_prefix
        delay = 0.1
        lost = False
        while True:
            try:
                revision = await self._load(notify=True)
                if lost:
                    log.info("META: etcd is back: records in step at revision %d", revision)
                lost = False
                delay = 0.1
                self.synced.set()
                async for msg in self.client.watch(prefix, prefix_end(prefix), revision + 1):
                    if msg.compact_revision:
                        log.info("META: etcd compacted past revision %d: listing again", revision)
                        break
                    for ev in msg.events:
                        topic = self._topic_of(ev.kv.key)
                        if topic is None:
                            continue
                        if ev.deleted:
                            self._apply(topic, None, ev.kv.mod_revision, notify=True)
                        else:
                            rec = _decode(ev.kv)
                            if rec is not None:
                                self._apply(topic, rec, ev.kv.mod_revision, notify=True)
                    revision = max(revision, msg.revision)
            except EtcdError as err:
                if not lost:
                    log.warning("META: lost etcd (%s); records kept, retrying", err)
                lost = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESYNC_DELAY_MAX)

    def _topic_of(self, key: bytes) -> str | None:
        name = key[len(self.keys.topics_prefix) :]
        if not key.startswith(self.keys.topics_prefix) or not name or b"/" in name:
            return None
        return name.decode(errors="replace")

    async def _load(self, notify: bool) -> int:
        """List the prefix and take what is newer than what is known; the revision."""
        revision, kvs = await self.client.range_prefix(self.keys.topics_prefix)
        newest = max((r for r, _ in self._known.values()), default=0)
        if revision < newest:
            # an etcd with a shorter history than ours (its data replaced): its
            # revisions say nothing against ours, so take its content as it is
            log.warning(
                "META: etcd is at revision %d, behind %d: taking its records", revision, newest
            )
            self._known = {t: (0, rec) for t, (_, rec) in self._known.items()}
        listed: set[str] = set()
        for kv in kvs:
            topic = self._topic_of(kv.key)
            if topic is None:
                continue
            listed.add(topic)
            rec = _decode(kv)
            if rec is not None:
                self._apply(topic, rec, kv.mod_revision, notify)
        for topic, (rev, rec) in list(self._known.items()):
            if topic not in listed and rec is not None and rev <= revision:
                self._apply(topic, None, revision, notify)
        return revision

    def _apply(self, topic: str, record: TopicRecord | None, revision: int, notify: bool) -> None:
        old_rev, old = self._known.get(topic, (0, None))
        if revision <= old_rev:
            return
        self._known[topic] = (revision, record)
        if record is None:
            self._records.pop(topic, None)
        else:
            self._records[topic] = record
        mine = topic in self._writing and self._writing[topic] == record
        if notify and record != old and not mine:
            self._notify(topic, record)

    def _notify(self, topic: str, record: TopicRecord | None) -> None:
        if self._hook is None:
            return
        try:
            self._hook(topic, record)
        except Exception:
            log.exception("META: applying the change of topic %s failed", topic)
