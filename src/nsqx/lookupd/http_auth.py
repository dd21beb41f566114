"""``--http-auth`` on nsqlookupd's HTTP API: what each request needs, and the aiohttp
middleware that checks it (nsqx.http_auth asks the auth server, nsqx.wire.auth decides).

Classes (``--http-auth=off|all|read,admin``; nsqlookupd has nothing to publish):

- ``read``: discovery and listings. ``/lookup``, ``/channels``, ``/partition/history``
  need ``subscribe`` or ``admin`` on their topic; ``/topics``, ``/nodes``, ``/info``,
  ``/debug``, ``/listlookup``, ``/cluster/nodes`` on the whole node. Off in ``admin``
  alone, so consumers keep discovering without a secret (go-nsq sends its AUTH
  secret to nsqlookupd as a Bearer header anyway).
- ``admin``: ``/topic/*`` and ``/partition/*`` actions need ``admin`` on their topic,
  ``/channel/{create,delete}`` on the topic and channel, ``/cluster/node/*`` on the
  whole node.

``/ping`` is always open. A path nobody listed here (a new endpoint) counts as an admin
action on the whole node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqx.http_auth import AuthClient, HTTPAuth
from nsqx.lookupd.http_api import parse_query
from nsqx.lookupd.options import HTTP_AUTH_CLASSES
from nsqx.wire.auth import ADMIN, READ, Need, parse_http_auth

if TYPE_CHECKING:
    from nsqx.lookupd.options import LookupdOptions

__all__ = ["install", "need"]

OPEN = frozenset({"/ping"})
NODE_READS = frozenset({"/info", "/debug", "/topics", "/nodes", "/listlookup", "/cluster/nodes"})
TOPIC_READS = frozenset({"/lookup", "/channels", "/partition/history"})
TOPIC_ACTIONS = frozenset(
    {
        "/topic/create",
        "/topic/delete",
        "/topic/tombstone",
        "/topic/partition/expand",
        "/topic/meta/update",
        "/topic/partition/move",
        "/partition/isr/leave",
        "/partition/isr/join",
        "/partition/leader/unreachable",
        "/partition/leader/restarted",
    }
)
CHANNEL_ACTIONS = frozenset({"/channel/create", "/channel/delete"})
NODE_ACTIONS = frozenset({"/cluster/node/roles", "/cluster/node/drain"})
#: every path this module classifies (a test checks that each route is one of them)
KNOWN = OPEN | NODE_READS | TOPIC_READS | TOPIC_ACTIONS | CHANNEL_ACTIONS | NODE_ACTIONS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def need(path: str, params: dict[str, list[str]] | None) -> Need | None:
    """What a request of nsqlookupd's API needs (None: it is open). ``params`` None:
    a query the handlers cannot parse, judged as about the whole node."""

    def first(key: str) -> str:
        values = (params or {}).get(key)
        return values[0] if values else ""

    if path in OPEN:
        return None
    if path in NODE_READS:
        return Need(READ)
    if path in TOPIC_READS:
        return Need(READ, first("topic"))
    if path in TOPIC_ACTIONS:
        return Need(ADMIN, first("topic"))
    if path in CHANNEL_ACTIONS:
        return Need(ADMIN, first("topic"), first("channel"))
    return Need(ADMIN)


def install(
    app: web.Application, options: LookupdOptions, routes: Mapping[str, Mapping[str, Any]]
) -> None:
    """Put the ``--http-auth`` check in front of ``app`` (nothing when it is off).

    ``routes`` is the API's path -> method -> handler: a request it answers without a
    handler (an unknown path or method, a redirect to the right spelling) goes on.
    """
    classes = parse_http_auth(options.http_auth, HTTP_AUTH_CLASSES)
    if not classes:
        return
    client = AuthClient(
        options.auth_http_addresses,
        options.http_client_connect_timeout,
        options.http_client_request_timeout,
    )
    auth = HTTPAuth(client, classes, lambda: options.cluster_secret, "nsqlookupd")

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        methods = routes.get(request.path)
        if methods is None or request.method not in methods:
            return await handler(request)
        try:
            params: dict[str, list[str]] | None = parse_query(request.rel_url.raw_query_string)
        except ValueError:
            params = None
        refused = await auth.check(request, need(request.path, params))
        return refused if refused is not None else await handler(request)

    async def close(_: web.Application) -> None:
        await client.close()

    app.middlewares.append(check)
    app.on_cleanup.append(close)
