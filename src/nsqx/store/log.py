"""The interface between nsqd's delivery and a topic partition's storage."""

from __future__ import annotations

import struct
from typing import Protocol

_I32 = struct.Struct(">i")


def split_chunks(chunks: list[bytes]) -> list[bytes]:
    """One frame per element, from chunks of consecutive frames (see MessageLog.read)."""
    out: list[bytes] = []
    unpack = _I32.unpack_from
    for chunk in chunks:
        pos = 0
        n = len(chunk)
        if n and 4 + unpack(chunk, 0)[0] == n:
            out.append(chunk)
            continue
        while pos < n:
            end = pos + 4 + unpack(chunk, pos)[0]
            out.append(chunk[pos:end])
            pos = end
    return out


class MessageLog(Protocol):
    """An append-only sequence of message records addressed by sequence number.

    A record is kept as the message frame nsqd sends for a first delivery (attempts=1),
    plus its 16-byte hex id; both are built once at publish time and shared by every
    channel. Sequence numbers only grow; ``start`` moves up as old records are trimmed.
    """

    @property
    def start(self) -> int:
        """Sequence of the oldest retained record."""
        ...

    @property
    def end(self) -> int:
        """Sequence the next appended record gets."""
        ...

    def append(self, frames: list[bytes], ids: list[bytes], deliver_at_ns: int = 0) -> int:
        """Append records; returns the first one's sequence. ``deliver_at_ns`` (wall
        clock) marks them deferred until then (DPUB)."""
        ...

    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq`` (clamped to ``start``): their frames, as
        chunks that may each hold several consecutive frames (so a read from disk can
        hand a whole batch over as one buffer), and one id per record."""
        ...

    def get(self, seq: int) -> bytes | None:
        """One record's frame, or None if trimmed."""
        ...

    def deferred_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(seq, deliver_at_ns) of deferred records with lo <= seq < hi, in order."""
        ...

    def trim(self, before: int) -> None:
        """Forget records below ``before`` (every channel is done with them)."""
        ...
