"""The batch record: how one stored batch of message frames is laid out in a segment
file, and the checks that tell a whole record from a torn or corrupt one.

A batch is what one PUB, MPUB or DPUB appended, or the publishes staged together for
one commit (see :mod:`nsqx.store.staging`)::

    [u32 payload length][u32 crc32c][u64 first seq][u32 count][i64 deliver-at ns][u16 flags]
    [payload: the batch's message frames, exactly as nsqd sends them with attempts=1]

The crc covers everything after itself, so a torn or corrupt record is recognised and
never delivered. (CRC-32C: hardware accelerated, five times faster than zlib's CRC-32
here. The first data format's records carry zlib's CRC-32: read as well.)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Final

import google_crc32c

from nsqx.store.log import frame_starts
from nsqx.wire.frames import MESSAGE_FRAME_OVERHEAD

BATCH_HEAD: Final = struct.Struct(">IIQIqH")
BATCH_HEAD_SIZE: Final = BATCH_HEAD.size
#: the smallest frame (an empty body)
MIN_FRAME_SIZE: Final = MESSAGE_FRAME_OVERHEAD
#: a batch header announcing more is not believed (nsqd's --max-body-size is far less)
MAX_BATCH: Final = 1 << 31
#: a frame's publish timestamp (at wire.frames.TIMESTAMP_AT)
TS: Final = struct.Struct(">q")
_I32: Final = struct.Struct(">i")
_LEN_CRC: Final = struct.Struct(">II")
_CRC_VALUE: Final = google_crc32c.value
_CRC_EXTEND: Final = google_crc32c.extend
# (compiled: bound methods made once, C statics; ``_LEN_CRC.pack`` makes one per use)
_LEN_CRC_PACK: Final = _LEN_CRC.pack
#: a batch head after its length and crc (what the crc covers, with the chunk)
_HEAD_REST_PACK: Final = struct.Struct(">QIqH").pack
#: chunks up to this size get their crc from one call over head and chunk joined (a
#: copy of a small chunk costs less than a second call into google_crc32c)
_CRC_JOIN_MAX: Final = 4096


class CorruptRecord(Exception):
    """A record failed its checks (length or crc)."""


def batch_head(chunk: bytes, seq: int, count: int, deliver_at: int) -> bytes:
    """The header of a batch record holding the frames ``chunk``, with its crc."""
    rest = _HEAD_REST_PACK(seq, count, deliver_at, 0)
    if len(chunk) <= _CRC_JOIN_MAX:
        crc = _CRC_VALUE(rest + chunk)
    else:
        crc = _CRC_EXTEND(_CRC_VALUE(rest), chunk)
    return _LEN_CRC_PACK(len(chunk), crc) + rest


def iter_batches(buf: bytes, pos: int, limit: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """Walk batch headers in ``buf[pos:limit]``: (pos, payload_len, crc, seq, count,
    deliver_at). Stops at the first incomplete record (no checks: see
    :mod:`nsqx.store.recovery` and :mod:`nsqx.store.walk` for the reads that check)."""
    unpack = BATCH_HEAD.unpack_from
    while pos + BATCH_HEAD_SIZE <= limit:
        plen, crc, seq, count, deliver_at, _flags = unpack(buf, pos)
        if pos + BATCH_HEAD_SIZE + plen > limit:
            return
        yield pos, plen, crc, seq, count, deliver_at
        pos += BATCH_HEAD_SIZE + plen


def check_batch(buf: bytes, pos: int, plen: int, crc: int) -> None:
    """Raise CorruptRecord unless the crc of ``buf[pos+8 : pos+head+plen]`` is ``crc``:
    CRC-32C, or zlib's CRC-32 for a record of nsqx's first data format (main before
    cd52af0 wrote those; tests/fixtures/upgrade_crc32), looked at only on a mismatch."""
    data = bytes(buf[pos + 8 : pos + BATCH_HEAD_SIZE + plen])
    if google_crc32c.value(data) != crc and zlib.crc32(data) != crc:
        raise CorruptRecord(f"crc mismatch at {pos}")


def equal_frames(buf: bytes, p0: int, plen: int, count: int) -> int:
    """The frames' common size if the ``count`` frames of the payload at ``buf[p0:]``
    all have the first one's size prefix (checked with four strided slices, not a
    loop), else 0. Sizes that merely add up (10, 5, 15) are not equal."""
    size: int = 4 + _I32.unpack_from(buf, p0)[0]
    if size * count != plen:
        return 0
    end = p0 + plen
    prefix = buf[p0 : p0 + 4]
    if all(buf[p0 + k : end : size] == prefix[k : k + 1] * count for k in range(4)):
        return size
    return 0


def split_frames(payload: memoryview | bytes, count: int) -> list[bytes]:
    """Cut a batch payload into its ``count`` frames (checking their sizes add up)."""
    try:
        starts = frame_starts(payload, count)
    except ValueError as err:
        raise CorruptRecord(str(err)) from None
    return [bytes(payload[starts[k] : starts[k + 1]]) for k in range(count)]
