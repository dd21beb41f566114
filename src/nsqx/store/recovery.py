"""Recovery: opening a DiskLog's segment files after a stop, clean or not.

The corruption policy (docs/reliability.md) is applied here, at start, and by the walk
(:mod:`nsqx.store.walk`) while reading, nowhere else: no sequence (so no message id)
and no virtual offset is ever given twice, and no damaged byte is ever delivered.

- A segment with a bad header, or that overlaps the one before, is set aside whole
  (renamed *.bad).
- Damage found at start (a torn tail, a crc mismatch, a record out of sequence) ends
  the segment there: the bytes from the damage on are moved to <segment>.<pos>.bad and
  the file is truncated, with a log line. Every whole record before is served.
- Sequences that bytes set aside may have held are never given again: when they were
  at the log's end (a power loss tears the newest segment), appends go on in a new
  segment that starts past them (and past their virtual offsets).
- Damage found while reading (the file changed under nsqd) ends the segment's readable
  records there, in memory; the segment being written is sealed first, so appends go on
  in a new one and the log's end never moves back (SegmentReader.damaged).

Sequences without a record form a gap: a read returns nothing there and
``resume_at()`` names the next sequence that has one.
"""

from __future__ import annotations

import logging
import os
from typing import Final

from nsqx.store.deferred import DeferredIndex
from nsqx.store.durable_file import fsync_dir
from nsqx.store.fsutil import file_size, free_name
from nsqx.store.record import (
    BATCH_HEAD,
    BATCH_HEAD_SIZE,
    MAX_BATCH,
    MIN_FRAME_SIZE,
    CorruptRecord,
    check_batch,
    iter_batches,
)
from nsqx.store.segment import (
    SEG_HEAD,
    SEG_HEAD_SIZE,
    SEGMENT_MAGIC,
    Segment,
    max_records,
    name_seq,
    new_segment,
    read_index,
    write_index,
)

log = logging.getLogger("nsqx.store")

_SCAN_CHUNK: Final = 4 * 1024 * 1024


def open_segments(directory: str, deferred: DeferredIndex) -> list[Segment]:
    """The segments of ``directory`` in order, the last one active (created if there is
    none), damage set aside by the policy above; deferred batches are added to
    ``deferred``."""
    segments: list[Segment] = []
    names = sorted(n for n in os.listdir(directory) if n.endswith(".seg"))
    #: the lowest sequence and virtual offset the next append may have: past all
    #: that was set aside
    floor_seq = floor_offset = 0
    for name in names:
        path = os.path.join(directory, name)
        size = file_size(path)
        seg = _load_segment(directory, path, deferred)
        if seg is None:
            # what the file may have held (its name says where it started)
            base = name_seq(name)
            if base is not None:
                floor_seq = max(floor_seq, base + max_records(size - SEG_HEAD_SIZE))
            continue
        if segments and seg.base_seq < segments[-1].end_seq:
            size = seg.size + seg.set_aside
            _set_aside(path, "overlaps the previous segment")
            floor_seq = max(floor_seq, seg.base_seq + max_records(size - SEG_HEAD_SIZE))
            floor_offset = max(floor_offset, seg.base_offset + size - SEG_HEAD_SIZE)
            continue
        segments.append(seg)
        if seg.set_aside:
            floor_seq = max(floor_seq, seg.end_seq + seg.set_aside_records)
            floor_offset = max(
                floor_offset, seg.base_offset + seg.size + seg.set_aside - SEG_HEAD_SIZE
            )
    if not segments:
        segments.append(new_segment(directory, floor_seq, floor_offset))
    for seg in segments[:-1]:
        seg.sealed = True
    active = segments[-1]
    active_offset = active.base_offset + active.size - SEG_HEAD_SIZE
    if floor_seq > active.end_seq or floor_offset > active_offset:
        nxt = max(floor_seq, active.end_seq)
        log.warning(
            "STORE: %s: sequences %d to %d are skipped (what was set aside may have "
            "held them); the next message is %d",
            directory,
            active.end_seq,
            nxt - 1,
            nxt,
        )
        write_index(active)
        active.sealed = True
        segments.append(new_segment(directory, nxt, max(floor_offset, active_offset)))
    return segments


def _load_segment(directory: str, path: str, deferred: DeferredIndex) -> Segment | None:
    try:
        with open(path, "rb") as f:
            head = f.read(SEG_HEAD_SIZE)
    except OSError as err:
        log.error("STORE: cannot read %s: %s", path, err)
        return None
    if len(head) < SEG_HEAD_SIZE or head[:8] != SEGMENT_MAGIC:
        _set_aside(path, "bad segment header")
        return None
    _, base_seq, base_offset = SEG_HEAD.unpack(head)
    seg = Segment(path, base_seq, base_offset, end_seq=base_seq)
    seg.last_write = os.path.getmtime(path)
    if read_index(seg):
        idx = seg.index
        for i in range(0, len(idx), 3):
            if idx[i + 2]:
                _add_deferred_from_file(seg, idx[i], idx[i + 1], idx[i + 2], deferred)
    else:
        _scan(directory, seg, deferred)
    return seg


def _add_deferred_from_file(
    seg: Segment, seq: int, pos: int, deliver_at: int, deferred: DeferredIndex
) -> None:
    with open(seg.path, "rb") as f:
        f.seek(pos)
        head = f.read(BATCH_HEAD_SIZE)
    if len(head) == BATCH_HEAD_SIZE:
        count = BATCH_HEAD.unpack(head)[3]
        deferred.add(seq, count, deliver_at)


def _scan(directory: str, seg: Segment, deferred: DeferredIndex) -> None:
    """Read a segment through: rebuild its index; set aside a torn or damaged tail."""
    seq = seg.base_seq
    good = SEG_HEAD_SIZE
    damage = "an incomplete record (torn write)"
    with open(seg.path, "rb") as f:
        f.seek(good)
        buf = b""
        base = good  # file position of buf[0]
        done = False
        while not done:
            more = f.read(_SCAN_CHUNK)
            done = not more
            buf = buf[good - base :] + more
            base = good
            for pos, plen, crc, first, count, deliver_at in iter_batches(buf, 0, len(buf)):
                try:
                    if first != seq:
                        raise CorruptRecord(f"sequence {first} where {seq} was expected")
                    check_batch(buf, pos, plen, crc)
                except CorruptRecord as err:
                    damage = f"a corrupt record ({err})"
                    done = True
                    break
                seg.note_batch(seq, base + pos, deliver_at)
                if deliver_at:
                    deferred.add(seq, count, deliver_at)
                seq += count
                good = base + pos + BATCH_HEAD_SIZE + plen
    seg.size = good
    seg.end_seq = seq
    seg.verified_upto = good
    size = os.path.getsize(seg.path)
    if good < size:
        # what the bytes set aside may have held: as many records as fit in them, or
        # as the first batch header there says if it is whole and sane (a torn write
        # may have cut off records it announces)
        held = max_records(size - good)
        with open(seg.path, "rb") as f:
            f.seek(good)
            head = f.read(BATCH_HEAD_SIZE)
        if len(head) == BATCH_HEAD_SIZE:
            plen, _crc, first, count, _d, _f = BATCH_HEAD.unpack(head)
            if first == seq and 0 < count * MIN_FRAME_SIZE <= plen <= MAX_BATCH:
                held = max(held, count)
        seg.set_aside_records = held
        _set_aside_tail(directory, seg, good, size, damage)


def _set_aside_tail(directory: str, seg: Segment, pos: int, size: int, damage: str) -> None:
    """Move the bytes of ``seg`` from ``pos`` on to a .bad file; truncate there."""
    bad = free_name(f"{seg.path}.{pos}.bad")
    log.error(
        "STORE: %s: %s at byte %d; setting aside the %d bytes from there as %s",
        seg.path,
        damage,
        pos,
        size - pos,
        bad,
    )
    with open(seg.path, "r+b") as f:
        f.seek(pos)
        with open(bad, "wb") as out:
            while chunk := f.read(_SCAN_CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        f.truncate(pos)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)
    seg.set_aside += size - pos
    try:
        os.remove(seg.idx_path)  # made for the whole file
    except FileNotFoundError:
        pass


def _set_aside(path: str, why: str) -> None:
    bad = free_name(path + ".bad")
    log.error("STORE: setting aside %s as %s: %s", path, bad, why)
    os.replace(path, bad)
    try:
        os.remove(path[:-4] + ".idx")
    except OSError:
        pass
