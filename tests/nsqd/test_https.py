"""HTTPS on --https-address, and --tls-required=true covering plain HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tlsnsq import make_certs

from rawnsq import run, start_nsqd


def test_https_serves_the_api_and_tls_required_refuses_plain_http(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)

    async def body() -> None:
        nsqd = await start_nsqd(
            **certs.nsqd_options(
                http_address="127.0.0.1:0", https_address="127.0.0.1:0", tls_required="true"
            )
        )
        assert nsqd.http_address is not None and nsqd.https_address is not None
        ctx = certs.client_context()
        async with aiohttp.ClientSession() as session:
            https = f"https://127.0.0.1:{nsqd.https_address[1]}"
            async with session.post(f"{https}/pub?topic=t", data=b"hi", ssl=ctx) as resp:
                assert (resp.status, await resp.read()) == (200, b"OK")
            async with session.get(f"{https}/ping", ssl=ctx) as resp:
                assert resp.status == 200
            plain = f"http://127.0.0.1:{nsqd.http_address[1]}"
            async with session.get(f"{plain}/ping") as resp:
                assert resp.status == 403
                assert json.loads(await resp.read()) == {
                    "message": "TLS_REQUIRED",
                    "https_port": nsqd.https_address[1],
                }
        assert nsqd.topics["t"].message_count == 1
        await nsqd.close()

    run(body())


def test_tcp_https_leaves_plain_http_open(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)

    async def body() -> None:
        nsqd = await start_nsqd(
            **certs.nsqd_options(http_address="127.0.0.1:0", tls_required="tcp-https")
        )
        assert nsqd.http_address is not None
        url = f"http://127.0.0.1:{nsqd.http_address[1]}/ping"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 200
        await nsqd.close()

    run(body())


def test_stats_report_tls_and_compression(tmp_path: Path) -> None:
    from nsqx.nsqd.stats import client_stats
    from tlsnsq import UpgradedRaw

    certs = make_certs(tmp_path)

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        r = await UpgradedRaw.connect(nsqd)
        await r.negotiate(certs.client_context(), tls_v1=True, snappy=True)
        await r.publish("t", b"x")
        (client,) = nsqd.clients
        stats = client_stats(client).to_json()
        assert stats["tls"] is True and stats["snappy"] is True
        assert stats["tls_version"].startswith("TLS") and stats["tls_cipher_suite"]
        assert "authed" not in stats
        await nsqd.close()

    run(body())
