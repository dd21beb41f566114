"""The interface between nsqd's delivery and a topic partition's storage."""

from __future__ import annotations

from typing import Protocol


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
        """Frames and ids of up to ``limit`` records from ``seq`` (clamped to ``start``)."""
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
