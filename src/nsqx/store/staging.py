"""Staging: the publishes of one loop iteration, gathered for a DiskLog's group commit.

Consecutive staged batches with the same deliver-at time and kind of frame become one
batch record (:class:`StagedBatch`), written with the others by one ``writev``.
"""

from __future__ import annotations

import os
from array import array
from typing import Final

#: staged batches smaller than MERGE_CHUNK are merged into one record up to MERGE_MAX
#: bytes (small publishes: their per-record cost matters); bigger ones are records of
#: their own (merging would only copy them)
MERGE_CHUNK: Final = 16 * 1024
MERGE_MAX: Final = 64 * 1024
#: buffers per writev (the kernel's IOV_MAX is 1024)
_IOV_MAX: Final = 1024


def writev_all(fd: int, buffers: list[bytes]) -> int:
    """writev ``buffers`` (in IOV_MAX slices); the bytes written."""
    if len(buffers) <= _IOV_MAX:
        return os.writev(fd, buffers)
    written = 0
    for i in range(0, len(buffers), _IOV_MAX):
        part = buffers[i : i + _IOV_MAX]
        n = os.writev(fd, part)
        written += n
        if n != sum(map(len, part)):
            break
    return written


class StagedBatch:
    """Batches staged together that become one batch record: their chunks, ids and
    frame layout (a common stride, else each chunk's stride or start positions)."""

    __slots__ = (
        "chunks",
        "count",
        "deliver_at",
        "ids",
        "kind",
        "own",
        "parts",
        "size",
        "stride",
    )

    def __init__(
        self,
        chunk: bytes,
        ids: list[bytes] | None,
        stride: int,
        starts: array[int] | None,
        deliver_at: int,
        kind: int,
        count: int,
    ) -> None:
        self.chunks = [chunk]
        #: None: read from the frames when first needed (a replicated record)
        self.ids = ids
        self.count = count
        self.size = len(chunk)
        self.stride = stride
        #: (stride, starts, chunk length) per chunk, kept once the strides differ
        self.parts: list[tuple[int, array[int] | None, int]] | None = (
            None if stride else [(0, starts, len(chunk))]
        )
        self.deliver_at = deliver_at
        self.kind = kind
        #: a record of its own (a replicated record): nothing is merged into it
        self.own = False

    def add(self, chunk: bytes, ids: list[bytes], stride: int, starts: array[int] | None) -> None:
        chunks = self.chunks
        own = self.ids
        assert own is not None  # (a record without ids is one of its own: never added to)
        if len(chunks) == 1:
            self.ids = own + ids  # the first list may be the caller's
        else:
            own.extend(ids)
        self.count += len(ids)
        chunks.append(chunk)
        self.size += len(chunk)
        parts = self.parts
        if parts is not None:
            parts.append((stride, starts, len(chunk)))
        elif stride != self.stride:
            # frame sizes differ from here on: keep the layout of every chunk
            common = self.stride
            self.parts = [(common, None, len(c)) for c in chunks[:-1]]
            self.parts.append((stride, starts, len(chunk)))
            self.stride = 0

    def batch(self) -> tuple[bytes, list[bytes] | None, int, array[int] | None]:
        """(chunk, ids, stride, starts) of the whole record."""
        chunks = self.chunks
        parts = self.parts
        if len(chunks) == 1:
            return chunks[0], self.ids, self.stride, parts[0][1] if parts else None
        chunk = b"".join(chunks)
        if parts is None:
            return chunk, self.ids, self.stride, None
        starts = array("q")
        base = 0
        for stride, part_starts, length in parts:
            if part_starts is None:
                starts.extend(range(base, base + length, stride))
            else:
                starts.extend(x + base for x in part_starts[:-1])
            base += length
        starts.append(base)
        return chunk, self.ids, 0, starts
