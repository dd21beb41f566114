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

import mmap
import re
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


#: the sequence field's place in a batch header
_SEQ_AT: Final = 8
_ZERO_LEN: Final = b"\0\0\0\0"
_NONZERO: Final = re.compile(rb"[^\0]")


def max_records(nbytes: int) -> int:
    """The most records ``nbytes`` of segment can hold (every frame is at least
    MIN_FRAME_SIZE bytes): what damaged bytes may have held."""
    return max(-(-nbytes // MIN_FRAME_SIZE), 0)


def whole_record_at(
    buf: bytes | mmap.mmap, pos: int, end: int, lo: int, hi: int, tiles: bool = True
) -> tuple[int, int, int]:
    """The record at ``buf[pos:]`` if it is whole and sound: it ends by ``end``, its first
    sequence is in ``lo .. hi``, its crc checks and (``tiles``) its frames tile its
    payload. Returns (payload length, first sequence, count), or (0, 0, 0) if it is not
    one."""
    if pos + BATCH_HEAD_SIZE > end:
        return 0, 0, 0
    plen, crc, first, count, _deliver_at, _flags = BATCH_HEAD.unpack_from(buf, pos)
    if not lo <= first <= hi or count <= 0 or count * MIN_FRAME_SIZE > plen:
        return 0, 0, 0
    stop = pos + BATCH_HEAD_SIZE + plen
    if stop > end:
        return 0, 0, 0
    covered = bytes(buf[pos + 8 : stop])  # (a mapped file's slice is a copy anyway)
    if not crc_matches(covered, crc):
        return 0, 0, 0
    if tiles:
        try:
            frame_starts(memoryview(covered)[BATCH_HEAD_SIZE - 8 :], count)
        except ValueError:
            return 0, 0, 0
    return plen, first, count


def find_record(
    buf: bytes | mmap.mmap,
    damage: int,
    start: int,
    end: int,
    expect: int,
    last: int = -1,
    hint: int = -1,
) -> int:
    """The file position of the first whole, sound record at or after ``start`` (and
    ending by ``end``) in ``buf`` (a whole segment file, mapped) that can follow damage
    at ``damage`` where sequence ``expect`` was due: its first sequence is at least
    ``expect`` and at most ``expect`` plus what the damaged bytes before it may have held
    (and at most ``last``, unless -1), so a record found never reuses a sequence, and a
    stray copy of a record inside a message body is not taken for one unless it also
    has the sequences due here, a crc that checks and frames that tile it. ``hint``,
    where the damaged record's length says the next one is, is tried first. -1 if
    there is none.

    Candidates are found by the sequence's high bytes, which every sequence that can
    follow shares, and zeroed stretches (what a power loss may leave) are passed in one
    regex step: a scan costs C-speed searches, not a Python step per byte."""
    hi_all = expect + max_records(end - damage)
    if last >= 0:
        hi_all = min(hi_all, last)
    if hi_all < expect:
        return -1
    if start <= hint and whole_record_at(buf, hint, end, expect, hi_all)[2]:
        return hint
    lo_b = expect.to_bytes(8, "big")
    hi_b = hi_all.to_bytes(8, "big")
    k = 0
    while k < 8 and lo_b[k] == hi_b[k]:
        k += 1
    prefix = lo_b[:k]
    final = end - BATCH_HEAD_SIZE  # the last position a header fits at
    pos = start
    while pos <= final:
        if k:
            at = buf.find(prefix, pos + _SEQ_AT, final + _SEQ_AT + k)
            if at < 0:
                return -1
            pos = at - _SEQ_AT
        if buf[pos : pos + 4] == _ZERO_LEN:
            # a zero length is no record: on to where the next non-zero byte could be a
            # length's last byte
            m = _NONZERO.search(buf, pos, final + 4)
            if m is None:
                return -1
            pos = m.start() - 3
            continue
        hi = min(expect + max_records(pos - damage), hi_all)
        if whole_record_at(buf, pos, end, expect, hi)[2]:
            return pos
        pos += 1
    return -1


def crc_matches(data: bytes, crc: int) -> bool:
    """Whether ``crc`` is the crc of ``data`` (what a record's crc covers): CRC-32C, or
    zlib's CRC-32 for a record of nsqx's first data format (main before cd52af0 wrote
    those; tests/fixtures/upgrade_crc32), looked at only on a mismatch."""
    return google_crc32c.value(data) == crc or zlib.crc32(data) == crc


def check_batch(buf: bytes | mmap.mmap, pos: int, plen: int, crc: int) -> None:
    """Raise CorruptRecord unless ``crc`` is the crc of ``buf[pos+8 : pos+head+plen]``
    (see :func:`crc_matches`)."""
    if not crc_matches(bytes(buf[pos + 8 : pos + BATCH_HEAD_SIZE + plen]), crc):
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
