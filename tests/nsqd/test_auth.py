"""AUTH against a real auth server (aiohttp on a free loopback port): the query nsqd
sends, the permissions PUB/MPUB/DPUB/SUB need, renewal after the ttl, and auth servers
that are down, slow or answer nonsense (E_AUTH_FAILED, the connection closed, other
clients unharmed)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nsqx.nsqd.auth import AuthError, parse_auth_response
from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c
from tlsnsq import UpgradedRaw, make_certs

from rawnsq import Raw, run, start_nsqd, wait_for

PUBLISHER = {
    "ttl": 3600,
    "identity": "pub-bot",
    "identity_url": "https://example.com/pub-bot?a=1&b=<2>",
    "authorizations": [
        {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]},
        {"topic": "^orders$", "channels": ["^audit$"], "permissions": ["subscribe"]},
    ],
}


class AuthServer:
    """The auth server the tests control: an answer per secret, every query recorded."""

    def __init__(self) -> None:
        self.answers: dict[str, Callable[[], Any]] = {}
        self.queries: list[dict[str, str]] = []
        self.release = asyncio.Event()
        self.address = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        answer = self.answers.get(request.query.get("secret", ""))
        if answer is None:
            return web.json_response({"message": "forbidden"}, status=403)
        result = answer()
        if asyncio.iscoroutine(result):
            result = await result
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)


@asynccontextmanager
async def auth_server(path: str = "/auth") -> AsyncIterator[AuthServer]:
    server = AuthServer()
    app = web.Application()
    app.router.add_get(path, server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.address = f"127.0.0.1:{port}"
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


async def authed(nsqd: NSQD, secret: str = "good") -> Raw:
    raw = await Raw.connect(nsqd)
    resp = await raw.identify()
    assert resp["auth_required"] is True
    raw.send(c.auth(secret))
    assert json.loads(await raw.response())["permission_count"] >= 1
    return raw


async def other_client_works(nsqd: NSQD) -> None:
    raw = await authed(nsqd)
    await raw.publish("orders", b"unharmed")
    await raw.close()


def test_auth_flow_and_permissions() -> None:
    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await Raw.connect(nsqd)
            assert (await raw.identify())["auth_required"] is True
            raw.send(c.auth("good"))
            # Go's json.Marshal escapes <, > and &
            assert await raw.response() == (
                b'{"identity":"pub-bot","identity_url":"https://example.com/pub-bot?a=1'
                b'\\u0026b=\\u003c2\\u003e","permission_count":2}'
            )
            assert auth.queries == [
                {"remote_ip": "127.0.0.1", "tls": "false", "secret": "good", "common_name": ""}
            ]
            await raw.publish("orders", b"one")
            raw.send(c.mpub("orders", [b"a", b"b"]) + c.dpub("orders", 10, b"later"))
            assert [await raw.response(), await raw.response()] == [b"OK", b"OK"]
            raw.send(c.pub("payments", b"x"))
            assert await raw.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "payments" ""'
            assert await raw.closed()

            sub = await authed(nsqd)
            sub.send(c.sub("orders", "other"))
            assert await sub.error() == (b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "other"')
            sub = await authed(nsqd)
            sub.send(c.sub("orders", "audit") + c.rdy(10))
            assert await sub.response() == b"OK"
            assert len(await sub.messages(3)) == 3
            await sub.close()
            await nsqd.close()

    run(body())


@pytest.mark.parametrize(
    ("command", "verb"),
    [
        (c.pub("orders", b"x"), "PUB"),
        (c.mpub("orders", [b"x"]), "MPUB"),
        (c.dpub("orders", 5, b"x"), "DPUB"),
        (c.sub("orders", "audit"), "SUB"),
    ],
)
def test_auth_first(command: bytes, verb: str) -> None:
    async def body() -> None:
        async with auth_server() as auth:
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await Raw.connect(nsqd)
            raw.send(command)
            assert await raw.error() == f"E_AUTH_FIRST AUTH required before {verb}".encode()
            assert await raw.closed()
            assert auth.queries == []
            await nsqd.close()

    run(body())


def test_auth_disabled_and_auth_twice() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await Raw.connect(nsqd)
        assert (await raw.identify())["auth_required"] is False
        raw.send(c.auth("x"))
        assert await raw.error() == b"E_AUTH_DISABLED AUTH Disabled"
        await nsqd.close()
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await authed(nsqd)
            raw.send(c.auth("good"))
            assert await raw.error() == b"E_INVALID AUTH Already set"
            await nsqd.close()

    run(body())


def test_commands_behind_auth_wait_for_its_answer() -> None:
    """AUTH and PUBs in one write: the PUBs run after the answer, in order."""

    async def body() -> None:
        async with auth_server() as auth:
            gate = asyncio.Event()

            async def slow_ok() -> Any:
                await gate.wait()
                return PUBLISHER

            auth.answers["good"] = slow_ok
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await Raw.connect(nsqd)
            await raw.identify()
            raw.send(c.auth("good") + c.pub("orders", b"1") + c.pub("orders", b"2"))
            await wait_for(lambda: len(auth.queries) == 1, what="the auth query")
            # meanwhile the server serves others
            plain = await Raw.connect(nsqd)
            await plain.identify()
            plain.send(c.nop())
            assert await plain.nothing_for(0.05)
            gate.set()
            assert json.loads(await raw.response())["identity"] == "pub-bot"
            assert [await raw.response(), await raw.response()] == [b"OK", b"OK"]
            assert nsqd.topics["orders"].message_count == 2
            await nsqd.close()

    run(body())


def test_authorization_is_renewed_after_ttl() -> None:
    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await authed(nsqd)
            (client,) = nsqd.clients
            assert client.auth_state is not None
            # let the ttl run out without waiting for it
            client.auth_state = dataclasses.replace(client.auth_state, expires=0.0)
            raw.send(c.pub("orders", b"after renewal") + c.pub("orders", b"next"))
            assert [await raw.response(), await raw.response()] == [b"OK", b"OK"]
            assert len(auth.queries) == 2
            # renewed again, and now the grant is gone
            auth.answers["good"] = lambda: {**PUBLISHER, "authorizations": []}
            client.auth_state = dataclasses.replace(client.auth_state, expires=0.0)
            raw.send(c.pub("orders", b"revoked"))
            assert await raw.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'
            assert await raw.closed()
            await nsqd.close()

    run(body())


def test_no_authorizations_and_refused_secret() -> None:
    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER
            auth.answers["none"] = lambda: {"ttl": 60, "authorizations": []}
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await Raw.connect(nsqd)
            await raw.identify()
            raw.send(c.auth("none"))
            assert await raw.error() == b"E_UNAUTHORIZED AUTH No authorizations found"
            assert await raw.closed()
            raw = await Raw.connect(nsqd)
            await raw.identify()
            raw.send(c.auth("wrong"))  # the auth server answers 403
            assert await raw.error() == b"E_AUTH_FAILED AUTH failed"
            assert await raw.closed()
            await other_client_works(nsqd)
            await nsqd.close()

    run(body())


NONSENSE: dict[str, Callable[[], Any]] = {
    "not json": lambda: web.Response(text="<html>hello</html>"),
    "a list": lambda: [1, 2],
    "ttl 0": lambda: {**PUBLISHER, "ttl": 0},
    "ttl string": lambda: {**PUBLISHER, "ttl": "60"},
    "bad permission": lambda: {
        "ttl": 60,
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["manage"]}],
    },
    "bad regex": lambda: {
        "ttl": 60,
        "authorizations": [{"topic": "(", "channels": [".*"], "permissions": ["publish"]}],
    },
    "channels not a list": lambda: {
        "ttl": 60,
        "authorizations": [{"topic": ".*", "channels": ".*", "permissions": ["publish"]}],
    },
}


@pytest.mark.parametrize("case", NONSENSE)
def test_nonsense_answers_fail_cleanly(case: str) -> None:
    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER
            auth.answers["odd"] = NONSENSE[case]
            nsqd = await start_nsqd(auth_http_addresses=[auth.address])
            raw = await Raw.connect(nsqd)
            await raw.identify()
            raw.send(c.auth("odd"))
            assert await raw.error() == b"E_AUTH_FAILED AUTH failed"
            assert await raw.closed()
            await other_client_works(nsqd)
            await nsqd.close()

    run(body())


def test_auth_server_down_or_slow() -> None:
    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["good"] = lambda: PUBLISHER

            async def never() -> Any:
                await auth.release.wait()
                return PUBLISHER

            auth.answers["slow"] = never
            # a port nothing listens on: grab one and close it
            probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            dead = f"127.0.0.1:{probe.sockets[0].getsockname()[1]}"
            probe.close()
            await probe.wait_closed()
            nsqd = await start_nsqd(auth_http_addresses=[dead], http_client_request_timeout=0.5)
            raw = await Raw.connect(nsqd)
            await raw.identify()
            raw.send(c.auth("good"))
            assert await raw.error() == b"E_AUTH_FAILED AUTH failed"
            await nsqd.close()

            nsqd = await start_nsqd(
                auth_http_addresses=[auth.address], http_client_request_timeout=0.5
            )
            slow = await Raw.connect(nsqd)
            await slow.identify()
            slow.send(c.auth("slow"))
            await wait_for(lambda: len(auth.queries) == 1, what="the slow query")
            await other_client_works(nsqd)  # while the slow one waits
            assert await slow.error() == b"E_AUTH_FAILED AUTH failed"
            assert await slow.closed()
            await nsqd.close()

    run(body())


def test_several_auth_servers_and_url_form() -> None:
    """One down, one up (tried in random order until one answers); a URL is used as is."""

    async def body() -> None:
        async with auth_server(path="/v2/check") as auth:
            auth.answers["good"] = lambda: PUBLISHER
            probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            dead = f"127.0.0.1:{probe.sockets[0].getsockname()[1]}"
            probe.close()
            await probe.wait_closed()
            url = f"http://{auth.address}/v2/check"
            nsqd = await start_nsqd(auth_http_addresses=[dead, url])
            for _ in range(4):
                raw = await authed(nsqd)
                await raw.publish("orders", b"x")
                await raw.close()
            await nsqd.close()

    run(body())


def test_tls_and_common_name_reach_the_auth_server(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", client_cn="worker-7")

    async def body() -> None:
        async with auth_server() as auth:
            auth.answers["s3cr3t &="] = lambda: PUBLISHER
            nsqd = await start_nsqd(
                auth_http_addresses=[auth.address],
                **certs.nsqd_options(
                    tls_client_auth_policy="require", tls_root_ca_file=certs.ca_file
                ),
            )
            raw = await UpgradedRaw.connect(nsqd)
            resp = await raw.negotiate(certs.client_context(with_cert=True), snappy=True)
            assert resp["auth_required"] is True
            raw.send(c.auth("s3cr3t &="))
            assert json.loads(await raw.response())["identity"] == "pub-bot"
            assert auth.queries[-1] == {
                "remote_ip": "127.0.0.1",
                "tls": "true",
                "secret": "s3cr3t &=",
                "common_name": "worker-7",
            }
            await raw.publish("orders", b"over tls+snappy")
            await nsqd.close()

    run(body())


def test_parse_auth_response_unit() -> None:
    state = parse_auth_response(json.dumps(PUBLISHER).encode(), now=100.0)
    assert state.expires == 100.0 + 3600 and not state.expired(200.0)
    assert state.allows("orders", "") and not state.allows("orders2", "")
    assert state.allows("orders", "audit") and not state.allows("orders", "x")
    # a publish grant needs a channel pattern that matches "" (as NSQ)
    strict = {"ttl": 1, "authorizations": [{"topic": ".*", "permissions": ["publish"]}]}
    assert not parse_auth_response(json.dumps(strict).encode(), 0).allows("t", "")
    with pytest.raises(AuthError):
        parse_auth_response(b'{"ttl": -1}', 0)
