"""NSQ's protocol error codes and the error type the parser and server raise.

An error is *fatal* when nsqd sends it and then closes the connection; only
E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED leave the connection open.
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

#: Errors after which nsqd keeps the connection open.
NON_FATAL = frozenset({E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED})


class ProtocolError(Exception):
    """A client error as nsqd reports it: ``CODE description`` in an error frame."""

    def __init__(self, code: str, description: str = "") -> None:
        super().__init__(code, description)
        self.code = code
        self.description = description

    @property
    def fatal(self) -> bool:
        """True when the connection must be closed after the error frame."""
        return self.code not in NON_FATAL

    def __str__(self) -> str:
        return f"{self.code} {self.description}" if self.description else self.code

    def to_bytes(self) -> bytes:
        """The error frame's payload."""
        return str(self).encode()
