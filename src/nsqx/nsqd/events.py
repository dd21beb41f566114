"""Events nsqd publishes about its own topology."""

from __future__ import annotations

from typing import Literal, NamedTuple


class TopologyEvent(NamedTuple):
    """A topic or channel appeared or went away (what nsqlookupd registration follows)."""

    kind: Literal["create", "delete"]
    topic: str
    channel: str | None = None
