"""``--http-auth`` on nsqd's HTTP API against a real auth server (tests/authserver.py, a
thread on a free loopback port): off by default, the authorization matrix (no header, a
refused secret, publish, subscribe, admin...) x endpoints, each class alone, bad headers
and flags, auth servers down or broken, the answer cache, cluster members, HTTPS with a
client certificate, a node of workers, and the TCP protocol unchanged."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqd_flags import parse_nsqd_args
from nsqx.http_auth import AuthClient, HTTPAuth
from nsqx.nsqd import http_auth as nsqd_http_auth
from nsqx.nsqd.http import ROUTES
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire import commands as c
from nsqx.wire import members
from nsqx.wire.auth import ADMIN, READ, Need
from tlsnsq import make_certs
from workernode import start_workers, topics_spread

from authserver import HOLD, AuthServer, auth_server, grant
from nsqdproc import start_nsqd as start_nsqd_process
from rawnsq import Raw, run, start_nsqd

ALL_PERMISSIONS = ["publish", "subscribe", "admin"]
#: secret -> the auth server's answer for it
SECRETS: dict[str, dict[str, Any]] = {
    "publisher": grant({"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}),
    "subscriber": grant(
        {"topic": "^orders$", "channels": ["^audit$"], "permissions": ["subscribe"]}
    ),
    "reader": grant({"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}),
    "orders-admin": grant({"topic": "^orders$", "channels": [".*"], "permissions": ["admin"]}),
    "root": grant({"topic": ".*", "channels": [".*"], "permissions": ["admin"]}),
    "everything": grant({"topic": ".*", "channels": [".*"], "permissions": ALL_PERMISSIONS}),
    "nothing": grant(),
}
NODE_READERS = {"reader", "root", "everything"}
ORDERS_READERS = {"reader", "orders-admin", "root", "everything"}
AUDIT_READERS = ORDERS_READERS | {"subscriber"}
ORDERS_ADMINS = {"orders-admin", "root", "everything"}
NODE_ADMINS = {"root", "everything"}

#: (method, path and query, body, the secrets allowed): in this order, so that what a
#: request needs exists (the topic "orders" and its channel "audit")
MATRIX: list[tuple[str, str, bytes | None, set[str]]] = [
    ("POST", "/pub?topic=orders", b"one", {"publisher", "everything"}),
    ("POST", "/mpub?topic=orders", b"a\nb", {"publisher", "everything"}),
    ("POST", "/pub?topic=payments", b"x", {"everything"}),
    ("POST", "/topic/create?topic=orders", None, ORDERS_ADMINS),
    ("POST", "/topic/create?topic=refunds", None, NODE_ADMINS),
    ("POST", "/channel/create?topic=orders&channel=audit", None, ORDERS_ADMINS),
    ("POST", "/channel/pause?topic=orders&channel=audit", None, ORDERS_ADMINS),
    ("POST", "/channel/unpause?topic=orders&channel=audit", None, ORDERS_ADMINS),
    # a channel parameter does not narrow a topic's action
    ("POST", "/topic/pause?topic=orders&channel=audit", None, ORDERS_ADMINS),
    ("POST", "/topic/unpause?topic=orders", None, ORDERS_ADMINS),
    ("GET", "/stats?format=json", None, NODE_READERS),
    ("GET", "/stats?format=json&topic=orders", None, ORDERS_READERS),
    ("GET", "/stats?format=json&topic=orders&channel=audit", None, AUDIT_READERS),
    ("GET", "/info", None, NODE_READERS),
    ("GET", "/metrics", None, NODE_READERS),
    ("GET", "/config/log_level", None, NODE_READERS),
    ("PUT", "/config/no_such_option", b"1", NODE_ADMINS),
    ("GET", "/channel/peek?topic=orders&channel=audit", None, AUDIT_READERS),
    ("GET", "/topic/peek?topic=orders", None, ORDERS_READERS),
    ("GET", "/message/trace?topic=orders", None, ORDERS_READERS),
    ("POST", "/message/trace/enable?topic=orders", None, ORDERS_ADMINS),
    ("POST", "/topic/empty?topic=refunds", None, NODE_ADMINS),
    ("POST", "/topic/delete?topic=refunds", None, NODE_ADMINS),
]


@asynccontextmanager
async def served(
    auth: AuthServer, **opts: Any
) -> AsyncIterator[tuple[NSQD, aiohttp.ClientSession, str]]:
    """An nsqd with its HTTP API on a free port, asking ``auth``, and a client session."""
    auth.answers.update(SECRETS)
    opts.setdefault("auth_http_addresses", [auth.address])
    nsqd = await start_nsqd(http_address="127.0.0.1:0", **opts)
    assert nsqd.http_address is not None
    try:
        async with aiohttp.ClientSession() as session:
            yield nsqd, session, f"http://127.0.0.1:{nsqd.http_address[1]}"
    finally:
        await nsqd.close()


async def call(
    s: aiohttp.ClientSession,
    method: str,
    url: str,
    secret: str | None = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    """(status, the JSON message of an error or the body, the response)."""
    h = dict(headers or {})
    if secret is not None:
        h["Authorization"] = f"Bearer {secret}"
    async with s.request(method, url, data=data, headers=h) as resp:
        body = await resp.read()
    if resp.status >= 400 and resp.content_type == "application/json":
        return resp.status, json.loads(body).get("message"), resp
    return resp.status, body, resp


def test_off_by_default_an_nsq13_client_needs_no_header() -> None:
    async def body() -> None:
        with auth_server() as auth:
            # TCP AUTH on (an auth server), the HTTP API open: as NSQ 1.3
            async with served(auth) as (nsqd, s, base):
                assert nsqd.options.http_auth == "off"
                for method, path, data, _ in MATRIX:
                    status, msg, _ = await call(s, method, base + path, data=data)
                    assert status not in (401, 403, 503), (method, path, status, msg)
                assert (await call(s, "POST", base + "/pub?topic=plain", data=b"x"))[0] == 200
                assert nsqd.topics["plain"].depth == 1
                assert auth.queries == []

    run(body())


def test_the_authorization_matrix() -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth="all") as (nsqd, s, base):
                protected = 0
                for method, path, data, allowed in MATRIX:
                    protected += 1
                    url = base + path
                    assert (await call(s, method, url, data=data))[:2] == (401, "AUTH_REQUIRED")
                    status, msg, _ = await call(s, method, url, "wrong", data)
                    assert (status, msg) == (401, "AUTH_FAILED"), path
                    for secret in SECRETS:
                        status, msg, _ = await call(s, method, url, secret, data)
                        if secret in allowed:
                            assert status not in (401, 403, 503), (path, secret, status, msg)
                        else:
                            assert (status, msg) == (403, "UNAUTHORIZED"), (path, secret)
                    # /ping never asks
                    assert (await call(s, "GET", base + "/ping"))[:2] == (200, b"OK")
                # each good secret was asked once (cached for its ttl); a refused one
                # each time
                asked = Counter(auth.secrets_asked())
                assert {k: asked[k] for k in SECRETS} == dict.fromkeys(SECRETS, 1)
                assert asked["wrong"] == protected
                # the allowed requests did what they do
                assert nsqd.topics["orders"].message_count == 6  # by publisher and everything
                assert "refunds" not in nsqd.topics

    run(body())


def test_a_refused_request_changes_nothing() -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth="all") as (nsqd, s, base):
                for path in (
                    "/topic/create?topic=orders",
                    "/channel/create?topic=orders&channel=audit",
                ):
                    assert (await call(s, "POST", base + path, "root"))[0] == 200
                for secret in (None, "wrong", "subscriber", "nothing"):
                    for method, path in (
                        ("POST", "/pub?topic=orders"),
                        ("POST", "/pub?topic=forbidden"),
                        ("POST", "/mpub?topic=forbidden"),
                        ("POST", "/topic/create?topic=forbidden"),
                        ("POST", "/channel/create?topic=orders&channel=sneaky"),
                        ("POST", "/channel/delete?topic=orders&channel=audit"),
                        ("POST", "/channel/pause?topic=orders&channel=audit"),
                        ("POST", "/topic/delete?topic=orders"),
                    ):
                        status, _, _ = await call(s, method, base + path, secret, b"x")
                        assert status in (401, 403), (secret, path)
                topic = nsqd.topics["orders"]
                assert "forbidden" not in nsqd.topics
                assert topic.message_count == 0
                (part,) = topic.partitions.values()
                assert set(part.channels) == {"audit"}
                assert not part.channels["audit"].paused

    run(body())


@pytest.mark.parametrize("classes", ["publish", "read", "admin", "publish,admin"])
def test_each_class_alone(classes: str) -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth=classes) as (_, s, base):
                for cls, method, path in (
                    ("publish", "POST", "/pub?topic=orders"),
                    ("read", "GET", "/stats"),
                    ("read", "GET", "/info"),
                    ("admin", "POST", "/topic/create?topic=orders"),
                    ("admin", "PUT", "/config/log_level"),
                ):
                    status, msg, _ = await call(s, method, base + path, data=b"info")
                    if cls in classes.split(","):
                        assert (status, msg) == (401, "AUTH_REQUIRED"), path
                    else:
                        assert status == 200, (path, status, msg)

    run(body())


def test_bad_authorization_headers() -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth="all") as (_, s, base):
                url = base + "/stats"
                status, msg, resp = await call(s, "GET", url)
                assert (status, msg) == (401, "AUTH_REQUIRED")
                assert resp.headers["WWW-Authenticate"] == 'Bearer realm="nsqd"'
                assert resp.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
                basic = {"Authorization": "Basic cm9vdDpyb290"}
                assert (await call(s, "GET", url, headers=basic))[:2] == (401, "AUTH_REQUIRED")
                for bad in ("Bearer", "Bearer ", "Bearer two words"):
                    status, msg, _ = await call(s, "GET", url, headers={"Authorization": bad})
                    assert (status, msg) == (400, "INVALID_AUTHORIZATION"), bad
                # a bad query is the API's own 400, an unknown path its 404, a wrong
                # method its 405: the API refuses them before any secret is needed
                status, msg, _ = await call(s, "GET", base + "/stats?topic=%zz")
                assert (status, msg) == (400, "INVALID_REQUEST")
                assert (await call(s, "GET", base + "/nope"))[:2] == (404, "NOT_FOUND")
                assert (await call(s, "GET", base + "/pub"))[0] == 405
                assert (await call(s, "GET", base + "/config/a/b"))[0] == 404
                assert auth.queries == []
                assert (await call(s, "GET", url, "root"))[0] == 200

    run(body())


def test_bad_flags_are_refused_with_the_flags_name() -> None:
    for argv, text in (
        (["--http-auth=sometimes", "--auth-http-address=127.0.0.1:1"], "--http-auth"),
        (["--http-auth=publish;admin", "--auth-http-address=127.0.0.1:1"], "--http-auth"),
        (["--http-auth=all"], "--http-auth needs an --auth-http-address"),
    ):
        with pytest.raises(FlagError, match=text):
            parse_nsqd_args(argv)
    opts = parse_nsqd_args(["--http-auth=publish,admin", "--auth-http-address=127.0.0.1:1"])
    assert opts.http_auth == "publish,admin"
    assert parse_nsqd_args([]).http_auth == "off"
    with pytest.raises(ValueError, match="--http-auth"):
        NsqdOptions(http_auth="yes", auth_http_addresses=["127.0.0.1:1"]).validate()


def test_a_bad_flag_stops_the_process_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="--http-auth") as err:
        start_nsqd_process(tmp_path, "--http-auth=sometimes", "--auth-http-address=127.0.0.1:1")
    assert "Traceback" not in str(err.value)


def test_auth_servers_down_slow_or_broken_are_a_503(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def body() -> None:
        with auth_server() as auth:
            secret = "s3cret/with+chars"
            # a port nothing listens on: grab one and close it
            probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            dead = f"127.0.0.1:{probe.sockets[0].getsockname()[1]}"
            probe.close()
            await probe.wait_closed()
            for addresses, answer in (
                ([dead], None),
                ([auth.address], HOLD),
                ([auth.address], (500, f"<html>no {secret} here</html>".encode())),
                ([auth.address], (200, b"not json")),
                ([auth.address], {"ttl": 0, "authorizations": []}),
                ([dead, dead], None),
            ):
                if answer is not None:
                    auth.answers[secret] = answer
                async with served(
                    auth,
                    http_auth="all",
                    auth_http_addresses=addresses,
                    http_client_request_timeout=0.5,
                ) as (nsqd, s, base):
                    status, msg, _ = await call(s, "GET", base + "/stats", secret)
                    assert (status, msg) == (503, "AUTH_UNAVAILABLE"), answer
                    assert (await call(s, "GET", base + "/ping"))[0] == 200
                    # the TCP protocol is unharmed
                    raw = await Raw.connect(nsqd)
                    await raw.identify()
                    await raw.close()
                auth.release.set()
                auth.answers.pop(secret, None)
                auth.release.clear()
            text = caplog.text
            assert "no auth server answered" in text
            for form in (secret, "s3cret%2Fwith%2Bchars", "s3cret/with%2Bchars"):
                assert form not in text

    run(body())


def test_answers_are_cached_for_their_ttl_and_asked_once() -> None:
    async def body() -> None:
        with auth_server() as auth:
            auth.answers["good"] = grant(
                {"topic": ".*", "channels": [".*"], "permissions": ["admin"]}, ttl=30
            )
            now = [1000.0]
            client = AuthClient([auth.address], 2.0, 5.0)
            cache = HTTPAuth(client, frozenset({ADMIN}), lambda: "", "t", clock=lambda: now[0])
            try:
                states = await asyncio.gather(
                    *(cache.state(b"good", "10.0.0.1", False, "") for _ in range(20))
                )
                assert len({id(st) for st in states}) == 1
                assert auth.secrets_asked() == ["good"]
                now[0] += 29
                await cache.state(b"good", "10.0.0.1", False, "")
                assert len(auth.queries) == 1
                now[0] += 1  # the ttl is over: asked again
                await cache.state(b"good", "10.0.0.1", False, "")
                assert len(auth.queries) == 2
                # another address is another question (the server may answer otherwise)
                await cache.state(b"good", "10.0.0.2", False, "")
                assert len(auth.queries) == 3
            finally:
                await client.close()

    run(body())


def test_cluster_members_pass_without_a_secret() -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth="all", cluster_secret="members") as (_, s, base):
                url = base + "/topic/create?topic=orders"
                member = members.headers("members")
                assert (await call(s, "POST", url, headers=member))[0] == 200
                wrong = members.headers("guess")
                assert (await call(s, "POST", url, headers=wrong))[:2] == (401, "AUTH_REQUIRED")
                # a request that sends a secret is judged on it
                status, msg, _ = await call(s, "POST", url, "wrong", headers=member)
                assert (status, msg) == (401, "AUTH_FAILED")
                assert (await call(s, "POST", url, "root", headers=member))[0] == 200
            # without a cluster secret, nobody is a member
            async with served(auth, http_auth="all") as (_, s, base):
                url = base + "/topic/create?topic=orders"
                member = {members.HEADER: ""}
                assert (await call(s, "POST", url, headers=member))[:2] == (401, "AUTH_REQUIRED")

    run(body())


def test_https_tells_the_auth_server_tls_and_the_common_name(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)

    async def body() -> None:
        with auth_server() as auth:
            async with served(
                auth,
                http_auth="all",
                https_address="127.0.0.1:0",
                tls_required="true",
                tls_client_auth_policy="require-verify",
                tls_root_ca_file=certs.ca_file,
                **certs.nsqd_options(),
            ) as (nsqd, s, base):
                assert nsqd.https_address is not None
                https = f"https://127.0.0.1:{nsqd.https_address[1]}"
                ctx = certs.client_context(with_cert=True)
                headers = {"Authorization": "Bearer publisher"}
                async with s.post(
                    https + "/pub?topic=orders", data=b"x", headers=headers, ssl=ctx
                ) as resp:
                    assert resp.status == 200
                async with s.get(https + "/stats", headers=headers, ssl=ctx) as resp:
                    assert resp.status == 403
                assert auth.queries == [
                    {
                        "remote_ip": "127.0.0.1",
                        "tls": "true",
                        "secret": "publisher",
                        "common_name": "client-one",
                    }
                ]
                # plain HTTP is refused for TLS before any secret is looked at
                status, msg, _ = await call(s, "POST", base + "/pub?topic=orders", "publisher")
                assert (status, msg) == (403, "TLS_REQUIRED")
                assert len(auth.queries) == 1

    run(body())


def test_tcp_is_unchanged_and_admin_grants_nothing_there() -> None:
    async def body() -> None:
        with auth_server() as auth:
            async with served(auth, http_auth="all") as (nsqd, _, _):
                raw = await Raw.connect(nsqd)
                assert (await raw.identify())["auth_required"] is True
                raw.send(c.auth("publisher"))
                assert json.loads(await raw.response())["permission_count"] == 1
                await raw.publish("orders", b"over tcp")
                await raw.close()
                # an answer with admin is accepted; admin allows neither PUB nor SUB
                raw = await Raw.connect(nsqd)
                await raw.identify()
                raw.send(c.auth("root"))
                assert json.loads(await raw.response())["permission_count"] == 1
                raw.send(c.pub("orders", b"x"))
                assert await raw.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'
                assert await raw.closed()
                assert nsqd.topics["orders"].message_count == 1

    run(body())


def test_every_route_is_classified() -> None:
    """A new endpoint must be given its class here (else it counts as a node admin
    action, which this test would not notice)."""
    assert set(ROUTES) <= nsqd_http_auth.KNOWN
    need = nsqd_http_auth.need
    assert need("GET", "/ping", {}) is None
    assert need("POST", "/drain", {}) == Need(ADMIN)
    assert need("POST", "/some/new/thing", {"topic": ["t"]}) == Need(ADMIN)
    assert need("GET", "/channel/config", {"topic": ["t"], "channel": ["c"]}) == Need(
        READ, "t", "c"
    )
    assert need("POST", "/channel/config", {"topic": ["t"], "channel": ["c"]}) == Need(
        ADMIN, "t", "c"
    )
    # the first value is the one the handlers use
    assert need("POST", "/pub", {"topic": ["a", "b"]}) == Need("publish", "a")


def http(
    url: str, method: str = "GET", secret: str | None = None, data: bytes | None = None
) -> tuple[int, bytes]:
    """(status, body) of one blocking request (to a node in processes)."""
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_node_of_workers_checks_once_where_the_request_lands(tmp_path: Path) -> None:
    with auth_server() as auth:
        auth.answers.update(SECRETS)
        node = start_workers(
            tmp_path,
            "--http-address=127.0.0.1:0",
            f"--auth-http-address={auth.address}",
            "--http-auth=all",
            workers=2,
        )
        try:
            base = node.http_url
            # /stats gathers every worker's over their loopback ports: those are not
            # checked again (each worker has a cache of its own: a second ask would show)
            status, body = http(f"{base}/stats?format=json", secret="root")
            assert status == 200, body
            assert auth.secrets_asked() == ["root"]
            status, body = http(f"{base}/stats?format=json")
            assert (status, json.loads(body)) == (401, {"message": "AUTH_REQUIRED"})
            # publishes to topics of either worker: judged where they land
            for topic in topics_spread(8, 2):
                url = f"{base}/pub?topic={topic}"
                assert http(url, "POST", "everything", b"x")[0] == 200
                assert http(url, "POST", "subscriber", b"x")[0] == 403
                assert http(url, "POST", None, b"x")[0] == 401
            status, body = http(f"{base}/stats?format=json", secret="reader")
            depths = {t["topic_name"]: t["depth"] for t in json.loads(body)["topics"]}
            assert depths == dict.fromkeys(topics_spread(8, 2), 1)
        finally:
            node.stop()
