"""Message ids: a u64 per topic partition, sent as 16 lowercase hex characters.

The partition sits in the high bits and the log sequence below, so an id leads back
to its record without any table: redelivery needs no per-message bookkeeping.

An id is never 0 (Youzan's clients read an answered id 0 as "no id"): a record's id is
``partition << 50 | (sequence + 1)``. Logs written before that rule keep their ids
(``partition << 50 | sequence``, and so the first message of partition 0 has id 0): each
partition has an *id base*, the first sequence whose id is sequence + 1 (0 for a log
made since; :data:`LEGACY_ID_BASE`, never reached, for one that holds records of the old
rule). See docs/storage.md.
"""

from __future__ import annotations

from typing import Final

PARTITION_SHIFT: Final = 50
SEQ_MASK: Final = (1 << PARTITION_SHIFT) - 1
#: the id base of a log whose ids are its sequences (written before ids started at 1)
LEGACY_ID_BASE: Final = 1 << PARTITION_SHIFT


# The low 16 bits as hex, precomputed: a batch of ids is then one prefix joined to
# table entries, about 3x faster than formatting each id (this is on the publish path).
_LOW16: Final = [b"%04x" % i for i in range(1 << 16)]


class _Prefix:
    """The last id prefix (all but the low 16 bits) formatted: consecutive single
    publishes share it, and formatting costs more than the rest of making an id. One
    tuple, replaced whole, so that two threads can never pair one's bits with the
    other's text."""

    def __init__(self) -> None:
        self.last: tuple[int, bytes] = (-1, b"")


_LAST_PREFIX: Final = _Prefix()


def make_ids(first_seq: int, count: int, partition: int = 0, id_base: int = 0) -> list[bytes]:
    """Hex ids for ``count`` consecutive records starting at ``first_seq``, of a log
    whose id base is ``id_base`` (a batch never straddles it: a log's base only moves
    where it has no records)."""
    n = (partition << PARTITION_SHIFT) + first_seq
    if first_seq >= id_base:
        n += 1
    if count == 1:  # a PUB
        high = n >> 16
        last = _LAST_PREFIX.last
        if last[0] != high:
            last = _LAST_PREFIX.last = (high, b"%012x" % high)
        return [last[1] + _LOW16[n & 0xFFFF]]
    ids: list[bytes] = []
    end = n + count
    while n < end:
        prefix = b"%012x" % (n >> 16)
        lo = n & 0xFFFF
        hi = min(lo + end - n, 1 << 16)
        ids.extend([prefix + t for t in _LOW16[lo:hi]])
        n += hi - lo
    return ids


def id_of(seq: int, partition: int = 0, id_base: int = 0) -> int:
    """The id (a u64) of the record at ``seq``, as :func:`make_ids` makes it."""
    return (partition << PARTITION_SHIFT) | (seq + 1 if seq >= id_base else seq)


def seq_of(msg_id: bytes, id_base: int = 0) -> int:
    """The log sequence of a message id made by :func:`make_ids` with ``id_base``."""
    n = int(msg_id, 16) & SEQ_MASK
    return n - 1 if n > id_base else n
