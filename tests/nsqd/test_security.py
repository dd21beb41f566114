"""Security: an authorization matrix against a real auth server, TLS with client
certificates, secrets kept out of logs and /stats, the HTTP API's admin actions
restricted, and fuzzed IDENTIFY and AUTH bodies that never grant anything."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import FRAME_ERROR, FRAME_RESPONSE
from nsqx.wire import commands as c
from tlsnsq import Certs, UpgradedRaw, make_certs

from nsqdproc import start_nsqd as start_nsqd_process
from rawnsq import run, start_nsqd

# -- the auth server ----------------------------------------------------------------------

#: what each secret is granted; "tls:" grants come only over TLS, "cn:" ones only to a
#: client certificate with that common name (the auth server decides, as NSQ intends)
GRANTS: dict[str, list[dict[str, Any]]] = {
    "pub-orders": [{"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}],
    "sub-orders-audit": [
        {"topic": "^orders$", "channels": ["^audit$"], "permissions": ["subscribe"]}
    ],
    "metrics-all": [
        {"topic": r"^metrics\.", "channels": [".*"], "permissions": ["publish", "subscribe"]}
    ],
    "tls:secure-pub": [{"topic": "^secure$", "channels": [".*"], "permissions": ["publish"]}],
    "cn:worker-7": [
        {"topic": "^secure$", "channels": [".*"], "permissions": ["publish", "subscribe"]}
    ],
    "empty": [],
}
SECRETS = [
    "pub-orders",
    "sub-orders-audit",
    "metrics-all",
    "secure-pub",
    "worker",
    "empty",
    "wrong",
]


def granted(secret: str, tls: bool, cn: str) -> list[dict[str, Any]] | None:
    """The auth server's rule: the grants for this secret (None: refused, 403)."""
    if secret == "worker":
        return GRANTS["cn:worker-7"] if cn == "worker-7" else None
    if secret == "secure-pub":
        return GRANTS["tls:secure-pub"] if tls else []
    return GRANTS.get(secret)


@asynccontextmanager
async def auth_server() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    queries: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        q = dict(request.query)
        queries.append(q)
        grants = granted(q.get("secret", ""), q.get("tls") == "true", q.get("common_name", ""))
        if grants is None:
            return web.json_response({"message": "forbidden"}, status=403)
        return web.json_response(
            {"ttl": 3600, "identity": q["secret"], "identity_url": "", "authorizations": grants}
        )

    app = web.Application()
    app.router.add_get("/auth", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", queries
    finally:
        await runner.cleanup()


def allowed(secret: str, tls: bool, cn: str, verb: str, topic: str, channel: str) -> bool:
    """NSQ's rule (internal/auth): a permission, the topic pattern, and a channel pattern
    that matches the channel (a publish matches channel patterns against "")."""
    grants = granted(secret, tls, cn) or []
    need = "subscribe" if verb.startswith("SUB") else "publish"
    return any(
        need in g["permissions"]
        and re.search(g["topic"], topic)
        and any(re.search(p, channel if need == "subscribe" else "") for p in g["channels"])
        for g in grants
    )


def command(verb: str, topic: str, channel: str) -> bytes:
    if verb == "PUB":
        return c.pub(topic, b"x")
    if verb == "MPUB":
        return c.mpub(topic, [b"x", b"y"])
    if verb == "DPUB":
        return c.dpub(topic, 10, b"x")
    if verb == "PUB_TRACE":
        return c.pub_trace(topic, None, 7, b"x")
    if verb == "SUB_ORDERED":
        return b"SUB_ORDERED %s %s 0\n" % (topic.encode(), channel.encode())
    return c.sub(topic, channel)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"), client_cn="worker-7")


VERBS = ["PUB", "MPUB", "DPUB", "PUB_TRACE", "SUB", "SUB_ORDERED"]
TOPICS = ["orders", "metrics.cpu", "secure", "other"]
CHANNELS = ["audit", "billing"]


async def _attempt(
    nsqd: NSQD, ctx: ssl.SSLContext | None, secret: str, verb: str, topic: str, channel: str
) -> str:
    """One connection: IDENTIFY (TLS when ``ctx``), AUTH, the command. Returns "OK", the
    error code, or "closed"."""
    raw = await UpgradedRaw.connect(nsqd)
    try:
        await raw.negotiate(ctx)
        raw.send(c.auth(secret))
        ftype, data = await raw.frame()
        if ftype == FRAME_ERROR:
            return data.split(b" ")[0].decode()
        raw.send(command(verb, topic, channel))
        ftype, data = await raw.frame()
        if ftype == FRAME_RESPONSE and data.startswith(b"OK"):  # PUB_TRACE: OK + ids
            return "OK"
        assert ftype == FRAME_ERROR, (ftype, data)
        assert await raw.closed(), "an authorization error is fatal"
        return data.split(b" ")[0].decode()
    except ConnectionError:
        return "closed"
    finally:
        await raw.close()


def test_authorization_matrix(certs: Certs) -> None:
    """Every identity x TLS (none, server-only, with a client certificate) x command x
    topic x channel: a command succeeds exactly when the auth server's grants allow
    it, and one refused changes nothing (no message stored, no subscriber)."""

    async def body() -> None:
        async with auth_server() as (address, _):
            # NSQ asks for client certificates from every client or from none: two nsqd
            nsqd = await start_nsqd(auth_http_addresses=[address], **certs.nsqd_options())
            nsqd_certs = await start_nsqd(
                auth_http_addresses=[address],
                **certs.nsqd_options(
                    tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca_file
                ),
            )
            outcomes: list[tuple[Any, ...]] = []
            tls_modes = {
                "plain": (nsqd, None, ""),
                "tls": (nsqd, certs.client_context(), ""),
                "tls+cert": (nsqd_certs, certs.client_context(with_cert=True), "worker-7"),
            }
            for mode, (server, ctx, cn) in tls_modes.items():
                for secret in SECRETS:
                    grants = granted(secret, ctx is not None, cn)
                    if not grants:
                        # refused, or nothing granted: AUTH itself fails, nothing runs
                        got = await _attempt(server, ctx, secret, "PUB", "orders", "")
                        want = "E_AUTH_FAILED" if grants is None else "E_UNAUTHORIZED"
                        outcomes.append((mode, secret, "AUTH", got == want, got))
                        continue
                    for verb in VERBS:
                        for topic in TOPICS:
                            for channel in CHANNELS if verb.startswith("SUB") else [""]:
                                before = _stored(server, topic)
                                subs = _subscribers(server, topic)
                                got = await _attempt(server, ctx, secret, verb, topic, channel)
                                ok = allowed(secret, ctx is not None, cn, verb, topic, channel)
                                want = "OK" if ok else "E_UNAUTHORIZED"
                                if not ok:
                                    assert _stored(server, topic) == before, (verb, topic)
                                    assert _subscribers(server, topic) <= subs, (verb, topic)
                                outcomes.append(
                                    (mode, secret, verb, topic, channel, got == want, got)
                                )
            wrong = [o for o in outcomes if o[-2] is False]
            assert not wrong, wrong
            assert len(outcomes) > 300
            assert sum(o[-1] == "OK" for o in outcomes) > 20  # grants are used, too
            await nsqd.close()
            await nsqd_certs.close()

    run(body(), timeout=120)


def _stored(nsqd: NSQD, topic: str) -> int:
    t = nsqd.topics.get(topic)
    return 0 if t is None else sum(p.log.end for p in t.partitions.values())


def _subscribers(nsqd: NSQD, topic: str) -> int:
    t = nsqd.topics.get(topic)
    if t is None:
        return 0
    return sum(len(ch.clients) for p in t.partitions.values() for ch in p.channels.values())


# -- TLS client certificates ----------------------------------------------------------------


def test_client_certificates_required(certs: Certs) -> None:
    """--tls-client-auth-policy=require-verify: no TLS, or TLS without a certificate
    signed by the CA, gets nowhere; with one, the common name reaches the auth server."""

    async def body() -> None:
        async with auth_server() as (address, queries):
            nsqd = await start_nsqd(
                auth_http_addresses=[address],
                **certs.nsqd_options(
                    tls_client_auth_policy="require-verify",
                    tls_root_ca_file=certs.ca_file,
                    tls_required="true",
                ),
            )
            raw = await UpgradedRaw.connect(nsqd)
            raw.send(c.pub("secure", b"plain"))
            assert (await raw.error()).startswith(b"E_INVALID cannot PUB in current state")
            with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
                raw = await UpgradedRaw.connect(nsqd)
                await raw.negotiate(certs.client_context(with_cert=False))
                raw.send(c.auth("worker"))
                await raw.frame()
            assert (
                await _attempt(
                    nsqd, certs.client_context(with_cert=True), "worker", "PUB", "secure", ""
                )
                == "OK"
            )
            assert queries[-1]["common_name"] == "worker-7" and queries[-1]["tls"] == "true"
            assert _stored(nsqd, "secure") == 1
            await nsqd.close()

    run(body())


# -- secrets never shown --------------------------------------------------------------------

SECRET = "s3cr3t-Do-Not-Log-42"


def _http_get(url: str, ctx: ssl.SSLContext | None = None) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
            return str(resp.read().decode(errors="replace"))
    except urllib.error.HTTPError as err:
        return str(err.read().decode(errors="replace"))


def test_secrets_are_never_in_logs_or_stats(tmp_path: Path, certs: Certs) -> None:
    """An auth secret (accepted, refused, or met by auth servers that are down, slow,
    answer nonsense or are misconfigured) and the TLS private key appear in no log
    line (at debug level) and in no answer of the HTTP API."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        async with auth_server() as (address, _):
            bad = web.Application()

            async def nonsense(request: web.Request) -> web.Response:
                return web.Response(text="not json " + request.query_string, status=500)

            bad.router.add_get("/auth", nonsense)
            runner = web.AppRunner(bad)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            bad_address = f"127.0.0.1:{runner.addresses[0][1]}"
            configs = [
                [address],  # granted
                [bad_address],  # 500 with a body echoing the query (and so the secret)
                ["127.0.0.1:1"],  # down
                ["http://[::1:bad/auth"],  # a malformed URL
            ]
            for i, servers in enumerate(configs):
                flags = [f"--auth-http-address={a}" for a in servers]
                nsqd = await loop.run_in_executor(
                    None,
                    lambda flags=flags, i=i: start_nsqd_process(
                        tmp_path / f"d{i}",
                        "--log-level=debug",
                        "--http-address=127.0.0.1:0",
                        *certs.nsqd_flags(),
                        *flags,
                    ),
                )
                try:
                    for secret in (SECRET, "pub-orders"):
                        raw = await UpgradedRaw.open(nsqd.tcp_address)
                        await raw.negotiate(certs.client_context())
                        raw.send(c.auth(f"{secret}"))
                        await raw.frame()
                        raw.send(c.pub("orders", b"x"))
                        try:
                            await raw.frame()
                        except ConnectionError:
                            pass
                        await raw.close()
                    pages = [
                        _http_get(nsqd.http_url + p)
                        for p in (
                            "/stats?format=json&include_clients=true",
                            "/stats?include_clients=true",
                            "/metrics",
                            "/info",
                            "/config/auth_http_addresses",
                            "/config/tls_key",
                        )
                    ]
                finally:
                    await loop.run_in_executor(None, nsqd.stop)
                key_pem = Path(certs.server_key).read_text().splitlines()[1]
                for text in ["".join(nsqd.log), *pages]:
                    assert SECRET not in text and "s3cr3t" not in text
                    assert key_pem not in text
                assert any("Auth Failed" in line for line in nsqd.log) or i == 0
            await runner.cleanup()

    run(body(), timeout=120)


# -- the HTTP API's admin actions ---------------------------------------------------------


def _http(url: str, method: str = "POST", data: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


ADMIN = [
    ("POST", "/topic/create?topic=t2"),
    ("POST", "/topic/empty?topic=t"),
    ("POST", "/topic/pause?topic=t"),
    ("POST", "/channel/create?topic=t&channel=c2"),
    ("POST", "/channel/empty?topic=t&channel=c"),
    ("POST", "/channel/setorder?topic=t&channel=c&order=true"),
    ("POST", "/topic/delete?topic=t"),
    ("PUT", "/config/log_level"),
]


@pytest.fixture
def two_nsqds(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    refused = start_nsqd_process(
        tmp_path / "a", "--http-address=127.0.0.1:0", "--http-admin-allow=10.0.0.0/8"
    )
    allowed_ = start_nsqd_process(
        tmp_path / "b", "--http-address=127.0.0.1:0", "--http-admin-allow=127.0.0.0/8"
    )
    yield refused, allowed_
    refused.stop()
    allowed_.stop()


def test_admin_actions_can_be_restricted(two_nsqds: tuple[Any, Any]) -> None:
    """--http-admin-allow: admin actions from elsewhere get 403 and change nothing;
    publishing and reading stay open; from an allowed network everything works."""
    refused, allowed_ = two_nsqds
    for nsqd in (refused, allowed_):
        assert _http(nsqd.http_url + "/pub?topic=t", data=b"m") == 200
        assert _http(nsqd.http_url + "/channel/create?topic=t&channel=c") in (200, 403)
    for method, path in ADMIN:
        data = b"warn" if method == "PUT" else None
        assert _http(refused.http_url + path, method, data) == 403, path
        assert _http(allowed_.http_url + path, method, data) == 200, path
    stats = json.loads(_http_get(refused.http_url + "/stats?format=json"))
    (topic,) = stats["topics"]
    assert topic["topic_name"] == "t" and topic["depth"] == 1 and not topic["paused"]
    assert _http(refused.http_url + "/pub?topic=t", data=b"m2") == 200
    assert "refused (--http-admin-allow)" in "".join(refused.log)


def test_admin_allow_must_be_networks(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not a network"):
        start_nsqd_process(tmp_path, "--http-admin-allow=localhost")


# -- fuzzed IDENTIFY and AUTH ---------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
identify_bodies = st.one_of(
    st.dictionaries(
        st.sampled_from(
            [
                "client_id",
                "hostname",
                "feature_negotiation",
                "tls_v1",
                "snappy",
                "deflate",
                "auth",
                "secret",
                "identity",
                "authorizations",
                "permissions",
                "sample_rate",
                "msg_timeout",
                "heartbeat_interval",
                "extend_support",
                "desired_tag",
            ]
        ),
        json_values,
        max_size=6,
    ).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=64),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(identify=identify_bodies, secret=st.binary(max_size=48), twice=st.booleans())
@example(identify=b'{"feature_negotiation": true, "snappy": true}', secret=b"", twice=False)
@example(identify=b'{"feature_negotiation": true, "deflate": true}', secret=b"x", twice=True)
def test_fuzzed_identify_and_auth_never_grant_anything(
    identify: bytes, secret: bytes, twice: bool
) -> None:
    """Whatever the IDENTIFY body and the AUTH secret (which the auth server refuses,
    or grants nothing), no PUB and no SUB goes through."""

    async def body() -> None:
        async with auth_server() as (address, _):
            nsqd = await start_nsqd(auth_http_addresses=[address])
            raw = await UpgradedRaw.connect(nsqd)
            raw.send(b"IDENTIFY\n" + len(identify).to_bytes(4, "big") + identify)
            # A body that negotiates snappy or deflate switches the stream: follow it,
            # so that AUTH, PUB and SUB below are really read by nsqd.
            try:
                ftype, payload = await raw.read_frame_exactly()
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
                ftype, payload = FRAME_ERROR, b""
            if ftype == FRAME_RESPONSE and payload.startswith(b"{"):
                await raw.upgrade(json.loads(payload))
            auth = c.auth(secret) * (2 if twice else 1)
            raw.send(auth + c.pub("orders", b"x") + c.sub("orders", "audit") + c.nop())
            try:
                while await raw.frame(timeout=5):
                    pass
            except (ConnectionError, AssertionError):
                pass  # closed (an error), or nothing more
            assert _stored(nsqd, "orders") == 0 and not _subscribers(nsqd, "orders")
            await raw.close()
            await nsqd.close()

    if secret.decode("latin-1") in GRANTS and GRANTS[secret.decode("latin-1")]:
        return  # a real secret: not what this test is about
    run(body())
