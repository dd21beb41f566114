"""Youzan-protocol scenarios run against any cluster, with normalized answers.

The same scenarios run against Youzan's reference cluster and against nsqx's must give
the same answers: each answer states facts (order held, bodies received, "the trace
reply's id equals the id read back"), never ids, offsets or timestamps that may differ
between implementations.

    python tests/youzan/side_by_side.py --lookupd-http 127.0.0.1:14161 [--json]

Self-contained on purpose (standard library only, raw asyncio sockets), so that it runs
against either cluster from any Python 3.11.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------
# murmur3 (x86, 32-bit): youzan/go-nsq shards keys with Hasher.Sum32(key) % partition_num,
# and its docs and tests set Hasher = spaolacci/murmur3.New32() (seed 0).

_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of data."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _M32
    n = len(data)
    end = n - n % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * c2) & _M32
        h ^= k
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[end:]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if tail:
        k ^= tail[0]
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * c2) & _M32
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def partition_for_key(key: str, partition_num: int) -> int:
    """The partition youzan/go-nsq's PublishOrdered picks for a key (murmur3 hasher)."""
    return murmur3_32(key.encode()) % partition_num


# --------------------------------------------------------------------------------------
# HTTP: the V1 format (Accept: application/vnd.nsq; version=1.0), standard library only.

V1_ACCEPT = "application/vnd.nsq; version=1.0"


@dataclass
class HttpReply:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else None

    def v1(self) -> Any:
        """The JSON body, unwrapped if it came in the ``{status_code, status_txt, data}``
        envelope although the V1 format was asked for."""
        data = self.json()
        if isinstance(data, dict) and set(data) == {"status_code", "status_txt", "data"}:
            return data["data"]
        return data

    def message(self) -> str:
        """The ``message`` of a V1 error body, or the raw text."""
        try:
            data = self.json()
        except ValueError:
            return self.body.decode(errors="replace")
        if isinstance(data, dict) and "message" in data:
            return str(data["message"])
        return self.body.decode(errors="replace")


def _http_sync(method: str, url: str, body: bytes | None, accept: str | None) -> HttpReply:
    req = urllib.request.Request(url, data=body, method=method)
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return HttpReply(resp.status, resp.read())
    except urllib.error.HTTPError as e:
        return HttpReply(e.code, e.read())


async def http(
    method: str,
    addr: str,
    path: str,
    params: dict[str, Any] | None = None,
    body: bytes | None = None,
    accept: str | None = V1_ACCEPT,
) -> HttpReply:
    """One HTTP request to ``addr`` (host:port); never raises on a 4xx/5xx."""
    url = f"http://{addr}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    if method == "POST" and body is None:
        body = b""
    return await asyncio.to_thread(_http_sync, method, url, body, accept)


# --------------------------------------------------------------------------------------
# Protocol V2 over a raw socket

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
HEARTBEAT = b"_heartbeat_"
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")


@dataclass
class Frame:
    type: int
    data: bytes

    @property
    def is_error(self) -> bool:
        return self.type == FRAME_ERROR

    @property
    def code(self) -> str:
        """An error frame's code (the text before the first space)."""
        return self.data.split(b" ", 1)[0].decode(errors="replace")

    def text(self) -> str:
        return self.data.decode(errors="replace")


@dataclass
class Msg:
    """A message frame as a Youzan-mode client sees it."""

    timestamp: int
    attempts: int
    id: int
    trace_id: int
    raw_id: bytes
    body: bytes
    ext_ver: int | None = None
    ext: bytes | None = None
    offset: int | None = None
    rawsize: int | None = None
    frame: bytes = b""

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def parse_message(data: bytes, *, ext: bool, detail: bool) -> Msg:
    """A message frame's data: ``[8 ts][2 attempts][8 id][8 trace id]`` + (ext)
    ``[1 ver]([2 len][ext])`` + (detail: SUB_ORDERED / SUB_ADVANCED) ``[8 offset][4 rawsize]``
    + body."""
    ts, attempts = struct.unpack_from(">qH", data, 0)
    msg_id, trace_id = struct.unpack_from(">QQ", data, 10)
    pos = 26
    ext_ver: int | None = None
    ext_bytes: bytes | None = None
    if ext:
        ext_ver = data[pos]
        pos += 1
        if ext_ver != 0:
            (n,) = struct.unpack_from(">H", data, pos)
            pos += 2
            ext_bytes = data[pos : pos + n]
            pos += n
    offset: int | None = None
    rawsize: int | None = None
    if detail:
        offset, rawsize = struct.unpack_from(">QI", data, pos)
        pos += 12
    return Msg(
        timestamp=ts,
        attempts=attempts,
        id=msg_id,
        trace_id=trace_id,
        raw_id=data[10:26],
        body=data[pos:],
        ext_ver=ext_ver,
        ext=ext_bytes,
        offset=offset,
        rawsize=rawsize,
        frame=data,
    )


@dataclass
class TraceReply:
    """The 30-byte answer to PUB_TRACE / MPUB_TRACE (and PUB_EXT with ##trace_id)."""

    id: int
    trace_id: int
    offset: int
    rawsize: int

    @classmethod
    def parse(cls, data: bytes) -> TraceReply:
        if len(data) != 30 or data[:2] != b"OK":
            raise ValueError(f"not a trace reply: {data!r}")
        msg_id, trace_id, offset, rawsize = struct.unpack_from(">QQQI", data, 2)
        return cls(msg_id, trace_id, offset, rawsize)


class Closed(Exception):
    """The server closed the connection."""


class Conn:
    """One protocol V2 connection: commands out, frames in (heartbeats answered)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def open(cls, addr: str) -> Conn:
        host, port = addr.rsplit(":", 1)
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"  V2")
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def command(self, line: bytes | str, body: bytes | None = None) -> None:
        if isinstance(line, str):
            line = line.encode()
        data = line + b"\n"
        if body is not None:
            data += _I32.pack(len(body)) + body
        self.writer.write(data)

    async def read_frame(self, timeout: float | None = 10.0) -> Frame:
        """The next frame that is not a heartbeat; Closed on EOF, TimeoutError on silence."""
        while True:
            try:
                async with asyncio.timeout(timeout):
                    head = await self.reader.readexactly(8)
                    size, ftype = struct.unpack(">ii", head)
                    data = await self.reader.readexactly(size - 4)
            except asyncio.IncompleteReadError as e:
                self.closed = True
                raise Closed() from e
            except ConnectionError as e:
                self.closed = True
                raise Closed() from e
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                self.command("NOP")
                continue
            return Frame(ftype, data)

    async def request(self, line: bytes | str, body: bytes | None = None) -> Frame:
        self.command(line, body)
        return await self.read_frame()

    async def identify(self, **fields: Any) -> Any:
        fields.setdefault("feature_negotiation", True)
        fields.setdefault("client_id", "side-by-side")
        fields.setdefault("hostname", "side-by-side")
        fields.setdefault("user_agent", "nsqx-side-by-side/1")
        f = await self.request("IDENTIFY", json.dumps(fields).encode())
        if f.is_error:
            raise RuntimeError(f"IDENTIFY failed: {f.text()}")
        if f.data == b"OK":
            return "OK"
        return json.loads(f.data)

    async def probe_open(self) -> bool:
        """Whether the server still served this connection (and then ends it): an unknown
        command gets a fatal error frame back; a closed connection gives EOF instead."""
        if self.closed:
            return False
        try:
            self.command("SBS_PROBE")
            await self.writer.drain()
            while True:
                f = await self.read_frame(5.0)
                if f.is_error:
                    return True
        except (Closed, ConnectionError):
            return False

    async def close(self) -> None:
        self.closed = True
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def fin(conn: Conn, msg: Msg) -> None:
    conn.send(b"FIN " + msg.raw_id + b"\n")


def req(conn: Conn, msg: Msg, delay_ms: int = 0) -> None:
    conn.send(b"REQ " + msg.raw_id + b" " + str(delay_ms).encode() + b"\n")


def trace_body(trace_id: int, body: bytes) -> bytes:
    return _U64.pack(trace_id) + body


def ext_body(header: dict[str, Any] | bytes, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack(">H", len(raw)) + raw + body


def mpub_body(bodies: Iterable[bytes]) -> bytes:
    items = list(bodies)
    return _I32.pack(len(items)) + b"".join(_I32.pack(len(b)) + b for b in items)


# --------------------------------------------------------------------------------------
# The cluster: discovery through nsqlookupd, topic creation, retried writes

RETRY_WRITE_CODES = {"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_TOPIC_NOT_EXIST"}
PROBE_CHANNEL = "sbs_probe"
# the reference hands new partitions their leaders in a periodic check that runs every
# 60-120 s (its 60 s ticker skips a beat when the previous check ended less than 60 s ago)
SETUP_TIMEOUT = 300.0


class ScenarioError(Exception):
    """A scenario could not run (as opposed to running and giving an answer)."""


@dataclass(frozen=True)
class Node:
    host: str
    tcp_port: int
    http_port: int

    @property
    def tcp(self) -> str:
        return f"{self.host}:{self.tcp_port}"

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @classmethod
    def from_peer(cls, peer: dict[str, Any]) -> Node:
        return cls(peer["broadcast_address"], int(peer["tcp_port"]), int(peer["http_port"]))


@dataclass
class Topic:
    name: str
    partition_num: int
    ordered: bool = False
    ext: bool = False
    channels: tuple[str, ...] = ()
    #: write one message per partition so that the run knows writes work, then create the
    #: channels (they start after it); False for a topic that must stay channel-less
    probe: bool = True
    leaders: dict[int, Node] = field(default_factory=dict)
    #: what the set-up saw on the way (reported in the observations)
    seen: dict[str, Any] = field(default_factory=dict)


async def until(
    what: str,
    attempt: Callable[[], Awaitable[Any]],
    timeout: float = SETUP_TIMEOUT,
    interval: float = 0.2,
) -> Any:
    """Call attempt() until it returns something other than None (polling, not sleeping)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            result = await attempt()
        except (OSError, Closed, TimeoutError, ValueError, KeyError, TypeError) as e:
            result, last = None, e
        if result is not None:
            return result
        if loop.time() > deadline:
            raise ScenarioError(f"timed out waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


class Cluster:
    """The cluster under test, reached through nsqlookupd's HTTP API."""

    def __init__(
        self,
        lookupd_http: str,
        nsqd_http: list[str] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.lookupd_http = lookupd_http
        self.nsqd_http_given = list(nsqd_http or [])
        self.log = log or (lambda _s: None)

    async def lookup(self, topic: str, access: str = "r", **extra: str) -> HttpReply:
        params = {"topic": topic, "access": access, "metainfo": "true", **extra}
        return await http("GET", self.lookupd_http, "/lookup", params)

    async def nsqd_http(self) -> list[str]:
        if self.nsqd_http_given:
            return self.nsqd_http_given
        r = await http("GET", self.lookupd_http, "/nodes")
        return sorted({Node.from_peer(p).http for p in (r.v1() or {}).get("producers", [])})

    async def create_topic(self, t: Topic) -> Topic:
        params: dict[str, Any] = {
            "topic": t.name,
            "partition_num": t.partition_num,
            "replicator": 1,
        }
        if t.ordered:
            params["orderedmulti"] = "true"
        if t.ext:
            params["extend"] = "true"
        r = await http("POST", self.lookupd_http, "/topic/create", params)
        t.seen["create"] = (r.status, r.message() if r.status != 200 else "")
        if r.status != 200:
            raise ScenarioError(f"/topic/create {t.name}: {r.status} {r.body!r}")
        t0 = time.monotonic()

        async def leaders() -> dict[int, Node] | None:
            r = await self.lookup(t.name, "r")
            data = r.v1() if r.status == 200 else None
            parts = (data or {}).get("partitions") or {}
            if len(parts) < t.partition_num:
                return None
            return {int(p): Node.from_peer(peer) for p, peer in parts.items()}

        t.leaders = await until(f"{t.name}: leaders in /lookup", leaders)
        if t.probe:
            await self._create_channels(t, [PROBE_CHANNEL])
            for p in range(t.partition_num):
                await self.publish(t, p, "PUB", b"sbs-probe")
        await self._create_channels(t, list(t.channels))
        self.log(f"topic {t.name} ready after {time.monotonic() - t0:.1f}s")
        return t

    async def _create_channels(self, t: Topic, channels: list[str]) -> None:
        async def one(p: int, ch: str) -> None:
            async def attempt() -> bool | None:
                r = await http(
                    "POST",
                    t.leaders[p].http,
                    "/channel/create",
                    {"topic": t.name, "channel": ch, "partition": p},
                )
                return True if r.status == 200 else None

            await until(f"{t.name}/{p}: channel {ch}", attempt)

        await asyncio.gather(*(one(p, ch) for p in range(t.partition_num) for ch in channels))

    async def publish(
        self, t: Topic, partition: int | None, cmd: str, body: bytes, conn: Conn | None = None
    ) -> Frame:
        """``<cmd> <topic> <partition>`` to the partition's leader, retried while it refuses
        writes (not leader yet, not writable); any other answer is returned."""
        part = 0 if partition is None else partition
        line = f"{cmd} {t.name}" + ("" if partition is None else f" {partition}")
        own = conn is None
        state: dict[str, Conn | None] = {"conn": conn}

        async def attempt() -> Frame | None:
            c = state["conn"]
            if c is None or c.closed:
                c = await Conn.open(t.leaders[part].tcp)
                await c.identify()
                state["conn"] = c
            f = await c.request(line, body)
            if f.is_error and f.code in RETRY_WRITE_CODES:
                if f.code == "E_TOPIC_NOT_EXIST":
                    await c.close()
                return None
            return f

        try:
            answer: Frame = await until(f"{t.name}/{part}: {cmd} accepted", attempt)
            return answer
        finally:
            c = state["conn"]
            if c is not None and (own or c is not conn):
                await c.close()


class Producer:
    """Publishes to each partition's leader over one connection per partition."""

    def __init__(self, cluster: Cluster, topic: Topic) -> None:
        self.cluster = cluster
        self.topic = topic
        self.conns: dict[int, Conn] = {}

    async def conn(self, partition: int) -> Conn:
        c = self.conns.get(partition)
        if c is None or c.closed:
            c = await Conn.open(self.topic.leaders[partition].tcp)
            await c.identify()
            self.conns[partition] = c
        return c

    async def pub(self, partition: int, cmd: str, body: bytes) -> Frame:
        c = await self.conn(partition)
        return await self.cluster.publish(self.topic, partition, cmd, body, conn=c)

    async def close(self) -> None:
        for c in self.conns.values():
            await c.close()


class Consumer:
    """One subscribed connection; its messages land in a queue, other frames in a list."""

    def __init__(
        self,
        name: str,
        node: Node,
        sub: str,
        *,
        ext: bool = False,
        detail: bool = False,
        rdy: int = 10,
        **identify: Any,
    ) -> None:
        self.name = name
        self.node = node
        self.sub = sub
        self.ext = ext
        self.detail = detail
        self.rdy = rdy
        self.identify_fields = identify
        self.messages: asyncio.Queue[Msg] = asyncio.Queue()
        self.frames: list[Frame] = []
        self.conn: Conn | None = None
        self.identify_reply: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Frame:
        """Connect, IDENTIFY, subscribe; on OK send RDY and start reading. Returns the SUB
        answer."""
        self.conn = await Conn.open(self.node.tcp)
        self.identify_reply = await self.conn.identify(**self.identify_fields)
        f = await self.conn.request(self.sub)
        if f.is_error:
            return f
        self.conn.command(f"RDY {self.rdy}")
        self._task = asyncio.create_task(self._read(self.conn))
        return f

    async def _read(self, conn: Conn) -> None:
        try:
            while True:
                f = await conn.read_frame(None)
                if f.type == FRAME_MESSAGE:
                    try:
                        m = parse_message(f.data, ext=self.ext, detail=self.detail)
                    except (struct.error, IndexError):
                        self.frames.append(f)  # not the layout expected: the wait times out
                        continue
                    self.messages.put_nowait(m)
                else:
                    self.frames.append(f)
        except (Closed, ConnectionError, asyncio.CancelledError):
            return

    async def next(self, timeout: float = 10.0) -> Msg:
        async with asyncio.timeout(timeout):
            return await self.messages.get()

    def fin(self, msg: Msg) -> None:
        assert self.conn is not None
        fin(self.conn, msg)

    def req(self, msg: Msg, delay_ms: int = 0) -> None:
        assert self.conn is not None
        req(self.conn, msg, delay_ms)

    async def stop(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None

    async def take(self, n: int, timeout: float = 15.0, do_fin: bool = True) -> list[Msg]:
        out = []
        for _ in range(n):
            m = await self.next(timeout)
            if do_fin:
                self.fin(m)
            out.append(m)
        return out


# --------------------------------------------------------------------------------------
# Scenarios. Each takes the cluster, its topics and an `observed` dict (raw facts for
# humans: frames in hex, texts with ids) and returns its normalized answer.

Observed = dict[str, Any]


def ordered_keys(partition_num: int, per_partition: int) -> dict[int, list[str]]:
    """key0, key1, ... assigned to partitions by the murmur3 hasher, per_partition each."""
    keys: dict[int, list[str]] = {p: [] for p in range(partition_num)}
    i = 0
    while any(len(v) < per_partition for v in keys.values()):
        k = f"key{i}"
        p = partition_for_key(k, partition_num)
        if len(keys[p]) < per_partition:
            keys[p].append(k)
        i += 1
    return keys


ORDER_SEQS = 12
ORDER_REQ_DELAY_MS = 10_000


async def scenario_ordered(cluster: Cluster, t: Topic, observed: Observed) -> dict[str, Any]:
    """Per-key order across the partitions of an orderedmulti topic: 2 producers, 2
    SUB_ORDERED consumers per partition, with REQ 0, REQ with a delay, a timeout and a
    consumer restart on chosen messages."""
    channel = "ord"
    keys_by_part = ordered_keys(t.partition_num, 2)
    part_of = {k: p for p, ks in keys_by_part.items() for k in ks}
    keys = [k for p in sorted(keys_by_part) for k in keys_by_part[p]]
    observed["keys"] = {k: part_of[k] for k in keys}
    # what a consumer does the first time it gets these messages
    actions: dict[tuple[str, int], str] = {}
    for a, b in keys_by_part.values():
        actions[(a, 2)] = "REQ 0"
        actions[(b, 4)] = f"REQ {ORDER_REQ_DELAY_MS}"
        actions[(a, 6)] = "timeout"
        actions[(b, 8)] = "restart"
    total = len(keys) * ORDER_SEQS
    acted: set[tuple[str, int]] = set()
    finished: set[tuple[str, int]] = set()
    done = asyncio.Event()
    # checks, made as messages arrive (one asyncio thread: arrival order is well defined)
    last_fin: dict[str, int] = {k: -1 for k in keys}
    last_delivered: dict[int, tuple[int, tuple[str, int]]] = {}
    counts = {"out_of_order": 0, "dup_after_fin": 0, "next_before_fin": 0}
    id_partition_ok = True
    offsets_increase = True
    last_offset: dict[int, int] = {}
    redelivery: dict[str, set[int]] = {}
    pending_action: dict[tuple[str, int], tuple[str, float]] = {}
    req_delay_early: list[bool] = []
    served: dict[int, set[str]] = {p: set() for p in range(t.partition_num)}

    def on_message(p: int, who: str, m: Msg) -> str | None:
        nonlocal id_partition_ok, offsets_increase
        key, seq_s = m.text.split(":")
        seq = int(seq_s)
        served[p].add(who)
        act: str | None
        if m.id >> 50 != p:
            id_partition_ok = False
        prev = last_delivered.get(p)
        if prev is not None and prev[0] != m.id and prev[1] not in finished:
            counts["next_before_fin"] += 1
        last_delivered[p] = (m.id, (key, seq))
        if seq == last_fin[key] + 1:
            pass
        elif seq <= last_fin[key]:
            counts["dup_after_fin"] += 1
        else:
            counts["out_of_order"] += 1
        if (key, seq) in pending_action:
            act, since = pending_action.pop((key, seq))
            redelivery.setdefault(act, set()).add(m.attempts)
            if act.startswith("REQ ") and act != "REQ 0":
                req_delay_early.append(time.monotonic() - since < ORDER_REQ_DELAY_MS / 1000)
        elif m.offset is not None:
            if m.offset <= last_offset.get(p, -1):
                offsets_increase = False
            last_offset[p] = m.offset
        act = actions.get((key, seq))
        if act is not None and (key, seq) not in acted:
            acted.add((key, seq))
            pending_action[(key, seq)] = (act, time.monotonic())
            return act
        return None

    async def consume(p: int, idx: int) -> None:
        gen = 0
        while not done.is_set():
            who = f"p{p}c{idx}"
            c = Consumer(
                f"{who}g{gen}",
                t.leaders[p],
                f"SUB_ORDERED {t.name} {channel} {p}",
                detail=True,
                rdy=10,
                msg_timeout=1000,
            )
            f = await c.start()
            if f.is_error:
                raise ScenarioError(f"SUB_ORDERED {t.name} {p}: {f.text()}")
            try:
                while not done.is_set():
                    try:
                        m = await c.next(0.5)
                    except TimeoutError:
                        continue
                    act = on_message(p, who, m)
                    if act == "REQ 0":
                        c.req(m, 0)
                    elif act is not None and act.startswith("REQ "):
                        c.req(m, ORDER_REQ_DELAY_MS)
                    elif act == "timeout":
                        pass
                    elif act == "restart":
                        break  # close without FIN, then a new connection
                    else:
                        key, seq = m.text.split(":")
                        finished.add((key, int(seq)))
                        last_fin[key] = max(last_fin[key], int(seq))
                        c.fin(m)
                        if len(finished) == total:
                            done.set()
            finally:
                await c.stop()
            gen += 1

    async def produce(my_keys: list[str]) -> None:
        prod = Producer(cluster, t)
        try:
            for seq in range(ORDER_SEQS):
                for k in my_keys:
                    f = await prod.pub(part_of[k], "PUB", f"{k}:{seq}".encode())
                    if f.is_error:
                        raise ScenarioError(f"PUB {k}:{seq}: {f.text()}")
        finally:
            await prod.close()

    consumers = [
        asyncio.create_task(consume(p, i)) for p in range(t.partition_num) for i in range(2)
    ]
    timed_out = False
    try:
        await asyncio.gather(produce(keys[0::2]), produce(keys[1::2]))
        try:
            await asyncio.wait_for(done.wait(), 120)
        except TimeoutError:
            timed_out = True
    finally:
        done.set()
        await asyncio.gather(*consumers)
    observed["served_by_both_connections"] = {p: sorted(w) for p, w in served.items()}
    lost = total - len(finished)
    return {
        "messages": total,
        "order_held": lost == 0 and counts["out_of_order"] == 0 and counts["dup_after_fin"] == 0,
        "lost": lost,
        "out_of_order": counts["out_of_order"],
        "redelivered_after_fin": counts["dup_after_fin"],
        "next_sent_before_fin": counts["next_before_fin"],
        "timed_out": timed_out,
        "partition_in_id_high_bits": id_partition_ok,
        "offsets_increase": offsets_increase,
        "redelivery_attempts": {k: sorted(v) for k, v in sorted(redelivery.items())},
        "req_with_delay_redelivered_before_delay": all(req_delay_early) and bool(req_delay_early),
    }


async def _first_bodies(c: Consumer, n: int) -> list[str]:
    return [m.text for m in await c.take(n)]


async def scenario_replay(cluster: Cluster, t: Topic, observed: Observed) -> dict[str, Any]:
    """Replay a 1-partition topic by time, byte offset and count, with SUB_ADVANCED and
    with POST /channel/setoffset; the answer is which bodies each replay starts with."""
    leader = t.leaders[0]
    prod = Producer(cluster, t)
    replies: dict[str, TraceReply] = {}
    try:
        for i in range(5):
            f = await prod.pub(0, "PUB_TRACE", trace_body(100 + i, f"r{i}".encode()))
            replies[f"r{i}"] = TraceReply.parse(f.data)
        # the point here is a timestamp between the two halves: wait for the next second
        now = time.time()
        split = int(now) + 1
        await asyncio.sleep(split - now + 0.2)
        for i in range(5, 10):
            f = await prod.pub(0, "PUB_TRACE", trace_body(100 + i, f"r{i}".encode()))
            replies[f"r{i}"] = TraceReply.parse(f.data)
    finally:
        await prod.close()
    observed["offsets"] = {b: (r.offset, r.rawsize) for b, r in replies.items()}
    answers: dict[str, Any] = {}
    starts = {
        "timestamp:<first second of r5..r9>": f"timestamp:{split}",
        "timestamp:<a second before all>": f"timestamp:{split - 3600}",
        "virtual_queue:<offset of r7>": f"virtual_queue:{replies['r7'].offset}",
        "virtual_queue:<offset of r0>": f"virtual_queue:{replies['r0'].offset}",
        "msgcount:1": "msgcount:1",
        "msgcount:4": "msgcount:4",
    }
    for i, (label, start) in enumerate(starts.items()):
        c = Consumer(f"adv{i}", leader, f"SUB_ADVANCED {t.name} adv{i} 0 {start}", detail=True)
        f = await c.start()
        try:
            answers[f"SUB_ADVANCED {label}"] = (
                f"error {f.code}" if f.is_error else await _first_bodies(c, 3)
            )
        finally:
            await c.stop()
    for i, (label, start) in enumerate(starts.items()):
        ch = f"set{i}"
        r = await http(
            "POST",
            leader.http,
            "/channel/create",
            {"topic": t.name, "channel": ch, "partition": 0},
        )
        if r.status != 200:
            raise ScenarioError(f"/channel/create {ch}: {r.status} {r.body!r}")
        r = await http(
            "POST",
            leader.http,
            "/channel/setoffset",
            {"topic": t.name, "channel": ch, "partition": 0},
            body=start.encode(),
        )
        key = f"setoffset {label}"
        if r.status != 200:
            answers[key] = f"http {r.status} {r.message()}"
            continue
        c = Consumer(f"set{i}", leader, f"SUB {t.name} {ch} 0")
        f = await c.start()
        try:
            answers[key] = f"error {f.code}" if f.is_error else await _first_bodies(c, 3)
        finally:
            await c.stop()
    # the end (special:-1), no start on a new channel, and positions that are not a
    # message's start or lie past the end: the first body each gets once r10 is published
    end = replies["r9"].offset + replies["r9"].rawsize
    edges = {
        "special:-1": "special:-1",
        "virtual_queue:<offset of r7 + 1>": f"virtual_queue:{replies['r7'].offset + 1}",
        "virtual_queue:<end + 1000>": f"virtual_queue:{end + 1000}",
        "msgcount:0": "msgcount:0",
        "msgcount:1000000": "msgcount:1000000",
    }
    ends: dict[str, Consumer] = {
        "SUB_ADVANCED without a start (new channel)": Consumer(
            "new", leader, f"SUB_ADVANCED {t.name} edge_new 0", detail=True
        )
    }
    for i, (label, start) in enumerate(edges.items()):
        ends[f"SUB_ADVANCED {label}"] = Consumer(
            f"edge{i}", leader, f"SUB_ADVANCED {t.name} edge{i} 0 {start}", detail=True
        )
        ch = f"edge_set{i}"
        await http(
            "POST", leader.http, "/channel/create", {"topic": t.name, "channel": ch, "partition": 0}
        )
        r = await http(
            "POST",
            leader.http,
            "/channel/setoffset",
            {"topic": t.name, "channel": ch, "partition": 0},
            body=start.encode(),
        )
        if r.status != 200:
            answers[f"setoffset {label}"] = f"http {r.status} {r.message()}"
        else:
            ends[f"setoffset {label}"] = Consumer(f"edge_set{i}", leader, f"SUB {t.name} {ch} 0")
    started: list[Consumer] = []
    try:
        for label, c in ends.items():
            f = await c.start()
            if f.is_error:
                answers[label] = f"error {f.code}"
            else:
                started.append(c)
        await cluster.publish(t, 0, "PUB", b"r10")
        for label, c in ends.items():
            if c in started:
                answers[label] = await _first_bodies(c, 1)
    finally:
        for c in started:
            await c.stop()
    return answers


def _layout(m: Msg, body: bytes, ext_json: bytes | None) -> str:
    """Which fields a message frame carried, found by parsing it every possible way."""
    for ext in (False, True):
        for detail in (False, True):
            try:
                p = parse_message(m.frame, ext=ext, detail=detail)
            except (struct.error, IndexError):
                continue
            if p.body != body:
                continue
            if ext and (p.ext or None) != ext_json:
                continue
            fields = ["ts:8", "attempts:2", "id:8", "trace_id:8"]
            if ext:
                fields += ["ext_ver:1"] + (["ext_len:2", "ext"] if p.ext_ver else [])
            if detail:
                fields += ["offset:8", "rawsize:4"]
            return " ".join([*fields, "body"])
    return f"unrecognized ({len(m.frame)} bytes)"


async def scenario_trace(cluster: Cluster, t: Topic, observed: Observed) -> dict[str, Any]:
    """PUB_TRACE / MPUB_TRACE replies against what a SUB_ADVANCED consumer reads back, and
    /message/get by id, offset and count."""
    leader = t.leaders[0]
    c = Consumer("tr", leader, f"SUB_ADVANCED {t.name} tr 0", detail=True)
    f = await c.start()
    if f.is_error:
        raise ScenarioError(f"{c.sub}: {f.text()}")
    prod = Producer(cluster, t)
    try:
        singles = []
        for i, tid in enumerate((1001, 1002, 1003)):
            f = await prod.pub(0, "PUB_TRACE", trace_body(tid, b"t" * (i + 1) + b"-single"))
            observed.setdefault("pub_trace_replies_hex", []).append(f.data.hex())
            singles.append(TraceReply.parse(f.data))
        batch_bodies = [b"m" * (i + 1) + b"-batch" for i in range(3)]
        f = await prod.pub(
            0,
            "MPUB_TRACE",
            mpub_body(trace_body(2001 + i, b) for i, b in enumerate(batch_bodies)),
        )
        observed["mpub_trace_reply_hex"] = f.data.hex()
        batch = TraceReply.parse(f.data)
        f = await prod.pub(0, "PUB", b"plain")
        plain_ok = f.data == b"OK"
        msgs = await c.take(7)
    finally:
        await prod.close()
        await c.stop()
    observed["read_back"] = [
        (m.id, m.trace_id, m.offset, m.rawsize, m.text, m.attempts) for m in msgs
    ]
    observed["frame_hex_SUB_ADVANCED_plain_topic"] = msgs[0].frame.hex()
    one = msgs[:3]
    mb = msgs[3:6]
    contiguous = all(
        a.offset is not None and a.rawsize is not None and a.offset + a.rawsize == b.offset
        for a, b in itertools.pairwise(msgs)
    )
    # /message/get by virtual_offset, by the count it reports, and by id
    gets: dict[str, Any] = {}
    first = singles[0]
    by_off = await http(
        "GET",
        leader.http,
        "/message/get",
        {
            "topic": t.name,
            "partition": 0,
            "search_mode": "virtual_offset",
            "search_pos": first.offset,
        },
    )
    j = by_off.json() if by_off.status == 200 else {}
    observed["message_get_by_offset"] = j
    gets["keys"] = sorted(j)
    gets["by_virtual_offset_matches_reply"] = (
        j.get("id") == first.id
        and j.get("trace_id") == first.trace_id
        and j.get("offset") == first.offset
        and j.get("body") == "t-single"
    )
    by_id = await http(
        "GET",
        leader.http,
        "/message/get",
        {"topic": t.name, "search_mode": "id", "search_pos": first.id},
    )
    gets["by_id_same_message"] = by_id.status == 200 and by_id.json().get("id") == first.id
    if "queue_cnt_index" in j:
        by_cnt = await http(
            "GET",
            leader.http,
            "/message/get",
            {
                "topic": t.name,
                "partition": 0,
                "search_mode": "count",
                "search_pos": j["queue_cnt_index"],
            },
        )
        gets["by_count_queue_cnt_index_same_message"] = (
            by_cnt.status == 200 and by_cnt.json().get("id") == first.id
        )
    gets["attempts"] = j.get("attempts")
    return {
        "PUB_TRACE reply id/trace_id/offset/rawsize == read back": [
            (r.id == m.id, r.trace_id == m.trace_id, r.offset == m.offset, r.rawsize == m.rawsize)
            for r, m in zip(singles, one, strict=True)
        ],
        "MPUB_TRACE reply id == first message id": batch.id == mb[0].id,
        "MPUB_TRACE reply trace_id": batch.trace_id,
        "MPUB_TRACE reply offset == first message offset": batch.offset == mb[0].offset,
        "MPUB_TRACE reply rawsize == sum of the batch's rawsizes": batch.rawsize
        == sum(m.rawsize or 0 for m in mb),
        "trace ids read back": [m.trace_id for m in msgs],
        "bodies read back": [m.text for m in msgs],
        "offset + rawsize == next offset": contiguous,
        "rawsize - len(body)": sorted({(m.rawsize or 0) - len(m.body) for m in msgs}),
        "ids consecutive": all(b.id == a.id + 1 for a, b in itertools.pairwise(msgs)),
        # youzan/go-nsq's PublishWithTrace / PublishOrdered take an answered id 0 for "no id"
        "no id is 0": all(x.id != 0 for x in [*singles, batch, *msgs]),
        "plain PUB answer": "OK" if plain_ok else "not OK",
        "message/get": gets,
    }


async def scenario_frames(
    cluster: Cluster, plain: Topic, ext: Topic, observed: Observed
) -> dict[str, Any]:
    """The message frame layout for SUB / SUB_ORDERED / SUB_ADVANCED on an ext and a
    non-ext topic."""
    answers: dict[str, Any] = {}
    for t in (plain, ext):
        leader = t.leaders[0]
        kind = "ext topic" if t.ext else "plain topic"
        subs = {
            "SUB": f"SUB {t.name} fr_sub 0",
            "SUB_ADVANCED": f"SUB_ADVANCED {t.name} fr_adv 0",
            "SUB_ORDERED": f"SUB_ORDERED {t.name} fr_ord 0",
        }
        consumers = {
            name: Consumer(f"fr_{name}", leader, line, extend_support=t.ext)
            for name, line in subs.items()
        }
        for c in consumers.values():
            f = await c.start()
            if f.is_error:
                raise ScenarioError(f"{c.sub}: {f.text()}")
        try:
            sent: list[tuple[bytes, bytes | None]] = []
            if t.ext:
                tagged = b'{"k":"v","##client_dispatch_tag":"x"}'
                # tagged: no client asked for tag x, so it goes to untagged clients
                f = await cluster.publish(t, 0, "PUB_EXT", ext_body(tagged, b"frame-ext"))
                sent.append((b"frame-ext", tagged))
                f2 = await cluster.publish(t, 0, "PUB", b"frame-noext")
                sent.append((b"frame-noext", None))
                oks: tuple[bytes, ...] = (f.data, f2.data)
            else:
                f = await cluster.publish(t, 0, "PUB_TRACE", trace_body(7, b"frame-plain"))
                sent.append((b"frame-plain", None))
                oks = (f.data[:2],)
            if any(ok != b"OK" for ok in oks):
                raise ScenarioError(f"publish for frames: {oks!r}")
            for name, c in consumers.items():
                for body, header in sent:
                    m = await c.next(15)
                    c.fin(m)
                    what = f"{kind} {name}" + (
                        "" if not t.ext else (" json ext" if header else " no ext")
                    )
                    answers[what] = _layout(m, body, header)
                    observed[f"hex {what}"] = m.frame.hex()
        finally:
            for c in consumers.values():
                await c.stop()
    return answers


EXT_FILTERS: dict[str, dict[str, Any]] = {
    "none": {},
    "exact k=v1": {"type": 1, "filter_ext_key": "k", "filter_data": "v1"},
    "regexp k=^v[0-9]$": {"type": 2, "filter_ext_key": "k", "filter_data": "^v[0-9]$"},
    "glob k=o*": {"type": 3, "filter_ext_key": "k", "filter_data": "o*"},
    "multi any k=v2|k2=x": {
        "type": 4,
        "filter_ext_key": "any",
        "filter_data_list": [
            {"filter_ext_key": "k", "filter_data": "v2"},
            {"filter_ext_key": "k2", "filter_data": "x"},
        ],
    },
    "multi all k=v2&k2=x": {
        "type": 4,
        "filter_ext_key": "all",
        "filter_data_list": [
            {"filter_ext_key": "k", "filter_data": "v2"},
            {"filter_ext_key": "k2", "filter_data": "x"},
        ],
    },
    "inverse exact k=v1": {"type": 1, "inverse": True, "filter_ext_key": "k", "filter_data": "v1"},
}
# the header of each consumer's end marker: one its filter surely matches
EXT_SENTINELS: dict[str, dict[str, Any]] = {
    "none": {},
    "exact k=v1": {"k": "v1"},
    "regexp k=^v[0-9]$": {"k": "v9"},
    "glob k=o*": {"k": "omega"},
    "multi any k=v2|k2=x": {"k2": "x"},
    "multi all k=v2&k2=x": {"k": "v2", "k2": "x"},
    "inverse exact k=v1": {"k": "zz"},
    "desired_tag tagA": {"##client_dispatch_tag": "tagA"},
    "no desired_tag (same channel)": {},
}
EXT_MESSAGES: list[tuple[str, dict[str, Any] | bytes | None]] = [
    ("e1", {"k": "v1"}),
    ("e2", {"k": "v2", "k2": "x"}),
    ("e3", {"k": "other", "k2": "x"}),
    ("e4", {"##client_dispatch_tag": "tagA", "k": "v1"}),
    ("e5", b"{}"),
    ("e6", None),  # plain PUB: no ext header
    ("e7", {"k": 5}),
    ("e8", {"##trace_id": "12345", "k": "v1"}),
    ("e9", {"k": "v10"}),
    ("e10", {"##client_dispatch_tag": "tagB", "k": "v2"}),
]


async def scenario_ext(cluster: Cluster, t: Topic, observed: Observed) -> dict[str, Any]:
    """PUB_EXT JSON headers and consumers with each kind of ext_filter and desired_tag;
    the answer is the set of bodies each consumer got."""
    leader = t.leaders[0]
    consumers: dict[str, Consumer] = {}
    for i, (name, flt) in enumerate(EXT_FILTERS.items()):
        fields: dict[str, Any] = {"extend_support": True}
        if flt:
            fields["ext_filter"] = flt
        consumers[name] = Consumer(
            name, leader, f"SUB {t.name} flt{i} 0", ext=True, rdy=50, **fields
        )
    consumers["desired_tag tagA"] = Consumer(
        "tagA",
        leader,
        f"SUB {t.name} tags 0",
        ext=True,
        rdy=50,
        extend_support=True,
        desired_tag="tagA",
    )
    consumers["no desired_tag (same channel)"] = Consumer(
        "untagged", leader, f"SUB {t.name} tags 0", ext=True, rdy=50, extend_support=True
    )
    for c in consumers.values():
        f = await c.start()
        if f.is_error:
            raise ScenarioError(f"{c.sub}: {f.text()}")
    tag_reply = consumers["desired_tag tagA"].identify_reply
    untagged_reply = consumers["no desired_tag (same channel)"].identify_reply
    observed["identify_reply_with_desired_tag"] = tag_reply
    answers: dict[str, Any] = {
        "IDENTIFY echoes desired_tag": isinstance(tag_reply, dict)
        and tag_reply.get("desired_tag") == "tagA",
        "IDENTIFY without desired_tag has the key": isinstance(untagged_reply, dict)
        and "desired_tag" in untagged_reply,
        "IDENTIFY reply keys with desired_tag": sorted(tag_reply)
        if isinstance(tag_reply, dict)
        else tag_reply,
    }
    prod = Producer(cluster, t)
    pub_answers: dict[str, str] = {}
    published: dict[str, bytes | None] = {}
    try:
        for body, header in EXT_MESSAGES:
            if header is None:
                f = await prod.pub(0, "PUB", body.encode())
                published[body] = None
            else:
                raw = header if isinstance(header, bytes) else json.dumps(header).encode()
                f = await prod.pub(0, "PUB_EXT", ext_body(raw, body.encode()))
                published[body] = raw
            if f.is_error:
                pub_answers[body] = f"error {f.code}"
            elif len(f.data) == 30:
                r = TraceReply.parse(f.data)
                observed[f"PUB_EXT {body} reply hex"] = f.data.hex()
                pub_answers[body] = f"trace reply, trace_id={r.trace_id}"
            else:
                pub_answers[body] = f.text()
        for name in consumers:
            header = {**EXT_SENTINELS[name], "sbs_end": name}
            f = await prod.pub(0, "PUB_EXT", ext_body(header, f"end:{name}".encode()))
            if f.is_error:
                raise ScenarioError(f"sentinel for {name}: {f.text()}")
    finally:
        await prod.close()
    answers["publish answers"] = pub_answers

    async def collect(name: str, c: Consumer) -> tuple[list[str], list[Msg]]:
        got: list[Msg] = []
        while True:
            m = await c.next(20)
            c.fin(m)
            if m.text == f"end:{name}":
                return sorted({x.text for x in got if not x.text.startswith("end:")}), got
            got.append(m)

    try:
        results = await asyncio.gather(*(collect(n, c) for n, c in consumers.items()))
    finally:
        for c in consumers.values():
            await c.stop()
    for name, (bodies, _msgs) in zip(consumers, results, strict=True):
        answers[f"bodies for {name}"] = sorted(bodies, key=lambda b: int(b[1:]))
    # what the unfiltered consumer read back: ext versions, header bytes, trace ids
    unfiltered = {m.text: m for m in results[0][1]}
    answers["ext_ver read back"] = {b: m.ext_ver for b, m in sorted(unfiltered.items())}
    answers["json header bytes read back unchanged"] = all(
        unfiltered[b].ext == raw for b, raw in published.items() if raw is not None
    )
    answers["trace id of e8 read back"] = unfiltered["e8"].trace_id if "e8" in unfiltered else None
    return answers


@dataclass
class ErrCase:
    node: Node
    steps: list[tuple[str | bytes, bytes | None]]
    identify: dict[str, Any] = field(default_factory=dict)


async def run_err_case(case: ErrCase) -> tuple[str, str]:
    """Run the steps on a fresh connection; the answer to the last one, as
    ``CODE closed|kept open`` (or the response), and the raw frame text."""
    conn = await Conn.open(case.node.tcp)
    try:
        await conn.identify(**case.identify)
        f: Frame | None = None
        for step, body in case.steps:
            line = step.encode() if isinstance(step, str) else step
            conn.command(line, body)
            if line.startswith((b"FIN ", b"REQ ", b"TOUCH ", b"RDY ")):
                # no answer unless it fails
                try:
                    f = await conn.read_frame(2.0)
                    while f.type == FRAME_MESSAGE:
                        f = await conn.read_frame(2.0)
                except TimeoutError:
                    f = Frame(FRAME_RESPONSE, b"(no answer)")
            else:
                f = await conn.read_frame(10.0)
                while f.type == FRAME_MESSAGE:
                    f = await conn.read_frame(10.0)
        assert f is not None
        if not f.is_error:
            if len(f.data) == 30 and f.data[:2] == b"OK":
                return "answer: a 30-byte trace reply", f.data.hex()
            return f"answer {f.text()}", f.text()
        still_open = await conn.probe_open()
        return f"{f.code} {'kept open' if still_open else 'closed'}", f.text()
    except Closed:
        return "closed without an answer", ""
    except RuntimeError as e:  # IDENTIFY refused
        return "IDENTIFY refused", str(e)
    finally:
        await conn.close()


async def scenario_errors(
    cluster: Cluster, topics: dict[str, Topic], observed: Observed
) -> dict[str, Any]:
    """Error frames (code, and whether the connection is closed) for misuse of the
    Youzan commands."""
    ordt, plain, ext, replay = topics["ord"], topics["trace"], topics["ext"], topics["replay"]
    pl, ol, el, rl = plain.leaders[0], ordt.leaders[0], ext.leaders[0], replay.leaders[0]
    missing_part = ordt.partition_num + 5
    some_id = b"\x00\x00\x00\x00\x00\x00\x7f\x01" + b"\x00" * 8
    cases: dict[str, ErrCase] = {
        "PUB to a partition that does not exist": ErrCase(
            pl, [(f"PUB {plain.name} {missing_part}", b"x")]
        ),
        "SUB to a partition that does not exist": ErrCase(
            pl, [(f"SUB {plain.name} e_sub {missing_part}", None)]
        ),
        "PUB without partition on an ordered topic": ErrCase(ol, [(f"PUB {ordt.name}", b"x")]),
        "plain SUB on an orderedmulti topic": ErrCase(ol, [(f"SUB {ordt.name} e_ord 0", None)]),
        "SUB_ADVANCED on an orderedmulti topic": ErrCase(
            ol, [(f"SUB_ADVANCED {ordt.name} e_ord 0", None)]
        ),
        "SUB with extend_support on a non-ext topic": ErrCase(
            pl, [(f"SUB {plain.name} e_ext 0", None)], {"extend_support": True}
        ),
        "SUB without extend_support on an ext topic": ErrCase(
            el, [(f"SUB {ext.name} e_ext 0", None)]
        ),
        "SUB_ORDERED with sample_rate": ErrCase(
            pl, [(f"SUB_ORDERED {plain.name} e_sample 0", None)], {"sample_rate": 50}
        ),
        "FIN of an unknown id": ErrCase(
            pl,
            [(f"SUB {plain.name} e_fin 0", None), (b"FIN " + some_id, None)],
        ),
        "PUB_EXT with bad JSON": ErrCase(
            el, [(f"PUB_EXT {ext.name} 0", ext_body(b"{not json", b"x"))]
        ),
        "PUB_EXT with a numeric ##trace_id": ErrCase(
            el, [(f"PUB_EXT {ext.name} 0", ext_body({"##trace_id": 5}, b"x"))]
        ),
        "PUB_EXT with a non-numeric ##trace_id": ErrCase(
            el, [(f"PUB_EXT {ext.name} 0", ext_body({"##trace_id": "abc"}, b"x"))]
        ),
        "PUB_EXT with custom keys on a non-ext topic": ErrCase(
            pl, [(f"PUB_EXT {plain.name} 0", ext_body({"k": "v"}, b"x"))]
        ),
        "PUB_EXT with only ## keys on a non-ext topic": ErrCase(
            pl, [(f"PUB_EXT {plain.name} 0", ext_body({"##client_dispatch_tag": "a"}, b"x"))]
        ),
        "PUB_EXT whose header length passes the body": ErrCase(
            el, [(f"PUB_EXT {ext.name} 0", struct.pack(">H", 50) + b"{}")]
        ),
        "PUB_EXT with an empty body after the header": ErrCase(
            el, [(f"PUB_EXT {ext.name} 0", ext_body(b"{}", b""))]
        ),
        "MPUB_TRACE with a message of 8 bytes or less": ErrCase(
            pl,
            [(f"MPUB_TRACE {plain.name} 0", mpub_body([trace_body(1, b"ok"), b"12345678"]))],
        ),
        "MPUB_TRACE well formed (control)": ErrCase(
            pl, [(f"MPUB_TRACE {plain.name} 0", mpub_body([trace_body(1, b"ok")]))]
        ),
    }
    bad_offsets = [
        "bogus",
        "timestamp",
        "timestamp:abc",
        "unknown:1",
        "timestamp:1:2",
        "special:0",
        "timestamp:9999999999",
    ]
    for i, off in enumerate(bad_offsets):
        cases[f"SUB_ADVANCED {off}"] = ErrCase(
            rl, [(f"SUB_ADVANCED {replay.name} e_off{i} 0 {off}", None)]
        )
    results = await asyncio.gather(*(run_err_case(c) for c in cases.values()))
    answers: dict[str, Any] = {}
    texts: dict[str, str] = {}
    names = {t.name: f"<{k}>" for k, t in topics.items()}
    for name, (answer, text) in zip(cases, results, strict=True):
        for real, placeholder in names.items():
            text = text.replace(real, placeholder)
        answers[name] = answer
        texts[name] = text
    observed["texts"] = texts
    return answers


async def scenario_http(
    cluster: Cluster, topics: dict[str, Topic], observed: Observed
) -> dict[str, Any]:
    """nsqlookupd and nsqd HTTP answers that Youzan clients and tools read."""
    L = cluster.lookupd_http
    ordt, ext, nochan, replay = topics["ord"], topics["ext"], topics["nochan"], topics["replay"]
    answers: dict[str, Any] = {}

    def short(r: HttpReply) -> str:
        return f"{r.status} {r.message()}".strip()

    # /topic/create: argument errors, and creating an existing topic again
    bad: dict[str, dict[str, Any]] = {
        "no topic": {},
        "no partition_num": {"topic": "sbs_bad"},
        "partition_num=0": {"topic": "sbs_bad", "partition_num": 0, "replicator": 1},
        "partition_num=256": {"topic": "sbs_bad", "partition_num": 256, "replicator": 1},
        "no replicator": {"topic": "sbs_bad", "partition_num": 1},
        "replicator=6": {"topic": "sbs_bad", "partition_num": 1, "replicator": 6},
        "bad topic name": {"topic": "bad!name", "partition_num": 1, "replicator": 1},
        "same settings again": {
            "topic": ordt.name,
            "partition_num": ordt.partition_num,
            "replicator": 1,
            "orderedmulti": "true",
        },
        "other partition_num again": {
            "topic": ordt.name,
            "partition_num": ordt.partition_num + 1,
            "replicator": 1,
            "orderedmulti": "true",
        },
    }
    creates = {}
    for name, params in bad.items():
        creates[name] = short(await http("POST", L, "/topic/create", params))
    answers["/topic/create"] = creates
    # /lookup
    metas = {}
    for key in ("ord", "ext", "replay"):
        r = await cluster.lookup(topics[key].name, "r")
        metas[key] = r.json().get("meta")
        if key == "ord":
            data = r.json()
            answers["/lookup partitions"] = sorted(data.get("partitions", {}))
            peers = list(data.get("partitions", {}).values()) + list(data.get("producers", []))
            answers["/lookup peer keys"] = sorted({k for p in peers for k in p})
            answers["/lookup top keys"] = sorted(data)
    answers["/lookup meta"] = metas
    r = await http(
        "GET", L, "/lookup", {"topic": ordt.name, "access": "r", "metainfo": "true"}, accept=None
    )
    answers["/lookup without Accept: keys"] = sorted(r.json() or {})
    r = await http("GET", L, "/lookup", {"topic": ordt.name, "access": "r"})
    answers["/lookup without metainfo: keys"] = sorted(r.json() or {})
    r = await cluster.lookup(f"{ordt.name}_nope", "r")
    answers["/lookup of a missing topic"] = (
        f"{r.status} partitions={len((r.json() or {}).get('partitions') or {})}"
        if r.status == 200
        else short(r)
    )
    r = await http("GET", L, "/lookup", {"topic": ordt.name, "access": "r", "partition": 1})
    answers["/lookup partition=1"] = sorted((r.json() or {}).get("partitions") or {})

    async def channels_listed() -> list[str] | None:
        r = await cluster.lookup(ordt.name, "r")
        chans = sorted(r.v1().get("channels") or [])
        return chans if "ord" in chans else None

    answers["/lookup channels (ordered topic)"] = await until(
        "channels in /lookup", channels_listed, 30
    )
    r = await http("GET", L, "/listlookup")
    data = r.json() or {}
    answers["/listlookup keys"] = sorted(data)
    answers["/listlookup node keys"] = sorted(
        {k for n in data.get("lookupdnodes") or [] for k in n}
    )

    # a topic without any channel: /lookup access=w, TCP PUB, and where its first channel starts
    async def refused() -> HttpReply | None:
        r = await cluster.lookup(nochan.name, "w")
        return r if r.status != 200 else None

    try:
        # 200 (from the coordinator's data) until nsqd registers the partition with lookupd;
        # every topic is ready by now, so its partitions are registered: a short wait
        r = await until("access=w refused", refused, 10)
        answers["/lookup access=w before any channel"] = short(r)
    except ScenarioError:
        r = await cluster.lookup(nochan.name, "w")
        n = len((r.v1() or {}).get("partitions") or {})
        answers["/lookup access=w before any channel"] = f"{r.status} partitions={n}"
    f = await cluster.publish(nochan, 0, "PUB", b"n0")
    answers["TCP PUB to a topic without channels"] = f.text() if not f.is_error else f.code
    c = Consumer("first", nochan.leaders[0], f"SUB {nochan.name} first 0")
    f = await c.start()
    try:
        if f.is_error:
            raise ScenarioError(f"{c.sub}: {f.text()}")
        await cluster.publish(nochan, 0, "PUB", b"n1")
        answers["the first channel starts at"] = await _first_bodies(c, 1)
    finally:
        await c.stop()

    async def writable() -> str | None:
        r = await cluster.lookup(nochan.name, "w")
        return (
            f"{r.status} partitions={len(r.v1().get('partitions') or {})}"
            if r.status == 200
            else None
        )

    answers["/lookup access=w after a channel"] = await until("access=w", writable, 30)
    # nsqd /channel/setoffset answers
    rh = replay.leaders[0].http
    q = {"topic": replay.name, "channel": "adv0", "partition": 0}
    setoffset = {
        "good (msgcount:1)": short(await http("POST", rh, "/channel/setoffset", q, b"msgcount:1")),
        "empty body": short(await http("POST", rh, "/channel/setoffset", q, b"")),
        "body foo": short(await http("POST", rh, "/channel/setoffset", q, b"foo")),
        "body unknown:1": short(await http("POST", rh, "/channel/setoffset", q, b"unknown:1")),
        "missing channel": short(
            await http("POST", rh, "/channel/setoffset", {**q, "channel": "nope"}, b"msgcount:1")
        ),
        "missing topic": short(
            await http("POST", rh, "/channel/setoffset", {**q, "topic": "sbs_nope"}, b"msgcount:1")
        ),
    }
    answers["/channel/setoffset"] = setoffset
    # /message/trace/enable and disable
    eh = ext.leaders[0].http
    answers["/message/trace/enable"] = {
        "topic": short(await http("POST", eh, "/message/trace/enable", {"topic": ext.name})),
        "channel": short(
            await http("POST", eh, "/message/trace/enable", {"topic": ext.name, "channel": "flt0"})
        ),
        "missing topic": short(
            await http("POST", eh, "/message/trace/enable", {"topic": "sbs_nope"})
        ),
        "disable": short(await http("POST", eh, "/message/trace/disable", {"topic": ext.name})),
    }
    # nsqd /stats for the partitioned (ordered) topic, over every nsqd
    entries = []
    for addr in await cluster.nsqd_http():
        r = await http("GET", addr, "/stats", {"format": "json", "topic": ordt.name})
        data = r.json() or {}
        if "data" in data and "topics" not in data:
            data = data["data"]
        observed.setdefault("stats_top_keys", sorted(data))
        entries += [e for e in data.get("topics") or [] if e.get("topic_name") == ordt.name]
    if entries:
        observed["stats_topic_entry"] = {k: v for k, v in entries[0].items() if k != "channels"}
        observed["stats_channel_entry"] = (entries[0].get("channels") or [{}])[0]
    answers["/stats ordered topic"] = {
        "partitions": sorted(str(e.get("topic_partition")) for e in entries),
        "topic_partition type": sorted({type(e.get("topic_partition")).__name__ for e in entries}),
        "is_leader": sorted({e.get("is_leader") for e in entries}, key=str),
        "is_multi_ordered": sorted({e.get("is_multi_ordered") for e in entries}, key=str),
        "is_ext": sorted({e.get("is_ext") for e in entries}, key=str),
        "message_count total": sum(int(e.get("message_count") or 0) for e in entries),
        "channels": sorted(
            {c.get("channel_name") for e in entries for c in e.get("channels") or []}
        ),
        "depth of channel ord": [
            c.get("depth")
            for e in sorted(entries, key=lambda e: str(e.get("topic_partition")))
            for c in e.get("channels") or []
            if c.get("channel_name") == "ord"
        ],
    }
    return answers


#: the segment size both clusters run with in the tests (nsqd's max-bytes-per-file):
#: what scenario_chain publishes spans more than one segment file
CHAIN_SEGMENT_BYTES = 64 * 1024
_CHAIN_BIG = 4096

#: restart(tcp address "host:port" of an nsqd): stop that nsqd and start it again on
#: its data (a cluster that cannot do it gives None: the chain scenario then stops
#: before its restart)
Restart = Callable[[str], Awaitable[None]]


async def _read_from_start(leader: Node, t: Topic, channel: str, n: int) -> list[Msg]:
    """The partition's first ``n`` messages as a Youzan tracing consumer reads them
    (SUB_ADVANCED from the first message: offsets and raw sizes in the frames)."""
    c = Consumer(channel, leader, f"SUB_ADVANCED {t.name} {channel} 0 msgcount:1", detail=True)
    f = await c.start()
    if f.is_error:
        raise ScenarioError(f"{c.sub}: {f.text()}")
    try:
        return await c.take(n)
    finally:
        await c.stop()


def _label(m: Msg) -> str:
    """A message's body up to its first space (the big ones' padding left out)."""
    return m.text.split(" ", 1)[0]


def _chained(msgs: list[Msg]) -> bool:
    return all(
        a.offset is not None and a.rawsize is not None and a.offset + a.rawsize == b.offset
        for a, b in itertools.pairwise(msgs)
    )


async def scenario_chain(
    cluster: Cluster, t: Topic, observed: Observed, restart: Restart | None
) -> dict[str, Any]:
    """Offsets chain by raw size (a message's offset plus its raw size is the next
    message's offset), as a Youzan client sees them in PUB_TRACE / MPUB_TRACE answers and
    SUB_ADVANCED frames: across single PUBs, PUBs sent in one write, MPUBs, traced
    publishes, more bytes than a segment file holds, and a restart of the leader."""
    prod = Producer(cluster, t)
    replies: dict[str, TraceReply] = {}
    published = 1  # the set-up's probe
    try:
        for body in (b"c-single-1", b"c-single-2"):
            await prod.pub(0, "PUB", body)
        conn = await prod.conn(0)
        # three PUBs in one write, then three answers (nsqx stores them as one batch)
        line = f"PUB {t.name} 0\n".encode()
        conn.send(
            b"".join(line + _I32.pack(len(b)) + b for b in (b"c-turn-1", b"c-turn-2", b"c-turn-3"))
        )
        turn = [await conn.read_frame() for _ in range(3)]
        if any(f.data != b"OK" for f in turn):
            raise ScenarioError(f"PUBs in one write: {[f.text() for f in turn]}")
        await prod.pub(0, "MPUB", mpub_body([b"c-mpub-1", b"c-mpub-2", b"c-mpub-3"]))
        for i in (1, 2):
            f = await prod.pub(0, "PUB_TRACE", trace_body(300 + i, b"c-trace-%d" % i))
            replies[f"c-trace-{i}"] = TraceReply.parse(f.data)
        f = await prod.pub(
            0, "MPUB_TRACE", mpub_body(trace_body(400 + i, b"c-tm-%d" % i) for i in (1, 2, 3))
        )
        replies["c-tm-1"] = TraceReply.parse(f.data)
        await prod.pub(0, "PUB", b"c-after-batch")
        # more than a segment holds (the tests run both clusters with CHAIN_SEGMENT_BYTES)
        for i in range(CHAIN_SEGMENT_BYTES // _CHAIN_BIG + 4):
            body = b"c-big-%02d " % i + b"x" * _CHAIN_BIG
            f = await prod.pub(0, "PUB_TRACE", trace_body(500 + i, body))
            replies[f"c-big-{i:02d}"] = TraceReply.parse(f.data)
        published += 14 + CHAIN_SEGMENT_BYTES // _CHAIN_BIG + 4
    finally:
        await prod.close()
    before = await _read_from_start(t.leaders[0], t, "chain_a", published)
    observed["before"] = [(_label(m), m.offset, m.rawsize) for m in before]
    by_body = {_label(m): m for m in before}
    after_batch = next(m for m in before if m.text == "c-after-batch")
    tm = replies["c-tm-1"]
    answer: dict[str, Any] = {
        "bodies read back": [_label(m) for m in before],
        "offset + rawsize == next offset": _chained(before),
        "PUB_TRACE answer offset, rawsize == read back": sorted(
            {
                (r.offset, r.rawsize) == (by_body[k].offset, by_body[k].rawsize)
                for k, r in replies.items()
                if k != "c-tm-1"
            }
        ),
        "MPUB_TRACE answer offset + rawsize == the next message's offset": tm.offset + tm.rawsize
        == after_batch.offset,
        "bytes past a segment": sum(m.rawsize or 0 for m in before) > CHAIN_SEGMENT_BYTES,
    }
    # positions computed by adding a raw size find the next message
    leader = t.leaders[0]
    for label, name in (("a PUB in one write", "c-turn-1"), ("an MPUB", "c-mpub-3")):
        m = by_body[name]
        nxt = (m.offset or 0) + (m.rawsize or 0)
        c = Consumer(
            "chain_seek",
            leader,
            f"SUB_ADVANCED {t.name} chain_seek_{name} 0 virtual_queue:{nxt}",
            detail=True,
        )
        f = await c.start()
        try:
            got = "error " + f.code if f.is_error else (await c.take(1))[0].text
        finally:
            await c.stop()
        r = await http(
            "GET",
            leader.http,
            "/message/get",
            {"topic": t.name, "partition": 0, "search_mode": "virtual_offset", "search_pos": nxt},
        )
        j = r.json() if r.status == 200 else {}
        answer[f"after {label}: virtual_queue:<offset + rawsize>, /message/get"] = [
            got,
            j.get("body"),
        ]
    if restart is None:
        return answer
    await restart(leader.tcp)

    async def new_leader() -> Node | None:
        r = await cluster.lookup(t.name, "w")
        parts = ((r.v1() if r.status == 200 else None) or {}).get("partitions") or {}
        return Node.from_peer(parts["0"]) if "0" in parts else None

    t.leaders[0] = await until(f"{t.name}: its leader back", new_leader)
    f = await cluster.publish(t, 0, "PUB_TRACE", trace_body(999, b"c-restart"))
    after = TraceReply.parse(f.data)
    again = await _read_from_start(t.leaders[0], t, "chain_b", published + 1)
    observed["after_restart"] = [(_label(m), m.offset, m.rawsize) for m in again[-3:]]
    last = before[-1]
    answer["after a restart"] = {
        "offsets and raw sizes before it unchanged": [(m.offset, m.rawsize) for m in again[:-1]]
        == [(m.offset, m.rawsize) for m in before],
        "its first message at the last one's offset + rawsize": (last.offset or 0)
        + (last.rawsize or 0)
        == after.offset,
        "offset + rawsize == next offset": _chained(again),
        "PUB_TRACE answer == read back": (after.offset, after.rawsize)
        == (again[-1].offset, again[-1].rawsize),
    }
    return answer


# --------------------------------------------------------------------------------------
# Running them

SCENARIOS = ("ordered", "replay", "trace", "frames", "ext", "errors", "http", "chain")


def make_topics(run_id: str) -> dict[str, Topic]:
    p = f"sbs_{run_id}"
    return {
        "ord": Topic(f"{p}_ord", 4, ordered=True, channels=("ord",)),
        "replay": Topic(f"{p}_replay", 1),
        "trace": Topic(f"{p}_trace", 1, channels=("tr",)),
        "ext": Topic(f"{p}_ext", 1, ext=True),
        "nochan": Topic(f"{p}_nochan", 1, probe=False),
        "chain": Topic(f"{p}_chain", 1),
    }


async def run_scenarios(
    lookupd_http: str,
    nsqd_http: list[str] | None = None,
    *,
    only: Iterable[str] | None = None,
    observed: dict[str, Observed] | None = None,
    log: Callable[[str], None] | None = None,
    restart: Restart | None = None,
) -> dict[str, object]:
    """Run the scenarios against the cluster behind ``lookupd_http`` (host:port of its
    HTTP API). Returns {scenario: answer}; a scenario that could not run has the answer
    ``"ERROR: ..."``. ``observed`` (if given) receives raw facts per scenario;
    ``restart`` restarts one nsqd (see :data:`Restart`; without it the chain scenario
    stops before its restart)."""
    cluster = Cluster(lookupd_http, nsqd_http, log)
    wanted = list(only or SCENARIOS)
    observed = observed if observed is not None else {}
    topics = make_topics(uuid.uuid4().hex[:8])
    results: dict[str, object] = {}
    t0 = time.monotonic()
    setup = await asyncio.gather(
        *(cluster.create_topic(t) for t in topics.values()), return_exceptions=True
    )
    failed = [r for r in setup if isinstance(r, BaseException)]
    if failed:
        return {name: f"ERROR: setup: {failed[0]!r}" for name in wanted}
    observed["setup"] = {
        "seconds": round(time.monotonic() - t0, 1),
        "topics": {k: {"name": t.name, "seen": t.seen} for k, t in topics.items()},
    }
    runners: dict[str, Callable[[Observed], Awaitable[dict[str, Any]]]] = {
        "ordered": lambda o: scenario_ordered(cluster, topics["ord"], o),
        "replay": lambda o: scenario_replay(cluster, topics["replay"], o),
        "trace": lambda o: scenario_trace(cluster, topics["trace"], o),
        "frames": lambda o: scenario_frames(cluster, topics["trace"], topics["ext"], o),
        "ext": lambda o: scenario_ext(cluster, topics["ext"], o),
        "errors": lambda o: scenario_errors(cluster, topics, o),
        "http": lambda o: scenario_http(cluster, topics, o),
        "chain": lambda o: scenario_chain(cluster, topics["chain"], o, restart),
    }
    for name in wanted:
        obs: Observed = {}
        observed[name] = obs
        t1 = time.monotonic()
        try:
            results[name] = await asyncio.wait_for(runners[name](obs), 300)
        except Exception as e:
            results[name] = f"ERROR: {type(e).__name__}: {e}"
        obs["seconds"] = round(time.monotonic() - t1, 1)
        cluster.log(f"{name} done in {obs['seconds']}s")
    # plain JSON values (lists, not tuples), so that answers compare equal to literals
    normalized: dict[str, object] = json.loads(json.dumps(results))
    return normalized


def format_answer(answer: object) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lookupd-http", required=True, help="host:port of nsqlookupd's HTTP API")
    ap.add_argument(
        "--nsqd-http",
        action="append",
        default=[],
        help="host:port of an nsqd's HTTP API (repeat; default: the nodes lookupd lists)",
    )
    ap.add_argument("--only", action="append", choices=SCENARIOS, help="run only these")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument(
        "--observed", metavar="FILE", help="write the raw observations (hex, texts) as JSON"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = ap.parse_args(argv)
    observed: dict[str, Observed] = {}

    def log(s: str) -> None:
        if args.verbose:
            print(s, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    results = asyncio.run(
        run_scenarios(args.lookupd_http, args.nsqd_http, only=args.only, observed=observed, log=log)
    )
    log(f"total {time.monotonic() - t0:.1f}s")
    if args.observed:
        with open(args.observed, "w") as fh:
            json.dump(observed, fh, indent=1, sort_keys=True, default=repr)
    if args.json:
        print(json.dumps(results, indent=1, sort_keys=True))
    else:
        for name, answer in results.items():
            print(f"{name}: {format_answer(answer)}")
    ok = all(not (isinstance(a, str) and a.startswith("ERROR")) for a in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
