"""What a publish is checked against, wherever it arrives: the partition it goes to,
whether that partition takes writes now, and the ext headers of PUB_EXT / MPUB_EXT.

A connection (nsqx.nsqd.client_v2) calls these for its own publishes, and a worker that
owns a partition calls them for the publishes other workers forward to it
(nsqx.nsqd.workers.forwarding): both refuse the same things with the same answers.
Each raises the :class:`~nsqx.wire.errors.ProtocolError` to answer (its ``fatal``
says whether the connection closes after it).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from nsqx.wire.errors import (
    E_BAD_PARTITION,
    E_EXT_NOT_SUPPORT,
    E_FAILED_ON_NOT_WRITABLE,
    E_TOPIC_NOT_EXIST,
    ProtocolError,
)
from nsqx.wire.ext import (
    JSON_HEADER_EXT_VER,
    ExtError,
    header_trace_id,
    only_reserved_keys,
    parse_header,
)
from nsqx.wire.frames import OK, encode_response

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition, Published
    from nsqx.nsqd.topic import Topic

_TRACED: Final = struct.Struct(">QQQI")


def pub_partition(nsqd: NSQD, topics: dict[str, Topic], topic_name: str, pid: int) -> Partition:
    """The partition a publish goes to. A topic that does not exist is made as NSQ 1.3
    makes it, unless a partition is named. Raises the ProtocolError to answer."""
    topic = topics.get(topic_name)
    if topic is None or not topic.partitions:
        if pid >= 0:
            raise ProtocolError(E_TOPIC_NOT_EXIST, "")
        topic = nsqd.get_topic(topic_name)
    part = topic.partition(pid)
    if part is None:
        raise ProtocolError(E_TOPIC_NOT_EXIST, "")
    if pid < 0 and topic.ordered:
        raise ProtocolError(
            E_BAD_PARTITION, f"topic partition is not valid for multi partition: {pid}"
        )
    replica = part.replica
    if replica is not None:
        # a draining node has left nsqlookupd, which elects other leaders: its clients
        # look the partition up again rather than wait for this one's lease to lapse
        code = E_FAILED_ON_NOT_WRITABLE if nsqd.draining else replica.write_error()
        if code is not None:
            # the client looks the partition up again (Youzan's non-fatal answer)
            raise ProtocolError(code, "", fatal=False)
    return part


def ext_fields(
    nsqd: NSQD, topic_name: str, headers: list[bytes]
) -> tuple[list[int | None], list[tuple[int, bytes]] | None]:
    """Check PUB_EXT / MPUB_EXT headers against the topic: trace ids (None: no
    ``##trace_id``) and ext data per message (None: not an ext topic). Raises a
    non-fatal ProtocolError (the connection stays open)."""
    topic = nsqd.topics.get(topic_name)
    ext_topic = topic is not None and topic.meta.ext
    trace_ids: list[int | None] = []
    exts: list[tuple[int, bytes]] = []
    try:
        for raw in headers:
            if not raw and not ext_topic:
                trace_ids.append(None)
                exts.append((0, b""))
                continue
            header = parse_header(raw)
            trace_ids.append(header_trace_id(header))
            if ext_topic:
                exts.append((JSON_HEADER_EXT_VER, raw))
            elif nsqd.options.allow_ext_compatible and only_reserved_keys(header):
                exts.append((0, b""))  # the reserved keys alone can be dropped
            else:
                raise ExtError(
                    E_EXT_NOT_SUPPORT, f"ext content not supported in topic {topic_name}"
                )
    except ExtError as err:
        raise ProtocolError(err.code, str(err), fatal=False) from None
    return trace_ids, (exts if ext_topic else None)


def traced_answer(p: Published, trace_id: int, raw_size: int) -> bytes:
    """PUB_TRACE's answer, 30 bytes: OK, then the message id, trace id, virtual offset
    and raw size."""
    return encode_response(OK + _TRACED.pack(p.first_id, trace_id, p.offset, raw_size))
