"""The PySpark data source "nsq": batch and Structured Streaming, read and write.

Reading (mode "range", the default) is by offset ranges: the driver finds every
partition of the topic on every nsqd (each nsqd lists its own in /stats) and plans, for
each (nsqd, topic partition), a range of message sequences; executors fetch exactly that
range with nsqd's stateless range reads (GET /range), one task per range, in sequence
order. A streaming query's offset is ``{"host:httpport/partition": sequence}``; it lives
in Spark's checkpoint, so a query restarted from its checkpoint resumes with no gap and
no repeat. A replicated partition (replicator 2 or more) has the same sequences on
every replica: it is read once, from its leader up to its commit point, and its key is
``"*/partition"``, so its offsets survive a failover. A partition that appears while a stream runs joins at its first retained
sequence. Writing publishes each task's rows with MPUB batches (at-least-once: a retried
task publishes again); ``key``, ``partition`` and ``headers`` columns route rows to
partitions, with ext headers (nsqx.spark.routing).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from nsqx.spark import rangeclient
from nsqx.spark.options import ByTimestamp, NsqOptionError, NsqOptions
from nsqx.spark.publisher import BlockingPublisher
from nsqx.spark.routing import SinkColumns, plain_addresses, publish_routed, sink_columns
from nsqx.wire.frames import (
    EXT_AT,
    EXT_LEN_AT,
    EXT_VER_AT,
    ID_AT,
    ID_END,
    RECORD_EXTENDED,
    TRACE_AT,
)
from nsqx.wire.range import RangeFrames

log = logging.getLogger("nsqx.spark")

#: Columns of the rows this source reads (``nsqd`` names the server a row came from).
SCHEMA = (
    "topic STRING, nsqd STRING, partition INT, offset BIGINT, id STRING, trace_id BIGINT, "
    "timestamp TIMESTAMP, attempts INT, body BINARY, ext STRING"
)


SCHEMA_NAMES = [c.split()[0] for c in SCHEMA.split(", ")]

#: the column includeHeaders adds: the JSON ext header's pairs, as Kafka's ``headers``
HEADERS_COLUMN = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"


def headers_column(exts: Any) -> Any:
    """Kafka's ``headers`` from the ``ext`` column: each JSON ext header's keys and
    values (a string value as its UTF-8 bytes, JSON null as a null value, any other as
    its JSON text); null where a message has none. Python runs only for the rows that
    have a header."""
    import pyarrow as pa

    kind = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    if exts.null_count == len(exts):
        return pa.nulls(len(exts), kind)
    out: list[Any] = []
    for text in exts.to_pylist():
        if text is None:
            out.append(None)
            continue
        try:
            header = json.loads(text)
        except ValueError:
            header = None
        if not isinstance(header, dict):
            out.append(None)
            continue
        out.append([{"key": k, "value": _header_value(v)} for k, v in header.items()])
    return pa.array(out, kind)


def _header_value(v: Any) -> bytes | None:
    # a string as its UTF-8 bytes (what the sink publishes from bytes), JSON null as null
    if isinstance(v, str):
        return v.encode()
    return None if v is None else json.dumps(v).encode()


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One executor task: sequences [start, end) of one nsqd's topic partition (of a
    replicated partition: read from ``address``, its leader, or else from one of the
    ``alternates``, its other replicas, which hold the same sequences)."""

    key: str
    address: str
    partition: int
    start: int
    end: int
    alternates: tuple[str, ...] = ()


#: the "address" in the key of a replicated partition: any of its replicas
ANY_REPLICA = "*"

#: driver side: a replicated partition's replicas by (topic, key), its leader first
#: (_bounds)
_replicas: dict[tuple[str, str], list[str]] = {}


def partition_key(address: str, partition: int) -> str:
    return f"{address}/{partition}"


def replicas_of(opts: NsqOptions, key: str) -> list[str]:
    """The nsqd to read ``key`` from: its own, or a replicated partition's replicas
    (the leader first) as the last look found them (looked up now if never)."""
    address, p = split_key(key)
    if address != ANY_REPLICA:
        return [address]
    assert opts.topic is not None
    if not _replicas.get((opts.topic, key)):
        _bounds(opts, tolerant=True)
    found = _replicas.get((opts.topic, key))
    if not found:
        raise RuntimeError(f"nsq: no nsqd holds partition {p} of {opts.topic!r} now")
    return found


def split_key(key: str) -> tuple[str, int]:
    address, _, part = key.rpartition("/")
    return address, int(part)


def nsqd_http_addresses(opts: NsqOptions) -> list[str]:
    """The nsqd to read from: the configured ones plus those nsqlookupd knows for the topic."""
    found = list(opts.nsqd_http)
    assert opts.topic is not None
    for lookupd in opts.lookupd_http:
        peers = rangeclient.lookup(lookupd, opts.topic)
        try:
            # the followers of replicated partitions too (/lookup lists the leaders)
            peers += rangeclient.holders(lookupd, opts.topic)
        except rangeclient.NsqHttpError:
            pass  # an old lookupd: the readers have no replica to fall back on
        for p in peers:
            addr = f"{p['broadcast_address']}:{p['http_port']}"
            if addr not in found:
                found.append(addr)
    return found


def _resolve(opts: NsqOptions, spec: Any, key: str, lo: int, hi: int, *, ending: bool) -> int:
    """A sequence for ``key`` from an offsets spec, clamped to [lo, hi]. A partition
    that a JSON spec leaves out gets the option's default: earliest for
    startingOffsets, latest for endingOffsets."""
    if spec == "earliest":
        return lo
    if spec == "latest":
        return hi
    if isinstance(spec, ByTimestamp):
        if key not in spec:
            return hi if ending else lo
        spec = spec[key]
    if isinstance(spec, int):
        address, part = replicas_of(opts, key)[0], split_key(key)[1]
        assert opts.topic is not None
        return max(lo, min(hi, rangeclient.sequence_at_time(address, opts.topic, part, spec)))
    assert isinstance(spec, dict)
    if key not in spec:
        return hi if ending else lo
    seq = int(spec[key])
    if seq == -2:
        return lo
    if seq == -1:
        return hi
    if seq < lo and not opts.fail_on_data_loss:
        return lo
    # below lo with failOnDataLoss: the read reports the loss
    return min(seq, hi)


def _bounds(opts: NsqOptions, *, tolerant: bool = False) -> dict[str, tuple[int, int]]:
    """(first retained, end) sequences of every partition of the topic on every nsqd,
    by ``host:httpport/partition`` key (``*/partition`` for a replicated one).

    Each nsqd is asked which partitions it hosts (its /stats), then for their bounds: so
    every partition of a partitioned topic is found wherever it lives, with any lookupd
    or none. A replicated partition counts once, with its leader's bounds (the newest
    epoch's, should an old leader not know yet), whose end is its commit point; its
    replicas are remembered for the readers (replicas_of). ``tolerant`` (a running
    stream) skips an nsqd that cannot be reached, with a warning: its partitions keep
    their offsets and are read again once it answers.
    """
    assert opts.topic is not None
    out = {}
    leaders: dict[str, tuple[int, str]] = {}
    holders: dict[str, list[str]] = {}
    for address in nsqd_http_addresses(opts):
        try:
            for p, replication in rangeclient.local_partitions(address, opts.topic).items():
                if replication is not None:
                    key = partition_key(ANY_REPLICA, p)
                    holders.setdefault(key, []).append(address)
                    epoch = int(replication.get("epoch") or 0)
                    if replication.get("role") != "leader" or not replication.get("confirmed"):
                        continue
                    if key in leaders and leaders[key][0] >= epoch:
                        continue
                    leaders[key] = (epoch, address)
                else:
                    key = partition_key(address, p)
                try:
                    out[key] = rangeclient.bounds(address, opts.topic, p)
                except rangeclient.NsqHttpError as err:
                    # deleted since /stats listed it (a server without /range says
                    # NOT_FOUND alone: that is an error)
                    if "TOPIC_NOT_FOUND" in str(err) or "PARTITION_NOT_FOUND" in str(err):
                        out.pop(key, None)
                        leaders.pop(key, None)
                        continue
                    raise
        except rangeclient.NsqUnreachable as err:
            if not tolerant:
                raise
            log.warning("nsq: %s skipped in this micro-batch: %s", address, err)
    for key, found in holders.items():
        if key not in leaders:
            log.warning("nsq: partition %s of %r has no leader now: not read", key, opts.topic)
            continue
        leader = leaders[key][1]
        _replicas[opts.topic, key] = [leader, *(a for a in found if a != leader)]
    return out


def frames_to_batch(
    res: RangeFrames, topic: str, address: str, partition: int, *, headers: bool = False
) -> Any:
    """An Arrow record batch of SCHEMA from a range read, built column by column with
    Arrow's kernels (no Python per record): ids and bodies are cut out of the frames,
    timestamps expanded from the runs' table, offsets (sequences) counted from the start;
    trace ids and ext headers come from extended records. A malformed body raises
    RuntimeError naming the nsqd."""
    import pyarrow as pa

    try:
        batch = _frames_to_batch(res, topic, address, partition)
    except pa.ArrowException as err:  # e.g. sizes that overflow, ids that are not text
        raise RuntimeError(f"nsq: a range read from {address} has malformed frames: {err}") from err
    if headers:
        batch = with_headers(batch)
    return batch


def with_headers(batch: Any) -> Any:
    """``batch`` with the includeHeaders column appended."""
    return batch.append_column("headers", headers_column(batch.column("ext")))


def _frames_to_batch(res: RangeFrames, topic: str, address: str, partition: int) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    n = res.size

    def col(arrow_type: Any, view: memoryview, length: int) -> Any:
        return pa.Array.from_buffers(arrow_type, length, [None, pa.py_buffer(view)])

    sizes = col(pa.int32(), res.sizes, n)
    ends = pc.cumulative_sum_checked(sizes)
    bounds = pc.min_max(sizes).as_py()
    longest = bounds["max"] or 0
    if n and (ends[-1].as_py() != len(res.frames) or bounds["min"] < ID_END):
        raise RuntimeError(f"nsq: a range read from {address} has malformed frames")
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), ends])
    data = pa.py_buffer(res.frames)
    frames = pa.Array.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], data])
    extended = _extended_mask(data, offsets, n)
    if extended is None:
        # every frame is a plain message frame: one slice makes the bodies
        trace_ids = pa.repeat(pa.scalar(0, pa.int64()), n)
        # an explicit stop: without one pyarrow 26 miscomputes the output's size
        bodies = pc.binary_slice(frames, ID_END, longest)
        exts = pa.nulls(n, pa.string())
    else:
        trace_ids, exts, bodies = _extended_columns(data, offsets, sizes, extended, n, address)
    runs = len(res.run_lengths) // 4
    # each record's timestamp is its run's (one publish, one timestamp)
    run_ends = pc.cumulative_sum_checked(col(pa.int32(), res.run_lengths, runs))
    timestamps = pc.run_end_decode(
        pa.RunEndEncodedArray.from_arrays(run_ends, col(pa.int64(), res.run_timestamps, runs))
    )
    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(address, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pc.cumulative_sum(ones, start=res.start_sequence - 1),  # record i: start + i
            pc.binary_slice(frames, ID_AT, ID_END).cast(pa.string()),
            trace_ids,
            pc.divide(timestamps, 1000).cast(pa.timestamp("us", tz="UTC")),  # Spark's
            pa.repeat(pa.scalar(1, pa.int32()), n),  # a range read is not a delivery
            bodies,
            exts,
        ],
        names=SCHEMA_NAMES,
    )


def _u8(data: Any) -> Any:
    """The frames' bytes as a uint8 array (a view), to gather single bytes from."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.uint8(), data.size, [None, data])


def _extended_mask(data: Any, offsets: Any, n: int) -> Any:
    """Which frames are extended records (a boolean array), or None if none is.

    The third byte of a frame's type field is 1 in an extended record's (0x102) and 0
    in a message frame's (2); gathering that one byte per frame costs far less than the
    columns, so plain topics keep the single-slice path.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not n:
        return None
    type_bytes = pc.take(_u8(data), pc.add(offsets.slice(0, n), pa.scalar(6, pa.int32())))
    extended = pc.equal(type_bytes, pa.scalar(RECORD_EXTENDED >> 8, pa.uint8()))
    return extended if pc.any(extended).as_py() else None


def _extended_columns(
    data: Any, offsets: Any, sizes: Any, extended: Any, n: int, address: str
) -> tuple[Any, Any, Any]:
    """Trace ids, ext headers and bodies of frames some of which are extended records
    (``[header][id][u64 trace id][u8 ext version][u16 ext length][ext][body]``).

    Bodies start at a different place in each frame, which Arrow's slicing kernels
    cannot express; so every frame is cut into five consecutive pieces (header and id,
    trace id, ext version and length, ext, body) by one offsets buffer of 5n + 1
    entries over the same bytes, and each column is a ``take`` of every fifth piece.
    A plain frame's trace piece is the last 8 bytes of its id (masked to 0) and its
    version and ext pieces are empty.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    i32 = pa.int32()

    def at(base: Any, ext_value: int, plain_value: int) -> Any:
        return pc.add(
            base, pc.if_else(extended, pa.scalar(ext_value, i32), pa.scalar(plain_value, i32))
        )

    starts = offsets.slice(0, n)
    if pc.any(pc.and_(extended, pc.less(sizes, pa.scalar(EXT_AT, i32)))).as_py():
        raise RuntimeError(f"nsq: a range read from {address} has malformed extended records")
    u8 = _u8(data)
    # gather the ext version and length bytes of extended records (a plain frame
    # points at its own first byte, always there, and is masked out below)
    ver = pc.take(u8, at(starts, EXT_VER_AT, 0))
    hi = pc.take(u8, at(starts, EXT_LEN_AT, 0)).cast(i32)
    lo = pc.take(u8, at(starts, EXT_LEN_AT + 1, 0)).cast(i32)
    ext_len = pc.if_else(
        extended, pc.add(pc.multiply(hi, pa.scalar(256, i32)), lo), pa.scalar(0, i32)
    )
    trace_at = at(starts, TRACE_AT, TRACE_AT - 8)
    ext_at = at(starts, EXT_AT, ID_END)
    body_at = pc.add(ext_at, ext_len)
    if not pc.all(pc.less_equal(body_at, offsets.slice(1, n))).as_py():
        raise RuntimeError(f"nsq: a range read from {address} has malformed extended records")
    pieces_offsets = array("i", [0]) * (5 * n + 1)
    for j, column in enumerate(
        (starts, trace_at, pc.add(trace_at, pa.scalar(8, i32)), ext_at, body_at)
    ):
        pieces_offsets[j : 5 * n : 5] = _int32s(column)
    pieces_offsets[5 * n] = data.size
    pieces = pa.Array.from_buffers(pa.binary(), 5 * n, [None, pa.py_buffer(pieces_offsets), data])
    fives = pc.cumulative_sum(pa.repeat(pa.scalar(5, i32), n), start=pa.scalar(-5, i32))

    def piece(j: int) -> Any:
        return pc.take(pieces, pc.add(fives, pa.scalar(j, i32)))

    # trace ids: big-endian u64s, now 8 bytes apart; Spark's BIGINT is signed, so one
    # at or above 2**63 reads as negative (the same 64 bits)
    raw = array("q")
    raw.frombytes(memoryview(piece(1).buffers()[2])[: 8 * n])
    if sys.byteorder == "little":
        raw.byteswap()
    traces = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(raw)])
    trace_ids = pc.if_else(extended, traces, pa.scalar(0, pa.int64()))
    has_ext = pc.and_(extended, pc.not_equal(ver, pa.scalar(0, pa.uint8())))
    exts = pc.if_else(has_ext, piece(3).cast(pa.string()), pa.scalar(None, pa.string()))
    return trace_ids, exts, piece(4)


def _int32s(column: Any) -> array[int]:
    """An int32 Arrow array (no nulls) as a Python array, copied in one go."""
    import pyarrow as pa

    if column.type != pa.int32() or column.null_count:
        raise TypeError(f"expected int32 offsets, got {column.type}")
    out = array("i")
    first = column.offset
    out.frombytes(memoryview(column.buffers()[1])[4 * first : 4 * (first + len(column))])
    return out


def _fetch(opts: NsqOptions, part: RangePartition, address: str, seq: int) -> RangeFrames:
    """One range read of ``part`` from ``seq`` on the nsqd at ``address``."""
    assert opts.topic is not None
    return rangeclient.fetch_range(
        address,
        opts.topic,
        part.partition,
        seq,
        part.end,
        max_messages=min(opts.read_messages, part.end - seq),
        max_bytes=opts.read_bytes,
    )


def read_range(opts: NsqOptions, part: RangePartition) -> Iterator[Any]:
    """Executor side: fetch [start, end) in chunks and yield Arrow record batches."""
    assert opts.topic is not None
    seq = part.start
    address = part.address
    while seq < part.end:
        try:
            res = _fetch(opts, part, address, seq)
        except rangeclient.NsqUnreachable:
            if not part.alternates:
                raise
            # the leader went away: another replica holds the same sequences
            address, res = _read_replica(opts, part, seq)
        if not res.size and res.end_sequence <= seq and part.alternates:
            # no longer the leader (its commit point lags): the others hold the range
            address, res = _read_replica(opts, part, seq)
        if res.start_sequence > seq:
            msg = (
                f"nsq: {part.key} sequences {seq}..{res.start_sequence - 1} were deleted "
                "before they were read (set failOnDataLoss=false to skip them)"
            )
            if opts.fail_on_data_loss:
                raise RuntimeError(msg)
            log.warning(msg)
        n = res.size
        if not n:
            if res.end_sequence <= seq:
                raise RuntimeError(
                    f"nsq: {part.key} ends at {res.end_sequence}, before the planned "
                    f"end {part.end} (was the topic deleted or emptied?)"
                )
            break

        yield frames_to_batch(
            res, opts.topic, address, part.partition, headers=opts.include_headers
        )
        seq = res.next_sequence


#: how long a read waits for another replica to hold the planned range (its commit
#: point follows the leader's within a heartbeat; a new leader's at once)
REPLICA_WAIT_S = 10.0


def _read_replica(opts: NsqOptions, part: RangePartition, seq: int) -> tuple[str, RangeFrames]:
    """Read from ``seq`` of a replicated partition from any of its replicas that holds
    records there (the planned range is committed: it is on every ISR member)."""
    deadline = time.monotonic() + REPLICA_WAIT_S
    while True:
        for address in (part.address, *part.alternates):
            try:
                res = _fetch(opts, part, address, seq)
            except rangeclient.NsqHttpError:
                continue
            if res.size or res.start_sequence > seq:
                log.info("nsq: %s read from %s from sequence %d", part.key, address, seq)
                return address, res
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"nsq: no replica of {part.key} ({', '.join((part.address, *part.alternates))})"
                f" served sequence {seq} within {REPLICA_WAIT_S:g} s"
            )
        time.sleep(0.2)


def offsets_behind_latest(source_progress: Any) -> dict[str, float]:
    """Kafka's source metrics from one source's progress (``query.lastProgress
    ["sources"][0]``): ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
    ``avgOffsetsBehindLatest``, the rows each partition's end is past the micro-batch's
    end offset. Spark's Python source API has no metrics hook; the source reports its
    latest offsets instead (reportLatestOffset), from which these follow."""

    def offsets(value: Any) -> dict[str, int]:
        if isinstance(value, str):
            value = json.loads(value) if value else {}
        return {str(k): int(v) for k, v in (value or {}).items()}

    latest = offsets(source_progress.get("latestOffset"))
    end = offsets(source_progress.get("endOffset"))
    behind = [max(v - end.get(k, v), 0) for k, v in latest.items()]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": float(min(behind)),
        "maxOffsetsBehindLatest": float(max(behind)),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }


def _range_partition(opts: NsqOptions, key: str, start: int, end: int) -> RangePartition:
    """The task that reads [start, end) of ``key`` (a replicated partition's: from its
    leader, or else its other replicas)."""
    found = replicas_of(opts, key)
    return RangePartition(key, found[0], split_key(key)[1], start, end, tuple(found[1:]))


def _read_partition(opts: NsqOptions, partition: InputPartition) -> Iterator[Any]:
    """Executor side of both readers. Spark hands a plain ``InputPartition(None)`` to
    read when planning found no range: that reads nothing."""
    if not isinstance(partition, RangePartition):
        return iter(())
    return read_range(opts, partition)


def share_budget(backlog: dict[str, int], budget: int) -> dict[str, int]:
    """Rows to read from each partition when their backlogs exceed ``budget``: shares in
    proportion to the backlogs that add up to exactly ``budget`` (largest remainders
    get the rows that rounding down leaves), so that a micro-batch always makes
    progress, however many partitions share a small budget. Unchanged if within it."""
    total = sum(backlog.values())
    if total <= budget:
        return dict(backlog)
    shares = {k: b * budget // total for k, b in backlog.items()}
    left = budget - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda k: (-(backlog[k] * budget % total), k))
    for k in by_remainder[:left]:
        shares[k] += 1
    return shares


class NsqBatchReader(DataSourceReader):
    """Batch read of [startingOffsets, endingOffsets) of every (nsqd, partition)."""

    def __init__(self, opts: NsqOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[RangePartition]:
        """One range per (nsqd, partition) with rows between the offsets; none at all
        when every range is empty or no nsqd has the topic (Spark then reads one empty
        partition: no rows, as Kafka's source gives for an empty range)."""
        opts = self.opts
        parts = []
        bounds = _bounds(opts)
        if not bounds:
            log.warning("nsq: no nsqd has a topic %r: the read has no rows", opts.topic)
        for key, (lo, hi) in sorted(bounds.items()):
            start = _resolve(opts, opts.starting, key, lo, hi, ending=False)
            end = _resolve(opts, opts.ending, key, lo, hi, ending=True)
            if end > start:
                parts.append(_range_partition(opts, key, start, end))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges; offsets are {"host:httpport/partition": sequence}."""

    def __init__(self, opts: NsqOptions) -> None:
        self.opts = opts
        self._target: dict[str, int] | None = None
        # partitions found below the stream's offset, warned about once
        self._behind: set[str] = set()
        #: the clock of maxTriggerDelay (a test may replace it)
        self.clock = time.monotonic
        # when the last micro-batch was planned (Kafka: the last trigger that ran one)
        self._last_batch: float | None = None
        # each partition's end as the last latestOffset saw it (reportLatestOffset)
        self._latest: dict[str, int] = {}

    def initialOffset(self) -> dict[str, int]:
        opts = self.opts
        return {
            key: _resolve(opts, opts.starting, key, lo, hi, ending=False)
            for key, (lo, hi) in sorted(_bounds(opts).items())
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        m = self.opts.max_offsets_per_trigger
        return ReadMaxRows(m) if m else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: hi for k, (_, hi) in _bounds(self.opts).items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the next micro-batch: every known partition's end (at most the
        pinned target of availableNow), its rows shared out under maxOffsetsPerTrigger.

        A partition (or nsqd) first seen here enters at its first retained sequence and
        is read from the next micro-batch on: the checkpointed offsets then say where
        its reading starts, so the batch replays identically after a restart, and
        segments deleted before the stream ever saw the partition are no data loss.
        """
        bounds = _bounds(self.opts, tolerant=True)
        end = dict(start)
        latest = {}
        for k, (lo, hi) in bounds.items():
            if k not in start:
                end[k] = lo
                if self._target is not None and k not in self._target:
                    # appeared after availableNow started: not part of this run's data
                    self._target[k] = lo
                log.info("nsq: new partition %s, read from sequence %d", k, lo)
            elif hi < start[k]:
                if k not in self._behind:
                    self._behind.add(k)
                    log.warning(
                        "nsq: %s ends at %d, below the stream's offset %d (deleted and "
                        "created again?): reading resumes once it passes that offset",
                        k,
                        hi,
                        start[k],
                    )
            else:
                latest[k] = hi
        self._latest = {k: hi for k, (_, hi) in bounds.items()}
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, v)) for k, v in latest.items()}
        elif self._too_few(start, latest):
            return {**start, **{k: v for k, v in end.items() if k not in start}}
        end.update({k: max(v, start[k]) for k, v in latest.items()})
        if isinstance(limit, ReadMaxRows):
            backlog = {k: max(v - start[k], 0) for k, v in latest.items()}
            for k, share in share_budget(backlog, limit.max_rows).items():
                end[k] = start[k] + share
        if end != start:
            self._last_batch = self.clock()
        return end

    def _too_few(self, start: dict[str, int], latest: dict[str, int]) -> bool:
        """Kafka's minOffsetsPerTrigger: wait (no micro-batch) while fewer rows than it
        are available, unless maxTriggerDelay has passed since the last micro-batch
        (or since the query started). availableNow reads what there is, as Kafka's."""
        least = self.opts.min_offsets_per_trigger
        if not least:
            return False
        now = self.clock()
        if self._last_batch is None:
            self._last_batch = now
        available = sum(max(v - start[k], 0) for k, v in latest.items())
        return available < least and now - self._last_batch < self.opts.max_trigger_delay

    def reportLatestOffset(self) -> dict[str, int]:
        """Each partition's end when the last micro-batch was planned: Spark shows it as
        the source's ``latestOffset`` in the query's progress, beside ``endOffset``
        (their difference is what Kafka's source reports as offsets behind latest; see
        :func:`offsets_behind_latest`)."""
        return dict(self._latest)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[RangePartition]:
        """One input partition per (nsqd, topic partition) with rows in [start, end).

        A key missing from ``start`` entered in this micro-batch at its first sequence
        (see latestOffset): nothing of it is read before the next one.
        """
        parts = []
        for key, hi in sorted(end.items()):
            lo = start.get(key, hi)
            if hi > lo:
                parts.append(_range_partition(self.opts, key, lo, hi))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark finished everything below ``end``: advance the named channel, if any,
        so consumption shows in nsqd's /stats (lag = depth of that channel)."""
        opts = self.opts
        if opts.channel is None:
            return
        assert opts.topic is not None
        for key, seq in end.items():
            p = split_key(key)[1]
            try:
                address = replicas_of(opts, key)[0]  # (a replicated one's: its leader)
                rangeclient.set_channel_offset(address, opts.topic, opts.channel, p, seq)
            except (rangeclient.NsqHttpError, RuntimeError) as err:
                log.warning("nsq: could not advance channel %s on %s: %s", opts.channel, key, err)

    def stop(self) -> None:
        """Nothing to release: every call is a stateless HTTP request."""


@dataclass(frozen=True)
class PublishedCount(WriterCommitMessage):
    messages: int
    bytes: int


def publish_rows(
    opts: NsqOptions, rows: Iterator[Any], cols: SinkColumns | None = None
) -> PublishedCount:
    """Executor side of both writers: rows -> MPUB batches, every one acknowledged.
    With routing columns (``key``, ``partition``, ``headers``: ``cols``), each row goes
    to its partition's leader, with its ext header (nsqx.spark.routing)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    index = ctx.partitionId() if ctx is not None else 0
    if cols is not None and cols.any:
        return PublishedCount(*publish_routed(opts, cols, rows, index))
    addresses = plain_addresses(opts)
    if not addresses:
        raise RuntimeError(
            "nsq: no nsqd to publish to (nsqdTcpAddresses / nsqdHttpAddresses / "
            "lookupdHttpAddresses)"
        )
    pub = BlockingPublisher(addresses[index % len(addresses)])
    by_topic: dict[str, list[bytes]] = {}
    count = size = 0
    try:
        for row in rows:
            body = row[opts.body_column]
            if body is None:
                raise ValueError(f"nsq: column {opts.body_column} is null; messages need a body")
            if isinstance(body, str):
                body = body.encode()
            topic = str(row[opts.topic_column]) if opts.topic_column else opts.topic
            assert topic is not None
            batch = by_topic.setdefault(topic, [])
            batch.append(bytes(body))
            count += 1
            size += len(body)
            if len(batch) >= opts.batch_size:
                pub.publish(topic, batch, opts.batch_size)
                batch.clear()
        for topic, batch in by_topic.items():
            if batch:
                pub.publish(topic, batch, opts.batch_size)
    finally:
        pub.close()
    return PublishedCount(count, size)


class NsqBatchWriter(DataSourceWriter):
    def __init__(self, opts: NsqOptions, cols: SinkColumns | None = None) -> None:
        self.opts = opts
        self.cols = cols

    def write(self, iterator: Iterator[Any]) -> PublishedCount:
        return publish_rows(self.opts, iterator, self.cols)


class NsqStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: NsqOptions, cols: SinkColumns | None = None) -> None:
        self.opts = opts
        self.cols = cols

    def write(self, iterator: Iterator[Any]) -> PublishedCount:
        return publish_rows(self.opts, iterator, self.cols)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Each task's publishes were acknowledged before it returned: nothing to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published messages cannot be taken back (at-least-once, documented)."""


class NsqDataSource(DataSource):
    """``spark.read.format("nsq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        # only includeHeaders shapes the schema; a bad option is named by the reader
        opts = {str(k).lower(): str(v) for k, v in dict(self.options).items()}
        try:
            include = NsqOptions.parse(
                {
                    "topic": "t",
                    "nsqdhttpaddresses": "h:1",
                    **{k: v for k, v in opts.items() if k == "includeheaders"},
                }
            ).include_headers
        except NsqOptionError:
            include = False
        return f"{SCHEMA}, {HEADERS_COLUMN}" if include else SCHEMA

    def _opts(self, for_write: bool = False) -> NsqOptions:
        return NsqOptions.parse(self.options, for_write=for_write)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        if opts.mode == "channel":
            raise NsqOptionError("option mode=channel is for readStream (a batch read is by range)")
        return NsqBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._opts()
        if opts.mode == "channel":
            # raises PySparkNotImplementedError: Spark then asks simpleStreamReader
            return super().streamReader(schema)
        return NsqStreamReader(opts)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        from nsqx.spark.channel_mode import NsqChannelStreamReader

        return NsqChannelStreamReader(self._opts())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("nsq").mode("append").save()``: Spark asks Python sources
        for "append" or "overwrite" only (its default, "errorifexists", is refused by
        Spark itself); a topic is only ever appended to, so "overwrite" is refused."""
        if overwrite:
            raise NsqOptionError(
                'nsq: a topic cannot be overwritten (messages are only appended): use .mode("append")'
            )
        opts = self._opts(for_write=True)
        return NsqBatchWriter(opts, sink_columns(schema, opts))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Every output mode publishes the rows of each micro-batch (Kafka's sink does
        the same: "complete" publishes the whole result table each time)."""
        opts = self._opts(for_write=True)
        return NsqStreamWriter(opts, sink_columns(schema, opts))
