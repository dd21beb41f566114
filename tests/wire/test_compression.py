"""Snappy (framed) and deflate stream codecs: round trips across any split, interop with
other implementations, and corrupt input refused with a CompressionError."""

from __future__ import annotations

import os
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.wire.compression import (
    SNAPPY_MAX_BLOCK,
    CompressionError,
    DeflateCompressor,
    DeflateDecompressor,
    SnappyCompressor,
    SnappyDecompressor,
    codec_pair,
    masked_crc32c,
)
from nsqx.wire.errors import ProtocolError

CODECS = {
    "snappy": (SnappyCompressor, SnappyDecompressor),
    "deflate": (DeflateCompressor, DeflateDecompressor),
}


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def decode_all(dec: object, pieces: list[bytes], max_length: int = 0) -> bytes:
    out = []
    for piece in pieces:
        out.append(dec.decompress(piece, max_length))  # type: ignore[attr-defined]
        while dec.pending:  # type: ignore[attr-defined]
            out.append(dec.decompress(b"", max_length))  # type: ignore[attr-defined]
    return b"".join(out)


writes = st.lists(st.binary(max_size=3000) | st.just(b"a" * 70_000), max_size=6)


@pytest.mark.parametrize("name", CODECS)
@settings(max_examples=60, deadline=None)
@given(writes=writes, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_round_trip_any_split(name: str, writes: list[bytes], cuts: list[int]) -> None:
    comp_cls, dec_cls = CODECS[name]
    comp = comp_cls()
    stream = b"".join(comp.compress(w) for w in writes)
    assert decode_all(dec_cls(), split(stream, cuts)) == b"".join(writes)


@pytest.mark.parametrize("name", CODECS)
@settings(max_examples=30, deadline=None)
@given(writes=writes, cut=st.integers(min_value=0))
def test_every_write_is_decodable_at_once(name: str, writes: list[bytes], cut: int) -> None:
    """A peer reading write by write gets each write's bytes without waiting for more."""
    comp_cls, dec_cls = CODECS[name]
    comp, dec = comp_cls(), dec_cls()
    for w in writes:
        assert decode_all(dec, [comp.compress(w)]) == w


@pytest.mark.parametrize("name", CODECS)
def test_max_length_bounds_each_output(name: str) -> None:
    comp_cls, dec_cls = CODECS[name]
    data = b"z" * 1_000_000  # compresses very well: the bomb case
    stream = comp_cls().compress(data)
    dec = dec_cls()
    pieces = [dec.decompress(stream, 100_000)]
    while dec.pending:
        pieces.append(dec.decompress(b"", 100_000))
    assert b"".join(pieces) == data
    assert len(pieces) > 1
    assert max(map(len, pieces)) <= 100_000 + SNAPPY_MAX_BLOCK


def test_snappy_stream_layout() -> None:
    comp = SnappyCompressor()
    first = comp.compress(b"hello" * 100)
    assert first.startswith(b"\xff\x06\x00\x00sNaPpY")
    second = comp.compress(b"x")
    assert not second.startswith(b"\xff")  # the stream identifier comes once
    assert second[0] == 0x01  # too small to shrink: an uncompressed chunk
    big = comp.compress(os.urandom(200_000))
    # chunks of at most 64 KiB of input
    pos, sizes = 0, []
    while pos < len(big):
        length = int.from_bytes(big[pos + 1 : pos + 4], "little")
        sizes.append(length)
        pos += 4 + length
    assert len(sizes) == 4 and max(sizes) <= SNAPPY_MAX_BLOCK + 4


def test_snappy_interop_with_cramjam_framing() -> None:
    """Our stream decodes with another framed implementation, and theirs with ours,
    including one stream identifier per write (as pynsq writes it)."""
    data = [b"PUB t\n" + os.urandom(50), b"a" * 100_000, b"NOP\n"]
    comp = SnappyCompressor()
    ours = b"".join(comp.compress(d) for d in data)
    assert bytes(cramjam.snappy.decompress(ours)) == b"".join(data)
    theirs = b"".join(bytes(cramjam.snappy.compress(d)) for d in data)
    assert decode_all(SnappyDecompressor(), split(theirs, [7, 1000, 5000])) == b"".join(data)


def test_snappy_skips_padding_and_skippable_chunks() -> None:
    comp = SnappyCompressor()
    stream = comp.compress(b"one") + b"\xfe\x03\x00\x00pad" + b"\x80\x00\x00\x00"
    stream += comp.compress(b"two")
    assert decode_all(SnappyDecompressor(), split(stream, [12, 15, 22])) == b"onetwo"
    # a large skippable chunk split across reads is dropped without being buffered
    comp, dec = SnappyCompressor(), SnappyDecompressor()
    assert dec.decompress(comp.compress(b"a") + b"\x99\x00\x00\x01" + b"s" * 10) == b"a"
    assert dec.decompress(b"s" * (0x10000 - 10)) == b""
    assert dec.decompress(comp.compress(b"b")) == b"b"


def test_deflate_interop_with_zlib() -> None:
    payload = b"SUB t c\n" * 50
    ours = DeflateCompressor(level=3).compress(payload)
    assert ours.endswith(b"\x00\x00\xff\xff")  # sync flush, as Go's Flush
    assert zlib.decompressobj(-15).decompress(ours) == payload
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    theirs = z.compress(payload) + z.flush(zlib.Z_SYNC_FLUSH)
    assert DeflateDecompressor().decompress(theirs) == payload


def test_deflate_final_block_ends_the_stream() -> None:
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    dec = DeflateDecompressor()
    assert dec.decompress(z.compress(b"NOP\n") + z.flush()) == b"NOP\n"
    assert dec.eof
    with pytest.raises(CompressionError):
        dec.decompress(b"more")


@pytest.mark.parametrize(
    "stream",
    [
        b"\x00\x08\x00\x00abcdefgh",  # data before the stream identifier
        b"\xff\x06\x00\x00sNaPpX",  # wrong identifier
        b"\xff\x07\x00\x00sNaPpYY",  # identifier of the wrong length
        b"\xff\x06\x00\x00sNaPpY\x02\x01\x00\x00z",  # reserved unskippable type
        b"\xff\x06\x00\x00sNaPpY\x00\xff\xff\xff",  # chunk longer than the format allows
        b"\xff\x06\x00\x00sNaPpY\x01\x02\x00\x00ab",  # shorter than its checksum
    ],
)
def test_snappy_corrupt_framing(stream: bytes) -> None:
    with pytest.raises(CompressionError):
        SnappyDecompressor().decompress(stream)


def test_snappy_bad_checksum_and_bad_block() -> None:
    good = SnappyCompressor().compress(b"hello world " * 20)
    bad_crc = bytearray(good)
    bad_crc[14] ^= 1
    with pytest.raises(CompressionError, match="checksum"):
        SnappyDecompressor().decompress(bytes(bad_crc))
    block = b"\xff\xff\xff\xff\x0f junk"
    chunk = (0x00 | (len(block) + 4) << 8).to_bytes(4, "little") + b"\0\0\0\0" + block
    with pytest.raises(CompressionError):
        SnappyDecompressor().decompress(good[:10] + chunk)
    crc = masked_crc32c(b"x" * 10)
    chunk = (0x01 | 14 << 8).to_bytes(4, "little") + crc.to_bytes(4, "little") + b"x" * 10
    assert SnappyDecompressor().decompress(good[:10] + chunk) == b"x" * 10


def test_deflate_corrupt() -> None:
    with pytest.raises(CompressionError):
        DeflateDecompressor().decompress(b"\xff\xff\xff\xff garbage")


def test_compression_error_is_fatal_protocol_error() -> None:
    err = CompressionError("snappy: corrupt input")
    assert isinstance(err, ProtocolError) and err.fatal
    assert err.to_bytes() == b"E_INVALID snappy: corrupt input"


def test_codec_pair() -> None:
    assert codec_pair(False, False) is None
    pair = codec_pair(True, False)
    assert pair is not None and isinstance(pair[0], SnappyCompressor)
    pair = codec_pair(False, True, 9)
    assert pair is not None and isinstance(pair[1], DeflateDecompressor)
    with pytest.raises(ValueError):
        DeflateCompressor(0)
