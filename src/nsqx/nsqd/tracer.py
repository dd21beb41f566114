"""Tracer: the history of traced messages, as log lines and for /message/trace.

A message is traced when it has a trace id (PUB_TRACE, MPUB_TRACE, ``##trace_id`` in an
ext header) or when tracing is on for its topic or channel (/message/trace/enable).
Each event (PUB, START, FIN, REQ, TIMEOUT ...) is logged as one JSON line on the
``nsqx.trace`` logger, prefixed ``[TRACE]`` as Youzan's nsqd prefixes its own, and
kept in a bounded ring so that /message/trace can answer by trace id or message id.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.guid import PARTITION_SHIFT, SEQ_MASK

if TYPE_CHECKING:
    from nsqx.nsqd.partition import Partition

trace_log = logging.getLogger("nsqx.trace")

#: events kept for /message/trace (the oldest go first); a kept event is a small dict,
#: about 400 bytes, so this bounds the memory at about 20 MB
DEFAULT_CAPACITY = 50_000

PUB = "PUB"
START = "START"
FIN = "FIN"
REQ = "REQ"
TIMEOUT = "TIMEOUT"


class Tracer:
    """Records trace events; bounded, so a busy traced topic cannot grow memory."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=capacity)

    def record(
        self,
        event: str,
        part: Partition,
        msg_id: bytes,
        trace_id: int,
        *,
        channel: str = "",
        client: str = "",
        offset: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """One event of the message with hex id ``msg_id``."""
        entry: dict[str, Any] = {
            "ts": time.time_ns(),
            "event": event,
            "topic": part.name,
            "partition": part.id,
            "msg_id": (part.id << PARTITION_SHIFT) | (int(msg_id, 16) & SEQ_MASK),
            "trace_id": trace_id,
        }
        if channel:
            entry["channel"] = channel
        if client:
            entry["client"] = client
        if offset is not None:
            entry["offset"] = offset
        if extra:
            entry.update(extra)
        self.events.append(entry)
        if trace_log.isEnabledFor(logging.INFO):
            trace_log.info("[TRACE] %s", json.dumps(entry, separators=(",", ":")))

    def published(
        self, part: Partition, ids: list[bytes], trace_ids: list[int] | None, offset: int
    ) -> None:
        """PUB events for a batch (its first message at virtual ``offset``)."""
        traces = trace_ids or [0] * len(ids)
        for k, (mid, trace) in enumerate(zip(ids, traces, strict=True)):
            self.record(PUB, part, mid, trace, offset=offset if k == 0 else None)

    def find(
        self,
        topic: str,
        *,
        trace_id: int | None = None,
        msg_id: int | None = None,
        partition: int | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Events of a topic's messages with this trace id or message id, oldest first."""
        out = []
        for e in self.events:
            if e["topic"] != topic:
                continue
            if partition is not None and e["partition"] != partition:
                continue
            if trace_id is not None and e["trace_id"] != trace_id:
                continue
            if msg_id is not None and e["msg_id"] != msg_id:
                continue
            out.append(e)
            if len(out) >= limit:
                break
        return out
