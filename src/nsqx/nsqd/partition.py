"""Partition: one log of a topic and the channels that read it.

A topic has 1-255 partitions (Youzan's extension; NSQ 1.3's topics have one); this
node hosts some of them. Each partition is its own log, with its own message ids (the
partition sits in the ids' high bits) and its own cursor for every channel.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING, NamedTuple

from nsqx.nsqd.channel import Channel
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.guid import PARTITION_SHIFT, make_ids
from nsqx.store.disklog import DiskLog
from nsqx.store.memlog import MemoryLog
from nsqx.wire.commands import (
    OFFSET_MSGCOUNT,
    OFFSET_SPECIAL,
    OFFSET_TIMESTAMP,
    OFFSET_VIRTUAL_QUEUE,
    ConsumeStart,
)
from nsqx.wire.frames import MESSAGE_FRAME_OVERHEAD as FRAME_OVERHEAD
from nsqx.wire.frames import encode_extended_batch, encode_message_batch

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.topic import Topic

log = logging.getLogger("nsqx.nsqd")


class Published(NamedTuple):
    """Where a publish landed: its first message's id, virtual offset and sequence, and
    the bytes of all its frames (PUB_TRACE's answer reports the first three)."""

    first_id: int
    offset: int
    seq: int
    raw_size: int
    messages: int


class Partition:
    """Partition owns one log; every channel is a cursor over it.

    Publishing appends once: each message's frame is built here, once, and shared by all
    channels. A partition with no channel keeps its messages for its first channel;
    later channels start at the end. Pausing freezes what channels can see
    (``visible_end``).
    """

    def __init__(self, topic: Topic, pid: int) -> None:
        self.topic = topic
        self.nsqd: NSQD = topic.nsqd
        self.id = pid
        self.name = topic.name
        self.ephemeral = topic.ephemeral
        self.channels: dict[str, Channel] = {}
        self.paused = topic.paused
        self.message_count = 0
        self.message_bytes = 0
        self.deleted = False
        self.log: MemoryLog | DiskLog
        #: the log's directory (None: memory only)
        self.directory: str | None = None
        self._state_path: str | None = None
        nsqd = topic.nsqd
        if topic.directory is None:
            self.log = MemoryLog()
        else:
            opts = nsqd.options
            self.directory = os.path.join(topic.directory, f"p{pid}")
            # partition 0 keeps the layout of nsqx before partitions
            state_file = "topic.json" if pid == 0 else f"topic.p{pid}.json"
            self._state_path = os.path.join(topic.directory, state_file)
            self.log = DiskLog(
                self.directory,
                max_bytes_per_file=opts.max_bytes_per_file,
                cache_size=opts.mem_queue_size,
            )
            os.makedirs(self.channel_dir, exist_ok=True)
        state = self._read_state()
        #: Channels deliver records below this sequence (frozen while paused).
        self.visible_end = min(int(state.get("visible_end", self.log.end)), self.log.end)
        #: Where the next first channel starts: records from here wait for it.
        self.hold_from = max(int(state.get("hold_from", self.log.start)), self.log.start)
        #: True once the log holds an extended record (a trace id or ext data): delivery
        #: then looks at each chunk's kind (see nsqx.wire.frames)
        self.extended = bool(state.get("extended", False))
        #: set by empty() while paused: what it dropped, for depth
        self._emptied_to = 0
        self._ephemeral_channels = 0

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
            if k in ("hold_from", "visible_end", "extended") and isinstance(v, (int, bool))
        }

    def save_state(self) -> None:
        """Persist where a first channel starts, while paused what channels see, and
        whether the log holds extended records."""
        if self._state_path is None:
            return
        state: dict[str, int | bool] = {"hold_from": self.hold_from}
        if self.paused:
            state["visible_end"] = self.visible_end
        if self.extended:
            state["extended"] = True
        path = self._state_path
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    # -- publishing ---------------------------------------------------------------------

    def publish(
        self,
        bodies: list[bytes],
        defer_ms: int = 0,
        trace_ids: list[int] | None = None,
        exts: list[tuple[int, bytes]] | None = None,
    ) -> Published:
        """Append messages (one MPUB is one call: atomic) and wake the channels.

        ``trace_ids`` and ``exts`` ((version, data) per message) make extended records.
        """
        log_ = self.log
        n = len(bodies)
        seq = log_.end
        ids = make_ids(seq, n, self.id)
        ts = time.time_ns()
        if trace_ids is None and exts is None:
            chunk, stride = encode_message_batch(ts, ids, bodies)
            body_bytes = len(chunk) - n * FRAME_OVERHEAD
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
            if not self.extended:
                self.extended = True
                self.save_state()
        offset = log_.next_offset
        try:
            log_.append(chunk, ids, ts + defer_ms * 1_000_000 if defer_ms else 0, stride)
        except OSError as err:
            # as nsqd: /ping answers NOK until a write succeeds again
            self.nsqd.health_error = f"failed to write to topic {self.name}: {err}"
            raise
        if self.nsqd.health_error is not None:
            self.nsqd.health_error = None
        self.message_count += n
        self.message_bytes += body_bytes
        self.topic.traced_publish(self, ids, trace_ids, offset)
        if not self.paused:
            self.visible_end = log_.end
            for ch in self.channels.values():
                ch.notify()
            if self.ephemeral or self.has_ephemeral_channels:
                self._bound_memory()
        return Published((self.id << PARTITION_SHIFT) | seq, offset, seq, len(chunk), n)

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
        self.visible_end = self.log.end
        self.save_state()
        for ch in self.channels.values():
            ch.notify()

    @property
    def depth(self) -> int:
        """Messages no channel can see yet: held for the first channel, or paused."""
        if not self.channels:
            return max(self.log.end - max(self.hold_from, self.log.start), 0)
        return self.log.end - max(self.visible_end, self._emptied_to)

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
        """Release memory of records that every channel is done with."""
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
        return log_.reclaim(self.low_water(), retention)

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
        """Shut down: checkpoint channels, fsync and close the log."""
        self.checkpoint()
        for ch in self.channels.values():
            ch.detach()
        self.log.close()

    def delete(self) -> None:
        """Deleted: close channels and remove the files."""
        self.deleted = True
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
