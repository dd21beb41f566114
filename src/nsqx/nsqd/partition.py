"""Partition: one log of a topic and the channels that read it.

A topic has 1-255 partitions (Youzan's extension; NSQ 1.3's topics have one); this
node hosts some of them. Each partition is its own log, with its own message ids (the
partition sits in the ids' high bits) and its own cursor for every channel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from nsqx.nsqd import clock
from nsqx.nsqd.channel import Channel
from nsqx.nsqd.channel_policy import ReplayMark
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.guid import LEGACY_ID_BASE, PARTITION_SHIFT, SEQ_MASK, make_ids, seq_of
from nsqx.nsqd.waiters import Waiter, future_waiter
from nsqx.store import MessageLog, open_log
from nsqx.store.durable_file import makedirs_durable, write_durable
from nsqx.wire.batch import StoredBatch
from nsqx.wire.commands import (
    OFFSET_MSGCOUNT,
    OFFSET_SPECIAL,
    OFFSET_TIMESTAMP,
    OFFSET_VIRTUAL_QUEUE,
    ConsumeStart,
)
from nsqx.wire.errors import E_TOPIC_FULL, ProtocolError
from nsqx.wire.frames import (
    ID_AT,
    ID_END,
    encode_extended_batch,
    encode_message_batch,
    is_extended,
)
from nsqx.wire.frames import MESSAGE_FRAME_OVERHEAD as FRAME_OVERHEAD

if TYPE_CHECKING:
    from nsqx.nsqd.host import PartitionHost
    from nsqx.nsqd.loopturn import LoopTurn
    from nsqx.nsqd.replication.replica import PartitionReplica
    from nsqx.nsqd.topic import Topic

log = logging.getLogger("nsqx.nsqd")

#: publishes wait for an fsync only once this many --sync-every windows are unsynced:
#: an fsync starts as one window fills, and publishes go on while it runs (holding
#: them at one window halved ingest on a disk whose fsync takes 5 ms)
SYNC_PACE_WINDOWS: Final = 4

#: Told None once publishes are acknowledged, or the error that failed them.
AckWaiter = Waiter


def _seen(fut: asyncio.Future[list[None]]) -> None:
    """An fsync nobody waits for: its failure is kept by the log (sync_error) and told
    by /ping, not left for asyncio to report."""
    if not fut.cancelled():
        fut.exception()


class StagedDropped(Exception):
    """Publishes staged and never written (the partition was cut under them)."""


class Published:
    """Where a publish landed: its first message's id, virtual offset and sequence, and
    its raw size (PUB_TRACE's and MPUB_TRACE's answers report them): the distance from
    its first message's offset to the offset of the message after its last, so that
    ``offset + raw_size`` is the next message's offset, as in Youzan's nsqd. That is
    known at once only for a publish that is a record of its own (a traced one, see
    :meth:`Partition.publish`); for the others it is their frames' bytes.

    (A plain class: compiled, it is made without a call through Python, as a NamedTuple
    is not; one is made per publish.)"""

    __slots__ = ("first_id", "messages", "offset", "raw_size", "seq")

    def __init__(self, first_id: int, offset: int, seq: int, raw_size: int, messages: int) -> None:
        self.first_id = first_id
        self.offset = offset
        self.seq = seq
        self.raw_size = raw_size
        self.messages = messages

    def __repr__(self) -> str:
        return (
            f"Published(first_id={self.first_id}, offset={self.offset}, seq={self.seq}, "
            f"raw_size={self.raw_size}, messages={self.messages})"
        )


class Partition:
    """Partition owns one log; every channel is a cursor over it.

    Publishing appends once: each message's frame is built here, once, and shared by all
    channels. A partition with no channel keeps its messages for its first channel;
    later channels start at the end. Pausing freezes what channels can see
    (``visible_end``).
    """

    def __init__(self, topic: Topic, pid: int) -> None:
        self.topic = topic
        #: the node, reached only through this seam (nsqx.nsqd.host)
        self.nsqd: PartitionHost = topic.nsqd
        self._turn: LoopTurn = topic.nsqd.turn  # (the node's attributes are dict lookups)
        self.id = pid
        self.name = topic.name
        self.ephemeral = topic.ephemeral
        self.channels: dict[str, Channel] = {}
        self.paused = topic.paused
        self.message_count = 0
        self.message_bytes = 0
        self.deleted = False
        #: the log's directory (None: memory only)
        self.directory: str | None = None
        self._state_path: str | None = None
        nsqd = topic.nsqd
        opts = nsqd.options
        if topic.directory is not None:
            self.directory = os.path.join(topic.directory, f"p{pid}")
            # partition 0 keeps the layout of nsqx before partitions
            state_file = "topic.json" if pid == 0 else f"topic.p{pid}.json"
            self._state_path = os.path.join(topic.directory, state_file)
        self.log: MessageLog = open_log(
            self.directory,
            max_bytes_per_file=opts.max_bytes_per_file,
            cache_size=opts.mem_queue_size,
            # a replica never skips sequences of its own after damage: its log ends at
            # its last whole record and converges to its leader's (docs/storage.md)
            skip_lost=topic.meta.replica <= 1,
        )
        if self.directory is not None:
            makedirs_durable(self.channel_dir)
        state = self._read_state()
        #: Channels deliver records below this sequence (frozen while paused).
        self.visible_end = min(int(state.get("visible_end", self.log.end)), self.log.end)
        #: Where the next first channel starts: records from here wait for it.
        self.hold_from = max(int(state.get("hold_from", self.log.start)), self.log.start)
        #: True once the log holds an extended record (a trace id or ext data): delivery
        #: then looks at each chunk's kind (see nsqx.wire.frames)
        self.extended = bool(state.get("extended", False))
        #: the first sequence whose id is sequence + 1 (guid.py; records below it, written
        #: before ids started at 1, keep id = sequence); a log without it in its state file
        #: says it in its records, and one that never had a record starts at 0
        known = "id_base" in state and self.log.end > 0
        self.id_base: int = state["id_base"] if known else self._stored_id_base()
        #: set by empty() while paused: what it dropped, for depth
        self._emptied_to = 0
        self._ephemeral_channels = 0
        #: a commit() is scheduled for this loop iteration; who waits for it
        self._commit_scheduled = False
        self._waiters: list[AckWaiter] = []
        #: --sync-before-ack (read once: nsqd's options are a Python object)
        self._sync_before_ack = nsqd.options.sync_before_ack
        #: the fsync started ahead of a full --sync-every window
        self._sync_ahead: asyncio.Future[list[None]] | None = None
        #: messages and body bytes staged (counted already) since the last commit
        self._staged_messages = 0
        self._staged_bytes = 0
        #: publishes wait for a commit (a DiskLog stages them; a MemoryLog appends)
        self._stages = self.log.durable
        #: channels whose policy refuses publishes once they are full (channel_policy)
        self.limited: list[Channel] = []
        #: replication (a topic with replicator > 1 on a durable node), else None
        self.replica: PartitionReplica | None = None
        if self.durable and topic.meta.replica > 1:
            self.replicate()

    def _stored_id_base(self) -> int:
        """The id base this log's records were written with (a state file without one:
        nsqx before ids started at 1): their first sequence if their ids are sequence +
        1, LEGACY_ID_BASE if they are their sequences; a log without records (a memory
        log too) starts the rule at its end (the ids it gave before were at most that)."""
        found = self.log.first_id()
        if found is not None:
            seq, msg_id = found
            try:
                n = int(msg_id, 16) & SEQ_MASK
            except ValueError:
                n = -1  # (damage: the end's rule, right for an old log)
            if n == seq:
                return LEGACY_ID_BASE
            if n == seq + 1:
                return seq
        return self.log.end

    def seq_of(self, msg_id: bytes) -> int:
        """The log sequence of one of this partition's message ids (hex)."""
        return seq_of(msg_id, self.id_base)

    def positions(self, frames: list[bytes], ids: list[bytes]) -> list[tuple[int, int]]:
        """The virtual offset and raw size of each of these records (one frame and one
        hex id each), as SUB_ORDERED and SUB_ADVANCED frames carry them: the raw size is
        the distance to the next message's offset, so that offset + raw size is where
        the next message of the partition starts (Youzan's rule). A stored batch's
        last message owns the next batch's header (docs/storage.md, Offsets); one
        whose record is gone is (0, its frame's size)."""
        log_ = self.log
        id_base = self.id_base
        offset_of = log_.offset_of
        seqs = [seq_of(mid, id_base) for mid in ids]
        offsets = [offset_of(s) for s in seqs]
        # what comes between a record's last frame and the next one's first: the next
        # stored batch's header on disk, nothing in memory
        head = log_.next_offset - log_.end_offset
        end = log_.end
        out: list[tuple[int, int]] = []
        n = len(seqs)
        for k in range(n):
            offset = offsets[k]
            size = len(frames[k])
            if offset is None:
                out.append((0, size))
                continue
            nxt = seqs[k] + 1
            following: int | None
            if k + 1 < n and seqs[k + 1] == nxt:
                following = offsets[k + 1]
            elif nxt >= end:
                following = log_.next_offset  # the next record starts after a header
            else:
                following = offset_of(nxt)
            if following is None:  # no record there (a gap after damage): its batch ended
                following = offset + size + head
            out.append((offset, following - offset))
        return out

    def replicate(self) -> None:
        """Become a replica of a replicated topic: writes wait for the coordinator's
        role, and channels see only what the ISR holds."""
        if self.replica is None and self.durable:
            self.replica = self.nsqd.replication.attach(self)
            # what the ISR held before a restart is not known here (records at the end
            # may never have reached it): channels wait for the next commit point, from
            # the leader's followers or, on a follower, from its leader
            self.visible_end = self.log.start

    def __repr__(self) -> str:
        return f"<partition {self.name}:{self.id}>"

    @property
    def key(self) -> tuple[str, int]:
        """(topic name, partition id): how nsqd finds this partition's syncer."""
        return (self.name, self.id)

    @property
    def durable(self) -> bool:
        return self.directory is not None

    @property
    def channel_dir(self) -> str:
        assert self.topic.directory is not None
        name = "channels" if self.id == 0 else f"channels.p{self.id}"
        return os.path.join(self.topic.directory, name)

    @property
    def sync_every(self) -> int:
        """--sync-every, or the topic's syncdisk."""
        return self.topic.meta.sync_every or self.nsqd.options.sync_every

    def _read_state(self) -> dict[str, int]:
        if self._state_path is None:
            return {}
        try:
            with open(self._state_path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError:
            log.error("TOPIC(%s): unreadable %s, ignoring it", self.name, self._state_path)
            return {}
        if not isinstance(state, dict):
            return {}
        return {
            k: int(v)
            for k, v in state.items()
            if k in ("hold_from", "visible_end", "extended", "id_base")
            and isinstance(v, (int, bool))
        }

    def save_state(self) -> None:
        """Persist where a first channel starts, while paused what channels see, and
        whether the log holds extended records."""
        if self._state_path is None:
            return
        state: dict[str, int | bool] = {"hold_from": self.hold_from, "id_base": self.id_base}
        if self.paused:
            state["visible_end"] = self.visible_end
        if self.extended:
            state["extended"] = True
        write_durable(self._state_path, json.dumps(state).encode())

    # -- publishing ---------------------------------------------------------------------

    def publish(
        self,
        bodies: list[bytes],
        defer_ms: int = 0,
        trace_ids: list[int] | None = None,
        exts: list[tuple[int, bytes]] | None = None,
    ) -> Published:
        """Add messages (one MPUB is one call: atomic); they get their ids and offsets now.

        On a durable partition the messages are staged: every publish of this loop
        iteration, from every connection, is written by one system call at the end of
        the iteration (:meth:`commit`, a group commit); channels see them then, and a
        publisher answers once :meth:`when_acknowledged` says so. A memory partition
        appends at once. ``trace_ids`` and ``exts`` ((version, data) per message) make
        extended records.
        """
        if self.limited:
            self._check_room()
        log_ = self.log
        n = len(bodies)
        seq = log_.next_seq
        id_base = self.id_base
        ids = make_ids(seq, n, self.id, id_base)
        ts = clock.time_ns()
        if trace_ids is None and exts is None:
            chunk, stride = encode_message_batch(ts, ids, bodies)
            body_bytes = len(chunk) - n * FRAME_OVERHEAD
            kind = 0
        else:
            ext_list = exts or [(0, b"")] * n
            chunk, stride = encode_extended_batch(
                ts,
                ids,
                bodies,
                trace_ids or [0] * n,
                [v for v, _ in ext_list],
                [e for _, e in ext_list],
            )
            body_bytes = sum(map(len, bodies))
            kind = 1
            if not self.extended:
                self.extended = True
                self.save_state()
        deliver_at = ts + defer_ms * 1_000_000 if defer_ms else 0
        raw_size = len(chunk)
        if trace_ids is None:
            offset = log_.stage(chunk, ids, deliver_at, stride, kind)
        else:
            # a traced publish is answered with its raw size: as a record of its own it
            # is followed by the next record's header, whatever is published after it
            offset = log_.stage(chunk, ids, deliver_at, stride, kind, False)
            raw_size += log_.next_offset - log_.end_offset
        self.message_count += n
        self.message_bytes += body_bytes
        topic = self.topic
        if topic.trace_enabled or trace_ids is not None:
            topic.traced_publish(self, ids, trace_ids, offset)
        if self._stages:  # (a DiskLog: written by the commit)
            self._staged_messages += n
            self._staged_bytes += body_bytes
            if not self._commit_scheduled:
                self._commit_scheduled = True
                self._turn.commit_soon(self)
        else:
            self._appended()
        first_id = (self.id << PARTITION_SHIFT) | (seq + 1 if seq >= id_base else seq)
        return Published(first_id, offset, seq, raw_size, n)

    def _check_room(self) -> None:
        """Refuse a publish while a channel whose policy says so is full."""
        for ch in self.limited:
            full = ch.full()
            if full:
                raise ProtocolError(E_TOPIC_FULL, f"topic {self.name} is full: {full}", fatal=False)

    def limits_changed(self) -> None:
        """A channel's policy changed, or a channel went: which ones refuse publishes."""
        self.limited = [ch for ch in self.channels.values() if ch.policy.refuses]

    def _appended(self) -> None:
        """New records are in the log: channels may deliver them (a replicated
        partition's once the ISR holds them: committed())."""
        if self.replica is not None:
            self.replica.appended()  # ship them to the followers
        elif not self.paused:
            self.visible_end = self.log.end
            for ch in self.channels.values():
                ch.notify()
            if self.ephemeral or self.has_ephemeral_channels:
                self._bound_memory()

    def commit(self) -> OSError | None:
        """Write what this loop iteration published (one ``writev``), let channels see
        it (or ship it to the followers), and answer the publishers waiting in
        :meth:`when_acknowledged` (once fsynced with --sync-before-ack, and held by the
        ISR if replicated). nsqd calls it at the end of the iteration; it returns the
        write's error, if any."""
        if not self._commit_scheduled:
            return None  # done already (close, delete, an HTTP publish)
        self._commit_scheduled = False
        waiters, self._waiters = self._waiters, []
        try:
            self.log.commit()
        except OSError as err:
            # nothing of the group is stored (or acknowledged): uncount it
            self.message_count -= self._staged_messages
            self.message_bytes -= self._staged_bytes
            self._staged_messages = self._staged_bytes = 0
            # as nsqd: /ping answers NOK until a write succeeds again
            self._turn.health_error = f"failed to write to topic {self.name}: {err}"
            log.error("TOPIC(%s): write failed: %s", self.name, err)
            for w in waiters:
                w(err)
            if self.replica is not None:
                self.replica.write_failed(err)  # a leader hands its leadership on
            return err
        self._staged_messages = self._staged_bytes = 0
        if self._turn.health_error is not None:
            self._turn.health_error = None
        self._appended()
        if self._sync_before_ack or self.replica is not None:
            if waiters:
                self._after_write(waiters)
            return None
        synced = self._sync_window()
        if synced is not None and waiters:

            def done(fut: asyncio.Future[list[None]]) -> None:
                err = OSError("cancelled") if fut.cancelled() else fut.exception()
                for w in waiters:
                    w(err)

            synced.add_done_callback(done)
        else:
            for w in waiters:
                w(None)
        return None

    def _sync_window(self) -> asyncio.Future[list[None]] | None:
        """--sync-every (or the topic's) is a window of acknowledged messages: an fsync
        starts (here, not at the next scan) once so many are written that the window
        would fill while it runs (what was written during the last one, twice over,
        before the window's end), and publishes past a full window are answered once
        an fsync that covers them is done (the future returned). So a power cut loses
        at most that many acknowledged messages (docs/storage.md), and a disk that
        keeps up costs about one fsync per window. Not after an fsync failed: /ping
        says so, and publishes go on unsynced."""
        log_ = self.log
        unsynced = log_.unsynced
        every = self.topic.meta.sync_every or self.nsqd.options.sync_every
        start = max(every - 2 * log_.sync_lag, every // 4)
        if unsynced < start or log_.sync_error is not None or not self._stages:
            return None
        fresh = None
        ahead = self._sync_ahead
        if ahead is None or ahead.done():
            fresh = self._sync_ahead = self.nsqd.sync_partitions({self.key})
            fresh.add_done_callback(_seen)
        if unsynced <= SYNC_PACE_WINDOWS * every:
            return None
        # (an fsync asked for before this commit's write may not cover it)
        return fresh if fresh is not None else self.nsqd.sync_partitions({self.key})

    def when_acknowledged(self, waiter: AckWaiter) -> None:
        """The one barrier before a publish is answered: call ``waiter(None)`` once every
        publish so far is acknowledged (written to the log's file by the commit at the
        end of this loop iteration; fsynced with --sync-before-ack; held by the ISR if
        replicated), ``waiter(error)`` if that failed (an OSError: the write or the
        fsync; CommitFailed: not held by the ISR). Called at once when there is
        nothing to wait for (a memory partition)."""
        if self._commit_scheduled:
            self._waiters.append(waiter)
        elif self.replica is not None or (self._sync_before_ack and self.durable):
            self._after_write([waiter])
        else:
            waiter(None)

    def acknowledged(self) -> asyncio.Future[None]:
        """:meth:`when_acknowledged` as a future (for the HTTP API)."""
        fut, done = future_waiter()
        self.when_acknowledged(done)
        return fut

    def _after_write(self, waiters: list[AckWaiter]) -> None:
        """Tell ``waiters`` once what is written is fsynced (--sync-before-ack) and held
        by the ISR (replicated): nsqd.acknowledged."""

        replica = self.replica
        # (a durable partition has a syncer: nsqd.partition_added)
        if replica is not None and not (self._sync_before_ack and self.durable):
            # the ISR alone: told in the call that moves the commit point (a future's
            # callback would answer a loop iteration later)
            def told(err: BaseException | None) -> None:
                for w in waiters:
                    w(err)

            replica.when_committed(self.log.end, waiters[0] if len(waiters) == 1 else told)
            return

        def done(fut: asyncio.Future[list[None]]) -> None:
            err = OSError("cancelled") if fut.cancelled() else fut.exception()
            for w in waiters:
                w(err)

        self.nsqd.acknowledged({self.key}).add_done_callback(done)

    # -- replication --------------------------------------------------------------------

    @property
    def committed_end(self) -> int:
        """The end of what channels may deliver: the log's end, or for a replicated
        partition the commit point (every record below it is held by the ISR)."""
        replica = self.replica
        if replica is None:
            return self.log.end
        if replica.leader is not None:
            return replica.leader.commit
        return self.visible_end

    @property
    def readable_end(self) -> int:
        """Where reads that bypass the channels (GET /range: Spark) stop: the log's end,
        or on a replicated partition its commit point (what the ISR holds: the leader's
        later records may still be cut by a failover)."""
        end = self.log.end
        rep = self.replica
        if rep is None:
            return end
        if rep.leader is not None:
            return min(rep.leader.commit, end)
        if rep.follower is not None:
            return min(rep.follower.commit, end)
        return min(self.visible_end, end)

    def committed(self, seq: int) -> None:
        """The commit point moved to ``seq``: channels may deliver up to it."""
        if self.paused or seq <= self.visible_end:
            return
        self.visible_end = min(seq, self.log.end)
        for ch in self.channels.values():
            ch.notify()

    def append_replicated(self, batches: Sequence[StoredBatch]) -> None:
        """A follower stores batches its leader stored, exactly as stored (the same
        records at the same sequences and offsets), with one write. Raises ValueError,
        storing none of them, if one does not follow the log."""
        log_ = self.log
        # publishes staged while this node led, unwritten, are not the leader's
        self._drop_staged("made a follower")
        messages = 0
        extended = False
        id_base = self.id_base
        try:
            for b in batches:
                if b.first != log_.next_seq:
                    raise ValueError(
                        f"batch at {b.first} does not follow the log end {log_.next_seq}"
                    )
                id_base = self._leaders_id_base(b, id_base)
                ext = is_extended(b.chunk)
                # (the ids are in the frames: read from there if a consumer ever
                # reads these records from the cache, not made for every record)
                offset = log_.stage(
                    b.chunk, None, b.deliver_at, b.stride, 1 if ext else 0, False, b.messages
                )
                if offset != b.offset:
                    raise ValueError(
                        f"batch at {b.first} (offset {b.offset}) does not follow the log"
                        f" end (offset {offset})"
                    )
                messages += b.messages
                extended = extended or ext
        except ValueError:
            log_.drop_staged()
            raise
        log_.commit()
        self.message_count += messages
        if id_base != self.id_base or (extended and not self.extended):
            self.id_base = id_base
            self.extended = self.extended or extended
            self.save_state()

    def _leaders_id_base(self, batch: StoredBatch, id_base: int) -> int:
        """The id base after a leader's ``batch`` (its ids are the leader's, and the
        leader's base is this log's): it moves to the batch when the batch starts ids at
        sequence + 1 where this log had none or had the rule before (a leader that kept
        an old log, then had nothing left of it at a restart), and to LEGACY_ID_BASE when
        a log without records gets the rule before."""
        first = batch.first
        try:
            delta = (int(batch.chunk[ID_AT:ID_END], 16) & SEQ_MASK) - first
        except ValueError:  # (not an id: stored as it is, as any leader's record)
            return id_base
        if delta == (1 if first >= id_base else 0):
            return id_base
        log_ = self.log
        if delta == 1:
            return first
        if delta == 0 and log_.next_seq == log_.start:
            return LEGACY_ID_BASE
        log.warning(
            "TOPIC(%s): the leader's message ids from sequence %d do not follow this "
            "partition's rule (id base %d): a leader of another nsqx version?",
            self.name,
            first,
            id_base,
        )
        return id_base

    def truncate(self, seq: int) -> None:
        """Cut the log at ``seq`` (records a failed leader wrote that the new leader
        never had); positions past the new end come back to it. Publishes staged and
        not yet written are dropped unanswered."""
        self._drop_staged("truncated")
        end = self.log.truncate(seq)
        if self.id_base >= end:
            # none of the records from the id base on is left: the next leader's say
            self.id_base = end if self.log.start >= end else LEGACY_ID_BASE
        self.visible_end = min(self.visible_end, end)
        self.hold_from = min(self.hold_from, end)
        for ch in self.channels.values():
            if ch.cursor > end:
                ch.seek(end)
        self.save_state()

    def _drop_staged(self, why: str) -> None:
        """Forget publishes staged and not written; their publishers get no answer."""
        if not self._commit_scheduled:
            return
        self._commit_scheduled = False
        waiters, self._waiters = self._waiters, []
        self.message_count -= self._staged_messages
        self.message_bytes -= self._staged_bytes
        self._staged_messages = self._staged_bytes = 0
        self.log.drop_staged()
        for w in waiters:
            w(StagedDropped(f"the partition was {why} before the write"))

    def reset(self, seq: int, offset: int) -> None:
        """Empty the log and start over at ``seq`` (its leader reclaimed what this
        follower lacks); positions come up to it."""
        self._drop_staged("reset")
        self.log.reset(seq, offset)
        self.id_base = seq  # (no record: the leader's next batch says its rule)
        self.visible_end = seq
        self.hold_from = max(self.hold_from, seq)
        for ch in self.channels.values():
            ch.seek(seq)
        self.save_state()

    def apply_cursors(
        self,
        channels: dict[str, tuple[int, bool]],
        hold_from: int,
        deferred: dict[str, list[tuple[int, int, int]]] | None = None,
        leader_now_ms: int = 0,
    ) -> None:
        """A follower takes its leader's channel positions and deferred messages (and
        makes its channels), so that consumers resume near there, and deferred messages
        keep their schedule, if it becomes the leader."""
        end = self.log.end
        for name, (cursor, ordered) in channels.items():
            cursor = min(cursor, end)
            ch = self.channels.get(name)
            if ch is None:
                ch = self.get_channel(name, start=cursor)
            ch.take_leader_state(cursor, deferred.get(name, []) if deferred else [], leader_now_ms)
            if ch.ordered_flag != ordered:
                ch.set_ordered(ordered)
        if hold_from != self.hold_from:
            self.hold_from = min(hold_from, end)
            self.save_state()

    def apply_replay_marks(self, marks: dict[str, dict[str, ReplayMark]]) -> None:
        """A follower takes its leader's replay marks in replicated dead-letter topics
        (nsqx.nsqd.dead_letters), so that it replays none of those twice if it becomes
        the leader; nsqd.dat keeps them."""
        changed = False
        for name, channel_marks in marks.items():
            ch = self.channels.get(name)
            if ch is not None and any(
                ch.replay_marks.get(k) != m for k, m in channel_marks.items()
            ):
                ch.replay_marks.update(channel_marks)
                changed = True
        if changed:
            self.nsqd.metadata_changed()

    def position(self, start: ConsumeStart) -> int:
        """The sequence a SUB_ADVANCED / /channel/setoffset position names: the first
        message at or after a time (seconds) or a virtual offset, the n-th message of the
        partition's life (``msgcount``, counted from 1 as Youzan counts: 0 and 1 are both
        the first), or the end (``special:-1``). ValueError, with Youzan's texts, for
        anything else."""
        log_ = self.log
        kind, value = start
        if kind == OFFSET_TIMESTAMP:
            ns = value * 1_000_000_000
            if not 0 <= ns < 1 << 63:
                raise ValueError(f"Invalid timestamp {value}")
            return log_.seek_time(ns)
        if kind == OFFSET_VIRTUAL_QUEUE:
            if value < 0:
                raise ValueError(f"invalid virtual queue offset: {value}")
            return log_.seek_offset(value)
        if kind == OFFSET_MSGCOUNT:
            if value < 0:
                raise ValueError(f"invalid message count: {value}")
            return min(max(value - 1, log_.start), log_.end)
        if kind == OFFSET_SPECIAL and value == -1:
            return log_.end
        raise ValueError("not supported offset type")

    # -- channels -----------------------------------------------------------------------

    def get_channel(self, name: str, start: int | None = None) -> Channel:
        """The channel named ``name``, created if needed (at ``start`` when given)."""
        ch = self.channels.get(name)
        if ch is None:
            if start is None:
                start = self.hold_from if not self.channels else self.visible_end
            ch = Channel(self, name, start)
            self.channels[name] = ch
            self._ephemeral_channels += ch.ephemeral
            log.info("TOPIC(%s): created CHANNEL(%s)%s", self.name, name, self._suffix())
            self.nsqd.topology_changed(
                TopologyEvent("create", self.name, name, self.id), persist=not ch.ephemeral
            )
        return ch

    def _suffix(self) -> str:
        return f" in partition {self.id}" if self.topic.meta.partitioned else ""

    def delete_channel(self, name: str) -> None:
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        self._ephemeral_channels -= ch.ephemeral
        ch.close()
        if ch in self.limited:
            self.limits_changed()
        log.info("TOPIC(%s): deleted CHANNEL(%s)%s", self.name, name, self._suffix())
        self.nsqd.topology_changed(
            TopologyEvent("delete", self.name, name, self.id), persist=not ch.ephemeral
        )
        if not self.channels:
            # later messages wait for the next first channel
            self.hold_from = self.visible_end
            self.save_state()
            if self.ephemeral and not any(p.channels for p in self.topic.partitions.values()):
                self.nsqd.delete_topic(self.name)

    # -- pausing and emptying -----------------------------------------------------------

    def pause(self) -> None:
        """Stop channels from seeing new messages (persisted by the caller)."""
        self.paused = True
        self.save_state()

    def unpause(self) -> None:
        self.paused = False
        self.visible_end = self.committed_end
        self.save_state()
        for ch in self.channels.values():
            ch.notify()

    @property
    def depth(self) -> int:
        """Messages no channel can see yet: held for the first channel, or paused."""
        log_ = self.log
        end = log_.end
        lo = (
            max(self.hold_from, log_.start)
            if not self.channels
            else max(self.visible_end, self._emptied_to)
        )
        if lo >= end:
            return 0
        # (sequences without a record: skipped after damage or a crash)
        return end - lo - log_.missing_between(lo, end)

    def empty(self) -> None:
        """Drop the messages no channel has seen yet (channels keep their own backlog).

        While paused with channels, the held messages are skipped by every channel that
        has caught up with what it could see; a channel still behind would read them.
        """
        end = self.log.end
        if not self.channels:
            self.hold_from = self.visible_end = end
            self.save_state()
            self.log.drop_before(end)
            return
        if self.paused:
            for ch in self.channels.values():
                if ch.cursor >= self.visible_end:
                    ch.cursor = end
                    ch.dirty = True
            self._emptied_to = end

    # -- space --------------------------------------------------------------------------

    def low_water(self) -> int:
        """The oldest sequence any reader still needs."""
        if not self.channels:
            return self.hold_from
        return min(ch.low_water() for ch in self.channels.values())

    def trim(self) -> None:
        """Release memory of records that every channel is done with (a memory log's:
        a DiskLog's cache is bounded by its size, and the low water costs a pass over
        every message in flight)."""
        if not self.log.durable:
            self.log.release(self.low_water())

    def reclaim(self) -> int:
        """Delete log segments every channel is done with (after the retention time:
        the topic's retention days, else --retention). Never past a channel's position."""
        log_ = self.log
        floor = log_.reclaim_floor
        if floor is None:
            return 0
        # cheap bound first: the low water is below every cursor and hold point
        bound = (
            self.hold_from if not self.channels else min(c.cursor for c in self.channels.values())
        )
        if bound < floor:
            return 0
        days = self.topic.meta.retention_days
        retention = days * 86400.0 if days else self.nsqd.options.retention
        return log_.reclaim(self.low_water(), retention, self.nsqd.remove_later)

    @property
    def has_ephemeral_channels(self) -> bool:
        # checked on every publish: kept up to date by get_channel/delete_channel
        return self._ephemeral_channels > 0

    def _bound_memory(self) -> None:
        # Ephemeral topics and channels live in memory only: past mem-queue-size
        # queued messages, the oldest are dropped, as in NSQ.
        floor = self.log.end - self.nsqd.options.mem_queue_size
        for ch in self.channels.values():
            if ch.ephemeral:
                ch.drop_before(floor)
        if self.ephemeral:
            if not self.channels:
                self.hold_from = max(self.hold_from, floor)
            self.log.trim(floor)

    # -- lifecycle ----------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write every channel's cursor (a clean shutdown)."""
        for ch in self.channels.values():
            ch.checkpoint()

    def close(self) -> None:
        """Shut down: write what is staged, checkpoint channels, fsync and close the
        log."""
        if self._commit_scheduled:
            self.commit()
        if self.replica is not None:
            self.nsqd.replication.detach(self)
        self.checkpoint()
        for ch in self.channels.values():
            ch.detach()
        self.log.close()

    def delete(self) -> None:
        """Deleted: close channels and remove the files."""
        if self._commit_scheduled:
            self.commit()  # its publishers get their answers, as before the delete
        self.deleted = True
        if self.replica is not None:
            self.nsqd.replication.detach(self)
            if os.path.exists(self.replica.path):
                os.remove(self.replica.path)
        for name in list(self.channels):
            ch = self.channels.pop(name)
            ch.close()
        self.log.destroy()
        if self.topic.directory is not None:
            shutil.rmtree(self.channel_dir, ignore_errors=True)
            if self._state_path is not None:
                try:
                    os.remove(self._state_path)
                except FileNotFoundError:
                    pass
