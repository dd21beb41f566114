"""Publishes to a partition another worker owns: forwarded, executed there, answered back.

The connection that took the publish (its worker, the *origin*) keeps the client's
state: its AUTH, its answers in order, its counts. It reserves the publish's answer in
its output (an OK, the usual answer), sends the publish to the owner over the link
(:mod:`.links`, one frame per loop turn for all its connections), and holds that answer
and everything after it, as it holds any answer until its publish is acknowledged. The
owner executes it exactly as its own connections' publishes (nsqx.nsqd.publishing: the
same checks, the same group commit, fsync and ISR), and answers once the publish is
acknowledged: the answer frame itself (OK, PUB_TRACE's answer, or the error), which
replaces the reserved one. If the link to the owner breaks first, the connection closes
without answering, as after a failed replication: the publisher does not know, and
publishes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from nsqx.nsqd.publishing import ext_fields, pub_partition, traced_answer
from nsqx.nsqd.workers.handoff import Handoff
from nsqx.nsqd.workers.links import Link, PeerLinks
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.nsqd.workers.spec import WorkerSpec
from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import OK, encode_error, encode_response

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition

log = logging.getLogger("nsqx.nsqd")

OK_FRAME: Final = encode_response(OK)

#: items on the links
PUB: Final = "pub"
PUB_ANSWER: Final = "pub_ans"
#: the plain publishes of one loop turn to one partition, as one batch
PUB_GROUP: Final = "pubs"
PUB_GROUP_OK: Final = "pubs_ok"
#: a group is sent before its bodies pass this size (a batch record stays reasonable)
GROUP_BYTES: Final = 1 << 20

#: verbs whose publishes of one turn to one partition are grouped
_GROUPED: Final = frozenset(("PUB", "PUBS", "MPUB"))

# what a forwarded publish is (the verb says how it is answered)
V_PUB: Final = "PUB"
#: pipelined PUBs of one topic, read at once (nsqx.wire.commands.Pubs): one answer each
V_PUBS: Final = "PUBS"
V_MPUB: Final = "MPUB"
V_DPUB: Final = "DPUB"
V_PUB_TRACE: Final = "PUB_TRACE"
V_MPUB_TRACE: Final = "MPUB_TRACE"
V_PUB_EXT: Final = "PUB_EXT"
V_MPUB_EXT: Final = "MPUB_EXT"


class LinkLost(Exception):
    """The owner's worker went away before it answered."""


class Ticket:
    """One forwarded publish, waiting for its owner's answer."""

    __slots__ = ("answer", "answers", "fatal", "group", "on_answer", "slot")

    def __init__(
        self,
        slot: int,
        on_answer: Callable[[Ticket, BaseException | None], None],
        answers: int = 1,
    ) -> None:
        #: where its answer sits in the connection's output (counted from its start)
        self.slot = slot
        #: the answers it stands for (pipelined PUBs read as one event: one each)
        self.answers = answers
        self.on_answer = on_answer
        #: the connection's AckGroup, once the read that published ended
        self.group: Any = None
        #: the owner's answer: b"" keeps the OK reserved for it, None closes the
        #: connection unanswered (not held by the ISR), else the frame to answer
        self.answer: bytes | None = b""
        self.fatal = False


class _Group:
    """Plain publishes of one loop turn to one partition, sent as one batch."""

    __slots__ = ("bodies", "mpubs", "seqs", "size")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        #: per publish: an MPUB (for the error it answers if the write fails)
        self.mpubs: list[bool] = []
        self.bodies: list[bytes] = []
        self.size = 0


class WorkerSet:
    """This worker's place in its node: its index, how many there are, the links
    between them, and the forwarding of publishes both ways."""

    def __init__(self, nsqd: NSQD, spec: WorkerSpec) -> None:
        self.nsqd = nsqd
        self.spec = spec
        self.index = index = spec.index
        self.count = count = spec.count
        self.links = PeerLinks(index, count, spec.prefix, self._handle)
        self._tickets: dict[Link, dict[int, Ticket]] = {}
        self._seq = 0
        #: this turn's groups, by (owner, topic, partition)
        self._groups: dict[tuple[int, str, int], _Group] = {}
        self._groups_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: more item kinds (subscriptions, calls), by their first field
        self.handlers: dict[str, Callable[[Link, tuple[Any, ...]], None]] = {
            PUB: self._on_pub,
            PUB_ANSWER: self._on_pub_answer,
            PUB_GROUP: self._on_pub_group,
            PUB_GROUP_OK: self._on_pub_group_ok,
        }
        #: plain connections moved to the worker that owns what they use (None: off,
        #: --worker-handoff=false); nsqd sets its adopt callback
        self.handoff: Handoff | None = (
            Handoff(spec.prefix, index, spec.token) if nsqd.options.worker_handoff else None
        )
        # (imported here: proxy.py imports this module)
        from nsqx.nsqd.workers.proxy import SubProxies

        #: subscriptions to partitions of other workers, both ways (its kinds in handlers)
        self.subs = SubProxies(self)
        from nsqx.nsqd.workers.shards import Shards

        #: topics of NSQ 1.3 with one shard per worker (made so with --worker-shards;
        #: one sharded before stays so)
        self.shards: Shards | None = Shards(self, nsqd.options.worker_shards)

    @property
    def lead(self) -> bool:
        """Worker 0 speaks for the node where one voice is needed (nsqlookupd)."""
        return self.index == 0

    def internal_http(self, index: int) -> str:
        """host:port of worker ``index``'s own HTTP API (loopback), for forwarding."""
        return f"127.0.0.1:{self.spec.internal_http_ports[index]}"

    def owner(self, topic: str, partition: int) -> int:
        if partition < 0 and self.shards is not None and topic in self.shards.topics:
            return self.index  # a sharded topic: this worker's shard
        return owner_of(topic, partition, self.count)

    @property
    def route_generation(self) -> int:
        """Changes when where a publish naming no partition goes may have changed."""
        return self.shards.generation if self.shards is not None else 0

    def owns(self, topic: str, partition: int) -> bool:
        return owner_of(topic, partition, self.count) == self.index

    async def start(self) -> None:
        # (kept: asyncio.get_running_loop() makes a getpid system call each time)
        self._loop = asyncio.get_running_loop()
        await self.links.start()
        if self.handoff is not None:
            self.handoff.start()
        if self.shards is not None:
            self.shards.start()

    async def close(self) -> None:
        if self.shards is not None:
            self.shards.close()
        if self.handoff is not None:
            self.handoff.close()
        await self.links.close()

    def _handle(self, link: Link, item: tuple[Any, ...]) -> None:
        handler = self.handlers.get(item[0])
        if handler is None:
            log.error("WORKERS: unknown item %r from worker %d", item[0], link.peer)
            return
        handler(link, item)

    # -- the origin's side ------------------------------------------------------------

    def forward(
        self,
        owner: int,
        slot: int,
        on_answer: Callable[[Ticket, BaseException | None], None],
        verb: str,
        topic: str,
        partition: int,
        bodies: list[bytes],
        defer_ms: int = 0,
        traces: list[int] | None = None,
        headers: list[bytes] | None = None,
    ) -> Ticket:
        """Send a publish to its owner; ``on_answer(ticket, error)`` is called once with
        its answer in the ticket (or LinkLost)."""
        link = self.links.link(owner)
        tickets = self._tickets.get(link)
        if tickets is None:
            tickets = self._tickets[link] = {}
            link.on_close.append(self._link_lost)
        self._seq += 1
        seq = self._seq
        ticket = Ticket(slot, on_answer, len(bodies) if verb == V_PUBS else 1)
        tickets[seq] = ticket
        if verb in _GROUPED:
            # the plain publishes of a turn to one partition go as one batch: one
            # publish, one acknowledgement and one answer at the owner for them all
            key = (owner, topic, partition)
            group = self._groups.get(key)
            if group is None or group.size >= GROUP_BYTES:
                if group is not None:
                    self._send_group(key, group)
                group = self._groups[key] = _Group()
                if not self._groups_scheduled:
                    self._groups_scheduled = True
                    loop = self._loop or asyncio.get_running_loop()
                    loop.call_soon(self._send_groups)
            group.seqs.append(seq)
            group.mpubs.append(verb == V_MPUB)
            group.bodies.extend(bodies)
            group.size += sum(map(len, bodies))
            return ticket
        self._send_groups(owner)  # what came before it on this link goes first
        link.send((PUB, seq, verb, topic, partition, bodies, defer_ms, traces, headers))
        return ticket

    def _send_group(self, key: tuple[int, str, int], group: _Group) -> None:
        owner, topic, partition = key
        self.links.link(owner).send(
            (PUB_GROUP, group.seqs, group.mpubs, topic, partition, group.bodies)
        )

    def _send_groups(self, owner: int = -1) -> None:
        """Send this turn's groups (to ``owner`` only, or all at the turn's end)."""
        if owner < 0:
            self._groups_scheduled = False
        groups = self._groups
        if not groups:
            return
        for key in list(groups):
            if owner < 0 or key[0] == owner:
                self._send_group(key, groups.pop(key))

    def _on_pub_group_ok(self, link: Link, item: tuple[Any, ...]) -> None:
        tickets = self._tickets.get(link)
        if tickets is None:
            return
        for seq in item[1]:
            ticket = tickets.pop(seq, None)
            if ticket is not None:
                ticket.on_answer(ticket, None)

    def _on_pub_answer(self, link: Link, item: tuple[Any, ...]) -> None:
        _, seq, frame, fatal = item
        tickets = self._tickets.get(link)
        ticket = tickets.pop(seq, None) if tickets is not None else None
        if ticket is None:
            return
        ticket.answer = frame
        ticket.fatal = fatal
        ticket.on_answer(ticket, None)

    def _link_lost(self, link: Link) -> None:
        tickets = self._tickets.pop(link, None)
        if not tickets:
            return
        err = LinkLost(f"worker {link.peer} went away before acknowledging")
        for ticket in tickets.values():
            ticket.on_answer(ticket, err)

    # -- the owner's side -------------------------------------------------------------

    def _on_pub_group(self, link: Link, item: tuple[Any, ...]) -> None:
        _, seqs, mpubs, topic, pid, bodies = item
        nsqd = self.nsqd
        try:
            part = pub_partition(nsqd, nsqd.topics, topic, pid)
            part.publish(bodies)
        except ProtocolError as err:
            frame = encode_error(err)
            for seq in seqs:
                link.send((PUB_ANSWER, seq, frame, err.fatal))
            return
        except OSError as err:
            log.error("TOPIC(%s): write failed: %s", topic, err)
            _GroupAnswer(link, seqs, mpubs)(err)
            return
        if not part.durable:
            link.send((PUB_GROUP_OK, seqs))
            return
        part.when_acknowledged(_GroupAnswer(link, seqs, mpubs))

    def _on_pub(self, link: Link, item: tuple[Any, ...]) -> None:
        _, seq, verb, topic, pid, bodies, defer_ms, traces, headers = item
        nsqd = self.nsqd
        exts: list[tuple[int, bytes]] | None = None
        trace_id: int | None = None
        try:
            if headers is not None:
                trace_list, exts = ext_fields(nsqd, topic, headers)
                if verb == V_PUB_EXT:
                    trace_id = trace_list[0]
                    traces = [trace_id] if trace_id else None
                else:
                    traces = [t or 0 for t in trace_list] if any(trace_list) else None
            elif verb == V_PUB_TRACE:
                trace_id = traces[0]
            part = pub_partition(nsqd, nsqd.topics, topic, pid)
            if not self.owns(topic, part.id):
                raise ProtocolError("E_TOPIC_NOT_EXIST", "")
            published = part.publish(bodies, defer_ms, traces, exts)
        except ProtocolError as err:
            link.send((PUB_ANSWER, seq, encode_error(err), err.fatal))
            return
        except OSError as err:
            log.error("TOPIC(%s): write failed: %s", topic, err)
            link.send((PUB_ANSWER, seq, _write_failed(verb, err), True))
            return
        if verb == V_MPUB_TRACE:
            answer = traced_answer(published, 0, published.raw_size)
        elif trace_id is not None:
            answer = traced_answer(published, trace_id, published.raw_size)
        else:
            answer = b""  # the OK the origin reserved
        if not part.durable:
            link.send((PUB_ANSWER, seq, answer, False))
            return
        part.when_acknowledged(_Answer(link, seq, answer, verb, part))


def _write_failed(verb: str, err: OSError) -> bytes:
    """The answer to a publish whose write or fsync failed, as a single nsqd gives it:
    E_PUB_FAILED, E_MPUB_FAILED or E_DPUB_FAILED (fatal)."""
    base = "MPUB" if verb.startswith("MPUB") else ("DPUB" if verb == V_DPUB else "PUB")
    return encode_error(ProtocolError(f"E_{base}_FAILED", f"{base} failed {err}"))


class _Answer:
    """Sends a forwarded publish's answer once its partition acknowledged it."""

    __slots__ = ("answer", "link", "part", "seq", "verb")

    def __init__(self, link: Link, seq: int, answer: bytes, verb: str, part: Partition):
        self.link = link
        self.seq = seq
        self.answer = answer
        self.verb = verb
        self.part = part

    def __call__(self, err: BaseException | None) -> None:
        if err is None:
            self.link.send((PUB_ANSWER, self.seq, self.answer, False))
        elif isinstance(err, OSError):
            self.link.send((PUB_ANSWER, self.seq, _write_failed(self.verb, err), True))
        else:
            # not held by the ISR: the origin closes without answering
            log.error("TOPIC(%s): %s", self.part.topic.name, err)
            self.link.send((PUB_ANSWER, self.seq, None, True))


class _GroupAnswer:
    """Answers a group of forwarded publishes once their partition acknowledged them."""

    __slots__ = ("link", "mpubs", "seqs")

    def __init__(self, link: Link, seqs: list[int], mpubs: list[bool]) -> None:
        self.link = link
        self.seqs = seqs
        self.mpubs = mpubs

    def __call__(self, err: BaseException | None) -> None:
        link = self.link
        if err is None:
            link.send((PUB_GROUP_OK, self.seqs))
            return
        for seq, mpub in zip(self.seqs, self.mpubs, strict=True):
            if isinstance(err, OSError):
                link.send((PUB_ANSWER, seq, _write_failed(V_MPUB if mpub else V_PUB, err), True))
            else:
                link.send((PUB_ANSWER, seq, None, True))
