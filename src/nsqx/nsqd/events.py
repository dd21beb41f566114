"""Events nsqd publishes about its own topology."""

from __future__ import annotations

from typing import Literal, NamedTuple


class TopologyEvent(NamedTuple):
    """A topic partition or a channel of one appeared or went away (what nsqlookupd
    registration follows). NSQ 1.3 topics have one partition, 0."""

    kind: Literal["create", "delete"]
    topic: str
    channel: str | None = None
    partition: int = 0
