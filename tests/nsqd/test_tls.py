"""TLS: IDENTIFY tls_v1 upgrades the connection in place; --tls-required, client
certificates, --tls-min-version; failed handshakes and garbage close only that client."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from nsqx.wire import FRAME_ERROR, FRAME_RESPONSE
from nsqx.wire import commands as c
from tlsnsq import Certs, UpgradedRaw, make_certs

from nsqdproc import start_nsqd as start_nsqd_process
from rawnsq import Raw, run, start_nsqd, wait_for


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


async def publish_ok(nsqd: object, topic: str = "healthy") -> None:
    """Another (plain) client can still publish: nothing else was harmed."""
    other = await Raw.connect(nsqd)  # type: ignore[arg-type]
    await other.publish(topic, b"still fine")
    await other.close()


def test_upgrade_then_publish_and_consume(certs: Certs) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        pub = await UpgradedRaw.connect(nsqd)
        resp = await pub.negotiate(certs.client_context())
        assert resp["tls_v1"] is True and resp["snappy"] is False
        await pub.publish("t", b"secret", b"x" * 200_000)
        sub = await UpgradedRaw.connect(nsqd)
        await sub.negotiate(certs.client_context())
        sub.send(c.sub("t", "c"))
        assert await sub.response() == b"OK"
        sub.send(c.rdy(5))
        assert [m.body for m in await sub.messages(2)] == [b"secret", b"x" * 200_000]
        assert all(cl.tls for cl in nsqd.clients)
        await pub.close()
        await sub.close()
        await nsqd.close()

    run(body())


def test_no_certificate_means_no_tls(certs: Certs) -> None:
    """Without --tls-cert, IDENTIFY answers tls_v1 false and the connection stays plain."""

    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await UpgradedRaw.connect(nsqd)
        resp = await raw.negotiate(certs.client_context())
        assert resp["tls_v1"] is False
        await raw.publish("t", b"plain")
        await raw.close()
        await nsqd.close()

    run(body())


def test_commands_pipelined_behind_identify_run_when_nothing_is_negotiated(
    certs: Certs,
) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        raw = await Raw.connect(nsqd)
        raw.send(c.identify({"feature_negotiation": True}) + c.pub("t", b"a") + c.pub("t", b"b"))
        assert (await raw.response()).startswith(b"{")
        assert await raw.response() == b"OK"
        assert await raw.response() == b"OK"
        assert nsqd.topics["t"].message_count == 2
        await raw.close()
        await nsqd.close()

    run(body())


def test_tls_required(certs: Certs) -> None:
    """--tls-required: anything but IDENTIFY before TLS is refused by name and closes;
    after the upgrade everything works."""

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options(tls_required="true"))
        raw = await Raw.connect(nsqd)
        raw.send(c.pub("t", b"x"))
        assert await raw.error() == b"E_INVALID cannot PUB in current state (TLS required)"
        assert await raw.closed()

        raw = await Raw.connect(nsqd)
        raw.send(c.identify({"feature_negotiation": True}) + c.nop())
        assert (await raw.response()).startswith(b"{")
        assert await raw.error() == b"E_INVALID cannot NOP in current state (TLS required)"
        assert await raw.closed()

        up = await UpgradedRaw.connect(nsqd)
        await up.negotiate(certs.client_context())
        await up.publish("t", b"over tls")
        await up.close()
        await nsqd.close()

    run(body())


def test_client_certificate_required(certs: Certs, tmp_path: Path) -> None:
    """--tls-client-auth-policy=require-verify: a client without a certificate (or with
    one from another CA) fails the handshake; one signed by --tls-root-ca-file passes."""

    async def body() -> None:
        nsqd = await start_nsqd(
            **certs.nsqd_options(
                tls_client_auth_policy="require-verify",
                tls_root_ca_file=certs.ca_file,
                tls_required="true",
            )
        )
        stranger = make_certs(tmp_path / "other")
        for ctx in (certs.client_context(), stranger.client_context(with_cert=True)):
            ctx.load_verify_locations(certs.ca_file)
            raw = await UpgradedRaw.connect(nsqd)
            with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
                await raw.negotiate(ctx)
                await raw.publish("t", b"x")
            await raw.close()
        ok = await UpgradedRaw.connect(nsqd)
        await ok.negotiate(certs.client_context(with_cert=True))
        await ok.publish("t", b"with a certificate")
        await ok.close()
        await nsqd.close()

    run(body())


def test_min_version(certs: Certs) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options(tls_min_version="tls1.3"))
        old = certs.client_context()
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        raw = await UpgradedRaw.connect(nsqd)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await raw.negotiate(old)
        await raw.close()
        new = await UpgradedRaw.connect(nsqd)
        await new.negotiate(certs.client_context())
        assert {cl.tls for cl in nsqd.clients} == {True}
        await new.publish("t", b"tls 1.3")
        await new.close()
        await nsqd.close()

    run(body())


def test_client_that_never_starts_tls_gets_a_clear_error(certs: Certs) -> None:
    """The handshake fails on a plain command; as nsqd, the error frame is sent in the
    clear, so such a client can read why, then the connection is closed."""

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        raw = await Raw.connect(nsqd)
        raw.send(c.identify({"feature_negotiation": True, "tls_v1": True}))
        assert (await raw.response()).startswith(b"{")
        raw.send(c.pub("t", b"not encrypted"))
        ftype, data = await raw.frame()
        assert ftype == FRAME_ERROR
        assert data.startswith(b"E_IDENTIFY_FAILED IDENTIFY failed ")
        assert await raw.closed()
        await publish_ok(nsqd)
        await nsqd.close()

    run(body())


def test_handshake_timeout(certs: Certs) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        nsqd.tls_handshake_timeout = 0.2
        raw = await Raw.connect(nsqd)
        raw.send(c.identify({"feature_negotiation": True, "tls_v1": True}))
        assert (await raw.response()).startswith(b"{")
        assert await raw.error() == b"E_IDENTIFY_FAILED IDENTIFY failed TLS handshake timed out"
        assert await raw.closed()
        await publish_ok(nsqd)
        await nsqd.close()

    run(body())


async def manual_tls(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: ssl.SSLContext
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """A client TLS handshake over memory buffers, leaving the raw socket to the test."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    while True:
        try:
            obj.do_handshake()
            writer.write(outgoing.read())
            return obj, incoming, outgoing
        except ssl.SSLWantReadError:
            writer.write(outgoing.read())
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "server closed during the handshake"
            incoming.write(data)


def test_garbage_after_upgrade_closes_only_that_client(certs: Certs) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        reader, writer = await asyncio.open_connection(*nsqd.tcp_address)  # type: ignore[misc]
        writer.write(b"  V2" + c.identify({"feature_negotiation": True, "tls_v1": True}))
        head = await reader.readexactly(8)
        await reader.readexactly(int.from_bytes(head[:4], "big") - 4)
        await manual_tls(reader, writer, certs.client_context())
        writer.write(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # a record nobody encrypted
        while await asyncio.wait_for(reader.read(65536), 10):
            pass  # an alert, then EOF
        writer.close()
        await wait_for(lambda: not nsqd.clients, what="the client to be dropped")
        await publish_ok(nsqd)
        await nsqd.close()

    run(body())


def test_tls_ok_is_encrypted_and_follows_the_handshake(certs: Certs) -> None:
    """Bytes on the wire: the IDENTIFY JSON in the clear, then only TLS records."""

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        reader, writer = await asyncio.open_connection(*nsqd.tcp_address)  # type: ignore[misc]
        writer.write(b"  V2" + c.identify({"feature_negotiation": True, "tls_v1": True}))
        head = await reader.readexactly(8)
        assert int.from_bytes(head[4:], "big") == FRAME_RESPONSE
        await reader.readexactly(int.from_bytes(head[:4], "big") - 4)
        obj, incoming, _ = await manual_tls(reader, writer, certs.client_context())
        plain = b""
        while len(plain) < 10:
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data[:1] in (b"\x16", b"\x17")  # handshake / application data records
            incoming.write(data)
            try:
                plain += obj.read(65536)
            except ssl.SSLWantReadError:
                pass
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        writer.close()
        await nsqd.close()

    run(body())


def test_nsqd_process_with_tls_flags(certs: Certs, tmp_path: Path) -> None:
    """The real command line: --tls-cert/--tls-key/--tls-client-auth-policy/
    --tls-root-ca-file; and the start refused without a certificate."""
    proc = start_nsqd_process(
        tmp_path / "data",
        *certs.nsqd_flags(),
        "--tls-client-auth-policy=require-verify",
        f"--tls-root-ca-file={certs.ca_file}",
    )
    try:

        async def body() -> None:
            raw = await UpgradedRaw.open(proc.tcp_address)
            resp = await raw.negotiate(certs.client_context(with_cert=True), snappy=True)
            assert resp["tls_v1"] and resp["snappy"]
            await raw.publish("t", b"cli")
            await raw.close()
            raw = await UpgradedRaw.open(proc.tcp_address)
            raw.send(c.nop())  # tls required by the auth policy
            assert await raw.error() == b"E_INVALID cannot NOP in current state (TLS required)"

        run(body())
    finally:
        proc.stop()

    with pytest.raises(RuntimeError, match="without TLS key and cert"):
        start_nsqd_process(tmp_path / "data2", "--tls-required=true")
    with pytest.raises(RuntimeError, match="failed to start"):
        start_nsqd_process(tmp_path / "data3", "--tls-cert=/nonexistent", "--tls-key=/nope")


def test_tls_required_without_certificate_refuses_to_start() -> None:
    async def body() -> None:
        with pytest.raises(ValueError, match="without TLS key and cert"):
            await start_nsqd(tls_required="true")

    run(body())


def test_handshake_sent_right_behind_identify_is_not_lost(certs: Certs) -> None:
    """A client that starts TLS without waiting for the IDENTIFY answer: its ClientHello
    arrives in the same read as IDENTIFY and goes to the handshake."""

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        reader, writer = await asyncio.open_connection(*nsqd.tcp_address)  # type: ignore[misc]
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = certs.client_context().wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            obj.do_handshake()
        hello = outgoing.read()
        identify = c.identify({"feature_negotiation": True, "tls_v1": True})
        writer.write(b"  V2" + identify + hello)
        head = await reader.readexactly(8)
        assert b'"tls_v1":true' in await reader.readexactly(int.from_bytes(head[:4], "big") - 4)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                writer.write(outgoing.read())
                incoming.write(await asyncio.wait_for(reader.read(65536), 10))
        writer.write(outgoing.read())
        obj.write(c.pub("t", b"early bird"))
        writer.write(outgoing.read())
        plain = b""
        while len(plain) < 20:  # the OK after the handshake, then the PUB's OK
            try:
                plain += obj.read(65536)
            except ssl.SSLWantReadError:
                incoming.write(await asyncio.wait_for(reader.read(65536), 10))
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2
        writer.close()
        await nsqd.close()

    run(body())
