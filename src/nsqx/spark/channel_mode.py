"""``mode=channel``: reading through an NSQ channel, for servers without range reads.

The query's driver-side source runner (one Python process per query) holds the
subscription: nsqx.client consumers on an event loop thread of their own. A message is
FINed only once Spark is past the micro-batch that took it, so nothing is lost; after a
failure, what was not FINed comes again (at-least-once: make the sink idempotent on
``id``).

Batches as large as ``maxOffsetsPerTrigger``: every message of a batch stays in flight
until the batch is committed, and nsqd lets one connection hold at most
``--max-rdy-count`` messages in flight (2,500 by default, Go's and ours). So the source
opens enough connections to each nsqd to hold two batches (the one Spark is running,
the next one arriving). Messages are kept as the frames' bytes (nsqx.client's frames
handler: no object per message) and their Arrow columns are built with Arrow's kernels
on the subscription's thread, a few thousand at a time as they arrive, while Spark works
on the batch before: a read only assembles them. The batch before is FINed when Spark
takes the new one in, so that nsqd's next messages arrive while Spark works.

Messages are held in flight with a short ``msgTimeout`` (30 s) and touched while they
wait, so that a driver that dies gives them back within that time; a query that stops
gives back (REQ, deferred by GIVE_BACK_DELAY) every message it has not committed.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import signal
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from nsqx.spark.options import NsqOptions
from nsqx.wire.frames import (
    MSG_DETAIL_SIZE,
    MSG_EXT_AT,
    MSG_EXT_LEN_AT,
    MSG_EXT_VER_AT,
    MSG_ID_AT,
    MSG_ID_END,
)

log = logging.getLogger("nsqx.spark")

#: how long a read waits for the first message of a batch
FIRST_WAIT = 1.0
#: a batch is complete when nothing more arrived for this long (or it is full)
IDLE_WAIT = 0.1
#: how long nsqd may hold messages for a connection before it writes them (below
#: IDLE_WAIT)
OUTPUT_BUFFER_TIMEOUT = 0.05
#: what a stopping query gives back is delivered again after this long (s): by then
#: every connection of the query is closed
GIVE_BACK_DELAY = 1.0
#: how often a read looks at what arrived
POLL = 0.005
#: nsqd's default --max-rdy-count: messages one connection may hold in flight
MAX_RDY_COUNT = 2500
#: messages per micro-batch without maxOffsetsPerTrigger (big batches: Spark spends
#: a fixed time on each)
DEFAULT_BATCH = 50_000
#: messages whose Arrow columns are built together, on the loop thread as they arrive
#: (while Spark works on the batch before), so that a read only assembles them
PIECE = 4096
#: a piece is built at the latest this long after its first message arrived
SEAL_AFTER = 0.01
#: connections to one nsqd at most (each holds MAX_RDY_COUNT messages in flight): two
#: batches of 320,000
MAX_CONNECTIONS = 256


def connections_for(batch: int, max_rdy: int = MAX_RDY_COUNT) -> int:
    """Connections to each nsqd that hold two batches in flight."""
    return max(1, min(MAX_CONNECTIONS, math.ceil(2 * batch / max_rdy)))


#: a subscription's message layout (see nsqx.client.message): (Youzan's binary id and
#: trace id, the ext part, the offset and raw size); NSQ 1.3's is a hex id alone
Layout = tuple[bool, bool, bool]
NSQ13: Layout = (False, False, False)
#: the partition is the high bits of a message id (partition << 50 | sequence + 1)
PARTITION_SHIFT = 50


def link_layout(link: Any) -> Layout:
    """The layout of the messages that come on ``link`` (a consumer's connection): a
    connection that subscribed to a partition (found through nsqlookupd, or named) gets
    Youzan's binary ids, and the ext part on an ext topic."""
    from nsqx.client.message import YouzanMessage

    cls = getattr(link, "msg_cls", None)
    if not isinstance(cls, type) or not issubclass(cls, YouzanMessage):
        return NSQ13
    return (True, bool(getattr(cls, "_ext", False)), bool(getattr(cls, "_detail", False)))


_hex_table: Any = None


def _hex_ids(frames: Any, n: int) -> Any:
    """The binary u64 ids of Youzan's frames (bytes 10-18) as 16 hex digits, as NSQ 1.3
    and the range reader show them: each byte becomes its two digits by one ``take``
    from a table of 256, and every 16 digits one string."""
    import pyarrow as pa
    import pyarrow.compute as pc

    global _hex_table
    if _hex_table is None:
        _hex_table = pa.array([f"{i:02x}" for i in range(256)], pa.string())
    raw = pc.binary_slice(frames, MSG_ID_AT, MSG_ID_AT + 8).buffers()[2]
    digits = pc.take(_hex_table, pa.Array.from_buffers(pa.uint8(), 8 * n, [None, raw]))
    sixteens = pc.cumulative_sum(
        pa.repeat(pa.scalar(16, pa.int32()), n + 1), start=pa.scalar(-16, pa.int32())
    )
    return pa.Array.from_buffers(pa.string(), n, [None, sixteens.buffers()[1], digits.buffers()[2]])


def frame_columns(payloads: list[bytes], layout: Layout = NSQ13) -> list[Any]:
    """The columns a message frame's data gives: id, timestamp, attempts, body,
    partition, trace id and ext header, built with Arrow's kernels (no Python work per
    message beyond one join).

    NSQ 1.3's frame is ``[i64 timestamp][u16 attempts][16-byte hex id][body]``: partition
    0, no trace id, no ext header. Youzan's (a subscription to a partition) has the u64
    id and u64 trace id in those 16 bytes, then on an ext topic ``[u8 ext version]`` and,
    unless 0, ``[u16 length][ext]``, then (after SUB_ORDERED / SUB_ADVANCED only) ``[u64
    offset][u32 raw size]``, then the body."""
    import pyarrow as pa
    import pyarrow.compute as pc

    youzan, ext, detail = layout
    n = len(payloads)
    # one join and the running sum of the lengths: the frames as an Arrow binary array
    # without converting each message on its own
    ends = array("i", [0])
    ends.extend(accumulate(map(len, payloads)))
    data = pa.py_buffer(b"".join(payloads))
    frames = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends), data])
    header = MSG_ID_END + (1 if ext else 0) + (MSG_DETAIL_SIZE if detail and not ext else 0)
    if n and pc.min(pc.binary_length(frames)).as_py() < header:
        raise RuntimeError("nsq: a message frame shorter than its header")
    longest = pc.max(pc.binary_length(frames)).as_py() or header

    def fixed(start: int, width: int, code: str) -> array[int]:
        # n fields of ``width`` bytes, big-endian, now side by side in one buffer
        values = array(code)
        values.frombytes(
            memoryview(pc.binary_slice(frames, start, start + width).buffers()[2])[: width * n]
        )
        if sys.byteorder == "little":
            values.byteswap()
        return values

    stamps = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(fixed(0, 8, "q"))])
    attempts = pa.Array.from_buffers(pa.uint16(), n, [None, pa.py_buffer(fixed(8, 2, "H"))])
    if not youzan:
        ids = pc.binary_slice(frames, MSG_ID_AT, MSG_ID_END).cast(pa.string())
        partitions = pa.repeat(pa.scalar(0, pa.int32()), n)
        traces = pa.repeat(pa.scalar(0, pa.int64()), n)
    else:
        ids = _hex_ids(frames, n)
        raw_ids = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(fixed(10, 8, "Q"))])
        partitions = pc.shift_right(raw_ids, PARTITION_SHIFT).cast(pa.int32())
        # a u64; Spark's BIGINT is signed (one at or above 2**63 reads as negative)
        traces = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(fixed(18, 8, "q"))])
    if ext:
        exts, bodies = _ext_columns(data, ends, n, detail)
    else:
        body_at = MSG_ID_END + (MSG_DETAIL_SIZE if detail else 0)
        bodies = pc.binary_slice(frames, body_at, longest)
        exts = pa.nulls(n, pa.string())
    return [
        ids,
        pc.divide(stamps, 1000).cast(pa.timestamp("us", tz="UTC")),
        attempts.cast(pa.int32()),
        bodies,
        partitions,
        traces,
        exts,
    ]


def _ext_columns(data: Any, ends: array[int], n: int, detail: bool) -> tuple[Any, Any]:
    """Ext headers and bodies of Youzan's frames with the ext part, which puts each
    body at its own place: every frame is cut into four consecutive pieces (header, ext
    version and length; ext; offset and size, if any; body) by one offsets buffer over
    the same bytes, and each column is a ``take`` of every fourth piece (as the range
    reader's extended records)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsqx.spark.source import _int32s, _u8

    i32 = pa.int32()
    starts = pa.Array.from_buffers(i32, n, [None, pa.py_buffer(ends)])
    stops = pa.Array.from_buffers(i32, n, [None, pa.py_buffer(ends)], offset=1)
    u8 = _u8(data)
    ver = pc.take(u8, pc.add(starts, pa.scalar(MSG_EXT_VER_AT, i32)))
    has = pc.not_equal(ver, pa.scalar(0, pa.uint8()))

    def at(base: Any, with_ext: int, without: int) -> Any:
        return pc.add(base, pc.if_else(has, pa.scalar(with_ext, i32), pa.scalar(without, i32)))

    if not pc.all(pc.less_equal(at(starts, MSG_EXT_AT, MSG_EXT_LEN_AT), stops)).as_py():
        raise RuntimeError("nsq: a message frame shorter than its ext header")
    # a frame without ext data points at its own first byte (masked out below)
    hi = pc.take(u8, at(starts, MSG_EXT_LEN_AT, 0)).cast(i32)
    lo = pc.take(u8, at(starts, MSG_EXT_LEN_AT + 1, 0)).cast(i32)
    length = pc.if_else(has, pc.add(pc.multiply(hi, pa.scalar(256, i32)), lo), pa.scalar(0, i32))
    ext_at = at(starts, MSG_EXT_AT, MSG_EXT_LEN_AT)
    ext_end = pc.add(ext_at, length)
    body_at = pc.add(ext_end, pa.scalar(MSG_DETAIL_SIZE if detail else 0, i32))
    if not pc.all(pc.less_equal(body_at, stops)).as_py():
        raise RuntimeError("nsq: a message frame shorter than its ext header")
    offsets = array("i", [0]) * (4 * n + 1)
    for j, column in enumerate((starts, ext_at, ext_end, body_at)):
        offsets[j : 4 * n : 4] = _int32s(column)
    offsets[4 * n] = data.size
    pieces = pa.Array.from_buffers(pa.binary(), 4 * n, [None, pa.py_buffer(offsets), data])
    fours = pc.cumulative_sum(pa.repeat(pa.scalar(4, i32), n), start=pa.scalar(-4, i32))

    def piece(j: int) -> Any:
        return pc.take(pieces, pc.add(fours, pa.scalar(j, i32)))

    exts = pc.if_else(has, piece(1).cast(pa.string()), pa.scalar(None, pa.string()))
    return exts, piece(3)


def columns_to_batch(columns: list[Any], topic: str, first_offset: int) -> Any:
    """An Arrow record batch of the source's schema from :func:`frame_columns`' columns,
    numbered from ``first_offset``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from nsqx.spark.source import SCHEMA_NAMES

    ids, stamps, attempts, bodies, partitions, traces, exts = columns
    n = len(ids)
    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar("", pa.string()), n),
            partitions,
            pc.cumulative_sum(ones, start=first_offset - 1),
            ids,
            traces,
            stamps,
            attempts,
            bodies,
            exts,
        ],
        names=SCHEMA_NAMES,
    )


#: messages that came on one connection, in order: (the connection, their frames' data)
Chunk = tuple[Any, list[bytes]]


def _ids(datas: list[bytes]) -> list[bytes]:
    return [d[MSG_ID_AT:MSG_ID_END] for d in datas]  # the id, in every layout


class _Piece:
    """Messages that arrived one after another (on one or more connections) and their
    Arrow columns (:func:`frame_columns`), or the error building them gave."""

    __slots__ = ("chunks", "columns", "error", "n")

    def __init__(self, chunks: list[Chunk], columns: list[Any] | None, n: int) -> None:
        self.chunks = chunks
        self.columns = columns
        self.error: Exception | None = None
        self.n = n

    @classmethod
    def build(cls, chunks: list[Chunk]) -> _Piece:
        n = sum(len(datas) for _, datas in chunks)
        try:
            # chunks in runs of one layout (connections to partitions and NSQ 1.3 ones
            # may be mixed), the runs' columns put end to end
            runs: list[tuple[Layout, list[bytes]]] = []
            for link, datas in chunks:
                layout = link_layout(link)
                if runs and runs[-1][0] == layout:
                    runs[-1][1].extend(datas)
                else:
                    runs.append((layout, list(datas)))
            if len(runs) <= 1:
                layout, datas = runs[0] if runs else (NSQ13, [])
                return cls(chunks, frame_columns(datas, layout), n)
            import pyarrow as pa

            built = [frame_columns(datas, layout) for layout, datas in runs]
            return cls(chunks, [pa.concat_arrays(list(c)) for c in zip(*built, strict=True)], n)
        except Exception as err:  # raised by the read that takes it, in Spark's query
            piece = cls(chunks, None, n)
            piece.error = err
            return piece

    def split(self, k: int) -> tuple[_Piece, _Piece]:
        """Its first ``k`` messages, and the others."""
        head: list[Chunk] = []
        tail: list[Chunk] = []
        need = k
        for link, datas in self.chunks:
            if need >= len(datas):
                head.append((link, datas))
            elif need > 0:
                head.append((link, datas[:need]))
                tail.append((link, datas[need:]))
            else:
                tail.append((link, datas))
            need -= len(datas)
        cols = self.columns
        first = _Piece(head, None if cols is None else [c.slice(0, k) for c in cols], k)
        rest = _Piece(tail, None if cols is None else [c.slice(k) for c in cols], self.n - k)
        first.error = rest.error = self.error
        return first, rest


@dataclass(frozen=True)
class SubscriptionGroup:
    """Consumers alike: nsqd by TCP address (each subscribed to ``partitions``, or as
    NSQ 1.3 subscribes when None) and nsqlookupd (every partition it lists)."""

    nsqd_tcp: list[str]
    lookupd_http: list[str]
    partitions: list[int] | None = None

    @property
    def targets(self) -> int:
        """The connections one consumer of the group opens to named nsqd (at least 1)."""
        return max(1, len(self.nsqd_tcp) * len(self.partitions or [0]))


def subscription_groups(opts: NsqOptions) -> list[SubscriptionGroup]:
    """Where mode=channel subscribes: nsqlookupd finds every partition (a connection to
    each leader); an nsqd named by its HTTP address is asked which partitions of the
    topic it leads (its /stats; its TCP port from /info) and each is subscribed to
    (``SUB <topic> <channel> <partition>``), or the topic as NSQ 1.3's when it has no
    partitions (or no such topic yet); an nsqd named by its TCP address alone gets NSQ
    1.3's ``SUB``, which reads its default partition only."""
    from nsqx.spark.routing import NodeTopic, node_topic

    assert opts.topic is not None
    nodes: dict[str, NodeTopic] = {}
    for address in opts.nsqd_http:
        node = node_topic(address, opts.topic)
        nodes.setdefault(node.tcp, node)
    plain = [a for a in opts.nsqd_tcp if a not in nodes]
    groups = []
    if plain or opts.lookupd_http:
        groups.append(SubscriptionGroup(plain, list(opts.lookupd_http)))
    for tcp, node in nodes.items():
        if node.leads is None:
            groups.append(SubscriptionGroup([tcp], []))
        elif node.leads:  # (a node that leads none of them is read from their leaders)
            groups.append(SubscriptionGroup([tcp], [], list(node.leads)))
    if not groups:
        raise RuntimeError(
            f"nsq: no nsqd of nsqdHttpAddresses leads a partition of {opts.topic!r} (its "
            "replicas are read from their leaders: name those, or use lookupdHttpAddresses)"
        )
    return groups


class _Subscription:
    """The consumers of one query's runner: messages arrive on the loop thread, kept as
    bytes with their connection (no object per message), and go to ``inbox`` in pieces
    of up to PIECE with their Arrow columns built; they are answered in bulk, one loop
    call per batch of answers."""

    def __init__(self, opts: NsqOptions, batch: int) -> None:
        from nsqx.client import Consumer
        from nsqx.client.sync import LoopThread

        assert opts.topic is not None and opts.channel is not None
        self.inbox: deque[_Piece] = deque()
        #: messages put in the inbox (on the loop thread) and taken out of it (on the
        #: reader's), ever: what waits is their difference
        self.arrived = 0
        self.taken = 0
        #: messages received, ever (some of them not in a piece yet)
        self.received = 0
        #: what arrived since the last piece (on the loop thread only)
        self._tail: list[Chunk] = []
        self._tail_n = 0
        self._seal_handle: asyncio.TimerHandle | None = None
        self.thread = LoopThread("nsqx-spark-channel")
        self.msg_timeout = opts.msg_timeout_ms / 1000
        per_conn = min(MAX_RDY_COUNT, math.ceil(2 * batch / connections_for(batch)))
        self.consumers = [
            Consumer(
                opts.topic,
                opts.channel,
                frames_handler=self._on_frames,
                nsqd_tcp_addresses=group.nsqd_tcp,
                lookupd_http_addresses=group.lookupd_http,
                partitions=group.partitions,
                max_in_flight=per_conn * group.targets,
                msg_timeout=self.msg_timeout,
                # the query decides when a message is done; never given up on here
                max_attempts=0,
                # a handshake that gets no answer is retried after 15 s, not 60
                heartbeat_interval=5.0,
                read_timeout=15.0,
                # nsqd sends what it buffered within 50 ms (its default, 250 ms, is
                # longer than a read waits for more: a batch's tail would wait for
                # the next one); a busy stream fills the buffer sooner anyway
                output_buffer_timeout=OUTPUT_BUFFER_TIMEOUT,
            )
            for group in subscription_groups(opts)
            for _ in range(connections_for(batch))
        ]
        self.closed = False

        async def start() -> None:
            await asyncio.gather(*(c.start() for c in self.consumers))

        try:
            self.thread.run(start(), 120)
        except BaseException:
            self.thread.stop()
            raise

    def _on_frames(self, link: Any, datas: list[bytes]) -> None:
        # on the loop thread, inline: the messages are answered later, by the query
        if self.closed:  # came after CLS: give them back
            link.requeue_many(_ids(datas), GIVE_BACK_DELAY)
            return
        self._tail.append((link, datas))
        self._tail_n += len(datas)
        self.received += len(datas)
        if self._tail_n >= PIECE:
            self._seal()
        elif self._seal_handle is None:
            self._seal_handle = self.thread.loop.call_later(SEAL_AFTER, self._seal)

    def _seal(self) -> None:
        """Build the tail's columns and put it in the inbox (on the loop thread)."""
        if self._seal_handle is not None:
            self._seal_handle.cancel()
            self._seal_handle = None
        if not self._tail or self.closed:
            return
        piece = _Piece.build(self._tail)
        self._tail, self._tail_n = [], 0
        self.inbox.append(piece)
        self.arrived += piece.n

    def waiting(self) -> int:
        """Messages in the inbox."""
        return self.arrived - self.taken

    def take(self, n: int) -> list[_Piece]:
        """The inbox's first ``n`` messages (on the reader's thread; the loop thread
        only appends on the right)."""
        taken: list[_Piece] = []
        inbox = self.inbox
        need = n
        while need > 0:
            piece = inbox[0]
            if piece.n <= need:
                inbox.popleft()
                taken.append(piece)
                need -= piece.n
            else:
                first, inbox[0] = piece.split(need)
                taken.append(first)
                need = 0
        self.taken += n
        return taken

    def answer(self, chunks: list[Chunk], how: str) -> None:
        """FIN ("finish") or TOUCH ("touch") the messages of ``chunks`` on the loop
        thread, in one call: one FIN list (or TOUCH run) per connection."""
        if not chunks or self.closed:
            return

        def run() -> None:
            by_link: dict[int, tuple[Any, list[bytes]]] = {}
            for link, datas in chunks:
                entry = by_link.get(id(link))
                if entry is None:
                    entry = by_link[id(link)] = (link, [])
                entry[1].extend(_ids(datas))
            for link, ids in by_link.values():
                if how == "finish":
                    link.finish_many(ids)
                else:
                    link.touch_many(ids)

        self.thread.call(run)

    def close(self, give_back: list[Chunk]) -> None:
        """Give ``give_back`` (and whatever else arrived) back to nsqd, then close.

        CLS first, on every connection: nsqd then sends nothing more. What is given back
        is deferred by GIVE_BACK_DELAY: given back at once, a message could reach
        another of these connections before nsqd took its CLS (Go's nsqd may send a
        message it had already picked), after that connection's close, and stay in
        flight there until msg_timeout."""
        if self.closed:
            return
        self.closed = True  # from now on, messages that arrive go straight back

        async def shutdown() -> None:
            closing = [asyncio.ensure_future(c.close(5.0)) for c in self.consumers]
            await asyncio.sleep(0)  # the CLS commands are written
            waiting = [c for piece in self.inbox for c in piece.chunks]
            for link, datas in [*give_back, *waiting, *self._tail]:
                link.requeue_many(_ids(datas), GIVE_BACK_DELAY)
            self.inbox.clear()
            self._tail.clear()
            await asyncio.gather(*closing, return_exceptions=True)

        try:
            self.thread.run(shutdown(), 15)
        except Exception as err:  # closing on the way out: say so, go on
            log.warning("nsq: closing the channel subscription: %s", err)
        finally:
            self.thread.stop()


class _OnFirst:
    """An iterator over ``items`` that calls ``first`` (once, across its copies: Spark's
    simple-reader wrapper copies it) before the first item is taken."""

    def __init__(
        self, items: list[Any], first: Any, at: int = 0, fired: list[bool] | None = None
    ) -> None:
        self._items = items
        self._first = first
        self._at = at
        self._fired = fired if fired is not None else [False]

    def __iter__(self) -> _OnFirst:
        return self

    def __next__(self) -> Any:
        if not self._fired[0]:
            self._fired[0] = True
            self._first()
        if self._at >= len(self._items):
            raise StopIteration
        self._at += 1
        return self._items[self._at - 1]

    def __copy__(self) -> _OnFirst:
        return _OnFirst(self._items, self._first, self._at, self._fired)


class NsqChannelStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches taken from a channel; the offset counts the messages taken."""

    def __init__(self, opts: NsqOptions) -> None:
        self.opts = opts
        #: messages per micro-batch at most
        self.batch = opts.max_offsets_per_trigger or opts.max_batch_messages or DEFAULT_BATCH
        self._sub: _Subscription | None = None
        # end offset of a batch -> its messages, FINed once Spark is past that batch
        self._pending: dict[int, list[Chunk]] = {}
        #: the offset up to which Spark has committed (what stop() FINs, not gives back)
        self._committed = 0
        self._taken_at: dict[int, float] = {}
        self._toucher: threading.Thread | None = None
        self._lock = threading.Lock()
        #: how often the toucher has looked (for tests)
        self.touch_rounds = 0

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader for its planner: the subscription stays here
        state = dict(self.__dict__)
        state.update(_sub=None, _pending={}, _taken_at={}, _toucher=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _subscribe(self) -> _Subscription:
        if self._sub is None:
            self._sub = _Subscription(self.opts, self.batch)
            # Spark ends the source's process when the query stops (SIGTERM) and
            # never calls a simple reader's stop(): give back what is not committed
            atexit.register(self.stop)
            if threading.current_thread() is threading.main_thread():
                previous = signal.getsignal(signal.SIGTERM)

                def on_term(signum: int, frame: Any) -> None:
                    # Spark may signal twice: the second must not cut the first short
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    self.stop()
                    signal.signal(
                        signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL
                    )
                    signal.raise_signal(signal.SIGTERM)

                signal.signal(signal.SIGTERM, on_term)
            self._toucher = threading.Thread(
                target=self._touch_loop, name="nsqx-spark-touch", daemon=True
            )
            self._toucher.start()
        return self._sub

    def _touch_loop(self) -> None:
        """TOUCH what waits for its batch's commit, well before msgTimeout runs out."""
        sub = self._sub
        assert sub is not None
        every = sub.msg_timeout / 3
        arrived_before = 0  # messages that had arrived at the last look
        while not sub.closed:
            time.sleep(every)
            self.touch_rounds += 1
            now = time.monotonic()
            with self._lock:
                old = [
                    chunk
                    for end, chunks in self._pending.items()
                    if now - self._taken_at.get(end, now) >= every
                    for chunk in chunks
                ]
            # the inbox's oldest messages (it is taken from the left) that were there at
            # the last look: waiting for at least ``every``; the others are fresh
            waiting = max(0, arrived_before - sub.taken)
            arrived_before = sub.arrived
            for piece in list(sub.inbox):
                if waiting <= 0:
                    break
                old += piece.chunks
                waiting -= piece.n
            sub.answer(old, "touch")

    def initialOffset(self) -> dict[str, int]:
        return {"taken": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow ends when a read finds nothing new: nothing else to pin."""

    def _finish_upto(self, offset: int) -> None:
        with self._lock:
            done = [k for k in self._pending if k <= offset]
            chunks = [c for k in sorted(done) for c in self._pending.pop(k)]
            for k in done:
                self._taken_at.pop(k, None)
        if self._sub is not None:
            self._sub.answer(chunks, "finish")

    def _take(self, sub: _Subscription) -> list[_Piece]:
        """Up to ``batch`` messages: waits FIRST_WAIT for the first one, then until
        the batch is full or nothing more arrived for IDLE_WAIT (by then the last
        messages are in a piece: SEAL_AFTER is shorter)."""
        start = time.monotonic()
        base = sub.taken  # every message received before these was taken
        seen, since = sub.received, start
        while sub.waiting() < self.batch:
            now = time.monotonic()
            received = sub.received
            if received != seen:
                seen, since = received, now
            elif now - (since if seen > base else start) >= (
                IDLE_WAIT if seen > base else FIRST_WAIT
            ):
                break
            time.sleep(POLL)
        return sub.take(min(self.batch, sub.waiting()))

    def read(self, start: dict[str, int]) -> tuple[Iterator[Any], dict[str, int]]:
        sub = self._subscribe()
        taken = int(start["taken"])
        # Spark asks for the batch after ``start`` only once the batch that ended there
        # is committed
        self._committed = max(self._committed, taken)
        pieces = self._take(sub)
        if not pieces:
            self._finish_upto(taken)
            return iter(()), {"taken": taken}
        end = taken + sum(p.n for p in pieces)
        with self._lock:
            self._pending[end] = [c for p in pieces for c in p.chunks]
            self._taken_at[end] = time.monotonic()
        # an Arrow batch per piece, its columns built already: the JVM takes them in as
        # they come
        batches = []
        first = taken
        for piece in pieces:
            if piece.error is not None:
                raise piece.error
            assert piece.columns is not None
            batch = columns_to_batch(piece.columns, self.opts.topic or "", first)
            first += piece.n
            if self.opts.include_headers:  # (ext headers come to partition subscribers)
                from nsqx.spark.source import with_headers

                batch = with_headers(batch)
            batches.append(batch)
        # FIN the batch that ended at ``start`` only when Spark takes this one in (not
        # while this read builds it, nor while Spark writes its offset log): nsqd then
        # sends the next messages while Spark works on this one
        return _OnFirst(batches, lambda: self._finish_upto(taken)), {"taken": end}

    def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Iterator[Any]:
        # A channel cannot replay: after a restart the unFINed messages are delivered
        # again by nsqd (attempts > 1) and land in a later batch.
        return iter(())

    def commit(self, end: dict[str, int]) -> None:
        self._committed = max(self._committed, int(end["taken"]))
        self._finish_upto(self._committed)

    def stop(self) -> None:
        """FIN what Spark committed, give back (REQ) every other message, and close the
        subscription."""
        sub = self._sub
        if sub is None or sub.closed:
            return
        self._finish_upto(self._committed)
        with self._lock:
            left = [c for chunks in self._pending.values() for c in chunks]
            self._pending.clear()
        sub.close(left)
