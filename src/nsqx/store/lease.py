"""SequenceLease: how far a single node's log may have given out sequences and offsets.

A record's sequence (so its message id) and virtual offset are seen before they are on
stable storage: a publisher gets its answer once the record is written, a consumer gets
it from memory, and both happen before an fsync. A power loss then takes the record
with it, and nothing in the files says it existed: a restart would give its sequence to
another message. So the log leases sequences ahead of use: before any record past the
lease is written, a larger lease is on disk; a restart starts past the lease on disk
(a clean close shrinks it to the log's end, so only a crash leaves a gap).

The lease file (``sequences.lease`` beside the segments) holds two 32-byte slots,
written in turn with ``pwrite`` and ``fdatasync``, each with a crc and a generation: a
write torn by a power loss spoils at most the slot being written, and the other one
holds the lease before it. One write serves LEASE_SEQUENCES sequences and LEASE_BYTES
of offsets; the log renews it from its sync, in a thread, long before it runs out.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Final

import google_crc32c

from nsqx.store.durable_file import fsync_dir

LEASE_FILE: Final = "sequences.lease"
#: sequences one lease covers past the log's end (the most a crash can skip)
LEASE_SEQUENCES: Final = 1 << 16
#: virtual offsets one lease covers past the log's end
LEASE_BYTES: Final = 1 << 28
_MAGIC: Final = b"NSQL"
#: magic, crc32c of the rest, generation, sequence, offset
_SLOT: Final = struct.Struct(">4sIQQQ")
_REST: Final = struct.Struct(">QQQ")


class SequenceLease:
    """The lease of one log's directory: ``seq`` and ``offset``, below which sequences
    and virtual offsets may have been given out (0, 0 if there is no lease file)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LEASE_FILE)
        self.seq = 0
        self.offset = 0
        self._generation = 0
        self._fd = -1
        self._lock = threading.Lock()
        try:
            with open(self.path, "rb") as f:
                data = f.read(2 * _SLOT.size)
        except FileNotFoundError:
            return
        for i in range(len(data) // _SLOT.size):
            magic, crc, gen, seq, offset = _SLOT.unpack_from(data, i * _SLOT.size)
            whole = magic == _MAGIC and crc == google_crc32c.value(_REST.pack(gen, seq, offset))
            if whole and gen >= self._generation:
                self._generation, self.seq, self.offset = gen, seq, offset

    def needs(self, seq: int, offset: int) -> bool:
        """Whether giving out sequences below ``seq`` and offsets below ``offset`` needs
        a larger lease first."""
        return seq > self.seq or offset > self.offset

    def set(self, seq: int, offset: int) -> None:
        """Write the lease (durably on return): sequences from ``seq`` and offsets from
        ``offset`` on were never given out. Safe to call from a thread."""
        with self._lock:
            gen = self._generation + 1
            rest = _REST.pack(gen, seq, offset)
            slot = _SLOT.pack(_MAGIC, google_crc32c.value(rest), gen, seq, offset)
            created = False
            if self._fd < 0:
                created = not os.path.exists(self.path)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(self._fd, slot, (gen % 2) * _SLOT.size)
            os.fdatasync(self._fd)
            if created:  # its directory entry, once
                fsync_dir(os.path.dirname(self.path) or ".")
            self._generation, self.seq, self.offset = gen, seq, offset

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
