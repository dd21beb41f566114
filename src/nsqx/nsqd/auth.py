"""AUTH: asking --auth-http-address servers what a client's secret allows.

nsqd sends ``GET /auth?common_name=&remote_ip=&secret=&tls=`` and expects
``{"ttl": s, "identity", "identity_url", "authorizations": [{"topic": re,
"channels": [re], "permissions": ["subscribe"|"publish"]}]}``. Topic and channel
patterns are unanchored regular expressions; a publish check matches the channel
patterns against "" (so a publisher needs a channel pattern such as ``.*``), exactly as
NSQ's internal/auth does.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

import aiohttp

log = logging.getLogger("nsqx.nsqd")

__all__ = ["AuthClient", "AuthError", "AuthState", "Authorization", "parse_auth_response"]

PERMISSIONS = frozenset({"subscribe", "publish"})


class AuthError(Exception):
    """No auth server gave a usable answer (never shown to the client)."""


@dataclass(frozen=True)
class Authorization:
    """One grant: permissions on the topics and channels matching the patterns."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        """SUB (channel given) needs ``subscribe``, PUB (channel "") ``publish``."""
        if ("subscribe" if channel else "publish") not in self.permissions:
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
        """True when any authorization allows this topic/channel."""
        return any(a.allows(topic, channel) for a in self.authorizations)

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


class AuthClient:
    """Queries the auth servers (in a random order, until one answers) with one shared
    HTTP session, bounded by --http-client-connect-timeout / -request-timeout."""

    def __init__(self, addresses: list[str], connect_timeout: float, request_timeout: float):
        self.addresses = list(addresses)
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout or None, connect=connect_timeout or None
        )
        self._session: aiohttp.ClientSession | None = None

    async def query(self, remote_ip: str, tls: bool, secret: bytes, common_name: str) -> AuthState:
        """Ask the servers; raises AuthError with every server's failure. The secret
        goes as the client sent it (percent-encoded bytes)."""
        params: dict[str, str | bytes] = {
            "remote_ip": remote_ip,
            "tls": "true" if tls else "false",
            "secret": secret,
            "common_name": common_name,
        }
        errors: list[str] = []
        n = len(self.addresses)
        start = random.randrange(n) if n else 0
        for i in range(n):
            address = self.addresses[(start + i) % n]
            try:
                return await self._query_one(auth_url(address, params))
            except (TimeoutError, AuthError, aiohttp.ClientError, OSError, ValueError) as exc:
                errors.append(f"failed to auth against {address} - {exc!r}")
        # the reasons go to the log: never the secret (an error page may echo the URL)
        raise AuthError(redact("; ".join(errors) or "no --auth-http-address", secret))

    async def _query_one(self, url: str) -> AuthState:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        async with self._session.get(url, headers=headers) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise AuthError(f"got response {resp.status} {body[:200]!r}")
        return parse_auth_response(body, time.monotonic())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
