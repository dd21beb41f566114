"""``--http-auth`` on nsqlookupd (processes) against a real auth server
(tests/authserver.py): off by default, admin actions alone or every request, the
authorization matrix, bad headers and flags, an auth server that is down, and the
cluster's members (nsqlookupd placing partitions on an nsqd that also has --http-auth)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nsqx.client.discovery import LookupdPoller
from nsqx.lookupd import http_auth as lookupd_http_auth
from nsqx.lookupd.http import LookupdHTTP
from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions
from nsqx.wire import members
from nsqx.wire.auth import ADMIN, READ, Need

from authserver import AuthServer, auth_server, grant
from lookupdproc import LookupdProcess, http_request, start_lookupd, wait_until
from nsqdproc import start_nsqd
from rawnsq import run

SECRETS: dict[str, dict[str, Any]] = {
    "subscriber": grant(
        {"topic": "^orders$", "channels": ["^audit$"], "permissions": ["subscribe"]}
    ),
    "reader": grant({"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}),
    "orders-admin": grant({"topic": "^orders$", "channels": [".*"], "permissions": ["admin"]}),
    "root": grant({"topic": ".*", "channels": [".*"], "permissions": ["admin"]}),
    "publisher": grant({"topic": ".*", "channels": [".*"], "permissions": ["publish"]}),
}
ORDERS_ADMINS = {"orders-admin", "root"}

#: (method, path and query, class, the secrets allowed), in an order that works
MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("POST", "/topic/create?topic=orders", "admin", ORDERS_ADMINS),
    ("POST", "/topic/create?topic=payments", "admin", {"root"}),
    ("POST", "/channel/create?topic=orders&channel=audit", "admin", ORDERS_ADMINS),
    ("POST", "/topic/tombstone?topic=orders&node=127.0.0.1:1", "admin", ORDERS_ADMINS),
    ("POST", "/cluster/node/roles?node=nobody", "admin", {"root"}),
    ("GET", "/lookup?topic=orders", "read", {"reader", "orders-admin", "root"}),
    ("GET", "/channels?topic=orders", "read", {"reader", "orders-admin", "root"}),
    ("GET", "/topics", "read", {"reader", "root"}),
    ("GET", "/nodes", "read", {"reader", "root"}),
    ("GET", "/info", "read", {"reader", "root"}),
    ("GET", "/debug", "read", {"reader", "root"}),
    ("POST", "/channel/delete?topic=orders&channel=audit", "admin", ORDERS_ADMINS),
    ("POST", "/topic/delete?topic=payments", "admin", {"root"}),
]


@pytest.fixture
def auth() -> Iterator[AuthServer]:
    with auth_server() as server:
        server.answers.update(SECRETS)
        yield server


def started(auth: AuthServer, *args: str) -> LookupdProcess:
    return start_lookupd(f"--auth-http-address={auth.address}", *args)


def call(
    lookupd: LookupdProcess,
    method: str,
    path: str,
    secret: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """(status, the error's message or the body)."""
    h = dict(headers or {})
    if secret is not None:
        h["Authorization"] = f"Bearer {secret}"
    status, _, body = lookupd.get(path, method=method, headers=h)
    if status >= 400:
        return status, json.loads(body)["message"]
    return status, body


def test_off_by_default(auth: AuthServer) -> None:
    lookupd = started(auth)
    try:
        for method, path, _, _ in MATRIX:
            status, msg = call(lookupd, method, path)
            assert status not in (401, 403, 503), (path, status, msg)
        assert auth.queries == []
    finally:
        lookupd.stop()


@pytest.mark.parametrize("mode", ["admin", "all", "read"])
def test_the_authorization_matrix(auth: AuthServer, mode: str) -> None:
    lookupd = started(auth, f"--http-auth={mode}")
    try:
        classes = {"read", "admin"} if mode == "all" else {mode}
        for method, path, cls, allowed in MATRIX:
            if cls not in classes:
                # open: consumers discover without a secret
                status, msg = call(lookupd, method, path)
                assert status not in (401, 403, 503), (path, status, msg)
                continue
            assert call(lookupd, method, path) == (401, "AUTH_REQUIRED"), path
            assert call(lookupd, method, path, "wrong") == (401, "AUTH_FAILED"), path
            for secret in SECRETS:
                status, msg = call(lookupd, method, path, secret)
                if secret in allowed:
                    assert status not in (401, 403, 503), (path, secret, status, msg)
                else:
                    assert (status, msg) == (403, "UNAUTHORIZED"), (path, secret)
        assert call(lookupd, "GET", "/ping") == (200, b"OK")
        # each good secret asked once (its answer kept for its ttl)
        asked = [q["secret"] for q in auth.queries if q["secret"] != "wrong"]
        assert sorted(asked) == sorted(set(asked))
    finally:
        lookupd.stop()


async def headers_seen_by_an_open_lookupd(secret: str) -> list[str | None]:
    """The Authorization headers a lookupd without --http-auth gets from a poller with
    ``secret`` (an aiohttp stand-in that answers every /lookup)."""
    seen: list[str | None] = []

    async def lookup(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"channels": [], "producers": []})

    app = web.Application()
    app.router.add_get("/lookup", lookup)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    poller = LookupdPoller([f"127.0.0.1:{port}"], "orders", auth_secret=secret)
    try:
        assert await poller.lookup() is not None
    finally:
        await poller.close()
        await runner.cleanup()
    return seen


def test_nsqx_clients_send_their_secret_to_a_lookupd_that_asks_for_it(auth: AuthServer) -> None:
    auth.answers.update(SECRETS)
    lookupd = started(auth, "--http-auth=read")
    try:

        async def look(secret: str | None) -> bool:
            poller = LookupdPoller([lookupd.http_address], "orders", auth_secret=secret)
            try:
                return await poller.lookup() is not None
            finally:
                await poller.close()

        assert not run(look(None))  # 401: no answer
        assert run(look("reader"))  # asked for it on the 401, answered with it
        # a lookupd that does not ask never sees the secret
        assert run(headers_seen_by_an_open_lookupd("reader")) == [None]
    finally:
        lookupd.stop()


def test_a_refused_action_changes_nothing(auth: AuthServer) -> None:
    lookupd = started(auth, "--http-auth=admin")
    try:
        for secret in (None, "wrong", "subscriber", "publisher"):
            for path in (
                "/topic/create?topic=forbidden",
                "/channel/create?topic=forbidden&channel=c",
            ):
                assert call(lookupd, "POST", path, secret)[0] in (401, 403)
        assert lookupd.json("/topics") == {"topics": []}
    finally:
        lookupd.stop()


def test_bad_headers_and_queries(auth: AuthServer) -> None:
    lookupd = started(auth, "--http-auth=all")
    try:
        status, headers, _ = lookupd.get("/topics")
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="nsqlookupd"'
        for bad in ("Bearer", "Bearer two words"):
            assert call(lookupd, "GET", "/topics", headers={"Authorization": bad}) == (
                400,
                "INVALID_AUTHORIZATION",
            )
        basic = {"Authorization": "Basic cm9vdDpyb290"}
        assert call(lookupd, "GET", "/topics", headers=basic) == (401, "AUTH_REQUIRED")
        # a query nobody can parse is judged as about the whole node
        assert call(lookupd, "GET", "/lookup?topic=orders&x=%zz", "orders-admin") == (
            403,
            "UNAUTHORIZED",
        )
        assert call(lookupd, "GET", "/lookup?topic=orders&x=%zz", "root") == (
            400,
            "INVALID_REQUEST",
        )
        # unknown paths and methods, and near-miss spellings, are the API's own answers
        assert call(lookupd, "GET", "/nope") == (404, "NOT_FOUND")
        assert call(lookupd, "GET", "/topic/create")[0] == 405
        status, headers, _ = lookupd.get("/topics/")
        assert status == 301 and headers["Location"] == "/topics"
    finally:
        lookupd.stop()


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--http-auth=publish", "--auth-http-address=127.0.0.1:1"], "'publish' is not one of"),
        (["--http-auth=sometimes", "--auth-http-address=127.0.0.1:1"], "--http-auth"),
        (["--http-auth=admin"], "--http-auth needs an --auth-http-address"),
    ],
)
def test_bad_flags_are_one_line(args: list[str], text: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nsqx", "nsqlookupd", "--http-address=127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_auth_server_that_is_down_is_a_503(tmp_path: Path) -> None:
    with auth_server() as auth:
        dead = auth.address
    lookupd = start_lookupd(
        f"--auth-http-address={dead}", "--http-auth=admin", "--http-client-request-timeout=1s"
    )
    try:
        assert call(lookupd, "POST", "/topic/create?topic=t", "root") == (503, "AUTH_UNAVAILABLE")
        assert call(lookupd, "GET", "/topics")[0] == 200
        assert "root" not in "".join(lookupd.log)
    finally:
        lookupd.stop()


def test_members_place_partitions_on_an_nsqd_with_http_auth(
    auth: AuthServer, tmp_path: Path
) -> None:
    """nsqlookupd creates a partitioned topic's partitions on nsqd through nsqd's
    /topic/create: as a member (the cluster secret), it needs no bearer secret."""
    secret = "--cluster-secret=members-only"
    lookupd = started(auth, "--http-auth=all", secret)
    nsqd = start_nsqd(
        tmp_path,
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        f"--auth-http-address={auth.address}",
        "--http-auth=all",
        secret,
    )
    try:
        wait_until(
            lambda: json.loads(call(lookupd, "GET", "/cluster/nodes", "root")[1])["nodes"],
            what="nsqd registered",
        )
        path = "/topic/create?topic=parts&partition_num=2&replicator=1&multipart=true"
        member = members.headers("members-only")
        assert call(lookupd, "POST", path, "subscriber", member) == (403, "UNAUTHORIZED")
        assert call(lookupd, "POST", path, "orders-admin", member) == (403, "UNAUTHORIZED")
        # an admin action of nsqlookupd's is still for members only (both are needed)
        assert call(lookupd, "POST", path, "root") == (403, members.NOT_A_MEMBER)
        status, msg = call(lookupd, "POST", path, "root", member)
        assert status == 200, msg

        def partitions() -> Any:
            status, _, body = http_request(
                f"{nsqd.http_url}/stats?format=json&topic=parts",
                headers={"Authorization": "Bearer root"},
            )
            assert status == 200, body
            return len(json.loads(body)["topics"]) == 2

        wait_until(partitions, what="both partitions on nsqd")
        # a member passes nsqlookupd's check too; anyone else does not
        assert call(lookupd, "GET", "/topics", headers=member)[0] == 200
        wrong = members.headers("guess")
        assert call(lookupd, "GET", "/topics", headers=wrong) == (401, "AUTH_REQUIRED")
    finally:
        nsqd.stop(signal.SIGKILL)
        lookupd.stop()


def test_every_route_is_classified() -> None:
    """A new endpoint must be given its class here (else it counts as a node admin
    action, which this test would not notice)."""
    lookupd = NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
    assert set(LookupdHTTP(lookupd).routes) <= lookupd_http_auth.KNOWN
    need = lookupd_http_auth.need
    assert need("/ping", {}) is None
    assert need("/lookup", {"topic": ["a", "b"]}) == Need(READ, "a")
    assert need("/lookup", None) == Need(READ)
    assert need("/channel/create", {"topic": ["t"], "channel": ["c"]}) == Need(ADMIN, "t", "c")
    assert need("/some/new/thing", {}) == Need(ADMIN)
