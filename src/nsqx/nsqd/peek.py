"""Looking at messages without consuming them: ``/channel/peek`` and ``/topic/peek``.

NSQ never had this (nsq #375, #956, #1412, #1482); an operator wants to see what a stuck
channel would deliver next, or what a topic holds at some point, without a consumer
that would take the messages. Both read the partition's log (and a channel's requeued
messages) and change nothing: no cursor moves, no attempt counts, nothing goes in
flight. See docs/peek.md.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Final

from nsqx.store.log import records
from nsqx.wire.frames import ID_AT, ID_END, attempts_of, record_parts, timestamp_of

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.partition import Partition

#: messages shown by default, and at most
DEFAULT_PEEK: Final = 10
MAX_PEEK: Final = 1000


def message_json(part: Partition, seq: int, frame: bytes, attempts: int) -> dict[str, Any]:
    """One stored message as the peek endpoints show it: its id as NSQ clients see it
    (16 hex characters), the delivery it would be, its publish time (ns), where it is
    in the log, its body as text (invalid UTF-8 replaced) and exactly (base64), and on
    an ext topic its trace id and ext header."""
    trace_id, _ver, ext, body_at = record_parts(frame)
    body = frame[body_at:]
    out: dict[str, Any] = {
        "id": frame[ID_AT:ID_END].decode("ascii", "replace"),
        "attempts": attempts,
        "timestamp": timestamp_of(frame),
        "sequence": seq,
        "offset": part.log.offset_of(seq),
        "body": body.decode("utf-8", "replace"),
        "body_base64": base64.b64encode(body).decode("ascii"),
    }
    if part.topic.meta.ext:
        out["trace_id"] = trace_id
        out["ext"] = ext.decode("utf-8", "replace")
    return out


def peek_channel(channel: Channel, n: int) -> dict[str, Any]:
    """The next ``n`` messages ``channel`` would deliver (Channel.peek), with its
    state beside them."""
    part = channel.partition
    depth, deferred = channel.reported_depths()  # (as /stats counts them)
    return {
        "topic_name": part.topic.name,
        "channel_name": channel.name,
        "partition": part.id,
        "paused": channel.paused,
        "depth": depth,
        "in_flight_count": channel.in_flight_count,
        "deferred_count": deferred,
        "messages": [message_json(part, s, f, a) for s, f, a in channel.peek(n)],
    }


def peek_log(part: Partition, seq: int, n: int) -> dict[str, Any]:
    """Up to ``n`` messages of ``part``'s log from sequence ``seq`` (clamped to the
    oldest kept), deferred ones included: the log as it is, whatever its channels did."""
    log = part.log
    end = part.visible_end
    out: list[dict[str, Any]] = []
    for s, frame in records(log, seq, end):
        if len(out) >= n:
            break
        out.append(message_json(part, s, frame, attempts_of(frame)))
    return {
        "topic_name": part.topic.name,
        "partition": part.id,
        "start": log.start,
        "end": end,
        "messages": out,
    }
