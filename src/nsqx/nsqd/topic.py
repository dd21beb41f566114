"""Topic: a named log of messages and the channels that read it."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from nsqx.nsqd.channel import Channel
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.guid import make_ids
from nsqx.store.memlog import MemoryLog
from nsqx.wire.frames import encode_message_frames
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
        self.log = MemoryLog()
        self.channels: dict[str, Channel] = {}
        self.paused = False
        #: Channels deliver records below this sequence (frozen while paused).
        self.visible_end = 0
        #: Where the next first channel starts: records from here wait for it.
        self.hold_from = 0
        self.message_count = 0
        self.message_bytes = 0
        self.deleted = False
        #: set by empty() while paused: what it dropped, for depth
        self._emptied_to = 0

    def publish(self, bodies: list[bytes], defer_ms: int = 0) -> None:
        """Append messages (one MPUB is one call: atomic) and wake the channels."""
        log_ = self.log
        n = len(bodies)
        ids = make_ids(log_.end, n)
        ts = time.time_ns()
        log_.append(
            encode_message_frames(ts, ids, bodies),
            ids,
            ts + defer_ms * 1_000_000 if defer_ms else 0,
        )
        self.message_count += n
        self.message_bytes += sum(map(len, bodies))
        if self.paused:
            return
        self.visible_end = log_.end
        for ch in self.channels.values():
            ch.notify()
        if self.ephemeral or self.ephemeral_channels:
            self._bound_memory()

    def get_channel(self, name: str) -> Channel:
        """The channel named ``name``, created if needed."""
        ch = self.channels.get(name)
        if ch is None:
            start = self.hold_from if not self.channels else self.visible_end
            ch = Channel(self, name, start)
            self.channels[name] = ch
            log.info("TOPIC(%s): created CHANNEL(%s)", self.name, name)
            self.nsqd.topology_changed(
                TopologyEvent("create", self.name, name), persist=not ch.ephemeral
            )
        return ch

    def delete_channel(self, name: str) -> None:
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        ch.close()
        log.info("TOPIC(%s): deleted CHANNEL(%s)", self.name, name)
        self.nsqd.topology_changed(
            TopologyEvent("delete", self.name, name), persist=not ch.ephemeral
        )
        if not self.channels:
            # later messages wait for the next first channel
            self.hold_from = self.visible_end
            if self.ephemeral:
                self.nsqd.delete_topic(self.name)

    def pause(self) -> None:
        """Stop channels from seeing new messages (persisted by the caller)."""
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.visible_end = self.log.end
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
            self.hold_from = end
            self.log.trim_to(end)
            return
        if self.paused:
            for ch in self.channels.values():
                if ch.cursor >= self.visible_end:
                    ch.cursor = end
            self._emptied_to = end

    def low_water(self) -> int:
        """The oldest sequence any reader still needs."""
        if not self.channels:
            return self.hold_from
        return min(ch.low_water() for ch in self.channels.values())

    def trim(self) -> None:
        """Release records that every channel is done with."""
        if len(self.log):
            self.log.trim(self.low_water())

    @property
    def ephemeral_channels(self) -> bool:
        return any(ch.ephemeral for ch in self.channels.values())

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

    def close(self) -> None:
        self.deleted = True
        for name in list(self.channels):
            ch = self.channels.pop(name)
            ch.close()
