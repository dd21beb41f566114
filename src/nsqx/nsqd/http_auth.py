"""``--http-auth`` on nsqd's HTTP API: what each request needs, and the check in front
of the API's handler (nsqx.http_auth asks the auth server, nsqx.wire.auth decides).

Classes (``--http-auth=off|all|publish,read,admin``):

- ``publish``: ``/pub``, ``/mpub`` need ``publish`` on the topic (as PUB over TCP);
- ``read``: ``/stats``, ``/info``, ``/metrics``, ``GET /config/*``, the peeks, ``/range``,
  ``/message/get``, ``/message/trace``, ``/partition/state`` need ``subscribe`` or
  ``admin`` on what they read (the topic, the channel, or the whole node);
- ``admin``: every action that changes topics, channels, partitions or settings
  (``/topic/*``, ``/channel/*``, ``/message/trace/{enable,disable}``,
  ``/partition/{role,fence}``, ``/replication/stream``, ``PUT /config/*``,
  ``/drain``) needs ``admin`` on its topic and channel (``PUT /config/*`` and
  ``/drain``: on the whole node). ``/channel/config`` is a read with GET, an action
  with POST.

``/ping`` is always open. A path nobody listed here (a new endpoint) counts as an admin
action on the whole node, so that it is never open by mistake.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqx.http_auth import HTTPAuth
from nsqx.wire.auth import ADMIN, PUBLISH, READ, Need, parse_http_auth

if TYPE_CHECKING:
    from nsqx.http_auth import AuthClient
    from nsqx.nsqd.options import NsqdOptions

__all__ = ["guarded", "need"]

Handle = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Params = dict[str, list[str]]

#: what anyone may ask (health checks, load balancers)
OPEN = frozenset({"/ping"})
PUBLISH_PATHS = frozenset({"/pub", "/mpub"})
#: reads of a node as a whole
NODE_READS = frozenset({"/info", "/metrics"})
#: reads about one topic (``topic``)
TOPIC_READS = frozenset(
    {"/topic/peek", "/message/get", "/message/trace", "/range", "/partition/state"}
)
#: reads about one channel (``topic`` and ``channel``)
CHANNEL_READS = frozenset({"/channel/peek"})
#: actions on one topic (``topic``); a channel parameter does not narrow them
TOPIC_ACTIONS = frozenset(
    {
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/topic/unpause",
        "/message/trace/enable",
        "/message/trace/disable",
        "/partition/role",
        "/partition/fence",
        "/replication/stream",
    }
)
#: actions on one channel (``topic`` and ``channel``)
CHANNEL_ACTIONS = frozenset(
    {
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
        "/channel/setoffset",
        "/channel/setorder",
        "/channel/deadletter/replay",
    }
)
#: a channel's settings: GET reads them (``read``), POST changes them (``admin``)
CHANNEL_SETTINGS = frozenset({"/channel/config"})
#: actions on the node as a whole
NODE_ACTIONS = frozenset({"/drain"})
#: every path this module classifies (a test checks that each route is one of them)
KNOWN = (
    OPEN
    | PUBLISH_PATHS
    | NODE_READS
    | TOPIC_READS
    | CHANNEL_READS
    | TOPIC_ACTIONS
    | CHANNEL_ACTIONS
    | CHANNEL_SETTINGS
    | NODE_ACTIONS
    | {"/stats"}
)


_CONFIG_METHODS = {"GET": None, "PUT": None}


def _is_config(path: str) -> bool:
    """``/config/<option>``, as the API routes it."""
    opt = path[len("/config/") :] if path.startswith("/config/") else ""
    return bool(opt) and "/" not in opt


def _first(params: Params, key: str) -> str:
    values = params.get(key)
    return values[0] if values else ""


def need(method: str, path: str, params: Params) -> Need | None:
    """What a request of nsqd's API needs (None: nothing, it is open). ``params`` as
    the handlers read them: the first value of each is the one they use."""
    if path in OPEN:
        return None
    if path.startswith("/config/"):
        return Need(ADMIN) if method == "PUT" else Need(READ)
    if path in PUBLISH_PATHS:
        return Need(PUBLISH, _first(params, "topic"))
    if path == "/stats":
        topic = _first(params, "topic")
        # without a topic, /stats is every topic's (a channel alone filters them all)
        return Need(READ, topic, _first(params, "channel") if topic else "")
    if path in NODE_READS:
        return Need(READ)
    if path in TOPIC_READS:
        return Need(READ, _first(params, "topic"))
    if path in CHANNEL_READS:
        return Need(READ, _first(params, "topic"), _first(params, "channel"))
    if path in TOPIC_ACTIONS:
        return Need(ADMIN, _first(params, "topic"))
    if path in CHANNEL_ACTIONS:
        return Need(ADMIN, _first(params, "topic"), _first(params, "channel"))
    if path in CHANNEL_SETTINGS:
        kind = READ if method == "GET" else ADMIN
        return Need(kind, _first(params, "topic"), _first(params, "channel"))
    # NODE_ACTIONS, and whatever nobody classified: an action on the whole node
    return Need(ADMIN)


def guarded(
    handle: Handle,
    options: NsqdOptions,
    client: AuthClient | None,
    routes: Mapping[str, Mapping[str, Any]],
    parse: Callable[[str], Params],
    trusted: Callable[[web.BaseRequest], bool],
) -> Handle:
    """``handle`` behind the ``--http-auth`` check (``handle`` itself when it is off).

    ``routes`` and ``parse`` are the API's own (path -> method -> handler, and its query
    parser), so a request is judged on the very parameters its handler will use;
    ``trusted`` tells a request that another worker of this node forwarded (and
    checked). A request the API answers without a handler (an unknown path or method,
    a query it cannot parse, plain HTTP under ``--tls-required=true``) goes straight
    to ``handle``, which refuses it.
    """
    classes = parse_http_auth(options.http_auth)
    if not classes or client is None:
        return handle
    auth = HTTPAuth(client, classes, lambda: options.cluster_secret, "nsqd")

    async def check_then_handle(request: web.BaseRequest) -> web.StreamResponse:
        path, method = request.path, request.method
        methods = routes.get(path)
        if methods is None and _is_config(path):
            methods = _CONFIG_METHODS
        if methods is None or method not in methods:
            return await handle(request)
        if options.tls_required == "true" and not request.secure:
            return await handle(request)
        try:
            params = parse(request.query_string)
        except Exception:
            return await handle(request)
        n = need(method, path, params)
        if auth.protects(n) and not trusted(request):
            refused = await auth.check(request, n)
            if refused is not None:
                return refused
        return await handle(request)

    return check_then_handle
