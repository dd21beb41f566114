"""The chaos workload: publishers that record every attempt, consumers that record every
delivery, both following each partition's leader through nsqlookupd as a client does.

Each message has a unique body. A publisher sends one PUB at a time and retries a body
until it is acknowledged; each attempt ends acknowledged (``OK``), refused (an error
frame) or unknown (no answer in time, or the connection closed). While it waits it looks
the partition up again, and gives the attempt up (unknown) as soon as another node leads:
so the time writes take to resume is the cluster's, not a client timeout's. Ordered
topics are published per key, one message after the other (the next only once the one
before is acknowledged), and consumed with SUB_ORDERED. With ``deferred_ms``, one more
publisher per partition of each unordered topic sends DPUB with that delay (its bodies
start with ``dpub:``), and the consumers of those topics requeue every tenth message
they are given for the first time with ``REQ <id> <requeue_ms>`` instead of finishing it,
so that the checker can tell a message delivered before its time.

Raw protocol V2 through nsqx.wire (the sans-IO codec), not nsqx's client: every attempt
and every answer is seen, and no client retry logic hides anything.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from nsqx.wire import commands as c
from nsqx.wire.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    FrameDecoder,
    decode_message,
    decode_youzan_message,
)

from chaos.cluster import LOOKUPD_HTTP, ChaosCluster

HEARTBEAT = b"_heartbeat_"
#: seconds a connection must stay open after a REQ for its delay to count as set
REQ_SETTLED = 1.0


@dataclass
class Attempt:
    """One PUB of a body: when it was sent and answered (time.time), where, and how."""

    sent: float
    done: float
    node: str  # the host name of the nsqd it went to
    outcome: str  # "ack" | "refused <code>" | "unknown <why>"


@dataclass
class Sent:
    body: bytes
    topic: str
    pid: int
    key: int | None = None
    seq: int | None = None
    #: DPUB: the delay asked for (ms)
    defer_ms: int = 0
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def acked(self) -> Attempt | None:
        for a in self.attempts:
            if a.outcome == "ack":
                return a
        return None


@dataclass
class Delivery:
    at: float
    topic: str
    pid: int
    node: str
    body: bytes
    attempts: int
    #: the message id as delivered
    id: bytes = b""
    #: finished (FIN); False: requeued with a delay (REQ)
    fin: bool = True


@dataclass
class Records:
    sent: dict[bytes, Sent] = field(default_factory=dict)
    delivered: list[Delivery] = field(default_factory=list)
    #: (topic, message id, body) -> when it was requeued with a delay, and the delay (s):
    #: by message, not by body (a body published twice, a retry whose first attempt was
    #: stored, is two messages)
    requeued: dict[tuple[str, bytes, bytes], tuple[float, float]] = field(default_factory=dict)

    def acked(self) -> list[Sent]:
        return [s for s in self.sent.values() if s.acked is not None]


class Link:
    """One V2 connection: frames in, commands out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: str):
        self.reader = reader
        self.writer = writer
        self.node = node
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, bytes]] = []

    @classmethod
    async def open(cls, ip: str, port: int, node: str, timeout: float = 1.0) -> Link:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
        # cancellation, and a run that failed then never finished cancelling its tasks
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(ip, port)
        writer.write(b"  V2")
        return cls(reader, writer, node)

    def send(self, data: bytes) -> None:
        # a connection the fault closed: the next read says so (writing would only make
        # asyncio log "socket.send() raised exception." once per write)
        if not self.writer.is_closing():
            self.writer.write(data)

    async def frame(self) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat (answered with NOP)."""
        while True:
            while not self.frames:
                data = await self.reader.read(1 << 16)
                if not data:
                    raise ConnectionError("closed")
                self.frames.extend(self.decoder.feed(data))
            ftype, body = self.frames.pop(0)
            if ftype == FRAME_RESPONSE and body == HEARTBEAT:
                self.send(c.nop())
                continue
            return ftype, body

    def close(self) -> None:
        self.writer.close()


async def lookup(cl: ChaosCluster, topic: str, pid: int, access: str) -> tuple[str, int] | None:
    """(ip, tcp port) of the partition's node for ``access`` (w: its leader), from the
    first nsqlookupd that lists it."""
    for host in cl.lookupd_hosts():
        doc = await cl.get(host, LOOKUPD_HTTP, f"/lookup?topic={topic}&access={access}")
        part = ((doc or {}).get("partitions") or {}).get(str(pid))
        if part:
            return str(part["broadcast_address"]), int(part["tcp_port"])
    return None


class Publisher:
    """Publishes unique bodies to one partition, retrying each until acknowledged."""

    def __init__(
        self,
        cl: ChaosCluster,
        rec: Records,
        topic: str,
        pid: int,
        name: str,
        key: int | None = None,
        timeout: float = 3.0,
        defer_ms: int = 0,
    ) -> None:
        self.cl = cl
        self.rec = rec
        self.topic = topic
        self.pid = pid
        self.name = name
        self.key = key
        self.timeout = timeout
        self.defer_ms = defer_ms
        self.link: Link | None = None
        self.address: tuple[str, int] | None = None

    def _node(self, ip: str) -> str:
        for name, p in self.cl.nsqd.items():
            if p.host.ip == ip:
                return name
        return ip

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        while not stop.is_set():
            if self.key is not None:
                body = f"o:{self.key}:{seq}".encode()
            elif self.defer_ms:
                body = f"dpub:{self.name}:{seq}".encode()
            else:
                body = f"{self.name}:{seq}".encode()
            sent = Sent(body, self.topic, self.pid, self.key, seq if self.key is not None else None)
            sent.defer_ms = self.defer_ms
            self.rec.sent[body] = sent
            while not stop.is_set():
                if await self.attempt(sent):
                    break
                await asyncio.sleep(0.05)
            seq += 1
        if self.link is not None:
            self.link.close()

    async def attempt(self, sent: Sent) -> bool:
        t0 = time.time()
        if self.link is None:
            address = await lookup(self.cl, self.topic, self.pid, "w")
            if address is None:
                return False
            try:
                self.link = await Link.open(*address, self._node(address[0]))
            except (OSError, TimeoutError):
                return False
            self.address = address
        link = self.link
        if self.defer_ms:
            # (DPUB names no partition: the node puts it in one it leads)
            link.send(c.dpub(self.topic, self.defer_ms, sent.body))
        else:
            link.send(c.pub(self.topic, sent.body, self.pid))
        answer = asyncio.ensure_future(link.frame())
        outcome = ""
        try:
            deadline = time.monotonic() + self.timeout
            while not outcome:
                done, _ = await asyncio.wait({answer}, timeout=0.25)
                if done:
                    try:
                        ftype, data = answer.result()
                    except (ConnectionError, OSError) as err:
                        outcome = f"unknown {err}"
                        break
                    if ftype == FRAME_RESPONSE and data == b"OK":
                        outcome = "ack"
                    elif ftype == FRAME_ERROR:
                        outcome = "refused " + data.split(b" ", 1)[0].decode(errors="replace")
                    else:
                        outcome = f"unknown frame {ftype}"
                    break
                if time.monotonic() > deadline:
                    outcome = "unknown timeout"
                    break
                # a new leader elsewhere: this one will not answer (or only refuse)
                now = await lookup(self.cl, self.topic, self.pid, "w")
                if now is not None and now != self.address:
                    outcome = "unknown leader moved"
        finally:
            if not answer.done():
                answer.cancel()
        sent.attempts.append(Attempt(t0, time.time(), link.node, outcome))
        if outcome != "ack":
            link.close()
            self.link = None
        return outcome == "ack"


class Consumer:
    """Reads one partition from its leader on channel ``c``, FINs every message (or, with
    ``requeue_ms``, requeues every tenth new one with that delay first)."""

    def __init__(
        self,
        cl: ChaosCluster,
        rec: Records,
        topic: str,
        pid: int,
        ordered: bool = False,
        requeue_ms: int = 0,
    ) -> None:
        self.cl = cl
        self.rec = rec
        self.topic = topic
        self.pid = pid
        self.ordered = ordered
        self.requeue_ms = requeue_ms
        self._new = 0
        #: (when, (topic, id, body)) of the REQs sent on the current connection
        self._reqs: list[tuple[float, tuple[str, bytes, bytes]]] = []
        self.link: Link | None = None
        self.address: tuple[str, int] | None = None

    async def _connect(self) -> bool:
        address = await lookup(self.cl, self.topic, self.pid, "r")
        if address is None:
            return False
        node = next((n for n, p in self.cl.nsqd.items() if p.host.ip == address[0]), address[0])
        try:
            link = await Link.open(*address, node)
            sub = c.sub_ordered if self.ordered else c.sub
            link.send(sub(self.topic, "c", self.pid))
            async with asyncio.timeout(2.0):
                ftype, data = await link.frame()
            if (ftype, data) != (FRAME_RESPONSE, b"OK"):
                link.close()
                return False
            link.send(c.rdy(200))
        except (OSError, TimeoutError, ConnectionError):
            return False
        self.link, self.address = link, address
        return True

    async def run(self, stop: asyncio.Event) -> None:
        quiet = 0.0
        while not stop.is_set():
            if self.link is None and not await self._connect():
                await asyncio.sleep(0.1)
                continue
            link = self.link
            assert link is not None
            try:
                async with asyncio.timeout(1.0):
                    ftype, data = await link.frame()
            except TimeoutError:
                quiet += 1.0
                if quiet >= 2.0:
                    quiet = 0.0
                    now = await lookup(self.cl, self.topic, self.pid, "r")
                    if now is not None and now != self.address:
                        self._drop()
                continue
            except (ConnectionError, OSError):
                self._drop()
                continue
            quiet = 0.0
            if ftype == FRAME_MESSAGE:
                # (an ordered subscription's frames carry the message's position too)
                msg = (
                    decode_youzan_message(data, False, True)
                    if self.ordered
                    else decode_message(data)
                )
                now = time.time()
                requeue = False
                key = (self.topic, bytes(msg.id), msg.body)
                if self.requeue_ms and key not in self.rec.requeued:
                    self._new += 1
                    requeue = self._new % 10 == 0
                self.rec.delivered.append(
                    Delivery(
                        now,
                        self.topic,
                        self.pid,
                        link.node,
                        msg.body,
                        msg.attempts,
                        bytes(msg.id),
                        fin=not requeue,
                    )
                )
                if requeue:
                    self.rec.requeued[key] = (now, self.requeue_ms / 1000)
                    self._reqs.append((now, key))
                    link.send(c.req(msg.id, self.requeue_ms))
                else:
                    link.send(c.fin(msg.id))
            elif ftype == FRAME_ERROR:
                self._drop()
        self._drop()

    def _drop(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
        # a REQ sent shortly before its connection closed may never have been processed:
        # its message comes back at once (in flight on a closed connection), so its
        # delay is not checked (it must still come back and be finished)
        now = time.time()
        for at, key in self._reqs:
            if now - at < REQ_SETTLED:
                self.rec.requeued[key] = (at, 0.0)
        self._reqs.clear()


@dataclass
class Workload:
    """The topics of a run and their publishers and consumers."""

    cl: ChaosCluster
    topics: list[tuple[str, int, bool]]  # (name, partitions, ordered)
    publishers_per_partition: int = 2
    #: DPUB publishers' delay (ms); 0: none
    deferred_ms: int = 0
    rec: Records = field(default_factory=Records)
    _pub_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _con_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)

    def start(self) -> None:
        for topic, partitions, ordered in self.topics:
            for pid in range(partitions):
                for i in range(self.publishers_per_partition):
                    key = pid + partitions * i if ordered else None
                    pub = Publisher(self.cl, self.rec, topic, pid, f"{topic}.{pid}.{i}", key)
                    self._tasks.append(asyncio.create_task(pub.run(self._pub_stop)))
                if self.deferred_ms and not ordered:
                    pub = Publisher(
                        self.cl, self.rec, topic, pid, f"{topic}.{pid}", defer_ms=self.deferred_ms
                    )
                    self._tasks.append(asyncio.create_task(pub.run(self._pub_stop)))
                requeue = 3000 if self.deferred_ms and not ordered else 0
                con = Consumer(self.cl, self.rec, topic, pid, ordered, requeue)
                self.consumers.append(con)
                self._tasks.append(asyncio.create_task(con.run(self._con_stop)))

    async def stop_publishing(self) -> None:
        self._pub_stop.set()

    async def drain(self, idle: float = 8.0, limit: float = 90.0) -> None:
        """Consume until every acknowledged body was delivered, or nothing new came for
        ``idle`` seconds (then what is missing is lost), at most ``limit`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        last_count, last_change = -1, loop.time()
        while loop.time() < end:
            got = {d.body for d in self.rec.delivered if d.fin}
            if all(s.body in got for s in self.rec.acked()):
                break
            if len(self.rec.delivered) != last_count:
                last_count, last_change = len(self.rec.delivered), loop.time()
            elif loop.time() - last_change > idle:
                break
            await asyncio.sleep(0.2)
        self._con_stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {"sent": len(self.rec.sent), "acked": len(self.rec.acked())}
