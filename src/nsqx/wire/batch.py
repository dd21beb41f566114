"""StoredBatch: what one publish appended to a partition, as stored and as shipped."""

from __future__ import annotations

from typing import NamedTuple


class StoredBatch(NamedTuple):
    """One stored batch (what one PUB, MPUB or DPUB appended): its first sequence, how
    many records, the virtual offset of its first frame, its deliver-at time (0: now),
    the frames' common size (0 if they differ) and the frames, concatenated.
    Replication ships these, so that a follower stores the same bytes at the same
    offsets (nsqx.wire.replication)."""

    first: int
    messages: int
    offset: int
    deliver_at: int
    stride: int
    chunk: bytes
