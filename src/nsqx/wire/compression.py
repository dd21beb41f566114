"""Stream codecs for the compression a connection negotiates in IDENTIFY: snappy and deflate.

Sans-IO: each side of a connection owns one compressor and one decompressor; bytes in,
bytes out, any chunk boundaries. ``compress(data)`` returns bytes the peer can decode at
once (nsqd flushes its compressor on every flush of its buffered writer; so do we, per
call). ``decompress(data, max_length)`` returns what ``data`` completes, at most about
``max_length`` bytes at a time; the rest stays inside until ``decompress(b"")`` is called
again while :attr:`pending` is true. Corrupt input raises :class:`CompressionError`, a
fatal :class:`ProtocolError`: the connection cannot be resynchronised and is closed.

* snappy: the framing format of github.com/google/snappy (``framing_format.txt``), as
  written by Go's snappy.Writer: a stream identifier chunk first, then chunks of at most
  64 KiB of input, each with the masked CRC-32C of its uncompressed data; a chunk that
  does not shrink by 1/8 is sent uncompressed. Blocks are (de)compressed by cramjam, the
  checksums by google-crc32c.
* deflate: a raw DEFLATE stream (RFC 1951, no zlib header) as Go's compress/flate writes
  it; every ``compress`` ends with a sync flush (an empty stored block).
"""

from __future__ import annotations

import struct
import zlib
from typing import Protocol

import cramjam
import google_crc32c

from nsqx.wire.errors import E_INVALID, ProtocolError

__all__ = [
    "CompressionError",
    "Compressor",
    "Decompressor",
    "DeflateCompressor",
    "DeflateDecompressor",
    "SnappyCompressor",
    "SnappyDecompressor",
    "codec_pair",
]


class CompressionError(ProtocolError):
    """The peer's compressed stream is corrupt (always fatal)."""

    def __init__(self, description: str) -> None:
        super().__init__(E_INVALID, description)


class Compressor(Protocol):
    """One direction of a compressed connection, sending side."""

    def compress(self, data: bytes) -> bytes: ...


class Decompressor(Protocol):
    """One direction of a compressed connection, receiving side."""

    @property
    def pending(self) -> bool: ...

    @property
    def eof(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int = 0) -> bytes: ...


# --- snappy framing ---------------------------------------------------------------------

#: Most input bytes in one chunk (the format's limit).
SNAPPY_MAX_BLOCK = 65536
_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_ID = 0xFF
# A compressed block of 64 KiB can take 32 + n + n/6 bytes (snappy's MaxEncodedLen).
_MAX_COMPRESSED_CHUNK = 4 + 32 + SNAPPY_MAX_BLOCK + SNAPPY_MAX_BLOCK // 6
_MAX_UNCOMPRESSED_CHUNK = 4 + SNAPPY_MAX_BLOCK
_LIMITS = {_CHUNK_COMPRESSED: _MAX_COMPRESSED_CHUNK, _CHUNK_UNCOMPRESSED: _MAX_UNCOMPRESSED_CHUNK}
_U32LE = struct.Struct("<I")
_compress_raw = cramjam.snappy.compress_raw
_decompress_raw = cramjam.snappy.decompress_raw
_decompress_raw_len = cramjam.snappy.decompress_raw_len
_crc32c = google_crc32c.value


def masked_crc32c(data: bytes) -> int:
    """The checksum a snappy chunk carries: CRC-32C, rotated right 15 and offset."""
    crc = int(_crc32c(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class SnappyCompressor:
    """Snappy framed-stream writer: the stream identifier once, then data chunks."""

    def __init__(self) -> None:
        self._started = False

    def compress(self, data: bytes) -> bytes:
        """Frame ``data`` as complete chunks (nothing is held back)."""
        if not data:
            return b""
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(_STREAM_ID)
        n = len(data)
        view = memoryview(data)
        for pos in range(0, n, SNAPPY_MAX_BLOCK):
            block = bytes(view[pos : pos + SNAPPY_MAX_BLOCK]) if n > SNAPPY_MAX_BLOCK else data
            size = len(block)
            crc = masked_crc32c(block)
            packed = bytes(_compress_raw(block))
            # as Go's writer: keep the compressed form only if it saves at least 1/8
            if len(packed) < size - size // 8:
                header = _CHUNK_COMPRESSED | (len(packed) + 4) << 8
                out.append(_U32LE.pack(header) + _U32LE.pack(crc))
                out.append(packed)
            else:
                header = _CHUNK_UNCOMPRESSED | (size + 4) << 8
                out.append(_U32LE.pack(header) + _U32LE.pack(crc))
                out.append(block)
        return b"".join(out)


class SnappyDecompressor:
    """Snappy framed-stream reader for input split anywhere.

    Checks what Go's snappy.Reader checks: the stream identifier comes first, chunk
    lengths are within the format's limits, reserved unskippable chunk types are
    refused, decoded blocks are at most 64 KiB and match their CRC-32C.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._started = False
        # bytes of a skippable chunk still to drop (such chunks may be up to 16 MiB)
        self._skip = 0

    @property
    def eof(self) -> bool:
        """Always False: a snappy stream has no end marker."""
        return False

    @property
    def pending(self) -> bool:
        """True when complete chunks are still buffered (after a ``max_length`` stop)."""
        buf = self._buf
        if len(buf) < 4:
            return False
        length: int = _U32LE.unpack_from(buf, 0)[0] >> 8
        return len(buf) >= 4 + length

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        """Decode every complete chunk (or, with ``max_length``, chunks until at least
        that many bytes are out); a partial chunk waits for more input."""
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return b""
            data = data[self._skip :]
            self._skip = 0
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        produced = 0
        pos = 0
        n = len(buf)
        unpack = _U32LE.unpack_from
        while n - pos >= 4:
            header = unpack(buf, pos)[0]
            kind = header & 0xFF
            length = header >> 8
            if not self._started and kind != _CHUNK_STREAM_ID:
                raise CompressionError("snappy: corrupt input (no stream identifier)")
            if kind in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                limit = _LIMITS[kind]
                if length < 4 or length > limit:
                    raise CompressionError(f"snappy: corrupt input (chunk length {length})")
                end = pos + 4 + length
                if end > n:
                    break
                body = buf[pos + 8 : end]
                if kind == _CHUNK_COMPRESSED:
                    body = _decode_block(body)
                elif len(body) > SNAPPY_MAX_BLOCK:  # pragma: no cover - bounded by limit
                    raise CompressionError("snappy: corrupt input (chunk too long)")
                if masked_crc32c(body) != unpack(buf, pos + 4)[0]:
                    raise CompressionError("snappy: corrupt input (checksum mismatch)")
                out.append(body)
                produced += len(body)
                pos = end
                if max_length and produced >= max_length:
                    break
            elif kind == _CHUNK_STREAM_ID:
                if length != 6:
                    raise CompressionError("snappy: corrupt input (bad stream identifier)")
                end = pos + 10
                if end > n:
                    break
                if buf[pos:end] != _STREAM_ID:
                    raise CompressionError("snappy: corrupt input (bad stream identifier)")
                self._started = True
                pos = end
            elif kind >= 0x80:
                # padding (0xfe) and reserved skippable chunks (0x80-0xfd)
                end = pos + 4 + length
                if end > n:
                    self._skip = end - n
                    pos = n
                    break
                pos = end
            else:
                raise CompressionError(f"snappy: corrupt input (unsupported chunk type {kind})")
        self._buf = buf[pos:] if pos < n else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)


def _decode_block(block: bytes) -> bytes:
    try:
        if _decompress_raw_len(block) > SNAPPY_MAX_BLOCK:
            raise CompressionError("snappy: corrupt input (block too long)")
        return bytes(_decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"snappy: corrupt input ({exc})") from None


# --- deflate ----------------------------------------------------------------------------


class DeflateCompressor:
    """Raw DEFLATE writer (window 2^15, no header) with a sync flush per call."""

    def __init__(self, level: int = 6) -> None:
        if not 1 <= level <= 9:
            raise ValueError(f"deflate level {level} is not in 1-9")
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)

    def compress(self, data: bytes) -> bytes:
        """Compress ``data`` and flush, so the peer can decode all of it now."""
        if not data:
            return b""
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecompressor:
    """Raw DEFLATE reader for input split anywhere."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(-15)
        self._limited = False

    @property
    def eof(self) -> bool:
        """True once the peer ended its stream with a final block: Go's reader then
        reports EOF, and nsqd hangs up after the commands that came before it."""
        return self._z.eof

    @property
    def pending(self) -> bool:
        """True when input is held back by ``max_length`` (more comes out without new
        input). zlib may also keep a few bytes it cannot use until more input arrives:
        those wait for the next call, and are not pending; nor is anything after the end
        of the stream (found by fuzzing: a loop on them made no progress, for ever)."""
        return self._limited and bool(self._z.unconsumed_tail) and not self._z.eof

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        """Inflate what ``data`` completes (at most ``max_length`` bytes when given)."""
        z = self._z
        if z.eof:
            # bytes held back behind the end are never read (Go's reader stops at EOF)
            self._limited = False
            if data:
                raise CompressionError("flate: data after the end of the stream")
            return b""
        if z.unconsumed_tail:
            data = z.unconsumed_tail + data
        try:
            out = z.decompress(data, max_length)
        except zlib.error as exc:
            raise CompressionError(f"flate: corrupt input ({exc})") from None
        self._limited = 0 < max_length <= len(out)
        return out


def codec_pair(
    snappy: bool, deflate: bool, deflate_level: int = 6
) -> tuple[Compressor, Decompressor] | None:
    """The compressor and decompressor of a connection that negotiated compression."""
    if snappy:
        return SnappyCompressor(), SnappyDecompressor()
    if deflate:
        return DeflateCompressor(deflate_level), DeflateDecompressor()
    return None
