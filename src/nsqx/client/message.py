"""Message: one delivered message, and the answers a handler gives nsqd (FIN, REQ, TOUCH).

A message keeps its frame's bytes; fields are decoded when read. The frame's layout
depends on the subscription (see :mod:`nsqx.wire.frames`): NSQ 1.3's (a hex id), or
Youzan's (a binary id and trace id; the ext header on ext topics; offset and raw size
after SUB_ORDERED / SUB_ADVANCED), told apart by the message's class, chosen once per
connection (:func:`message_class`), so that no per-message field records it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nsqx.client.errors import NSQError
from nsqx.wire.ext import CLIENT_DISPATCH_TAG_KEY, JSON_HEADER_EXT_VER, header_tag
from nsqx.wire.frames import (
    MSG_ATTEMPTS_AT,
    MSG_BODY_AT,
    MSG_DETAIL_SIZE,
    MSG_EXT_AT,
    MSG_EXT_LEN_AT,
    MSG_EXT_VER_AT,
    MSG_ID_AT,
    MSG_ID_END,
    MSG_TRACE_AT,
)

if TYPE_CHECKING:
    from nsqx.client.consumer import _Link


_HEAD = struct.Struct(">qH")
_U64 = struct.Struct(">Q")
_DETAIL = struct.Struct(">QI")


class MessageRespondedError(NSQError):
    """finish() or requeue() on a message that was already finished or requeued."""


class Message:
    """A message delivered to a consumer.

    Answer it once with :meth:`finish` or :meth:`requeue`; :meth:`touch` asks nsqd for
    more time. A handler's return finishes it and an exception requeues it, unless the
    handler answered itself or called :meth:`enable_async` (then it must answer later).
    """

    # A message keeps its frame's bytes and decodes fields when asked: most handlers
    # read the body once, and building fewer attributes per message is what keeps
    # consumption fast.
    __slots__ = ("_async", "_data", "_link", "_responded")

    def __init__(self, data: bytes, link: _Link | None = None) -> None:
        #: the message frame's data: [i64 timestamp][u16 attempts][16-byte id][body]
        self._data = data
        self._link = link
        self._responded = False
        self._async = False

    @classmethod
    def make(cls, id: bytes, body: bytes, timestamp: int = 0, attempts: int = 1) -> Message:
        """A message not tied to a connection (tests, fakes): answers go nowhere."""
        if len(id) != 16:
            raise ValueError("a message id has 16 bytes")
        return cls(_HEAD.pack(timestamp, attempts) + id + body)

    @property
    def id(self) -> bytes:
        """The 16 bytes nsqd identifies the message by (what FIN, REQ and TOUCH send back):
        16 hex ASCII characters from NSQ 1.3, or, in Youzan mode, the u64 id then the u64
        trace id, big-endian (binary: use :attr:`hex_id` or :attr:`internal_id` to print)."""
        return self._data[MSG_ID_AT:MSG_ID_END]

    @property
    def body(self) -> bytes:
        return self._data[MSG_BODY_AT:]

    @property
    def hex_id(self) -> bytes:
        """The id as NSQ 1.3 clients see it: 16 lowercase hex characters (ASCII bytes)."""
        return self._data[MSG_ID_AT:MSG_ID_END]

    @property
    def internal_id(self) -> int:
        """The id as an integer (nsqx and Youzan: ``partition << 50 | sequence``)."""
        return int(self._data[MSG_ID_AT:MSG_ID_END], 16)

    @property
    def trace_id(self) -> int:
        """The trace id it was published with (PUB_TRACE, ``##trace_id``); 0 if none, or
        when the subscription is NSQ 1.3's (which does not carry it)."""
        return 0

    @property
    def offset(self) -> int:
        """Its virtual byte offset in the partition's log; -1 unless the subscription
        carries positions (ordered, a start position, or ``enable_trace``)."""
        return -1

    @property
    def raw_size(self) -> int:
        """Its size in the log (the next message's offset is ``offset + raw_size``); 0
        when :attr:`offset` is -1."""
        return 0

    @property
    def ext_ver(self) -> int:
        """The ext header's version: 0 none, 2 a dispatch tag, 4 a JSON header."""
        return 0

    @property
    def ext(self) -> bytes:
        """The ext header's bytes as published (JSON for version 4); empty if none."""
        return b""

    @property
    def ext_header(self) -> dict[str, Any]:
        """The ext header as a dict (``##`` keys included: ``##client_dispatch_tag``,
        ``##trace_id``); empty when there is none or it is not a JSON object."""
        ver = self.ext_ver
        if ver == JSON_HEADER_EXT_VER:
            try:
                header = json.loads(self.ext)
            except (ValueError, UnicodeDecodeError):
                return {}
            return header if isinstance(header, dict) else {}
        if ver:
            tag = header_tag(ver, self.ext)
            return {CLIENT_DISPATCH_TAG_KEY: tag} if tag else {}
        return {}

    @property
    def tag(self) -> str:
        """The dispatch tag of its ext header ("" if none)."""
        return header_tag(self.ext_ver, self.ext)

    @property
    def partition(self) -> int | None:
        """The partition it came from, when the subscription named one."""
        link = self._link
        return link.partition if link is not None else None

    @property
    def timestamp(self) -> int:
        """When nsqd received the message, in nanoseconds since the epoch."""
        return int(_HEAD.unpack_from(self._data)[0])

    @property
    def attempts(self) -> int:
        """How many times nsqd has delivered it, this time included (starts at 1)."""
        data = self._data
        return data[MSG_ATTEMPTS_AT] << 8 | data[MSG_ATTEMPTS_AT + 1]

    def __repr__(self) -> str:
        return (
            f"<Message {self.hex_id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"{len(self.body)} B>"
        )

    @property
    def has_responded(self) -> bool:
        """True once finished or requeued."""
        return self._responded

    @property
    def is_async(self) -> bool:
        """True when the handler said it will answer later."""
        return self._async

    def enable_async(self) -> None:
        """The handler will answer later: its return must not finish this message."""
        self._async = True

    # go-nsq's name for the same thing
    disable_auto_response = enable_async

    def _take(self, what: str) -> _Link | None:
        if self._responded:
            raise MessageRespondedError(f"{what}: message {self.hex_id!r} was already answered")
        self._responded = True
        return self._link

    def finish(self) -> None:
        """Tell nsqd the message was processed (FIN)."""
        link = self._take("finish")
        if link is not None:
            link.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """Give the message back to nsqd (REQ) to be delivered again after ``delay`` s.

        Without a delay, the consumer's ``default_requeue_delay`` times the attempts
        (up to ``max_requeue_delay``). ``backoff=True`` counts as a failure for the
        consumer's backoff; ``False`` requeues without slowing the consumer down.
        """
        link = self._take("requeue")
        if link is not None:
            link.requeue(self, delay, backoff)

    def touch(self) -> None:
        """Ask nsqd for more time (TOUCH resets the message's timeout).

        The client never touches on its own: call this from long handlers.
        """
        if self._responded:
            raise MessageRespondedError(f"touch: message {self.hex_id!r} was already answered")
        if self._link is not None:
            self._link.touch(self)


def finish_all(messages: Iterable[Message]) -> int:
    """FIN every message of ``messages`` not answered yet, as :meth:`Message.finish`
    would one by one, but grouped by connection: one FIN command list and one
    bookkeeping step per connection instead of per message (for consumers that hold
    many messages with :meth:`Message.enable_async` and answer them together). Call it
    on the consumer's event loop. Returns how many were finished."""
    by_link: dict[int, tuple[_Link, list[bytes]]] = {}
    n = 0
    for msg in messages:
        if msg._responded:
            continue
        msg._responded = True
        n += 1
        link = msg._link
        if link is not None:
            entry = by_link.get(id(link))
            if entry is None:
                entry = by_link[id(link)] = (link, [])
            entry[1].append(msg._data[MSG_ID_AT:MSG_ID_END])  # the id, in every layout
    for link, ids in by_link.values():
        link.finish_many(ids)
    return n


class YouzanMessage(Message):
    """A message in Youzan's layout: ``[i64 ts][u16 attempts][u64 id][u64 trace id]``,
    then the ext part if the subscription has ext (``_ext``), then ``[u64 offset][u32
    raw size]`` if it has positions (``_detail``), then the body.

    Four subclasses fix the two flags as class attributes (see :func:`message_class`).
    """

    __slots__ = ()
    _ext = False
    _detail = False

    @classmethod
    def make_youzan(
        cls,
        internal_id: int,
        body: bytes,
        *,
        trace_id: int = 0,
        timestamp: int = 0,
        attempts: int = 1,
        ext_ver: int = 0,
        ext: bytes = b"",
        offset: int = 0,
        raw_size: int = 0,
    ) -> Message:
        """A message not tied to a connection, in this class's layout (tests, fakes)."""
        parts = [_HEAD.pack(timestamp, attempts), _U64.pack(internal_id), _U64.pack(trace_id)]
        if cls._ext:
            parts.append(bytes((ext_ver,)))
            if ext_ver:
                parts += (len(ext).to_bytes(2, "big"), ext)
        if cls._detail:
            parts.append(_DETAIL.pack(offset, raw_size))
        parts.append(body)
        return cls(b"".join(parts))

    def _detail_at(self) -> int:
        """Where the offset field (or, without one, the body) starts."""
        if not self._ext:
            return MSG_ID_END
        data = self._data
        if data[MSG_EXT_VER_AT]:
            return MSG_EXT_AT + (data[MSG_EXT_LEN_AT] << 8 | data[MSG_EXT_LEN_AT + 1])
        return MSG_EXT_LEN_AT

    @property
    def body(self) -> bytes:
        return self._data[self._detail_at() + (MSG_DETAIL_SIZE if self._detail else 0) :]

    @property
    def hex_id(self) -> bytes:
        return b"%016x" % _U64.unpack_from(self._data, MSG_ID_AT)[0]

    @property
    def internal_id(self) -> int:
        return int(_U64.unpack_from(self._data, MSG_ID_AT)[0])

    @property
    def trace_id(self) -> int:
        return int(_U64.unpack_from(self._data, MSG_TRACE_AT)[0])

    @property
    def offset(self) -> int:
        if not self._detail:
            return -1
        return int(_U64.unpack_from(self._data, self._detail_at())[0])

    @property
    def raw_size(self) -> int:
        if not self._detail:
            return 0
        return int(_DETAIL.unpack_from(self._data, self._detail_at())[1])

    @property
    def ext_ver(self) -> int:
        return self._data[MSG_EXT_VER_AT] if self._ext else 0

    @property
    def ext(self) -> bytes:
        data = self._data
        if not self._ext or not data[MSG_EXT_VER_AT]:
            return b""
        return data[
            MSG_EXT_AT : MSG_EXT_AT + (data[MSG_EXT_LEN_AT] << 8 | data[MSG_EXT_LEN_AT + 1])
        ]


class _YzExt(YouzanMessage):
    __slots__ = ()
    _ext = True


class _YzDetail(YouzanMessage):
    __slots__ = ()
    _detail = True


class _YzExtDetail(YouzanMessage):
    __slots__ = ()
    _ext = True
    _detail = True


def message_class(youzan: bool, ext: bool = False, detail: bool = False) -> type[Message]:
    """The message class for a subscription's frames: NSQ 1.3's, or Youzan's with or
    without the ext part and the position fields."""
    if not youzan:
        return Message
    if ext:
        return _YzExtDetail if detail else _YzExt
    return _YzDetail if detail else YouzanMessage
