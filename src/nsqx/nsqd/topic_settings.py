"""TopicSettings: what a topic was created with (Youzan's topic meta).

A topic created the NSQ 1.3 way (by a PUB or SUB, or /topic/create with no more than a
name) has the defaults: one partition, no ordering, no ext headers. nsqlookupd's
/topic/create (or nsqd's, on a single node) sets the rest; nsqd.dat keeps them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

MAX_PARTITIONS = 255


@dataclass(frozen=True)
class TopicSettings:
    """A topic's meta, with Youzan's names in comments where they differ."""

    #: partitions in the whole cluster (1-255); this node hosts some of them
    partition_num: int = 1
    #: replicas of each partition (replicator)
    replica: int = 1
    #: orderedmulti: every channel is ordered, a plain SUB is refused, PUB must name a
    #: partition
    ordered: bool = False
    #: extend: messages may carry JSON ext headers; consumers must IDENTIFY with
    #: extend_support
    ext: bool = False
    #: multipart: several partitions of the topic may share a node
    multipart: bool = False
    #: channels are made by the API only, never by a SUB
    disable_channel_auto_create: bool = False
    #: retention in days (0: nsqd's --retention)
    retention_days: int = 0
    #: syncdisk: fsync every this many messages (0: nsqd's --sync-every)
    sync_disk: int = 0

    @property
    def partitioned(self) -> bool:
        """True unless the topic is NSQ 1.3's single partition with no extension."""
        return self != DEFAULT_SETTINGS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> TopicSettings:
        """From nsqd.dat; unknown keys are ignored and wrong types give the default."""
        if not isinstance(data, dict):
            return cls()
        values: dict[str, Any] = {}
        for f in fields(cls):
            v = data.get(f.name)
            default = getattr(DEFAULT_SETTINGS, f.name)
            if isinstance(default, bool):
                if isinstance(v, bool):
                    values[f.name] = v
            elif isinstance(v, int) and not isinstance(v, bool):
                values[f.name] = v
        return cls(**values)

    def validate(self) -> None:
        """ValueError (with the reason) unless the values are usable."""
        if not 1 <= self.partition_num <= MAX_PARTITIONS:
            raise ValueError(f"partition_num must be 1-{MAX_PARTITIONS}")
        if not 1 <= self.replica <= 5:
            raise ValueError("replicator must be 1-5")
        if self.retention_days < 0 or self.sync_disk < 0:
            raise ValueError("retention and syncdisk must not be negative")


DEFAULT_SETTINGS = TopicSettings()
