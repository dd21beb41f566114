"""One connection subscribed to every shard of a sharded topic: the fan-in.

With ``--worker-shards`` a topic of NSQ 1.3 has one shard (a partition) in each worker
of the node (nsqx.nsqd.workers.shards): a publish stays in the worker that took it. A
consumer that names no partition must still get every message of the topic, so its
connection subscribes to every shard: its own worker's directly (a :class:`LocalShard`
in that shard's channel), the others' through the links (a proxy consumer there,
nsqx.nsqd.workers.proxy). A node restarted with fewer workers (or one) keeps doing this
over the shards it holds.

RDY stays a bound over all of them. The connection's RDY is split into *grants*, one
per shard, whose sum never passes it: a shard's channel delivers while that shard's
messages in flight are below its grant. Grants follow the messages:

- at first each other worker's shard gets 1 and the connection's own worker's shard the
  rest (deliveries from it take no hop); with a RDY below the number of shards, its own
  first;
- a shard whose channel has messages while none of its consumers can take one says so
  (:meth:`FanIn.want`; the channel's ``starved``), and takes it back once the channel
  has none left (``sated``: else its old ask keeps it from giving up the RDY it holds);
  spare RDY goes to it at once, else some is taken back from a shard with nothing to
  send, or from one above its share when all are busy (another worker's shard: a
  quarter of an even share; this worker's: the rest, so that most deliveries take no
  hop); with a RDY below the number of busy shards they take turns;
- RDY taken back is reused as the shard's messages in flight go down (a local shard's
  are looked at; a remote one reports its count over the link, each time it went down,
  until it is within the lower grant), so the messages in flight over all shards never
  pass the connection's RDY, and messages a consumer holds count for what they are (a
  consumer that finishes a batch only once RDY's worth arrived gets the rest).

FIN, REQ and TOUCH go to the shard in the message id's high bits (nsqx.nsqd.guid).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Protocol

from nsqx.nsqd import clock
from nsqx.nsqd.guid import PARTITION_SHIFT
from nsqx.wire.commands import SUB_PLAIN

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.wire import commands as cmd
    from nsqx.wire.errors import ProtocolError
    from nsqx.wire.identify import ClientSettings

#: a message id as a client sees it: 16 hex characters, whose first 4 hold its shard
#: (the partition, above bit PARTITION_SHIFT, with two bits of the sequence)
HEX_ID_LEN: Final = 16
SHARD_PREFIX_LEN: Final = 4

#: a shard that delivered nothing for this long (seconds) gives its RDY to one that asks
IDLE_AFTER = 0.05
#: a shard that asked for this long (seconds) gets RDY from busy shards too, one at a
#: time: with a RDY below the number of busy shards, they take turns
TURN_AFTER = 0.02
#: RDY is taken back from busy shards at most this often (seconds): shards that keep
#: asking then move RDY in steps, not at every message
TAKE_EVERY = 0.005


class FanInClient(Protocol):
    """What the fan-in needs of its connection (ClientV2)."""

    remote_address: str
    msg_timeout: float
    sample_rate: int
    settings: ClientSettings

    def ready(self) -> int: ...

    def shard_send(
        self, shard: LocalShard, frames: list[bytes], ids: list[bytes], flush: bool
    ) -> float: ...

    def close(self) -> None: ...

    def fail(self, err: ProtocolError) -> None: ...

    def notice(self, frame: bytes) -> None: ...


class Source:
    """One shard of a fan-in: its grant and what is known of its use."""

    #: the shard (partition id)
    partition: int
    #: the RDY it may use now
    grant = 0
    #: an upper bound of its messages in flight (a remote shard's, after its grant was
    #: lowered, is the grant before until it reports fewer in flight)
    committed = 0
    #: when it last delivered (clock.monotonic)
    last_delivery = 0.0
    #: it said it has messages and no room (cleared when its grant grows)
    wanting = False
    #: since when (clock.monotonic)
    wanting_since = 0.0

    def set_grant(self, n: int) -> None:
        raise NotImplementedError

    def in_use(self) -> int:
        """The most of the connection's RDY it may be using now."""
        return max(self.grant, self.committed)

    def idle(self, now: float) -> bool:
        """Whether it has nothing to send, as far as is known (a remote shard: it
        delivered nothing lately)."""
        return now - self.last_delivery > IDLE_AFTER


def fanin_wanted(ev: cmd.Sub, settings: ClientSettings) -> bool:
    """Whether a SUB, on a sharded topic, subscribes to every shard: an NSQ 1.3
    client's plain SUB that names no partition (a Youzan client names its partitions)."""
    return ev.partition < 0 and ev.mode == SUB_PLAIN and not settings.youzan


def partition_of(msg_id: bytes) -> int:
    """The partition (shard) a hex message id was made in (nsqx.nsqd.guid)."""
    return int(msg_id[:4], 16) >> (PARTITION_SHIFT - 48)


class LocalShard(Source):
    """The connection's consumer in a shard of its own worker (a channel's Consumer)."""

    #: one shard of a connection that reads them all: /stats counts the connection on
    #: shard 0 only
    fans_in = True

    def __init__(self, fanin: FanIn, channel: Channel) -> None:
        client = fanin.client
        self.fanin = fanin
        #: the connection, for /stats (nsqx.nsqd.stats shows it with this shard's counts)
        self.fanin_client = client
        self.channel = channel
        self.partition = channel.partition.id
        #: the channel tells it when it has messages and no consumer with room
        self.wants_starved = True
        #: more in flight than granted (its grant was lowered): until it is not, each
        #: FIN or REQ of it frees RDY for another shard
        self.over = False
        self.remote_address = client.remote_address
        self.msg_timeout = client.msg_timeout
        self.sample_rate = client.sample_rate
        self.settings = client.settings

    def __repr__(self) -> str:
        return f"<shard {self.partition} of {self.remote_address}>"

    # -- as the channel's Consumer

    def send(self, frames: list[bytes], ids: list[bytes], flush: bool) -> float:
        self.last_delivery = clock.monotonic()
        return self.fanin.client.shard_send(self, frames, ids, flush)

    def notice(self, frame: bytes) -> None:
        self.fanin.client.notice(frame)

    def close(self) -> None:
        self.fanin.client.close()

    def fail(self, err: ProtocolError) -> None:
        self.fanin.client.fail(err)

    def starved(self) -> None:
        """The channel has messages and none of its consumers has room."""
        if not self.wanting:
            self.fanin.want(self)

    def sated(self) -> None:
        """The channel has no message left."""
        self.wanting = False

    # -- as a source

    def set_grant(self, n: int) -> None:
        if n > self.grant:
            self.wanting = False
        self.grant = n
        self.over = self.held() > n
        self.channel.ready_changed(self, n)
        self.channel.notify()  # (with no room and messages, it asks again)

    def held(self) -> int:
        held = self.channel.held_by(self)
        return len(held) if held is not None else 0

    def in_use(self) -> int:
        return max(self.grant, self.held())

    def idle(self, now: float) -> bool:
        channel = self.channel
        return not channel.flight.requeued and channel.partition.visible_end <= channel.cursor


class FanIn:
    """A connection's subscription to every shard of a topic (see the module)."""

    def __init__(self, client: FanInClient) -> None:
        self.client = client
        self.sources: list[Source] = []
        self.by_partition: dict[int, Source] = {}
        #: a hex id's first 4 characters -> its shard (they hold the partition: one
        #: dictionary lookup per FIN rather than a parse)
        self._by_prefix: dict[bytes, Source | None] = {}
        #: the connection's RDY as last split
        self.rdy = 0
        #: when RDY may next be taken back from a shard (clock.monotonic)
        self._next_take = 0.0
        self._later: asyncio.TimerHandle | None = None

    def add(self, source: Source) -> None:
        self.sources.append(source)
        self.by_partition[source.partition] = source

    def drop(self, source: Source) -> None:
        """Forget a shard whose worker went away while the node stops."""
        if source in self.sources:
            self.sources.remove(source)
            self.by_partition.pop(source.partition, None)
            self._by_prefix.clear()
            self.freed()

    def local(self) -> list[LocalShard]:
        return [s for s in self.sources if isinstance(s, LocalShard)]

    def source_of(self, msg_id: bytes) -> Source | None:
        """The shard a hex message id came from (None: not one of them)."""
        prefix = msg_id[:SHARD_PREFIX_LEN]
        try:
            return self._by_prefix[prefix]
        except KeyError:
            pass
        try:
            src = self.by_partition.get(partition_of(msg_id))
        except ValueError:
            return None
        if len(self._by_prefix) < 1024:
            self._by_prefix[prefix] = src
        return src

    # -- splitting RDY

    def ready_changed(self) -> None:
        """The connection's RDY (or its state: closing, output paused) changed."""
        n = self.client.ready()
        if n == self.rdy:
            return
        first = self.rdy == 0
        self.rdy = n
        if n <= 0:
            for s in self.sources:
                if s.grant:
                    s.set_grant(0)
            return
        granted = sum(s.grant for s in self.sources)
        if granted > n:
            self._shrink(granted - n)
        if first and not any(s.wanting for s in self.sources):
            self._initial()
        self.rebalance()
        spare = self.spare()
        local = self.local()
        if spare > 0 and local:
            # what no shard asked for yet: this worker's (most deliveries take no hop)
            own = local[0]
            own.set_grant(own.grant + spare)

    def _initial(self) -> None:
        """The first split: 1 to each other worker's shard, the rest to this one's."""
        local = self.local()
        remote = [s for s in self.sources if not isinstance(s, LocalShard)]
        spare = self.rdy - sum(s.in_use() for s in self.sources)
        order: list[Source] = [*local, *remote]
        for s in order:
            if spare <= 0:
                return
            if s.grant == 0:
                s.set_grant(1)
                spare -= 1
        if spare > 0 and local:
            own = local[0]
            own.set_grant(own.grant + spare)

    def _shrink(self, excess: int) -> None:
        """Lower the largest grants by ``excess`` in all (the RDY went down)."""
        for s in sorted(self.sources, key=lambda s: s.grant, reverse=True):
            if excess <= 0:
                return
            cut = min(excess, s.grant)
            if cut:
                s.set_grant(s.grant - cut)
                excess -= cut

    def spare(self) -> int:
        return self.rdy - sum(s.in_use() for s in self.sources)

    def want(self, source: Source) -> None:
        """``source`` has messages and no room: give it RDY, from what is spare or
        taken back from a shard with less need."""
        if not source.wanting:
            source.wanting = True
            source.wanting_since = clock.monotonic()
        self._serve()

    def freed(self) -> None:
        """Messages in flight went down somewhere (a FIN, REQ, a timeout, a remote
        shard's confirmation): give what is now spare to the shards that want it."""
        for s in self.sources:
            if isinstance(s, LocalShard) and s.over:
                s.over = s.held() > s.grant
        if any(s.wanting for s in self.sources):
            self._serve()

    def _serve(self) -> None:
        self.rebalance()
        if self.rdy <= 0:
            return
        now = clock.monotonic()
        if now < self._next_take:
            if self._later is None:
                loop = asyncio.get_running_loop()
                self._later = loop.call_later(self._next_take - now, self._serve_later)
            return
        self._next_take = now + TAKE_EVERY
        for s in self.sources:
            if s.wanting and isinstance(s, LocalShard) and s.idle(now):
                s.wanting = False  # (what it asked for went to another consumer)
        n = len(self.sources)
        # busy everywhere, a shard of another worker keeps a quarter of an even share
        # and this worker's the rest: most deliveries take no hop
        far = max(self.rdy // (4 * n), 1)
        near = max(self.rdy - far * (n - 1), 1)
        for source in self.sources:
            if not source.wanting:
                continue
            # take back from a shard with nothing to send (all of it: a consumer that
            # waits for RDY messages before it answers any must get them from one
            # shard), else from one above its share (half the excess)
            best: Source | None = None
            best_take = 0
            turn = now - source.wanting_since > TURN_AFTER
            for s in self.sources:
                if s is source or s.grant == 0:
                    continue
                if s.idle(now) and not s.wanting:
                    take = s.grant
                else:
                    fair = near if isinstance(s, LocalShard) else far
                    take = (s.grant - fair + 1) // 2
                    if turn and take <= 0 and s.grant > 0 and source.grant == 0:
                        take = 1  # its turn: one from a busy shard
                if take > best_take:
                    best, best_take = s, take
            if best is None:
                if not turn and source.grant == 0 and self._later is None:
                    # nothing to take yet: look again when its turn comes
                    due = source.wanting_since + TURN_AFTER - now
                    loop = asyncio.get_running_loop()
                    self._later = loop.call_later(max(due, 0.001), self._serve_later)
                continue
            best.set_grant(best.grant - best_take)
            self.rebalance()  # (a local shard's RDY is free at once when not in flight)

    def _serve_later(self) -> None:
        self._later = None
        if self.sources and any(s.wanting for s in self.sources):
            self._serve()

    def rebalance(self) -> None:
        """Give spare RDY to the shards that asked for it, evenly."""
        spare = self.spare()
        if spare <= 0:
            return
        wanting = [s for s in self.sources if s.wanting]
        if not wanting:
            return
        share = -(-spare // len(wanting))
        for s in wanting:
            give = min(share, spare)
            if give <= 0:
                break
            s.set_grant(s.grant + give)
            s.wanting = False
            spare -= give

    def tick(self) -> None:
        """Periodic: messages that timed out free RDY too (no one is told of those)."""
        if self.rdy > 0:
            self.freed()

    def close(self) -> None:
        """The connection closed: leave every shard."""
        for s in self.sources:
            leave = getattr(s, "unsubscribe", None)
            if isinstance(s, LocalShard):
                s.channel.remove_client(s)
            elif leave is not None:
                leave()
        self.sources = []
        self.by_partition = {}
        self._by_prefix.clear()
        if self._later is not None:
            self._later.cancel()
            self._later = None
