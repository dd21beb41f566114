"""What nsqlookupd keeps about a partitioned topic: its settings and where each
partition lives.

A :class:`TopicRecord` is one topic's stored state: its :class:`TopicMeta` (the settings
given to ``/topic/create``, Youzan's ``TopicMetaInfo``), the placement of each partition
(the node ids that hold it, leader first) and the channels created through lookupd.
Records are immutable values: the coordinator replaces a topic's record as a whole, so
a reader never sees half an update. They are stored as JSON by a
:class:`~nsqx.lookupd.meta_store.MetaStore`.

The limits are Youzan's (nsqlookupd/http.go and consistence/nsqlookup_coord_api.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: partition_num is 1..MAX_PARTITION_NUM; partition ids are 0..MAX_PARTITION_NUM - 1.
MAX_PARTITION_NUM = 255
#: replicator is 1..MAX_REPLICATOR.
MAX_REPLICATOR = 5
#: suggestload is 0..MAX_LOAD_FACTOR.
MAX_LOAD_FACTOR = 10000
#: syncdisk above this is lowered to it at create time, refused by /topic/meta/update.
MAX_SYNC_EVERY = 4000
#: /topic/meta/update refuses a retention above this many days.
MAX_RETENTION_DAYS = 60


@dataclass(frozen=True)
class TopicMeta:
    """A partitioned topic's settings (what ``/topic/create`` was given)."""

    partition_num: int
    #: Copies of each partition (Youzan's ``replicator``).
    replica: int = 1
    #: Youzan's ``suggestload``: kept and shown, not used for placement.
    suggest_lf: int = 0
    #: ``syncdisk``: fsync every this many messages (0: nsqd's --sync-every).
    sync_every: int = 0
    #: ``retention`` in days (0: nsqd's default).
    retention_days: int = 0
    #: ``orderedmulti``: for SUB_ORDERED; allows several partitions per node.
    ordered: bool = False
    #: ``multipart``: allows several partitions of the topic on one node.
    multipart: bool = False
    #: ``extend``: messages carry JSON ext headers.
    ext: bool = False
    #: Consumers may only SUB to channels created through ``/channel/create``.
    disable_channel_auto_create: bool = False

    @property
    def allow_multi(self) -> bool:
        """True if a node may hold several partitions of this topic (Youzan's
        ``AllowMulti``: ordered or multipart). Otherwise every partition replica needs a
        node of its own, as Youzan keeps for old clients that expect one partition per
        nsqd."""
        return self.ordered or self.multipart

    def lookup_json(self) -> dict[str, Any]:
        """The ``meta`` object of ``/lookup?metainfo=true`` (keys sorted, as Go's map)."""
        return {
            "disable_channel_auto_create": self.disable_channel_auto_create,
            "extend_support": self.ext,
            "multi_part": self.multipart,
            "ordered": self.ordered,
            "partition_num": self.partition_num,
            "replica": self.replica,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "partition_num": self.partition_num,
            "replica": self.replica,
            "suggest_lf": self.suggest_lf,
            "sync_every": self.sync_every,
            "retention_days": self.retention_days,
            "ordered": self.ordered,
            "multipart": self.multipart,
            "ext": self.ext,
            "disable_channel_auto_create": self.disable_channel_auto_create,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TopicMeta:
        """Decode :meth:`to_json`'s output; ValueError if a field is missing or wrong."""
        meta = cls(
            partition_num=_int(obj, "partition_num"),
            replica=_int(obj, "replica"),
            suggest_lf=_int(obj, "suggest_lf"),
            sync_every=_int(obj, "sync_every"),
            retention_days=_int(obj, "retention_days"),
            ordered=_bool(obj, "ordered"),
            multipart=_bool(obj, "multipart"),
            ext=_bool(obj, "ext"),
            disable_channel_auto_create=_bool(obj, "disable_channel_auto_create"),
        )
        if not 1 <= meta.partition_num <= MAX_PARTITION_NUM:
            raise ValueError(f"partition_num {meta.partition_num} out of range")
        if not 1 <= meta.replica <= MAX_REPLICATOR:
            raise ValueError(f"replica {meta.replica} out of range")
        return meta


#: Youzan's zero TopicMetaInfo: what /lookup?metainfo=true shows for an unknown topic.
UNKNOWN_TOPIC_META_JSON: dict[str, Any] = {
    "disable_channel_auto_create": False,
    "extend_support": False,
    "multi_part": False,
    "ordered": False,
    "partition_num": 0,
    "replica": 0,
}


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
        return cls(meta, dict(sorted(placements.items())), tuple(channels))


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is not an integer: {value!r}")
    return value


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"{key} is not a boolean: {value!r}")
    return value
