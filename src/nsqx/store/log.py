"""MessageLog: the one interface between nsqd and a topic partition's storage.

nsqd holds a partition's log as a :class:`MessageLog` and never asks which kind it is:
every operation a caller needs (stage, commit, read, seek, reclaim, sync, close,
destroy ...) is a method here, which :class:`~nsqx.store.memlog.MemoryLog` (``#ephemeral``
topics) implements with a no-op where memory has nothing to do, as Go's nsqd has a
do-nothing backend for ephemeral topics, and :class:`~nsqx.store.disklog.DiskLog`
implements with files. Also here: splitting chunks of frames, and what a range read
returns (:class:`RangeFramesOut`).
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from nsqx.wire.batch import StoredBatch

_I32: Final = struct.Struct(">i")


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


def frame_starts(chunk: bytes | memoryview, count: int) -> array[int]:
    """Start positions of the ``count`` frames in ``chunk``, plus its length. Raises
    ValueError unless the frames' size prefixes tile the chunk exactly."""
    starts = array("q", [0]) * (count + 1)
    unpack = _I32.unpack_from
    total = len(chunk)
    pos = 0
    for k in range(count):
        starts[k] = pos
        if pos + 4 > total:
            raise ValueError("chunk shorter than its frames")
        end = pos + 4 + unpack(chunk, pos)[0]
        if not pos + 4 <= end <= total:
            raise ValueError("frame runs past its chunk")
        pos = end
    if pos != total:
        raise ValueError("chunk length does not match its frames")
    starts[count] = pos
    return starts


def split_chunk(chunk: bytes, count: int, stride: int = 0) -> list[bytes]:
    """The ``count`` frames of ``chunk`` (``stride`` bytes each, or 0 if they differ)."""
    if stride:
        if stride * count != len(chunk):
            raise ValueError("chunk length does not match its frames")
        return [chunk[o : o + stride] for o in range(0, len(chunk), stride)]
    starts = frame_starts(chunk, count)
    return [chunk[starts[k] : starts[k + 1]] for k in range(count)]


class RangeFramesOut:
    """What a range read found (see MessageLog.read_frames): runs of frames from one
    stored batch each (length, timestamp, virtual offset of the first), every frame's
    size, and the frames themselves as chunks of consecutive frames."""

    __slots__ = (
        "chunks",
        "count",
        "first",
        "run_lengths",
        "run_offsets",
        "run_timestamps",
        "sizes",
    )

    def __init__(self, first: int) -> None:
        #: the sequence of the first record (records are consecutive from it)
        self.first = first
        self.run_lengths: array[int] = array("i")
        self.run_timestamps: array[int] = array("q")
        self.run_offsets: array[int] = array("q")
        self.sizes: array[int] = array("i")
        self.chunks: list[bytes] = []
        self.count = 0

    def add_run(self, chunk: bytes, n: int, size: int, offset: int, ts: int) -> None:
        """``n`` frames of ``size`` bytes each."""
        self.run_lengths.append(n)
        self.run_timestamps.append(ts)
        self.run_offsets.append(offset)
        self.sizes += array("i", [size]) * n
        self.chunks.append(chunk)
        self.count += n


@dataclass(frozen=True)
class SetAside:
    """Damaged bytes of a log, set aside by the corruption policy (docs/reliability.md):
    the sequences they held, or may have held, and where they were and are kept."""

    #: the segment file they were in
    segment: str
    #: their file position in it
    pos: int
    nbytes: int
    #: the first sequence they held (or may have held)
    first: int
    #: the sequence after them: the next record's (a hole), or past as many records as
    #: they may have held (the end of a file)
    end: int
    #: the file that keeps a copy of them ("" if none could be made)
    kept_in: str
    #: "hole": records follow them, which are served (the bytes stay in the file);
    #: "tail": they ended their segment (cut off it); "file": a whole segment file;
    #: "header": a segment's header, rewritten from its name and its neighbours (no
    #: record lost)
    kind: str


class MessageLog(ABC):
    """An append-only sequence of message records addressed by sequence number.

    A record is kept as the message frame nsqd sends for a first delivery (attempts=1),
    plus its 16-byte hex id; both are built once at publish time, a batch's frames as
    one bytes object, and shared by every channel. Sequence numbers only grow; ``start``
    moves up as old records are trimmed.

    (An abstract class rather than a Protocol: compiled with mypyc, a call through it
    is a native method call, as fast as one on the concrete class.)
    """

    def __init__(self) -> None:
        #: records appended since the last fsync (what --sync-every counts)
        self.unsynced = 0
        #: when the last fsync ended (time.monotonic)
        self.last_sync = 0.0
        #: records appended while the last fsync ran (how far fsyncs run behind)
        self.sync_lag = 0
        #: the first failed fsync, kept: after one, the kernel may have dropped the dirty
        #: pages and a later fsync would succeed without them, so no sync succeeds again
        self.sync_error: OSError | None = None
        #: damage set aside since the log was opened (at its opening, then while
        #: reading), oldest first: what a caller logs, or acts on (a replica cuts its log
        #: at a hole, so that its leader ships the records again)
        self.set_aside: list[SetAside] = []

    @property
    @abstractmethod
    def durable(self) -> bool:
        """Whether the records survive a restart (a DiskLog) or live in memory only."""

    @property
    @abstractmethod
    def start(self) -> int:
        """Sequence of the oldest retained record."""

    @property
    @abstractmethod
    def end(self) -> int:
        """Sequence the next appended record gets."""

    @abstractmethod
    def append(
        self, chunk: bytes, ids: list[bytes], deliver_at_ns: int = 0, stride: int = 0
    ) -> int:
        """Append a batch of records, given as their frames concatenated (``chunk``,
        see wire.frames.encode_message_batch) and one id each; ``stride`` is the frames'
        common size, or 0 if they differ. Returns the first one's sequence.
        ``deliver_at_ns`` (wall clock) marks them deferred until then (DPUB)."""

    @property
    @abstractmethod
    def next_seq(self) -> int:
        """Sequence the next staged batch gets (``end`` plus what waits for commit)."""

    @property
    @abstractmethod
    def staged(self) -> bool:
        """Whether staged batches wait for :meth:`commit` (a MemoryLog appends at once)."""

    @abstractmethod
    def stage(
        self,
        chunk: bytes,
        ids: list[bytes] | None,
        deliver_at_ns: int = 0,
        stride: int = 0,
        kind: int = 0,
        merge: bool = True,
        count: int = 0,
    ) -> int:
        """Like :meth:`append`, but a DiskLog only stages the batch for the next
        :meth:`commit`, which writes everything staged at once (a group commit; readers
        see staged records once committed). Batches of different ``kind`` (vanilla or
        extended frames) never share a stored batch; ``merge=False`` keeps it a record
        of its own. ``ids`` None (with ``merge=False``): ``count`` frames whose ids are
        read from the frames themselves when needed (a follower's records). Returns the
        virtual offset of the batch's first frame."""

    @abstractmethod
    def commit(self) -> int:
        """Write the staged batches (OSError: none of them is kept); how many records."""

    @abstractmethod
    def drop_staged(self) -> None:
        """Forget the staged batches, unwritten."""

    @abstractmethod
    def read(self, seq: int, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Up to ``limit`` records from ``seq`` (clamped to ``start``): their frames, as
        chunks that may each hold several consecutive frames (so a read from disk can
        hand a whole batch over as one buffer), and one id per record. A chunk never
        spans two stored batches, so its frames are all of one kind (vanilla or
        extended records, see nsqx.wire.frames)."""

    @abstractmethod
    def read_frames(
        self, seq: int, max_messages: int, max_bytes: int = 1 << 62, end: int | None = None
    ) -> RangeFramesOut:
        """A stateless read for range consumers (Spark): up to ``max_messages`` records
        from ``seq`` (below ``end``), stopping once ``max_bytes`` of frames are taken (so
        at least one record if there is one); touches no channel. The records are
        consecutive from the result's ``first``, which is past ``seq`` if the records
        there are gone."""

    @abstractmethod
    def resume_at(self, seq: int) -> int:
        """The first sequence at or after ``seq`` (and ``start``) that has a record, or
        ``end``: where a reader goes on when :meth:`read` returns nothing at ``seq``
        (sequences a DiskLog skipped after damage have no record)."""

    def missing_between(self, lo: int, hi: int) -> int:
        """How many sequences in ``lo .. hi-1`` have no record (skipped after damage, or
        past a crash's sequence lease): what a depth must not count. None here."""
        return 0

    @property
    @abstractmethod
    def end_offset(self) -> int:
        """Virtual offset just past the last record."""

    @property
    @abstractmethod
    def next_offset(self) -> int:
        """The virtual offset the next append's first record will have."""

    @abstractmethod
    def offset_of(self, seq: int) -> int | None:
        """The virtual offset of the record at ``seq`` (its frame's position in the
        partition's life), or None if it is gone."""

    @abstractmethod
    def seek_offset(self, offset: int) -> int:
        """The sequence of the first retained record at or after virtual ``offset``."""

    @abstractmethod
    def seek_time(self, timestamp_ns: int) -> int:
        """The sequence of the first retained record published at or after then."""

    @abstractmethod
    def get(self, seq: int) -> bytes | None:
        """One record's frame, or None if trimmed."""

    @abstractmethod
    def first_id(self) -> tuple[int, bytes] | None:
        """The sequence and hex id of the oldest record as it was stored (nsqd reads its
        id rule from it, see nsqx.nsqd.guid), or None: no record, or none kept across a
        restart (a MemoryLog)."""

    @abstractmethod
    def deferred_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(seq, deliver_at_ns) of deferred records with lo <= seq < hi, in order."""

    @abstractmethod
    def trim(self, before: int) -> None:
        """Forget records below ``before`` (every channel is done with them)."""

    @abstractmethod
    def release(self, before: int) -> None:
        """Free the memory of records below ``before`` that every reader is done with
        (a MemoryLog's records; a DiskLog's memory is bounded by its cache instead)."""

    @abstractmethod
    def drop_before(self, seq: int) -> None:
        """Forget every record below ``seq`` now (a topic emptied)."""

    @property
    @abstractmethod
    def reclaim_floor(self) -> int | None:
        """The sequence every reader must have passed for :meth:`reclaim` to free
        something (None: there is nothing to reclaim)."""

    @abstractmethod
    def reclaim(
        self,
        before: int,
        retention: float = 0.0,
        remove: Callable[[str], None] | None = None,
    ) -> int:
        """Delete what is below ``before`` and idle for ``retention`` seconds; the bytes
        freed. Files are unlinked with ``remove`` (default: at once)."""

    @property
    @abstractmethod
    def sync_pending(self) -> bool:
        """Whether a roll left segments or directory entries to fsync (never, in memory)."""

    @abstractmethod
    def sync(self) -> None:
        """Make everything appended so far survive a power loss (fsync; nothing to do in
        memory). Safe to call from a thread. An OSError is raised and kept in
        ``sync_error``: every later sync raises it too."""

    @abstractmethod
    def close(self, *, sync: bool = True) -> None:
        """Shut down (fsync first unless ``sync`` is false)."""

    @abstractmethod
    def destroy(self) -> None:
        """Close and delete everything (the topic was deleted)."""

    @abstractmethod
    def batch_start(self, seq: int) -> int | None:
        """The first sequence of the stored batch that holds ``seq`` (None if no record
        holds it: gone, in a gap, or past the end)."""

    @abstractmethod
    def read_batches(self, seq: int, max_bytes: int) -> list[StoredBatch]:
        """Whole stored batches from ``seq`` (where a batch starts; ValueError if not,
        or if it is gone) until ``max_bytes`` of frames are taken (at least one)."""

    @abstractmethod
    def truncate(self, seq: int) -> int:
        """Forget every record at or after ``seq`` (cut at the batch that holds it);
        returns the new end."""

    @abstractmethod
    def reset(self, seq: int, offset: int) -> None:
        """Forget every record and start over empty: the next record gets sequence
        ``seq`` and its frame virtual offset ``offset``."""


def records(log: MessageLog, seq: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(sequence, frame) of each record of ``log`` from ``seq`` below ``end``, one at a
    time (for looking, not delivering: each is a ``get``), going past sequences that
    have none (trimmed meanwhile, or a gap after damage)."""
    seq = max(seq, log.start)
    while seq < end:
        frame = log.get(seq)
        if frame is None:
            nxt = log.resume_at(seq)
            if nxt <= seq:
                return
            seq = nxt
            continue
        yield seq, frame
        seq += 1
