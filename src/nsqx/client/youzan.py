"""Values of Youzan's extensions as the client shows them: trace replies, ext headers,
start positions for consuming from an offset or a time.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from nsqx.wire.commands import (
    OFFSET_MSGCOUNT,
    OFFSET_SPECIAL,
    OFFSET_TIMESTAMP,
    OFFSET_VIRTUAL_QUEUE,
    ConsumeStart,
)
from nsqx.wire.ext import CLIENT_DISPATCH_TAG_KEY, MAX_EXT_LEN, TRACE_ID_KEY, check_tag
from nsqx.wire.frames import OK

__all__ = [
    "ConsumeStart",
    "TraceResult",
    "ext_header",
    "set_channel_offset",
    "start_at_count",
    "start_at_end",
    "start_at_offset",
    "start_at_time",
]

#: partition << PARTITION_SHIFT | sequence: the ids of nsqx and of Youzan's nsqd
PARTITION_SHIFT = 50
_TRACED = struct.Struct(">QQQI")
TRACED_RESPONSE_SIZE = 2 + _TRACED.size
_U64_MAX = (1 << 64) - 1


class TraceResult(NamedTuple):
    """nsqd's answer to a traced publish (PUB_TRACE, MPUB_TRACE, PUB_EXT with a trace id).

    For a batch: the first message's id and offset, trace id 0, and the raw size of the
    whole batch.
    """

    #: the message id (``partition << 50 | sequence``)
    id: int
    trace_id: int
    #: the message's virtual byte offset in its partition's log
    offset: int
    #: its size in the log: the next message starts at ``offset + raw_size``
    raw_size: int

    @property
    def partition(self) -> int:
        """The partition the message went to (from its id)."""
        return self.id >> PARTITION_SHIFT

    @classmethod
    def from_response(cls, data: bytes) -> TraceResult:
        """Parse the 30-byte answer: ``OK`` + id + trace id + offset + raw size."""
        if len(data) != TRACED_RESPONSE_SIZE or data[:2] != OK:
            raise ValueError(f"not a traced publish answer: {bytes(data[:40])!r}")
        return cls(*_TRACED.unpack_from(data, 2))


def check_trace_id(trace_id: int) -> int:
    """``trace_id`` if it is a u64 (TypeError, ValueError otherwise)."""
    if isinstance(trace_id, bool) or not isinstance(trace_id, int):
        raise TypeError(f"a trace id is an int, not {type(trace_id).__name__}")
    if not 0 <= trace_id <= _U64_MAX:
        raise ValueError(f"a trace id is an unsigned 64-bit integer (got {trace_id})")
    return trace_id


def ext_header(
    ext: Mapping[str, Any] | None = None,
    *,
    tag: str | None = None,
    trace_id: int | None = None,
) -> bytes:
    """The JSON ext header of a PUB_EXT / MPUB_EXT: ``ext`` plus the reserved keys.

    ``tag`` becomes ``##client_dispatch_tag`` (consumers whose ``desired_tag`` is that
    tag get the message); a non-zero ``trace_id`` becomes ``##trace_id`` (a decimal
    string, as Youzan's nsqd wants it), which makes nsqd answer with a
    :class:`TraceResult`. Other keys starting with ``##`` are the server's and are
    refused. The JSON is compact with sorted keys (what go-nsq's ``json.Marshal`` of a
    map gives), UTF-8.
    """
    header: dict[str, Any] = dict(ext or {})
    for key in header:
        if not isinstance(key, str):
            raise TypeError(f"ext header keys are strings (got {key!r})")
    reserved = [k for k in header if k.startswith("##")]
    for key in reserved:
        if key == CLIENT_DISPATCH_TAG_KEY:
            if tag is not None:
                raise ValueError(f"both tag= and {key!r} in ext")
            if not isinstance(header[key], str):
                raise ValueError(f"{key!r} must be a string")
        elif key == TRACE_ID_KEY:
            if trace_id is not None:
                raise ValueError(f"both trace_id= and {key!r} in ext")
            value = header[key]
            if not isinstance(value, str) or not value.isdigit() or int(value) > _U64_MAX:
                raise ValueError(f"{key!r} must be a u64 as a decimal string (got {value!r})")
        else:
            raise ValueError(f"ext header keys starting with ## are reserved (got {key!r})")
    if tag:
        check_tag(tag)
        header[CLIENT_DISPATCH_TAG_KEY] = tag
    if trace_id:
        header[TRACE_ID_KEY] = str(check_trace_id(trace_id))
    data = json.dumps(header, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    if len(data) > MAX_EXT_LEN:
        raise ValueError(f"ext header too long ({len(data)} bytes, at most {MAX_EXT_LEN})")
    return data


# -- start positions (SUB_ADVANCED) ----------------------------------------------------


def start_at_time(when: float | datetime) -> ConsumeStart:
    """Start at the first message published at or after ``when`` (epoch seconds or an
    aware datetime; nsqd's resolution is the second)."""
    seconds = when.timestamp() if isinstance(when, datetime) else when
    return ConsumeStart(OFFSET_TIMESTAMP, int(seconds))


def start_at_offset(offset: int) -> ConsumeStart:
    """Start at a virtual byte offset of the partition's log (a :attr:`Message.offset`
    or :attr:`TraceResult.offset`)."""
    if offset < 0:
        raise ValueError(f"an offset is >= 0 (got {offset})")
    return ConsumeStart(OFFSET_VIRTUAL_QUEUE, offset)


def start_at_count(count: int) -> ConsumeStart:
    """Start at the partition's ``count``-th message, counted from 1 over the partition's
    life as Youzan's nsqd counts (0 and 1 both mean the first message ever published)."""
    if count < 0:
        raise ValueError(f"a message count is >= 0 (got {count})")
    return ConsumeStart(OFFSET_MSGCOUNT, count)


def start_at_end() -> ConsumeStart:
    """Start after the last message: only what is published from now on."""
    return ConsumeStart(OFFSET_SPECIAL, -1)


async def set_channel_offset(
    nsqd_http_address: str,
    topic: str,
    channel: str,
    partition: int,
    start: ConsumeStart,
    *,
    timeout: float = 5.0,
) -> None:
    """Move a channel of one partition to ``start`` (nsqd's ``POST /channel/setoffset``),
    whatever its clients: how an ordered channel is replayed (SUB_ADVANCED cannot be
    used on an ordered topic). Ask the nsqd that leads the partition.

    Raises :class:`~nsqx.client.errors.NSQServerError` with nsqd's message
    (``CHANNEL_NOT_FOUND``, ``E_FAILED_ON_NOT_LEADER``, ...).
    """
    import aiohttp  # only this helper needs it

    from nsqx.client.errors import NSQServerError

    base = nsqd_http_address if "://" in nsqd_http_address else "http://" + nsqd_http_address
    params = {"topic": topic, "channel": channel, "partition": str(partition)}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.post(
            base.rstrip("/") + "/channel/setoffset", params=params, data=str(start).encode()
        ) as resp,
    ):
        text = await resp.text()
        if resp.status == 200:
            return
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    message = text.strip()
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        message = parsed["message"]
    raise NSQServerError(message or f"HTTP_{resp.status}", f"(HTTP {resp.status})")
