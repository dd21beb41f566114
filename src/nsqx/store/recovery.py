"""Recovery: opening a DiskLog's segment files after a stop, clean or not.

The corruption policy (docs/reliability.md) is applied here, at start, and by the walk
(:mod:`nsqx.store.walk`) while reading, nowhere else: no sequence (so no message id)
and no virtual offset is ever given twice, no damaged byte is ever delivered, and
damage costs the records it hit, not the ones around it.

- A record that fails its checks (its crc, its sequence, its length) in the middle of
  a segment is a *hole*: the bytes from it to the next sound record (found by its
  length, else by a scan for a header whose sequence fits and whose crc checks) stay
  in the file, copied to ``<segment>.<pos>.bad``, and every walk passes over them;
  their sequences are never served nor given again, the records after them are.
- Damage with no sound record after it (a torn tail, a power loss's zeros) ends the
  segment: the bytes from there are moved to ``<segment>.<pos>.bad`` and the file is
  truncated. Every whole record before is served.
- A segment header that is damaged is rewritten from the file's name (its first
  sequence) and its neighbours (its first virtual offset: the previous segment's end,
  or the next one's start); the old bytes are kept in ``<segment>.0.bad``.
- A file too short for a header, or a segment that overlaps the one before, is set
  aside whole (renamed ``*.bad``).
- Sequences that bytes set aside at the log's end may have held (a power loss tears
  the newest segment) are skipped on a single node: appends go on in a new segment
  that starts past them (and past their virtual offsets), so that no id a consumer may
  have seen is given again. A replica opens with ``skip_lost=False`` instead: its log
  ends at its last whole record, so that its leader can ship what follows (a replica
  never invents a gap its leader cannot ship past).

Every stretch set aside is logged (which sequences were lost) and reported in
``MessageLog.set_aside``. Sequences without a record form a gap: a read returns
nothing there and ``resume_at()`` names the next sequence that has one.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from typing import Final

from nsqx.store.deferred import DeferredIndex
from nsqx.store.durable_file import fsync_dir
from nsqx.store.fsutil import file_size, free_name, keep_bad_bytes, remove_file
from nsqx.store.log import SetAside
from nsqx.store.record import (
    BATCH_HEAD,
    BATCH_HEAD_SIZE,
    MAX_BATCH,
    MIN_FRAME_SIZE,
    find_record,
    max_records,
    whole_record_at,
)
from nsqx.store.segment import (
    SEG_HEAD,
    SEG_HEAD_SIZE,
    SEGMENT_MAGIC,
    Segment,
    name_seq,
    new_segment,
    read_index,
    write_index,
)

log = logging.getLogger("nsqx.store")

_COPY_CHUNK: Final = 4 * 1024 * 1024


@dataclass
class _Opened:
    """A segment file as found at start, before its neighbours are known."""

    seg: Segment
    #: the file's size as found (before a damaged tail is cut off)
    size: int
    #: the header as found
    head: bytes
    #: its magic or first sequence is wrong: its offset comes from its neighbours
    head_damaged: bool
    #: a damaged tail was cut off: (its file position, how many records it may have held)
    tail: tuple[int, int] | None = None


def open_segments(
    directory: str,
    deferred: DeferredIndex,
    set_aside: list[SetAside],
    *,
    skip_lost: bool = True,
    leased: tuple[int, int] = (0, 0),
) -> list[Segment]:
    """The segments of ``directory`` in order, the last one active (created if there is
    none), damage set aside by the policy above and reported in ``set_aside``;
    deferred batches are added to ``deferred``. ``skip_lost``: skip the sequences that
    bytes set aside at the log's end may have held, and those below ``leased`` (the
    sequence and offset a crash's lease says may have been given out: see
    :mod:`nsqx.store.lease`), as a single node does, rather than end the log at its last
    whole record (a replica)."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".seg"))
    #: the lowest sequence and virtual offset the next append may have: past all that
    #: was set aside
    floor_seq = floor_offset = 0
    found: list[_Opened] = []
    for name in names:
        path = os.path.join(directory, name)
        size = file_size(path)
        base = name_seq(name)
        opened = _open_segment(path, base, deferred, set_aside)
        if opened is None:
            if base is not None:  # what the file may have held (its name says where)
                floor_seq = max(floor_seq, base + max_records(size - SEG_HEAD_SIZE))
            continue
        found.append(opened)
    _check_offsets(found, set_aside)
    segments: list[Segment] = []
    for opened in found:
        seg = opened.seg
        if segments and seg.base_seq < segments[-1].end_seq:
            _set_aside_file(seg.path, "it overlaps the previous segment", seg.base_seq, set_aside)
            floor_seq = max(floor_seq, seg.base_seq + max_records(opened.size - SEG_HEAD_SIZE))
            floor_offset = max(floor_offset, seg.base_offset + opened.size - SEG_HEAD_SIZE)
            continue
        segments.append(seg)
        if opened.tail is not None:
            held = opened.tail[1]
            floor_seq = max(floor_seq, seg.end_seq + held)
            floor_offset = max(floor_offset, seg.base_offset + opened.size - SEG_HEAD_SIZE)
    if not skip_lost:  # a replica: its log ends at its last whole record
        floor_seq = floor_offset = 0
    lease_seq, lease_offset = leased if skip_lost else (0, 0)
    if not segments:
        segments.append(new_segment(directory, floor_seq, floor_offset))
    for seg in segments[:-1]:
        seg.sealed = True
    active = segments[-1]
    active_offset = active.base_offset + active.size - SEG_HEAD_SIZE
    if lease_seq > max(floor_seq, active.end_seq) or lease_offset > active_offset:
        log.warning(
            "STORE: %s: the last run did not stop cleanly: sequences up to %d may have "
            "been given out (its lease) past the log's last record",
            directory,
            lease_seq - 1,
        )
    floor_seq = max(floor_seq, lease_seq)
    floor_offset = max(floor_offset, lease_offset)
    if floor_seq > active.end_seq or floor_offset > active_offset:  # (a single node's)
        nxt = max(floor_seq, active.end_seq)
        log.warning(
            "STORE: %s: sequences %d to %d are skipped (they may have been given out "
            "before); the next message is %d",
            directory,
            active.end_seq,
            nxt - 1,
            nxt,
        )
        write_index(active)
        active.sealed = True
        segments.append(new_segment(directory, nxt, max(floor_offset, active_offset)))
    return segments


def _open_segment(
    path: str, base: int | None, deferred: DeferredIndex, set_aside: list[SetAside]
) -> _Opened | None:
    """Open one segment file: its header, then its index if that matches the file, else
    a scan of every record (holes and a damaged tail dealt with). None: set aside
    whole."""
    try:
        with open(path, "rb") as f:
            head = f.read(SEG_HEAD_SIZE)
        size = os.path.getsize(path)
    except OSError as err:
        log.error("STORE: cannot read %s: %s", path, err)
        return None
    if len(head) < SEG_HEAD_SIZE:
        _set_aside_file(path, "too short for a segment header", base or 0, set_aside)
        return None
    magic, head_seq, head_offset = SEG_HEAD.unpack(head)
    if base is None:  # not named as ours: only its header says where it starts
        if magic != SEGMENT_MAGIC:
            _set_aside_file(path, "bad segment header", 0, set_aside)
            return None
        base = head_seq
    seg = Segment(path, base, head_offset, end_seq=base)
    seg.last_write = os.path.getmtime(path)
    opened = _Opened(seg, size, head, magic != SEGMENT_MAGIC or head_seq != base)
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            if read_index(seg) and _index_matches(seg, mm):
                idx = seg.index
                for i in range(0, len(idx), 3):
                    if idx[i + 2]:
                        _add_deferred(mm, seg, idx[i], idx[i + 1], idx[i + 2], deferred)
            else:
                seg.forget_index_from(seg.base_seq)
                opened.tail = _scan(mm, seg, size, deferred, set_aside)
    finally:
        os.close(fd)
    if opened.tail is not None:
        _cut_tail(seg, opened.tail[0], size, opened.tail[1], set_aside)
    return opened


def _index_matches(seg: Segment, mm: mmap.mmap) -> bool:
    """Whether the batch headers after the index's last entry lead exactly to the end
    and the end sequence it gives (what its crc does not cover)."""
    idx = seg.index
    pos, seq = (idx[-2], idx[-3]) if idx else (SEG_HEAD_SIZE, seg.base_seq)
    while pos + BATCH_HEAD_SIZE <= seg.size:
        plen, _crc, first, count, _d, _f = BATCH_HEAD.unpack_from(mm, pos)
        if first != seq or not 0 < count * MIN_FRAME_SIZE <= plen:
            return False
        pos += BATCH_HEAD_SIZE + plen
        seq += count
    return pos == seg.size and seq == seg.end_seq


def _add_deferred(
    mm: mmap.mmap, seg: Segment, seq: int, pos: int, deliver_at: int, deferred: DeferredIndex
) -> None:
    """An indexed deferred batch: its records are due then, if it is sound (a damaged
    one is a hole for the reads, and must not hold back other records)."""
    count = whole_record_at(mm, pos, seg.size, seq, seq, False)[2]
    if count:
        deferred.add(seq, count, deliver_at)


def _scan(
    mm: mmap.mmap, seg: Segment, size: int, deferred: DeferredIndex, set_aside: list[SetAside]
) -> tuple[int, int] | None:
    """Read a segment through: rebuild its index and its deferred batches, pass over
    damage that sound records follow (holes), and find a damaged tail: (its file
    position, how many records it may have held), or None if there is none."""
    seq = seg.base_seq
    pos = SEG_HEAD_SIZE
    while pos < size:
        plen, _first, count = whole_record_at(mm, pos, size, seq, seq, False)
        if count:
            deliver_at = BATCH_HEAD.unpack_from(mm, pos)[4]
            seg.note_batch(seq, pos, deliver_at)
            if deliver_at:
                deferred.add(seq, count, deliver_at)
            seq += count
            pos += BATCH_HEAD_SIZE + plen
            continue
        why, hint, announced = _damage_at(mm, pos, size, seq)
        nxt_pos = find_record(mm, pos, pos + 1, size, seq, -1, hint)
        if nxt_pos < 0:
            seg.size, seg.end_seq = pos, seq
            seg.forget_index_from(seq)
            log.error("STORE: %s: %s at byte %d", seg.path, why, pos)
            return pos, max(max_records(size - pos), announced)
        nxt = BATCH_HEAD.unpack_from(mm, nxt_pos)[2]
        bad = keep_bad_bytes(seg.path, pos, mm[pos:nxt_pos])
        seg.add_hole(pos, nxt_pos, seq, nxt)
        log.error(
            "STORE: %s: %s at byte %d: sequences %d to %d are lost (bytes %d to %d, kept "
            "in %s); the records after them are served",
            seg.path,
            why,
            pos,
            seq,
            nxt - 1,
            pos,
            nxt_pos,
            bad,
        )
        set_aside.append(SetAside(seg.path, pos, nxt_pos - pos, seq, nxt, bad, "hole"))
        seq, pos = nxt, nxt_pos
    seg.size, seg.end_seq = pos, seq
    return None


def _damage_at(mm: mmap.mmap, pos: int, size: int, seq: int) -> tuple[str, int, int]:
    """What is wrong with the record at ``pos`` (where ``seq`` is due), where its length
    says the next one is (-1 if unbelievable), and how many records its header
    announces if it is sane (a torn write may have cut off records it announces)."""
    if pos + BATCH_HEAD_SIZE > size:
        return "an incomplete record header (torn write)", -1, 0
    plen, _crc, first, count, _d, _f = BATCH_HEAD.unpack_from(mm, pos)
    sane = first == seq and 0 < count * MIN_FRAME_SIZE <= plen <= MAX_BATCH
    hint = pos + BATCH_HEAD_SIZE + plen if plen <= MAX_BATCH else -1
    if pos + BATCH_HEAD_SIZE + plen > size:
        return "an incomplete record (torn write)", hint, count if sane else 0
    if first != seq:
        return f"a corrupt record (sequence {first} where {seq} was expected)", hint, 0
    if not sane:
        return f"a corrupt record ({count} records in {plen} bytes)", hint, 0
    return "a corrupt record (crc mismatch)", hint, count


def _cut_tail(seg: Segment, pos: int, size: int, held: int, set_aside: list[SetAside]) -> None:
    """Move the bytes of ``seg`` from ``pos`` on to a .bad file; truncate there."""
    bad = free_name(f"{seg.path}.{pos}.bad")
    log.error(
        "STORE: %s: setting aside the %d bytes from byte %d as %s: sequences from %d on "
        "are lost (they may have held %d)",
        seg.path,
        size - pos,
        pos,
        bad,
        seg.end_seq,
        held,
    )
    with open(seg.path, "r+b") as f:
        f.seek(pos)
        with open(bad, "wb") as out:
            while chunk := f.read(_COPY_CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        f.truncate(pos)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(seg.path))
    remove_file(seg.idx_path)  # (made for the whole file)
    set_aside.append(
        SetAside(seg.path, pos, size - pos, seg.end_seq, seg.end_seq + held, bad, "tail")
    )


def _check_offsets(found: list[_Opened], set_aside: list[SetAside]) -> None:
    """Check each segment's first virtual offset against its neighbours' and rewrite a
    header that is wrong. A segment that starts at the sequence its predecessor ends
    at starts at the offset it ends at (a *link*). A header whose magic or first
    sequence is damaged takes its neighbours' offset. An intact header's offset is
    taken for flipped (and rewritten) only when it is one bit away from what its
    neighbours say and they are confirmed: the segments on both sides agree across it,
    or its one neighbour agrees with its own other neighbour. An offset no neighbour
    can check (a segment alone, or between gaps) is kept."""

    def end_of(i: int) -> int:
        """Where segment ``i``'s successor starts if they are linked (-1 if not)."""
        a, b = found[i], found[i + 1]
        if a.tail is not None or a.seg.end_seq != b.seg.base_seq:
            return -1
        return a.seg.base_offset + a.size - SEG_HEAD_SIZE

    def linked_ok(i: int) -> bool:
        """Whether segments ``i`` and ``i + 1`` (both there) are linked and agree."""
        return 0 <= i < len(found) - 1 and end_of(i) == found[i + 1].seg.base_offset

    for i, opened in enumerate(found):
        seg = opened.seg
        span = opened.size - SEG_HEAD_SIZE
        by_prev = end_of(i - 1) if i > 0 else -1
        by_next = -1
        if i + 1 < len(found) and end_of(i) >= 0 and not found[i + 1].head_damaged:
            by_next = found[i + 1].seg.base_offset - span
        offset = seg.base_offset
        if opened.head_damaged:
            for candidate in (by_prev if by_prev == by_next else -1, by_prev, by_next):
                if candidate >= 0:
                    offset = candidate
                    break
        elif offset not in (by_prev, by_next) and (by_prev >= 0 or by_next >= 0):
            if by_prev >= 0 and by_next >= 0:
                confirmed = by_prev if by_prev == by_next else -1
            elif by_prev >= 0:
                confirmed = by_prev if linked_ok(i - 2) else -1
            else:
                confirmed = by_next if linked_ok(i + 1) else -1
            if confirmed >= 0 and (confirmed ^ offset).bit_count() == 1:
                offset = confirmed
        if opened.head_damaged or offset != seg.base_offset:
            _rewrite_header(opened, offset, set_aside)


def _rewrite_header(opened: _Opened, offset: int, set_aside: list[SetAside]) -> None:
    seg = opened.seg
    bad = keep_bad_bytes(seg.path, 0, opened.head)
    log.error(
        "STORE: %s: a damaged segment header (kept in %s): rewritten with first "
        "sequence %d (its name) and first offset %d (was %d); no record is lost",
        seg.path,
        bad,
        seg.base_seq,
        offset,
        SEG_HEAD.unpack(opened.head)[2],
    )
    seg.base_offset = offset
    fd = os.open(seg.path, os.O_WRONLY)
    try:
        os.pwrite(fd, SEG_HEAD.pack(SEGMENT_MAGIC, seg.base_seq, offset), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    opened.head_damaged = False
    set_aside.append(
        SetAside(seg.path, 0, SEG_HEAD_SIZE, seg.base_seq, seg.base_seq, bad, "header")
    )


def _set_aside_file(path: str, why: str, base: int, set_aside: list[SetAside]) -> None:
    bad = free_name(path + ".bad")
    size = file_size(path)
    log.error("STORE: setting aside %s as %s: %s", path, bad, why)
    os.replace(path, bad)
    remove_file(path[:-4] + ".idx")
    held = max_records(size - SEG_HEAD_SIZE)
    set_aside.append(SetAside(path, 0, size, base, base + held, bad, "file"))
