"""TopicMeta: a topic's settings (Youzan's topic meta), as every part speaks of it.

What ``/topic/create`` was given: the partition count, replicas, ordering, ext headers,
placement and storage settings. nsqlookupd stores it and answers it in ``/lookup``'s
``meta``; nsqd keeps it in ``nsqd.dat`` and acts on it; clients read it from
``/lookup``. A topic made the NSQ 1.3 way has the defaults: one partition, nothing else.

The limits are Youzan's (nsqlookupd/http.go and consistence/nsqlookup_coord_api.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: partition_num is 1..MAX_PARTITION_NUM; partition ids are 0..MAX_PARTITION_NUM - 1.
MAX_PARTITION_NUM = 255
#: replicator is 1..MAX_REPLICATOR.
MAX_REPLICATOR = 5
#: When a replicated publish is answered (``replication_ack``, nsqd's
#: ``--replication-ack``): "durable", once every in-sync replica holds it and a write
#: quorum of the replicas has it fsynced; "written", once every in-sync replica wrote it.
REPLICATION_ACKS = ("durable", "written")


@dataclass(frozen=True)
class TopicMeta:
    """A topic's settings, with Youzan's parameter names in comments where they differ."""

    #: partitions in the whole cluster (1-255); a node hosts some of them
    partition_num: int = 1
    #: copies of each partition (``replicator``)
    replica: int = 1
    #: ``suggestload``: kept and shown, not used for placement
    suggest_lf: int = 0
    #: ``syncdisk``: fsync every this many messages (0: nsqd's --sync-every)
    sync_every: int = 0
    #: ``retention`` in days (0: nsqd's --retention); never past a channel's position
    retention_days: int = 0
    #: ``orderedmulti``: every channel is ordered, a plain SUB is refused, a PUB must
    #: name its partition; several partitions may share a node
    ordered: bool = False
    #: ``multipart``: several partitions of the topic may share a node
    multipart: bool = False
    #: ``extend``: messages carry JSON ext headers; consumers IDENTIFY with
    #: extend_support
    ext: bool = False
    #: channels are made through the API only, never by a SUB
    disable_channel_auto_create: bool = False
    #: nsqx: when a publish of a replicated topic is answered (REPLICATION_ACKS; empty:
    #: each nsqd's --replication-ack)
    replication_ack: str = ""

    @property
    def partitioned(self) -> bool:
        """True unless these are NSQ 1.3's defaults (one partition, no extension)."""
        return self != TopicMeta()

    @property
    def allow_multi(self) -> bool:
        """True if a node may hold several partitions of this topic (Youzan's
        ``AllowMulti``: ordered or multipart). Otherwise every partition replica needs a
        node of its own, as Youzan keeps for old clients that expect one partition per
        nsqd."""
        return self.ordered or self.multipart

    def validate(self) -> None:
        """ValueError (with the reason) unless the values are usable."""
        if not 1 <= self.partition_num <= MAX_PARTITION_NUM:
            raise ValueError(f"partition_num {self.partition_num} out of range")
        if not 1 <= self.replica <= MAX_REPLICATOR:
            raise ValueError(f"replica {self.replica} out of range")
        if self.retention_days < 0 or self.sync_every < 0 or self.suggest_lf < 0:
            raise ValueError("retention, syncdisk and suggestload must not be negative")
        if self.replication_ack and self.replication_ack not in REPLICATION_ACKS:
            raise ValueError(f"replication_ack {self.replication_ack!r} is not durable|written")

    # -- JSON -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """As stored (nsqlookupd's meta store, nsqd.dat)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Any) -> TopicMeta:
        """Decode :meth:`to_json`'s output; ValueError if a field is missing or wrong."""
        if not isinstance(obj, Mapping):
            raise ValueError("topic meta is not an object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = obj.get(f.name)
            default = getattr(_DEFAULT, f.name)
            if f.name in _ADDED_LATER and value is None:
                value = default  # (stored by a release before the field)
            if isinstance(default, str):
                if not isinstance(value, str):
                    raise ValueError(f"{f.name} is not a string: {value!r}")
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} is not a boolean: {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{f.name} is not an integer: {value!r}")
            values[f.name] = value
        meta = cls(**values)
        meta.validate()
        return meta

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

    @classmethod
    def from_lookup_json(cls, meta: Mapping[str, Any]) -> TopicMeta:
        """From a ``/lookup`` answer's ``meta`` (leniently: a missing or mistyped field
        keeps its default; Youzan's answer for an unknown topic has ``partition_num``
        0, kept as is)."""

        def num(name: str, default: int) -> int:
            value = meta.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else default

        return cls(
            partition_num=num("partition_num", 1),
            replica=num("replica", 1),
            ext=meta.get("extend_support") is True,
            ordered=meta.get("ordered") is True,
            multipart=meta.get("multi_part") is True,
            disable_channel_auto_create=meta.get("disable_channel_auto_create") is True,
        )


_DEFAULT = TopicMeta()
#: fields a meta stored by an earlier release lacks (they take their defaults)
_ADDED_LATER = frozenset({"replication_ack"})
#: NSQ 1.3's topic: one partition, no extension
DEFAULT_META = _DEFAULT
