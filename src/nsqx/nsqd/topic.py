"""Topic: a named log of messages and the channels that read it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING

from nsqx.nsqd.channel import Channel
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.guid import make_ids
from nsqx.store.disklog import DiskLog
from nsqx.store.memlog import MemoryLog
from nsqx.wire.frames import MESSAGE_FRAME_OVERHEAD as FRAME_OVERHEAD
from nsqx.wire.frames import encode_message_batch
from nsqx.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD

log = logging.getLogger("nsqx.nsqd")


class Topic:
    """Topic owns one partition's log; every channel is a cursor over it.

    Publishing appends once: each message's frame is built here, once, and shared by all
    channels. A topic with no channel keeps its messages for its first channel; later
    channels start at the end. Pausing freezes what channels can see (``visible_end``).
    """

    def __init__(self, nsqd: NSQD, name: str) -> None:
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.message_count = 0
        self.message_bytes = 0
        self.deleted = False
        self.log: MemoryLog | DiskLog
        #: where this topic's files live (None: memory only)
        self.directory: str | None = None
        if self.ephemeral:
            self.log = MemoryLog()
        else:
            opts = nsqd.options
            # the suffix keeps names such as "." or ".." harmless as paths
            self.directory = os.path.join(nsqd.data_path, f"{name}.topic")
            self.log = DiskLog(
                os.path.join(self.directory, "p0"),
                max_bytes_per_file=opts.max_bytes_per_file,
                cache_size=opts.mem_queue_size,
            )
            os.makedirs(self.channel_dir, exist_ok=True)
        state = self._read_state()
        #: Channels deliver records below this sequence (frozen while paused).
        self.visible_end = min(state.get("visible_end", self.log.end), self.log.end)
        #: Where the next first channel starts: records from here wait for it.
        self.hold_from = max(state.get("hold_from", self.log.start), self.log.start)

        #: set by empty() while paused: what it dropped, for depth
        self._emptied_to = 0
        self._ephemeral_channels = 0

    @property
    def durable(self) -> bool:
        return self.directory is not None

    @property
    def channel_dir(self) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, "channels")

    def _read_state(self) -> dict[str, int]:
        if self.directory is None:
            return {}
        try:
            with open(os.path.join(self.directory, "topic.json"), encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError:
            log.error("TOPIC(%s): unreadable topic.json, ignoring it", self.name)
            return {}
        return {k: int(v) for k, v in state.items() if k in ("hold_from", "visible_end")}

    def save_state(self) -> None:
        """Persist where a first channel starts and, while paused, what channels see."""
        if self.directory is None:
            return
        state = {"hold_from": self.hold_from}
        if self.paused:
            state["visible_end"] = self.visible_end
        path = os.path.join(self.directory, "topic.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    def publish(self, bodies: list[bytes], defer_ms: int = 0) -> None:
        """Append messages (one MPUB is one call: atomic) and wake the channels."""
        log_ = self.log
        n = len(bodies)
        ids = make_ids(log_.end, n)
        ts = time.time_ns()
        chunk, stride = encode_message_batch(ts, ids, bodies)
        try:
            log_.append(chunk, ids, ts + defer_ms * 1_000_000 if defer_ms else 0, stride)
        except OSError as err:
            # as nsqd: /ping answers NOK until a write succeeds again
            self.nsqd.health_error = f"failed to write to topic {self.name}: {err}"
            raise
        if self.nsqd.health_error is not None:
            self.nsqd.health_error = None
        self.message_count += n
        self.message_bytes += len(chunk) - n * FRAME_OVERHEAD  # the bodies' bytes
        if self.paused:
            return
        self.visible_end = log_.end
        for ch in self.channels.values():
            ch.notify()
        if self.ephemeral or self.has_ephemeral_channels:
            self._bound_memory()

    def get_channel(self, name: str, start: int | None = None) -> Channel:
        """The channel named ``name``, created if needed (at ``start`` when given)."""
        ch = self.channels.get(name)
        if ch is None:
            if start is None:
                start = self.hold_from if not self.channels else self.visible_end
            ch = Channel(self, name, start)
            self.channels[name] = ch
            self._ephemeral_channels += ch.ephemeral
            log.info("TOPIC(%s): created CHANNEL(%s)", self.name, name)
            self.nsqd.topology_changed(
                TopologyEvent("create", self.name, name), persist=not ch.ephemeral
            )
        return ch

    def delete_channel(self, name: str) -> None:
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        self._ephemeral_channels -= ch.ephemeral
        ch.close()
        log.info("TOPIC(%s): deleted CHANNEL(%s)", self.name, name)
        self.nsqd.topology_changed(
            TopologyEvent("delete", self.name, name), persist=not ch.ephemeral
        )
        if not self.channels:
            # later messages wait for the next first channel
            self.hold_from = self.visible_end
            self.save_state()
            if self.ephemeral:
                self.nsqd.delete_topic(self.name)

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
            if isinstance(self.log, DiskLog):
                self.log.drop_before(end)
            else:
                self.log.trim_to(end)
            return
        if self.paused:
            for ch in self.channels.values():
                if ch.cursor >= self.visible_end:
                    ch.cursor = end
                    ch.dirty = True
            self._emptied_to = end

    def low_water(self) -> int:
        """The oldest sequence any reader still needs."""
        if not self.channels:
            return self.hold_from
        return min(ch.low_water() for ch in self.channels.values())

    def trim(self) -> None:
        """Release memory of records that every channel is done with (a DiskLog's
        memory is bounded by its cache size instead)."""
        if isinstance(self.log, MemoryLog) and len(self.log):
            self.log.trim(self.low_water())

    def reclaim(self) -> int:
        """Delete log segments every channel is done with (after --retention)."""
        log_ = self.log
        if not isinstance(log_, DiskLog) or len(log_.segments) < 2:
            return 0
        first_end = log_.segments[0].end_seq
        # cheap bound first: the low water is below every cursor and hold point
        bound = (
            self.hold_from if not self.channels else min(c.cursor for c in self.channels.values())
        )
        if bound < first_end:
            return 0
        return log_.reclaim(self.low_water(), self.nsqd.options.retention)

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

    def checkpoint(self) -> None:
        """Write every channel's cursor (a clean shutdown)."""
        for ch in self.channels.values():
            ch.checkpoint()

    def close(self) -> None:
        """Shut down: checkpoint channels, fsync and close the log."""
        self.checkpoint()
        for ch in self.channels.values():
            ch.detach()
        if isinstance(self.log, DiskLog):
            self.log.close()

    def delete(self) -> None:
        """Deleted: close channels and remove the files."""
        self.deleted = True
        for name in list(self.channels):
            ch = self.channels.pop(name)
            ch.close()
        if isinstance(self.log, DiskLog):
            self.log.destroy()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
