"""Negotiated features: TLS, deflate and AUTH, through a front (tests/clienthelp.py)
that adds them to a real nsqd, so that the client's side is tested apart from nsqd's
(tests/client/test_client_nsqd_features.py runs them against nsqd's own).

The deflate codec here is a zlib stream registered for the test: the client's own
codecs come from nsqx.wire.compression; these tests cover the negotiation and the
read/write transforms around any codec."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from nsqx.client import (
    AuthError,
    ConnectionClosedError,
    Consumer,
    HandshakeError,
    NSQServerError,
    Producer,
    register_codec,
)
from nsqx.client.conn import Connection
from nsqx.nsqd.nsqd import NSQD

from clienthelp import NsqFront, ZlibCodec, make_cert
from rawnsq import run, start_nsqd, wait_for


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    try:
        return make_cert(tmp_path_factory.mktemp("tls"))
    except (OSError, Exception) as exc:  # pragma: no cover - openssl missing
        pytest.skip(f"cannot make a certificate with openssl: {exc}")


@pytest.fixture
def deflate_codec() -> Iterator[None]:
    register_codec("deflate", ZlibCodec)
    yield
    register_codec("deflate", None)


def server_ctx(cert: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    return ctx


def up(nsqd: NSQD) -> tuple[str, int]:
    assert nsqd.tcp_address is not None
    return nsqd.tcp_address


async def roundtrip(address: str, n: int = 50, **options: object) -> list[Connection]:
    """Publish n messages and consume them, both through ``address`` with ``options``."""
    async with Producer(address, **options) as p:  # type: ignore[arg-type]
        await p.multi_publish("t", [b"m%d" % i for i in range(n)])
        assert p._conn is not None
        conns: list[Connection] = [p._conn]
    got: list[bytes] = []
    async with Consumer(
        "t",
        "c",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=address,
        max_in_flight=20,
        **options,  # type: ignore[arg-type]
    ) as c:
        await wait_for(lambda: len(got) == n, what=f"{n} messages")
        conns.extend(c._conns.values())
    assert sorted(got) == sorted(b"m%d" % i for i in range(n))
    return conns


def test_tls(cert: tuple[Path, Path]) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        front = await NsqFront(up(nsqd), tls=server_ctx(cert)).start()
        conns = await roundtrip(front.address, tls_v1=True, tls_root_ca_file=str(cert[0]))
        assert all(c.tls and c.features["tls_v1"] for c in conns)
        assert all(b["tls_v1"] is True for b in front.identify_bodies)
        await front.close()
        await nsqd.close()

    run(body())


def test_tls_refused_when_not_offered_or_not_trusted(cert: tuple[Path, Path]) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        host, port = up(nsqd)
        p = Producer(f"{host}:{port}", tls_v1=True, tls_insecure_skip_verify=True)
        with pytest.raises(ConnectionClosedError) as info:
            await p.publish("t", b"x")
        assert isinstance(info.value.__cause__, HandshakeError)
        assert "does not offer" in str(info.value.__cause__)
        front = await NsqFront(up(nsqd), tls=server_ctx(cert)).start()
        p = Producer(front.address, tls_v1=True)  # the system CAs do not know our cert
        with pytest.raises(ConnectionClosedError) as info:
            await p.publish("t", b"x")
        assert "TLS handshake failed" in str(info.value.__cause__)
        await front.close()
        await nsqd.close()

    run(body())


def test_deflate(deflate_codec: None) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        front = await NsqFront(up(nsqd), deflate=True).start()
        conns = await roundtrip(front.address, n=300, deflate=True, deflate_level=3)
        assert all(c.compression == "deflate" for c in conns)
        assert all(b["deflate"] is True and b["deflate_level"] == 3 for b in front.identify_bodies)
        await front.close()
        await nsqd.close()

    run(body())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_deflate_inside_tls_with_auth(
    cert: tuple[Path, Path], deflate_codec: None, loop: str
) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        front = await NsqFront(
            up(nsqd), tls=server_ctx(cert), deflate=True, auth_secret="s3cret"
        ).start()
        conns = await roundtrip(
            front.address,
            tls_v1=True,
            tls_root_ca_file=str(cert[0]),
            deflate=True,
            auth_secret="s3cret",
        )
        assert all(c.tls and c.compression == "deflate" for c in conns)
        assert all(
            c.auth == {"identity": "tester", "identity_url": "", "permission_count": 1}
            for c in conns
        )
        assert front.auth_secrets == [b"s3cret"] * len(conns)
        await front.close()
        await nsqd.close()

    if loop == "uvloop":
        uvloop.run(asyncio.wait_for(body(), 60))
    else:
        run(body())


def test_auth_required() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        front = await NsqFront(up(nsqd), auth_secret="s3cret").start()
        p = Producer(front.address)
        with pytest.raises(ConnectionClosedError) as info:
            await p.publish("t", b"x")
        assert isinstance(info.value.__cause__, AuthError)
        p = Producer(front.address, auth_secret="wrong")
        with pytest.raises(ConnectionClosedError) as info:
            await p.publish("t", b"x")
        cause = info.value.__cause__
        assert isinstance(cause, NSQServerError) and cause.code == "E_UNAUTHORIZED"
        # a consumer keeps retrying in the background and stays unconnected
        c = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=front.address, auth_secret="bad")
        async with c:
            assert c.connections == []
        await roundtrip(front.address, auth_secret="s3cret")
        await front.close()
        await nsqd.close()

    run(body())
