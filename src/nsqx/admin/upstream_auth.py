"""The bearer secret nsqadmin sends to nsqd and nsqlookupd whose ``--http-auth`` asks
for one (docs/http-auth.md).

- ``--http-auth-secret`` (or the first line of ``--http-auth-secret-file``, or
  ``$NSQX_AUTH_SECRET`` as for the tools): the admin's own secret, on every call it makes (pages, actions, the history sampler).
- ``--http-auth-forward``: a request to the admin that carries ``Authorization: Bearer
  <secret>`` (a user's, set by the proxy that logs users in, or by a script calling the
  JSON API) has the calls made for it sent with that secret instead, so the auth server
  judges that user; nsqadmin's own rule (``--admin-user``) still applies first.

The secret goes into the admin's requests through an aiohttp trace hook, from a context
variable that the admin's middleware sets for the length of one request (tasks started
meanwhile inherit it). Notifications (``--notification-http-endpoint``) never get it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from types import SimpleNamespace

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from nsqx.clusterinfo.secret import check_secret
from nsqx.clusterinfo.secret import load_secret as _load_secret
from nsqx.wire.auth import bearer_secret

__all__ = ["check_secret", "load_secret", "middleware", "trace_config"]

#: the user's secret while the admin serves that user's request (--http-auth-forward)
_FORWARDED: ContextVar[str] = ContextVar("nsqx_admin_forwarded_secret", default="")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_secret(flag_value: str, path: str) -> str:
    """The secret to send: the first line of ``path`` when given, else ``flag_value``,
    else ``$NSQX_AUTH_SECRET`` (as the tools' ``--auth-secret``); ValueError naming the
    flag when the file cannot give one."""
    return _load_secret(flag_value, path, "--http-auth-secret")


def trace_config(own_secret: str, forward: bool, never_to: str) -> aiohttp.TraceConfig | None:
    """The hook that adds ``Authorization: Bearer`` to the admin's calls: the user's
    secret (``forward``) or the admin's own; none to URLs starting with ``never_to``
    (the notification endpoint, outside the cluster). None when there is nothing to add."""
    if not own_secret and not forward:
        return None

    async def on_request_start(
        session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        secret = (_FORWARDED.get() if forward else "") or own_secret
        if not secret or (never_to and str(params.url).startswith(never_to)):
            return
        # the request is built from these very headers after this hook
        params.headers["Authorization"] = f"Bearer {secret}"

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_request_start)
    return config


def middleware(forward: bool) -> list[Middleware]:
    """The admin app's middleware that picks up a user's Bearer secret (none without
    ``forward``). A Bearer header that is no token gets 400 INVALID_AUTHORIZATION."""
    if not forward:
        return []

    @web.middleware
    async def forward_secret(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        try:
            secret = bearer_secret(header) if header else None
        except ValueError:
            return web.json_response({"message": "INVALID_AUTHORIZATION"}, status=400)
        if secret is None:
            return await handler(request)
        token = _FORWARDED.set(secret.decode("ascii"))
        try:
            return await handler(request)
        finally:
            _FORWARDED.reset(token)

    return [forward_secret]
