"""NSQ's protocol error codes and the error type the parser and server raise.

An error is *fatal* when nsqd sends it and then closes the connection. In NSQ 1.3 only
E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED leave the connection open. Youzan's
extensions add codes whose fatality depends on the command (E_FAILED_ON_NOT_LEADER
closes a SUB but not a PUB), so an error can also say so itself.
"""

from __future__ import annotations

E_INVALID = "E_INVALID"
E_BAD_BODY = "E_BAD_BODY"
E_BAD_TOPIC = "E_BAD_TOPIC"
E_BAD_CHANNEL = "E_BAD_CHANNEL"
E_BAD_MESSAGE = "E_BAD_MESSAGE"
E_PUB_FAILED = "E_PUB_FAILED"
E_MPUB_FAILED = "E_MPUB_FAILED"
E_DPUB_FAILED = "E_DPUB_FAILED"
E_FIN_FAILED = "E_FIN_FAILED"
E_REQ_FAILED = "E_REQ_FAILED"
E_TOUCH_FAILED = "E_TOUCH_FAILED"
E_IDENTIFY_FAILED = "E_IDENTIFY_FAILED"
E_AUTH_FAILED = "E_AUTH_FAILED"
E_AUTH_FIRST = "E_AUTH_FIRST"
E_AUTH_DISABLED = "E_AUTH_DISABLED"
E_UNAUTHORIZED = "E_UNAUTHORIZED"
E_BAD_PROTOCOL = "E_BAD_PROTOCOL"

# Youzan's extensions (partitions, ordered consumption, tracing, ext headers)
E_BAD_PARTITION = "E_BAD_PARTITION"
E_TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"
E_SUB_ORDER_IS_MUST = "E_SUB_ORDER_IS_MUST"
E_SUB_EXTEND_NEED = "E_SUB_EXTEND_NEED"
#: (sic: Youzan's spelling, which clients match)
E_SUB_EXTEND_FORBIDDON = "E_SUB_EXTEND_FORBIDDON"
E_SUB_CHANNEL_NOT_REGISTERED = "E_SUB_CHANNEL_NOT_REGISTERED"
E_FAILED_ON_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
E_FAILED_ON_NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
E_EXT_NOT_SUPPORT = "E_EXT_NOT_SUPPORT"
E_INVALID_JSON_HEADER = "E_INVALID_JSON_HEADER"
#: (sic: no E_ prefix in Youzan's nsqd)
INVALID_TRACE_ID = "INVALID_TRACE_ID"
E_PUB_TOO_MUCH_WAITING = "E_PUB_TOO_MUCH_WAITING"
#: nsqx: a channel of the topic is at its maximum depth and its policy refuses publishes
#: until it has room (docs/dead-letters.md)
E_TOPIC_FULL = "E_TOPIC_FULL"

#: Errors after which nsqd keeps the connection open.
NON_FATAL = frozenset({E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED})
#: Errors that leave the connection open when answering a publish (Youzan's nsqd): the
#: client looks the partition up again, or fixes one message, and goes on.
NON_FATAL_ON_PUB = frozenset(
    {
        E_FAILED_ON_NOT_LEADER,
        E_FAILED_ON_NOT_WRITABLE,
        E_EXT_NOT_SUPPORT,
        E_INVALID_JSON_HEADER,
        INVALID_TRACE_ID,
        E_TOPIC_FULL,
    }
)


#: Youzan's codes that its nsqd sends with an empty description as ``CODE `` (Go's
#: ``code + " " + desc``); NSQ 1.3's bare codes keep their exact bytes
_SPACED = frozenset({E_TOPIC_NOT_EXIST, E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE})


class ProtocolError(Exception):
    """A client error as nsqd reports it: ``CODE description`` in an error frame."""

    def __init__(self, code: str, description: str = "", *, fatal: bool | None = None) -> None:
        super().__init__(code, description)
        self.code = code
        self.description = description
        self._fatal = fatal

    @property
    def fatal(self) -> bool:
        """True when the connection must be closed after the error frame."""
        if self._fatal is not None:
            return self._fatal
        return self.code not in NON_FATAL

    def __str__(self) -> str:
        if self.description or self.code in _SPACED:
            return f"{self.code} {self.description}"
        return self.code

    def to_bytes(self) -> bytes:
        """The error frame's payload."""
        return str(self).encode()
