"""Message: one delivered message, and the answers a handler gives nsqd (FIN, REQ, TOUCH)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nsqx.client.errors import NSQError

if TYPE_CHECKING:
    from nsqx.client.consumer import _Link


_HEAD = struct.Struct(">qH")


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
        """The 16-character hex id nsqd gave the message (ASCII bytes)."""
        return self._data[10:26]

    @property
    def body(self) -> bytes:
        return self._data[26:]

    @property
    def timestamp(self) -> int:
        """When nsqd received the message, in nanoseconds since the epoch."""
        return int(_HEAD.unpack_from(self._data)[0])

    @property
    def attempts(self) -> int:
        """How many times nsqd has delivered it, this time included (starts at 1)."""
        data = self._data
        return data[8] << 8 | data[9]

    def __repr__(self) -> str:
        return (
            f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts} "
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
            raise MessageRespondedError(f"{what}: message {self.id!r} was already answered")
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
            raise MessageRespondedError(f"touch: message {self.id!r} was already answered")
        if self._link is not None:
            self._link.touch(self)
