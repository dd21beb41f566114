"""Asking auth servers, for nsqd and nsqlookupd: the client of ``--auth-http-address``
(TCP AUTH uses it too) and the check that ``--http-auth`` puts in front of an HTTP API.

The protocol and the rules are sans-IO in :mod:`nsqx.wire.auth`; this module does the
IO. Both daemons import it (they may not import each other). A request's answer:

- ``401 AUTH_REQUIRED``: no ``Authorization: Bearer <secret>`` (another scheme counts
  as none), with ``WWW-Authenticate: Bearer``;
- ``400 INVALID_AUTHORIZATION``: a Bearer header whose secret is not one printable token;
- ``401 AUTH_FAILED``: an auth server refused the secret (it answered 4xx);
- ``403 UNAUTHORIZED``: the secret's authorizations do not cover the request;
- ``503 AUTH_UNAVAILABLE``: no auth server gave a usable answer (down, slow, 5xx,
  nonsense); the reason is logged, the secret never.

A request that sends no Authorization header but the cluster's secret
(:mod:`nsqx.wire.members`, when one is set) passes: nsqlookupd, nsqd and nsqadmin talk
to each other that way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from nsqx.wire import members
from nsqx.wire.auth import (
    AuthCache,
    AuthDenied,
    AuthError,
    AuthState,
    Need,
    auth_url,
    bearer_secret,
    cache_key,
    parse_auth_response,
    redact,
)

__all__ = ["AuthClient", "HTTPAuth", "peer_common_name", "refusal"]

log = logging.getLogger("nsqx.auth")

_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}


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
        """Ask the servers; raises AuthError with every server's failure (AuthDenied
        when one of them refused the secret). The secret goes as the client sent it
        (percent-encoded bytes)."""
        params: dict[str, str | bytes] = {
            "remote_ip": remote_ip,
            "tls": "true" if tls else "false",
            "secret": secret,
            "common_name": common_name,
        }
        errors: list[str] = []
        denied = False
        n = len(self.addresses)
        start = random.randrange(n) if n else 0
        for i in range(n):
            address = self.addresses[(start + i) % n]
            try:
                return await self._query_one(auth_url(address, params))
            except (TimeoutError, AuthError, aiohttp.ClientError, OSError, ValueError) as exc:
                denied = denied or isinstance(exc, AuthDenied)
                errors.append(f"failed to auth against {address} - {exc!r}")
        # the reasons go to the log: never the secret (an error page may echo the URL)
        reason = redact("; ".join(errors) or "no --auth-http-address", secret)
        raise AuthDenied(reason) if denied else AuthError(reason)

    async def _query_one(self, url: str) -> AuthState:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        async with self._session.get(url, headers=headers) as resp:
            body = await resp.read()
            if 400 <= resp.status < 500:
                raise AuthDenied(f"got response {resp.status} {body[:200]!r}")
            if resp.status != 200:
                raise AuthError(f"got response {resp.status} {body[:200]!r}")
        return parse_auth_response(body, time.monotonic())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def refusal(status: int, code: str, realm: str = "") -> web.Response:
    """NSQ's error answer ``{"message": CODE}``; a 401 says how to authenticate."""
    headers = {"Content-Type": "application/json; charset=utf-8", **_HEADERS}
    if status == 401:
        headers["WWW-Authenticate"] = f'Bearer realm="{realm}"' if realm else "Bearer"
    body = json.dumps({"message": code}, separators=(",", ":")).encode()
    return web.Response(status=status, body=body, headers=headers)


def peer_common_name(request: web.BaseRequest) -> str:
    """The CN of an HTTPS client's certificate subject ("" without one)."""
    cert = request.transport.get_extra_info("peercert") if request.transport else None
    if not isinstance(cert, dict):
        return ""
    for rdn in cert.get("subject", ()):
        for attr in rdn:
            if attr[0] == "commonName":
                return str(attr[1])
    return ""


class HTTPAuth:
    """The ``--http-auth`` check of one daemon's HTTP API: which classes of requests
    need a secret, the answers cached by secret (and what else the auth server was
    told) for their ttl, one query at a time per key however many requests wait on it.

    :meth:`check` answers a refusal, or None to let the request through.
    """

    def __init__(
        self,
        client: AuthClient,
        classes: frozenset[str],
        cluster_secret: Callable[[], str],
        realm: str,
        *,
        max_cached: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.classes = classes
        self.realm = realm
        self.cache = AuthCache(max_cached)
        self._cluster_secret = cluster_secret
        self._clock = clock
        self._pending: dict[tuple[Any, ...], asyncio.Future[AuthState]] = {}

    def protects(self, need: Need | None) -> bool:
        return need is not None and need.kind in self.classes

    async def check(self, request: web.BaseRequest, need: Need | None) -> web.Response | None:
        """None when ``request`` may go on; else the refusal to answer."""
        if need is None or need.kind not in self.classes:
            return None
        header = request.headers.get("Authorization")
        secret = None
        if header is not None:
            try:
                secret = bearer_secret(header)
            except ValueError:
                return refusal(400, "INVALID_AUTHORIZATION")
        if secret is None:
            cluster = self._cluster_secret()
            if header is None and cluster and members.is_member(cluster, request.headers):
                return None
            return refusal(401, "AUTH_REQUIRED", self.realm)
        remote_ip = request.remote or ""
        try:
            state = await self.state(secret, remote_ip, request.secure, peer_common_name(request))
        except AuthDenied as err:
            log.warning("HTTP: %s %s from %s: auth failed (%s)", *_what(request), err)
            return refusal(401, "AUTH_FAILED", self.realm)
        except AuthError as err:
            log.error("HTTP: %s %s from %s: no auth server answered (%s)", *_what(request), err)
            return refusal(503, "AUTH_UNAVAILABLE")
        if not need.granted_by(state):
            log.warning(
                "HTTP: %s %s from %s refused: %r may not %s",
                *_what(request),
                state.identity,
                need.describe(),
            )
            return refusal(403, "UNAUTHORIZED")
        return None

    async def state(self, secret: bytes, remote_ip: str, tls: bool, common_name: str) -> AuthState:
        """The auth server's answer for this secret: cached, else asked (once, for all
        the requests that want it meanwhile). Raises AuthError/AuthDenied."""
        key = cache_key(secret, remote_ip, tls, common_name)
        state = self.cache.get(key, self._clock())
        if state is not None:
            return state
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(key, secret, remote_ip, tls, common_name))
            self._pending[key] = pending
            pending.add_done_callback(_consume)
        # shielded: a client that hangs up does not cancel the query others wait on
        return await asyncio.shield(pending)

    async def _ask(
        self, key: tuple[Any, ...], secret: bytes, remote_ip: str, tls: bool, common_name: str
    ) -> AuthState:
        try:
            state = await self.client.query(remote_ip, tls, secret, common_name)
            # the ttl counts from the answer, on this cache's clock
            self.cache.put(key, state, self._clock())
            return state
        finally:
            del self._pending[key]


def _consume(fut: asyncio.Future[AuthState]) -> None:
    # retrieved here so that a query nobody waits on any more logs no warning
    if not fut.cancelled():
        fut.exception()


def _what(request: web.BaseRequest) -> tuple[str, str, str]:
    return request.method, request.path, request.remote or "?"
