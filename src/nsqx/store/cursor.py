"""A channel's cursor checkpoint: where it is in its topic's log, and what is unfinished.

Every message below ``confirmed`` is finished; nothing at or above ``cursor`` has been
read; between them, the messages listed in ``pending`` are unfinished (in flight,
requeued or deferred: ``(seq, attempts, due_ns)``, due 0 meaning "now") and all others
are finished. The file is written whole, with a crc, by
:func:`~nsqx.store.durable_file.write_durable` (temporary file, fsync, rename, fsync of
the directory), so a reader sees the old or the new checkpoint, never a mix, even after
a power loss.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass, field

from nsqx.store.durable_file import write_durable

_MAGIC = b"NSQXCUR1"
_HEAD = struct.Struct(">8sQQQI")
_BIG_ENDIAN = struct.pack("=q", 1) == struct.pack(">q", 1)


@dataclass
class CursorState:
    confirmed: int
    cursor: int
    #: flat (seq, attempts, due_ns) triples
    pending: array[int] = field(default_factory=lambda: array("q"))

    def entries(self) -> list[tuple[int, int, int]]:
        p = self.pending
        return [(p[i], p[i + 1], p[i + 2]) for i in range(0, len(p), 3)]


def write_cursor(path: str, state: CursorState) -> None:
    """Replace the checkpoint at ``path``, atomically and durably (see durable_file)."""
    pending = array("q", state.pending)
    if not _BIG_ENDIAN:
        pending.byteswap()
    body = pending.tobytes()
    head = _HEAD.pack(
        _MAGIC, state.confirmed, state.cursor, len(state.pending) // 3, zlib.crc32(body)
    )
    write_durable(path, head + body)


def read_cursor(path: str) -> CursorState | None:
    """The checkpoint at ``path``; None if there is none. A damaged file raises ValueError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEAD.size:
        raise ValueError(f"{path}: truncated cursor file")
    magic, confirmed, cursor, n, crc = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if magic != _MAGIC or len(body) != n * 24 or zlib.crc32(body) != crc:
        raise ValueError(f"{path}: damaged cursor file")
    pending = array("q")
    pending.frombytes(body)
    if not _BIG_ENDIAN:
        pending.byteswap()
    return CursorState(confirmed, cursor, pending)
