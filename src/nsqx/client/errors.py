"""Errors raised by the client.

Every error is an :class:`NSQError`. Errors that nsqd sent in an error frame are
:class:`NSQServerError` and carry NSQ's code (``E_BAD_TOPIC``, ``E_PUB_FAILED``, ...).
"""

from __future__ import annotations

from nsqx.wire.errors import ProtocolError


class NSQError(Exception):
    """Base class of every error the client raises."""


class ConfigError(NSQError, ValueError):
    """A configuration value is invalid; raised when the object is built."""


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed (or could not be opened) before the command was answered."""


class NSQServerError(NSQError, ProtocolError):
    """nsqd answered with an error frame: ``CODE description`` (``fatal``: nsqd closes
    the connection after every error but E_FIN/REQ/TOUCH_FAILED)."""

    @classmethod
    def from_frame(cls, data: bytes) -> NSQServerError:
        """Parse an error frame's payload."""
        text = bytes(data).decode("utf-8", "replace")
        code, _, description = text.partition(" ")
        if code.startswith("E_AUTH") or code == "E_UNAUTHORIZED":
            return AuthError(code, description)
        return cls(code, description)


class AuthError(NSQServerError):
    """AUTH failed, or nsqd required AUTH and no ``auth_secret`` was configured."""


class PublishError(NSQServerError):
    """nsqd refused a publish (PUB, MPUB, DPUB or HTTP /pub, /mpub)."""


class HandshakeError(NSQError):
    """The connection could not be set up: bad IDENTIFY reply, TLS refused, and so on."""


class CodecUnavailableError(ConfigError):
    """snappy or deflate was asked for but no stream codec for it is installed."""


class PartitionUnavailableError(NSQError):
    """No nsqd serves the partition a publish must go to (nsqlookupd lists no leader for
    it, or the topic is unknown), after the retries."""


class OrderError(NSQError):
    """An ordered subscription delivered a message whose offset and id do not follow the
    last one of its partition (``ordered_check="raise"`` stops the consumer with it)."""
