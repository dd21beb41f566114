"""TopicRecord: what nsqlookupd keeps about a partitioned topic, its settings and where
each partition lives (the settings themselves are :mod:`nsqx.wire.topic_meta`'s).

A :class:`TopicRecord` is one topic's stored state: its
:class:`~nsqx.wire.topic_meta.TopicMeta` (the settings given to ``/topic/create``,
Youzan's ``TopicMetaInfo``), the placement of each partition
(the node ids that hold it, leader first) and the channels created through lookupd.
Records are immutable values: the coordinator replaces a topic's record as a whole, so
a reader never sees half an update. They are stored as JSON by a
:class:`~nsqx.lookupd.meta_store.MetaStore`.

The limits are Youzan's (nsqlookupd/http.go and consistence/nsqlookup_coord_api.go).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nsqx.wire.topic_meta import TopicMeta

__all__ = [
    "MAX_LOAD_FACTOR",
    "MAX_RETENTION_DAYS",
    "MAX_SYNC_EVERY",
    "UNKNOWN_TOPIC_META_JSON",
    "EpochChange",
    "TopicRecord",
]

#: suggestload is 0..MAX_LOAD_FACTOR.
MAX_LOAD_FACTOR = 10000
#: syncdisk above this is lowered to it at create time, refused by /topic/meta/update.
MAX_SYNC_EVERY = 4000
#: /topic/meta/update refuses a retention above this many days.
MAX_RETENTION_DAYS = 60


#: Youzan's zero TopicMetaInfo: what /lookup?metainfo=true shows for an unknown topic.
UNKNOWN_TOPIC_META_JSON: dict[str, Any] = {
    "disable_channel_auto_create": False,
    "extend_support": False,
    "multi_part": False,
    "ordered": False,
    "partition_num": 0,
    "replica": 0,
}


#: Epoch changes kept per partition (the newest).
HISTORY_MAX = 32


@dataclass(frozen=True)
class EpochChange:
    """One change of a replicated partition's leader, ISR or placement: its new epoch,
    leader and ISR, when (Unix ms, the deciding nsqlookupd's clock) and why."""

    epoch: int
    leader: str
    isr: tuple[str, ...]
    at_ms: int
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "leader": self.leader,
            "isr": list(self.isr),
            "at": self.at_ms,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, obj: Any) -> EpochChange:
        if not isinstance(obj, dict):
            raise ValueError(f"bad epoch change {obj!r}")
        epoch, leader, isr = obj.get("epoch"), obj.get("leader"), obj.get("isr")
        at, reason = obj.get("at", 0), obj.get("reason", "")
        if not isinstance(epoch, int) or not isinstance(leader, str) or not isinstance(at, int):
            raise ValueError(f"bad epoch change {obj!r}")
        if not isinstance(isr, list) or not all(isinstance(n, str) for n in isr):
            raise ValueError(f"bad epoch change {obj!r}")
        return cls(epoch, leader, tuple(isr), at, reason if isinstance(reason, str) else "")


@dataclass(frozen=True)
class TopicRecord:
    """One topic's stored state: settings, placement, lookupd-created channels."""

    meta: TopicMeta
    #: partition -> node ids holding it, leader first. A partition of the meta that is
    #: missing here is not placed (yet); ``/topic/create`` places it.
    placements: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    #: Channels created through lookupd's ``/channel/create``, in creation order. For a
    #: disable_channel_auto_create topic these are the only channels consumers may use.
    channels: tuple[str, ...] = ()
    #: partition -> the in-sync replicas (leader first) of a replicated topic; a
    #: placed partition missing here has all its placement in sync
    isr: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    #: partition -> its epoch, bumped at every change of leader or ISR (1 if missing)
    epochs: Mapping[int, int] = field(default_factory=dict)
    #: partition -> its latest epoch changes, oldest first (at most HISTORY_MAX)
    history: Mapping[int, tuple[EpochChange, ...]] = field(default_factory=dict)

    def isr_of(self, partition: int) -> tuple[str, ...]:
        """The partition's in-sync replicas, leader first."""
        isr = self.isr.get(partition)
        return isr if isr is not None else tuple(self.placements.get(partition, ()))

    def epoch_of(self, partition: int) -> int:
        return self.epochs.get(partition, 1)

    def with_replicas(
        self,
        partition: int,
        placement: tuple[str, ...],
        isr: tuple[str, ...],
        reason: str = "",
    ) -> TopicRecord:
        """A new leader, ISR or placement for one partition, in a new epoch (noted in
        its history with ``reason``)."""
        placements = {**self.placements, partition: placement}
        isrs = {**self.isr, partition: isr}
        epoch = self.epoch_of(partition) + 1
        epochs = {**self.epochs, partition: epoch}
        change = EpochChange(epoch, placement[0] if placement else "", isr, now_ms(), reason)
        changes = (*self.history.get(partition, ()), change)[-HISTORY_MAX:]
        history = {**self.history, partition: changes}
        return replace(
            self,
            placements=dict(sorted(placements.items())),
            isr=dict(sorted(isrs.items())),
            epochs=dict(sorted(epochs.items())),
            history=dict(sorted(history.items())),
        )

    def with_first_epochs(self, partitions: list[int], reason: str) -> TopicRecord:
        """The history of newly placed partitions starts: their epoch, leader and ISR."""
        history = dict(self.history)
        at = now_ms()
        for pid in partitions:
            placement = self.placements.get(pid)
            if placement:
                change = EpochChange(self.epoch_of(pid), placement[0], self.isr_of(pid), at, reason)
                history[pid] = (*history.get(pid, ()), change)[-HISTORY_MAX:]
        return replace(self, history=dict(sorted(history.items())))

    def leader(self, partition: int) -> str | None:
        """The node id that leads ``partition``, if it is placed."""
        nodes = self.placements.get(partition)
        return nodes[0] if nodes else None

    def unplaced(self) -> list[int]:
        """Partitions of the meta that have no placement."""
        return [p for p in range(self.meta.partition_num) if not self.placements.get(p)]

    def with_placements(self, placements: Mapping[int, tuple[str, ...]]) -> TopicRecord:
        return replace(self, placements=dict(sorted(placements.items())))

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta.to_json(),
            "placements": {str(p): list(nodes) for p, nodes in sorted(self.placements.items())},
            "channels": list(self.channels),
            "isr": {str(p): list(nodes) for p, nodes in sorted(self.isr.items())},
            "epochs": {str(p): e for p, e in sorted(self.epochs.items())},
            "history": {
                str(p): [c.to_json() for c in changes]
                for p, changes in sorted(self.history.items())
            },
        }

    @classmethod
    def from_json(cls, obj: Any) -> TopicRecord:
        """Decode :meth:`to_json`'s output; ValueError if it is malformed."""
        if not isinstance(obj, dict):
            raise ValueError("topic record is not an object")
        meta_obj = obj.get("meta")
        if not isinstance(meta_obj, dict):
            raise ValueError("topic record has no meta")
        meta = TopicMeta.from_json(meta_obj)
        raw_placements = obj.get("placements", {})
        if not isinstance(raw_placements, dict):
            raise ValueError("placements is not an object")
        placements: dict[int, tuple[str, ...]] = {}
        for key, nodes in raw_placements.items():
            if not key.isdigit() or not isinstance(nodes, list):
                raise ValueError(f"bad placement {key!r}: {nodes!r}")
            if not all(isinstance(n, str) for n in nodes):
                raise ValueError(f"bad placement {key!r}: {nodes!r}")
            placements[int(key)] = tuple(nodes)
        channels = obj.get("channels", [])
        if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
            raise ValueError("channels is not a list of names")
        isr: dict[int, tuple[str, ...]] = {}
        raw_isr = obj.get("isr", {})
        if not isinstance(raw_isr, dict):
            raise ValueError("isr is not an object")
        for key, nodes in raw_isr.items():
            if not key.isdigit() or not isinstance(nodes, list):
                raise ValueError(f"bad isr {key!r}: {nodes!r}")
            if not all(isinstance(n, str) for n in nodes):
                raise ValueError(f"bad isr {key!r}: {nodes!r}")
            isr[int(key)] = tuple(nodes)
        epochs: dict[int, int] = {}
        raw_epochs = obj.get("epochs", {})
        if not isinstance(raw_epochs, dict):
            raise ValueError("epochs is not an object")
        for key, epoch in raw_epochs.items():
            if not key.isdigit() or not isinstance(epoch, int) or epoch < 1:
                raise ValueError(f"bad epoch {key!r}: {epoch!r}")
            epochs[int(key)] = epoch
        history: dict[int, tuple[EpochChange, ...]] = {}
        raw_history = obj.get("history", {})
        if not isinstance(raw_history, dict):
            raise ValueError("history is not an object")
        for key, changes in raw_history.items():
            if not key.isdigit() or not isinstance(changes, list):
                raise ValueError(f"bad history {key!r}")
            history[int(key)] = tuple(EpochChange.from_json(c) for c in changes)
        return cls(
            meta,
            dict(sorted(placements.items())),
            tuple(channels),
            dict(sorted(isr.items())),
            dict(sorted(epochs.items())),
            dict(sorted(history.items())),
        )


def now_ms() -> int:
    """Unix time in ms: when an epoch change was decided."""
    return time.time_ns() // 1_000_000
