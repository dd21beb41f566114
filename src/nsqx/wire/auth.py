"""NSQ's auth server protocol, sans-IO: an auth server's answer parsed into grants, and
what those grants permit, over TCP (AUTH, then PUB/SUB) and over HTTP (``--http-auth``).

A daemon sends ``GET /auth?common_name=&remote_ip=&secret=&tls=`` and expects ``{"ttl":
s, "identity", "identity_url", "authorizations": [{"topic": re, "channels": [re],
"permissions": ["subscribe"|"publish"|"admin"]}]}``. Topic and channel patterns are
unanchored regular expressions; a check that names no channel (a publish, or an HTTP
request about a whole topic) matches the channel patterns against "" (so it needs a
pattern such as ``.*``), exactly as NSQ's internal/auth does for PUB; a check about the
whole node matches the topic pattern against "" too.

``admin`` is nsqx's: it lets the HTTP API's actions through (create, delete, empty,
pause...) and grants nothing over TCP. NSQ 1.3 refuses an answer that has it.

Over HTTP the secret is ``Authorization: Bearer <secret>`` (what go-nsq already sends
to nsqlookupd); :class:`AuthCache` keeps answers for their ttl, the clock
passed in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

__all__ = [
    "ADMIN",
    "HTTP_AUTH_CLASSES",
    "PERMISSIONS",
    "PUBLISH",
    "READ",
    "AuthCache",
    "AuthDenied",
    "AuthError",
    "AuthState",
    "Authorization",
    "Need",
    "auth_url",
    "bearer_secret",
    "cache_key",
    "parse_auth_response",
    "parse_http_auth",
    "redact",
]

#: what an authorization may grant: NSQ's two, and nsqx's ``admin`` (HTTP actions)
PERMISSIONS = frozenset({"subscribe", "publish", "admin"})

#: the classes of HTTP requests ``--http-auth`` can protect (see :class:`Need`)
PUBLISH = "publish"
READ = "read"
ADMIN = "admin"
HTTP_AUTH_CLASSES = (PUBLISH, READ, ADMIN)


class AuthError(Exception):
    """No auth server gave a usable answer (never shown to the client)."""


class AuthDenied(AuthError):
    """An auth server refused the secret (it answered 4xx): the secret is wrong, as
    opposed to no server answering."""


@dataclass(frozen=True)
class Authorization:
    """One grant: permissions on the topics and channels matching the patterns."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        """SUB (channel given) needs ``subscribe``, PUB (channel "") ``publish``."""
        return self.permits("subscribe" if channel else "publish", topic, channel)

    def permits(self, permission: str, topic: str, channel: str) -> bool:
        """Whether this grant gives ``permission`` on ``topic`` and ``channel``."""
        if permission not in self.permissions:
            return False
        if not self.topic.search(topic):
            return False
        return any(c.search(channel) for c in self.channels)


@dataclass(frozen=True)
class AuthState:
    """What one auth answer granted, until ``expires`` (monotonic seconds)."""

    identity: str
    identity_url: str
    ttl: int
    authorizations: tuple[Authorization, ...]
    expires: float = field(compare=False)

    def allows(self, topic: str, channel: str) -> bool:
        """True when any authorization allows this topic/channel (TCP's PUB/SUB rule)."""
        return any(a.allows(topic, channel) for a in self.authorizations)

    def permits(self, permission: str, topic: str, channel: str) -> bool:
        """True when any authorization gives ``permission`` on this topic/channel."""
        return any(a.permits(permission, topic, channel) for a in self.authorizations)

    def expired(self, now: float) -> bool:
        return now >= self.expires


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AuthError(f"{what} is not a list of strings")
    return value


def _compile(pattern: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AuthError(f"unable to compile {what} {pattern!r} {exc}") from None


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Validate an auth server's JSON like nsqd (types, permissions, patterns, ttl > 0)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AuthError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AuthError("response is not a JSON object")
    ttl = data.get("ttl", 0)
    identity = data.get("identity") or ""
    identity_url = data.get("identity_url") or ""
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise AuthError("ttl is not an integer")
    if not isinstance(identity, str) or not isinstance(identity_url, str):
        raise AuthError("identity and identity_url must be strings")
    raw = data.get("authorizations")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise AuthError("authorizations is not a list")
    grants = []
    for item in raw:
        if not isinstance(item, dict):
            raise AuthError("an authorization is not an object")
        topic = item.get("topic") or ""
        if not isinstance(topic, str):
            raise AuthError("topic is not a string")
        permissions = _strings(item.get("permissions"), "permissions")
        for p in permissions:
            if p not in PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        channels = _strings(item.get("channels"), "channels")
        grants.append(
            Authorization(
                _compile(topic, "topic"),
                tuple(_compile(c, "channel") for c in channels),
                frozenset(permissions),
            )
        )
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(identity, identity_url, ttl, tuple(grants), now + ttl)


def redact(text: str, secret: bytes) -> str:
    """``text`` without ``secret`` in any form it may take there (as sent, or URL-,
    form- or Python-quoted)."""
    if not secret:
        return text
    forms = {
        secret.decode("utf-8", "replace"),
        secret.decode("latin-1"),
        quote(secret, safe=""),
        quote_plus(secret),
        urlencode({"s": secret})[2:],
        repr(secret)[2:-1],
    }
    for form in sorted(forms, key=len, reverse=True):
        if form:
            text = text.replace(form, "<secret>")
    return text


def auth_url(address: str, query: dict[str, str | bytes]) -> str:
    """host:port -> http://host:port/auth?...; a URL is used as it is, plus the query."""
    qs = urlencode(sorted(query.items()))
    if "://" in address:
        return f"{address}?{qs}"
    return f"http://{address}/auth?{qs}"


# -- HTTP -------------------------------------------------------------------------------


def parse_http_auth(value: str, allowed: tuple[str, ...] = HTTP_AUTH_CLASSES) -> frozenset[str]:
    """``--http-auth``: ``off`` (nothing), ``all`` (every class in ``allowed``) or a comma
    list of classes; ValueError naming the flag for anything else."""
    text = value.strip().lower()
    if text in ("", "off"):
        return frozenset()
    if text == "all":
        return frozenset(allowed)
    classes = [c.strip() for c in text.split(",")]
    for c in classes:
        if c not in allowed:
            choices = "|".join(("off", "all", *allowed))
            raise ValueError(f"--http-auth: {c!r} is not one of {choices} (or a comma list)")
    return frozenset(classes)


@dataclass(frozen=True)
class Need:
    """What one HTTP request needs: its class (``publish``, ``read`` or ``admin``) and
    the topic and channel it is about ("" for none: a topic's "" channel, or the whole
    node when the topic is "" too)."""

    kind: str
    topic: str = ""
    channel: str = ""

    def granted_by(self, state: AuthState) -> bool:
        """``publish`` needs publish; ``read`` subscribe or admin; ``admin`` admin."""
        if self.kind == PUBLISH:
            return state.permits("publish", self.topic, "")
        if self.kind == READ:
            return state.permits("subscribe", self.topic, self.channel) or state.permits(
                "admin", self.topic, self.channel
            )
        return state.permits("admin", self.topic, self.channel)

    def describe(self) -> str:
        """The need as a log line says it (``admin on "orders" "audit"``)."""
        return f'{self.kind} on "{self.topic}" "{self.channel}"'


#: a bearer token: printable ASCII without spaces (RFC 6750's b64token is narrower,
#: but an NSQ secret is whatever the auth server hands out)
_TOKEN = re.compile(r"[\x21-\x7e]+")


def bearer_secret(header: str) -> bytes | None:
    """The secret of an ``Authorization: Bearer <secret>`` value; None for another
    scheme; ValueError for a Bearer value that is empty or not one printable token."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip(" ")
    if not _TOKEN.fullmatch(token):
        raise ValueError("not one printable token")
    return token.encode("ascii")


def cache_key(secret: bytes, remote_ip: str, tls: bool, common_name: str) -> tuple[Any, ...]:
    """What an answer is cached under: everything the auth server was told (the
    secret hashed, so the cache holds no secret)."""
    return (hashlib.sha256(secret).digest(), remote_ip, tls, common_name)


class AuthCache:
    """Answers by :func:`cache_key`, each for its ttl from when it was put, the least
    recently used dropped beyond ``max_entries`` (so random secrets cannot grow it
    without bound)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        #: key -> (when it expires, the answer)
        self._states: OrderedDict[tuple[Any, ...], tuple[float, AuthState]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: tuple[Any, ...], now: float) -> AuthState | None:
        """The cached answer, or None (never cached, dropped, or expired at ``now``)."""
        entry = self._states.get(key)
        if entry is None:
            return None
        if now >= entry[0]:
            del self._states[key]
            return None
        self._states.move_to_end(key)
        return entry[1]

    def put(self, key: tuple[Any, ...], state: AuthState, now: float) -> None:
        """Keep ``state`` for its ttl from ``now``."""
        self._states[key] = (now + state.ttl, state)
        self._states.move_to_end(key)
        while len(self._states) > self.max_entries:
            self._states.popitem(last=False)
