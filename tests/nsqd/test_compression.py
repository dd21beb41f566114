"""snappy and deflate negotiated in IDENTIFY: the compressed OK, traffic both ways, level
negotiation, --snappy/--deflate=false, corrupt streams closing only their client."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from nsqx.wire import FRAME_ERROR
from nsqx.wire import commands as c
from nsqx.wire.compression import (
    DeflateCompressor,
    DeflateDecompressor,
    SnappyCompressor,
    SnappyDecompressor,
)
from tlsnsq import Certs, UpgradedRaw, make_certs

from rawnsq import Raw, run, start_nsqd, wait_for

KINDS: dict[str, dict[str, Any]] = {"snappy": {"snappy": True}, "deflate": {"deflate": True}}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("kind", KINDS)
def test_compressed_publish_and_consume(kind: str, tls: bool, certs: Certs) -> None:
    """Each compression alone and on top of TLS (handshake, OK, compressed OK)."""

    async def body() -> None:
        nsqd = await start_nsqd(**certs.nsqd_options())
        ctx = certs.client_context() if tls else None
        pub = await UpgradedRaw.connect(nsqd)
        resp = await pub.negotiate(ctx, **KINDS[kind])
        assert resp[kind] is True and resp["tls_v1"] is tls
        bodies = [b"small", bytes(range(256)) * 1000, b"z" * 300_000]
        await pub.publish("t", *bodies)
        pub.send(c.mpub("t", [b"m%d" % i * 50 for i in range(500)]))
        assert await pub.response() == b"OK"
        sub = await UpgradedRaw.connect(nsqd)
        await sub.negotiate(ctx, **KINDS[kind])
        sub.send(c.sub("t", "c") + c.rdy(1000))
        assert await sub.response() == b"OK"
        got = [m.body for m in await sub.messages(503)]
        assert got[:3] == bodies and len(got) == 503
        client = next(cl for cl in nsqd.clients if cl.channel is not None)
        assert getattr(client, kind) is True and client.tls is tls
        await pub.close()
        await sub.close()
        await nsqd.close()

    run(body())


@pytest.mark.parametrize(
    ("requested", "max_level", "negotiated"),
    [(None, 6, 6), (9, 6, 6), (2, 6, 2), (None, 3, 3), (9, 9, 9)],
)
def test_deflate_level(requested: int | None, max_level: int, negotiated: int) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(max_deflate_level=max_level)
        raw = await UpgradedRaw.connect(nsqd)
        fields: dict[str, Any] = {"deflate": True}
        if requested is not None:
            fields["deflate_level"] = requested
        resp = await raw.negotiate(**fields)
        assert (resp["deflate_level"], resp["max_deflate_level"]) == (negotiated, max_level)
        await raw.publish("t", b"x" * 1000)
        await raw.close()
        await nsqd.close()

    run(body())


@pytest.mark.parametrize("kind", KINDS)
def test_disabled_compression_is_not_negotiated(kind: str) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(**{kind: False})
        raw = await UpgradedRaw.connect(nsqd)
        resp = await raw.negotiate(**KINDS[kind])
        assert resp[kind] is False
        assert raw.compressor is None
        await raw.publish("t", b"plain")
        await raw.close()
        await nsqd.close()

    run(body())


def test_snappy_and_deflate_exclude_each_other() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await Raw.connect(nsqd)
        raw.send(c.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
        assert await raw.error() == (
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
        )
        assert await raw.closed()
        await nsqd.close()

    run(body())


@pytest.mark.parametrize("kind", KINDS)
def test_commands_sent_right_behind_identify_are_not_lost(kind: str) -> None:
    """A client that compresses its commands without waiting for the IDENTIFY answer:
    the bytes behind IDENTIFY go through the decompressor, nothing is dropped."""

    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await UpgradedRaw.connect(nsqd)
        comp = SnappyCompressor() if kind == "snappy" else DeflateCompressor()
        identify = c.identify({"feature_negotiation": True, **KINDS[kind]})
        raw.writer.write(identify + comp.compress(c.pub("t", b"one") + c.pub("t", b"two")))
        _, payload = await raw.read_frame_exactly()
        assert payload.startswith(b"{")
        raw.compressor = comp
        raw.decompressor = SnappyDecompressor() if kind == "snappy" else DeflateDecompressor()
        assert [await raw.response() for _ in range(3)] == [b"OK", b"OK", b"OK"]
        assert nsqd.topics["t"].message_count == 2
        await raw.close()
        await nsqd.close()

    run(body())


@pytest.mark.parametrize(
    ("kind", "garbage", "error"),
    [
        ("snappy", b"\x00\x10\x00\x00" + b"\x00" * 16, b"E_INVALID snappy: corrupt input"),
        ("snappy", b"\x02\x01\x00\x00z", b"E_INVALID snappy: corrupt input"),
        ("deflate", b"\xff" * 32, b"E_INVALID flate: corrupt input"),
    ],
)
def test_corrupt_stream_closes_only_that_client(kind: str, garbage: bytes, error: bytes) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        bad = await UpgradedRaw.connect(nsqd)
        await bad.negotiate(**KINDS[kind])
        good = await UpgradedRaw.connect(nsqd)
        await good.negotiate(**KINDS[kind])
        await bad.publish("t", b"before")
        bad.writer.write(garbage)  # not through the compressor
        ftype, data = await bad.frame()
        assert ftype == FRAME_ERROR and data.startswith(error), data
        assert await bad.closed()
        await good.publish("t", b"after")
        await wait_for(lambda: len(nsqd.clients) == 1, what="the bad client to be dropped")
        await good.close()
        await nsqd.close()

    run(body())


def test_deflate_final_block_ends_the_connection_after_its_commands() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await UpgradedRaw.connect(nsqd)
        await raw.negotiate(deflate=True)
        z = zlib.compressobj(6, zlib.DEFLATED, -15)
        raw.writer.write(z.compress(c.pub("t", b"last")) + z.flush())
        assert await raw.response() == b"OK"
        assert await raw.closed()
        await nsqd.close()

    run(body())


def test_second_upgrade_is_refused() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await UpgradedRaw.connect(nsqd)
        await raw.negotiate(snappy=True)
        raw.send(c.identify({"feature_negotiation": True, "deflate": True}))
        assert (await raw.response()).startswith(b"{")
        assert await raw.error() == b"E_IDENTIFY_FAILED IDENTIFY failed already upgraded"
        assert await raw.closed()
        await nsqd.close()

    run(body())


def _nops_then(tail: bytes, finish: bool) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    end = zlib.Z_FINISH if finish else zlib.Z_SYNC_FLUSH
    nops = 30000 if not finish else 32768  # 128 KiB: the end falls on nsqd's 64 KiB step
    return z.compress(c.nop() * nops) + z.flush(end) + tail


@pytest.mark.parametrize(
    "stream",
    [
        # zlib keeps bytes it cannot use until more input arrives
        _nops_then(bytes.fromhex("032483bc0e"), finish=False),
        # the stream ends exactly at a 64 KiB step, bytes after the end held back
        _nops_then(b"junkjunk", finish=True),
    ],
    ids=["unusable-tail", "bytes-after-the-end"],
)
def test_a_deflate_stream_zlib_cannot_progress_on_does_not_hang_nsqd(stream: bytes) -> None:
    """Found by fuzzing: nsqd decompresses 64 KiB at a time and takes the input zlib
    held back for pending output; zlib may hold back bytes it cannot use (until more
    input arrives, or ever: after the end of the stream). nsqd looped on them for ever,
    its event loop stuck, every client frozen."""

    async def body() -> None:
        nsqd = await start_nsqd()
        raw = await UpgradedRaw.connect(nsqd)
        await raw.negotiate(deflate=True)
        raw.writer.write(stream)
        other = await Raw.connect(nsqd)
        await other.publish("t", b"nsqd still answers")
        await other.close()
        await raw.close()
        await nsqd.close()

    run(body(), timeout=20)
