"""Replicas: the coordinator's decisions for topics with ``replicator`` > 1.

For each partition the coordinator keeps, in the topic's record, its placement (leader
first), its ISR and its epoch, and tells every node that holds a replica
(``POST nsqd/partition/role``) whenever one of them changes, and whenever a node
registers the partition (so a node that restarted learns the current role before it
accepts a write).

* **A node is lost** when its registration connection closes, or stays silent for the
  node timeout (:mod:`nsqx.lookupd.liveness`: a stopped, hung or cut-off node), and it
  has not come back once any lease it held has surely ended, and (several nsqlookupd
  over etcd) no other nsqlookupd holds a session of it
  (:mod:`nsqx.lookupd.node_sessions`): a node cut off from the leading nsqlookupd only
  keeps its roles, and a node whose last session ends anywhere is judged even if it
  never connected to the leading one. For each partition it led, the coordinator holds
  an *election* (below), moves the old leader to the end of the placement (it will catch
  up when it returns, after cutting what the new leader never had) and bumps the epoch.
  An ISR member that is lost leaves the ISR.
* **Elections** (nsqx.lookupd.elections) never pick a replica with less than the
  committed log: the coordinator asks the live replicas for their log (``GET
  nsqd/partition/state``) and elects once an intact in-sync replica answered, or enough
  replicas that every write quorum includes one of them; the newest log wins. Until
  then the partition has no leader; the election is tried again as nodes come back, and
  when a node that led the partition when it stopped asks for it
  (``/partition/leader/restarted``: a restarted node never takes a leadership back
  without one).
* **Write quorum** (Youzan's rule): writes need an ISR of more than half of the
  replicas. When a lost node leaves an ISR too small for writes, a live node that holds
  no replica of the partition takes the lost node's place in the placement: it is asked
  to create the partition, catches up from the leader, and joins the ISR.
* **Leaders report** a member that stays behind (``/partition/isr/leave``) and a replica
  that caught up (``/partition/isr/join``), in the epoch they hold (a report of another
  epoch is refused: it was decided on an ISR that is no longer the partition's).
* **Followers report** a leader they cannot hear (``/partition/leader/unreachable``):
  when in-sync followers that could write without it (more than half of the replicas)
  all report it, the leadership moves to one of them, as after a loss.
* **Fencing.** A leader acknowledges writes only while it holds a lease (a PING
  answered by an nsqlookupd) and after the coordinator confirmed its leadership in that
  lease (``/cluster/node/roles``). A node is judged lost only after any lease it held
  has ended; a live leader that is replaced (a move, a drain, an unreachable leader)
  must step down (it is told its new role) before the new leader is confirmed.

Every change is one new record, saved before any node is told, in a new epoch; nodes
refuse a role of an older epoch than the one they hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from nsqx.lookupd.elections import LogState, choose, log_state
from nsqx.lookupd.nsqd_client import NsqdCallError
from nsqx.lookupd.registration_db import Peer
from nsqx.lookupd.topic_record import TopicRecord

if TYPE_CHECKING:
    from nsqx.lookupd.liveness import Timing
    from nsqx.lookupd.node_sessions import NodeSessions
    from nsqx.lookupd.nsqd_client import NsqdClient

log = logging.getLogger("nsqx.lookupd")


class CoordinatorSeam(Protocol):
    """What Replicas uses of its coordinator (:class:`nsqx.lookupd.coordinator.Coordinator`):
    the records and the one way to change them, which nodes are alive, and the calls
    to nsqd. Tests drive Replicas on a fake of this alone."""

    @property
    def timing(self) -> Timing:
        """Heartbeats, leases and the node timeout."""

    @property
    def records(self) -> Mapping[str, TopicRecord]:
        """Every partitioned topic's current record (changed only through save)."""

    @property
    def client(self) -> NsqdClient:
        """The calls to nodes' HTTP APIs."""

    @property
    def sessions(self) -> NodeSessions:
        """Which nsqlookupd hold a session of each node (several over etcd)."""

    @property
    def leading(self) -> bool:
        """This nsqlookupd administers the topics now."""

    @property
    def admin_lock(self) -> asyncio.Lock:
        """Held by every administrative change (each reads, decides and writes)."""

    def nodes(self) -> dict[str, Peer]:
        """Placement targets connected and heard from, by node id."""

    def alive(self, node_id: str) -> bool:
        """The node is alive here, or holds a session with another nsqlookupd."""

    def may_decide(self) -> bool:
        """This nsqlookupd's word counts now (it leads, and its leadership holds)."""

    async def save(self, topic: str, record: TopicRecord) -> None:
        """Store a topic's new record (it becomes the current one)."""

    def load(self) -> Counter[str]:
        """Replicas held per node id."""

    def holds(self, peer: Peer, topic: str, partition: int) -> bool:
        """The node registered the partition on its current connection."""

    def ask_to_create(self, peer: Peer, topic: str, partition: int, record: TopicRecord) -> None:
        """Ask the node to create the partition (in the background)."""


class Replicas:
    """Leaders, ISRs and epochs of replicated partitions; elections."""

    #: seconds a node whose connection closed has at least to come back before it is
    #: lost (also bounded below by the end of any lease it held)
    lost_grace = 0.3
    #: seconds before a role that could not be told is told again
    retell_delay = 0.5

    def __init__(self, coord: CoordinatorSeam) -> None:
        self.coord = coord
        # (connection id, topic, partition) -> the epoch last told on that connection
        self._told: dict[tuple[str, str, int], int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # nodes whose connection closed while this nsqlookupd did not lead (several
        # nsqlookupd over etcd): judged when it starts leading
        self._gone_unjudged: set[str] = set()
        # nodes being judged (lost or not)
        self._judging: set[str] = set()
        # node -> the latest loop time before which it may not be judged (the end of
        # any lease it may hold, as its connections closed)
        self._not_before: dict[str, float] = {}
        # (topic, partition) -> former leaders that have not yet taken a role in which
        # they do not lead: the new leader is not confirmed until they have, or are lost
        self._stepping_down: dict[tuple[str, int], set[str]] = {}
        # (topic, partition, epoch) -> in-sync follower -> loop time of its report that
        # it cannot hear the leader
        self._unreachable: dict[tuple[str, int, int], dict[str, float]] = {}
        # partitions whose lost leader could not be replaced yet (too few replicas
        # answered): tried again as nodes come back
        self._leaderless: set[tuple[str, int]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            # e.g. this lookupd stopped leading while deciding (etcd refused the write)
            log.warning("REPL: %s failed: %s: %s", task.get_coro(), type(err).__name__, err)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- telling nodes ----------------------------------------------------------------

    def role(
        self, topic: str, record: TopicRecord, pid: int, nodes: dict[str, Peer]
    ) -> dict[str, Any] | None:
        """The role document of one partition (None if it is not placed)."""
        placement = record.placements.get(pid)
        if not placement:
            return None
        leader = placement[0]
        peer = nodes.get(leader)
        leader_http = ""
        if peer is not None:
            info = peer.info
            leader_http = info.replication_address or f"{info.broadcast_address}:{info.http_port}"
        return {
            "epoch": record.epoch_of(pid),
            "leader": leader,
            "leader_http": leader_http,
            "isr": list(record.isr_of(pid)),
            "replicas": list(placement),
            "replica": record.meta.replica,
        }

    async def tell(self, topic: str, record: TopicRecord, pid: int) -> None:
        """Send one partition's role to every connected node that holds it."""
        nodes = self.coord.nodes()
        role = self.role(topic, record, pid, nodes)
        if role is None:
            return
        await asyncio.gather(
            *(
                self._tell_one(peer, topic, pid, role)
                for node in record.placements.get(pid, ())
                if (peer := nodes.get(node)) is not None
            )
        )

    async def tell_all(self, topic: str, record: TopicRecord) -> None:
        if record.meta.replica < 2:
            return
        await asyncio.gather(*(self.tell(topic, record, pid) for pid in record.placements))

    async def _tell_one(self, peer: Peer, topic: str, pid: int, role: dict[str, Any]) -> bool:
        key = (peer.id, topic, pid)
        try:
            await self.coord.client.send_role(peer.info, topic, pid, role)
        except NsqdCallError as err:
            log.warning("REPL: role of %s:%d for %s failed: %s", topic, pid, peer.node_id, err)
            self._told.pop(key, None)
            # again shortly, while the node is connected and the role still current
            self._spawn(self._retell(peer, topic, pid, role["epoch"]))
            return False
        self._told[key] = role["epoch"]
        if role["leader"] != peer.node_id:
            # it took a role in which it does not lead: it stopped acknowledging
            self._stepped_down(topic, pid, peer.node_id)
        return True

    def _await_step_down(self, topic: str, pid: int, node_id: str) -> bool:
        """Hold the partition's next leader back from confirmation until ``node_id``
        (its leader now) steps down or is judged lost; False (nothing held) if the node
        cannot hold a lease any more: not alive and not being judged (judged already)."""
        if not (self.coord.alive(node_id) or node_id in self._judging):
            return False
        self._stepping_down.setdefault((topic, pid), set()).add(node_id)
        return True

    def _stepped_down(self, topic: str, pid: int, node_id: str) -> None:
        pending = self._stepping_down.get((topic, pid))
        if pending is not None and node_id in pending:
            pending.discard(node_id)
            if not pending:
                del self._stepping_down[(topic, pid)]
            log.info("REPL: %s:%d: former leader %s stepped down", topic, pid, node_id)

    async def _retell(self, peer: Peer, topic: str, pid: int, epoch: int) -> None:
        await asyncio.sleep(self.retell_delay)
        record = self.coord.records.get(topic)
        nodes = self.coord.nodes()
        if record is None or record.epoch_of(pid) != epoch:
            return  # a newer role was told meanwhile
        if nodes.get(peer.node_id) is not peer or (peer.id, topic, pid) in self._told:
            return
        role = self.role(topic, record, pid, nodes)
        if role is not None:
            await self._tell_one(peer, topic, pid, role)

    def registered(self, peer: Peer, topic: str, pid: int) -> None:
        """A node registered a partition: tell it its role if it has not heard this
        epoch on this connection."""
        record = self.coord.records.get(topic)
        if record is None or record.meta.replica < 2 or not self.coord.leading:
            return
        if pid not in record.placements:
            return
        if self._told.get((peer.id, topic, pid)) == record.epoch_of(pid):
            return
        self._told[(peer.id, topic, pid)] = record.epoch_of(pid)
        if peer.node_id in record.placements[pid]:
            self._spawn(self.tell(topic, record, pid))
            return
        # a replica that was replaced while it was away: the current role tells it it
        # is none (it stops leading or following; its data stays, for an operator)
        role = self.role(topic, record, pid, self.coord.nodes())
        if role is not None:
            log.warning("REPL: %s:%d: %s is no longer a replica", topic, pid, peer.node_id)
            self._spawn(self._tell_one(peer, topic, pid, role))

    def created(self, peer: Peer, topic: str, pid: int, record: TopicRecord) -> None:
        """The coordinator created a partition on a node: tell it its role."""
        if record.meta.replica >= 2:
            self._spawn(self.tell(topic, self.coord.records.get(topic, record), pid))

    # -- losing nodes -----------------------------------------------------------------

    def peer_gone(self, peer: Peer) -> None:
        for key in [k for k in self._told if k[0] == peer.id]:
            del self._told[key]
        if peer.speaks_partitions:
            if self.coord.leading:
                # not before any lease it got from this nsqlookupd has ended; a node
                # closed for silence is long past that, and is judged at once
                not_before = self.coord.timing.lost_after(peer.last_heard)
                grace = 0.0 if peer.lost else self.lost_grace
                self._spawn(self._maybe_lost(peer.node_id, not_before, grace))
            else:
                self._gone_unjudged.add(peer.node_id)

    def start_leading(self) -> None:
        """This nsqlookupd now leads (after another): the nodes it saw go meanwhile and
        that are still away are lost now, so their leaderships move."""
        gone, self._gone_unjudged = self._gone_unjudged, set()
        self._told.clear()  # roles told by a former leader are told again
        # when they went is not known here: a full lease from now, to be safe
        loop = asyncio.get_running_loop()
        not_before = self.coord.timing.lost_after(loop.time())
        for node_id in gone:
            self._spawn(self._maybe_lost(node_id, not_before, self.lost_grace))
        # a leadership moved by a former coordinator whose old leader may not have
        # heard it: held back until that leader takes its new role (told now) or is lost
        self._stepping_down.clear()
        for topic, record in self.coord.records.items():
            if record.meta.replica < 2:
                continue
            for pid, changes in record.history.items():
                if len(changes) >= 2 and changes[-2].leader != changes[-1].leader:
                    self._await_step_down(topic, pid, changes[-2].leader)
            self._spawn(self.tell_all(topic, record))

    def peer_arrived(self, peer: Peer) -> None:
        """A node connected: partitions that lost a replica when no spare was free may
        take one now, and partitions left without a leader may elect one."""
        if peer.speaks_partitions and self.coord.leading:
            self._spawn(self._fill_gaps())
            if self._leaderless:
                self._spawn(self._elect_leaderless())

    async def _elect_leaderless(self) -> None:
        """Elect a leader where a lost one could not be replaced yet (more replicas may
        answer now)."""
        await asyncio.sleep(self.lost_grace)  # registered and serving by then
        coord = self.coord
        if not coord.leading:
            return
        async with coord.admin_lock:
            for topic, pid in sorted(self._leaderless):
                record = coord.records.get(topic)
                placement = record.placements.get(pid) if record is not None else None
                if record is None or not placement or coord.alive(placement[0]):
                    # gone, or its leader is back (it asks for an election itself)
                    self._leaderless.discard((topic, pid))
                    continue
                old = placement[0]
                chosen = await self._elect(topic, record, pid, [n for n in placement if n != old])
                if isinstance(chosen, str):
                    log.warning("REPL: %s:%d: still no leader: %s", topic, pid, chosen)
                    continue
                self._leaderless.discard((topic, pid))
                leader, new_isr = chosen
                new_placement = (leader, *[n for n in placement if n != leader])
                changed = record.with_replicas(
                    pid, new_placement, new_isr, f"node {old} lost, elected when {leader} answered"
                )
                await coord.save(topic, changed)
                log.warning(
                    "REPL: %s:%d epoch %d: %s leads, isr %s (leader %s lost)",
                    topic,
                    pid,
                    changed.epoch_of(pid),
                    leader,
                    ",".join(new_isr),
                    old,
                )
                await self._apply(topic, changed, pid)

    async def _fill_gaps(self) -> None:
        """Partitions too small to write (ISR at or below half of the replicas) with a
        replica on a node that is gone get a spare in its place, in a new epoch: it
        copies the log from the leader and joins the ISR. (node_lost does this when a
        node goes; this is for when no spare was free then.)"""
        await asyncio.sleep(self.lost_grace)  # registered and active by then
        coord = self.coord
        if not coord.leading:
            return
        async with coord.admin_lock:
            nodes = coord.nodes()
            for topic, record in list(coord.records.items()):
                if record.meta.replica < 2:
                    continue
                for pid, placement in list(record.placements.items()):
                    isr = record.isr_of(pid)
                    if len(isr) > record.meta.replica // 2 or placement[0] not in nodes:
                        continue
                    gone = [n for n in placement if n not in nodes and n not in isr]
                    spare = self._spare(record, placement, nodes) if gone else None
                    if spare is None:
                        continue
                    new_placement = tuple(spare if n == gone[0] else n for n in placement)
                    record = record.with_replicas(
                        pid, new_placement, isr, f"{spare} replaces {gone[0]} (isr too small)"
                    )
                    await coord.save(topic, record)
                    log.warning(
                        "REPL: %s:%d epoch %d: isr %s is too small to write; %s replaces %s",
                        topic,
                        pid,
                        record.epoch_of(pid),
                        ",".join(isr),
                        spare,
                        gone[0],
                    )
                    await self._apply(topic, record, pid)

    def session_ended(self, node_id: str) -> None:
        """The node's last session with any nsqlookupd ended (several nsqlookupd over
        etcd: it may never have been connected to this one)."""
        if self.coord.leading:
            # the nsqlookupd that held it deleted its key once the lease it granted had
            # ended, but its keys may also go early (its etcd lease revoked as it starts
            # a new session): a full lease from now, to be safe
            loop = asyncio.get_running_loop()
            self._spawn(self._maybe_lost(node_id, self.coord.timing.lost_after(loop.time()), 0.0))
        else:
            self._gone_unjudged.add(node_id)

    async def _maybe_lost(self, node_id: str, not_before: float, grace: float) -> None:
        """Judge the node once ``not_before`` (loop time) has passed and it had at least
        ``grace`` seconds to come back. Another close of the node meanwhile (a flapping
        connection) can only push the moment later."""
        loop = asyncio.get_running_loop()
        not_before = max(not_before, loop.time() + grace)
        self._not_before[node_id] = max(self._not_before.get(node_id, 0.0), not_before)
        if node_id in self._judging:
            return  # its connection here and its last session elsewhere both ended
        self._judging.add(node_id)
        try:
            while (wait := self._not_before.get(node_id, 0.0) - loop.time()) > 0:
                await asyncio.sleep(wait)
            self._not_before.pop(node_id, None)
            if node_id in self.coord.nodes() or not self.coord.leading:
                return  # it came back, or another nsqlookupd decides now
            held = self.coord.sessions.holders(node_id)
            if held:
                # cut off from this nsqlookupd only: it still serves, so its roles stay
                # (and it hears them again when it reconnects)
                log.warning(
                    "REPL: node %s left this nsqlookupd but holds a session with %s: "
                    "its roles stay",
                    node_id,
                    ",".join(held),
                )
                return
            await self.node_lost(node_id)
        finally:
            self._judging.discard(node_id)

    async def node_lost(self, node_id: str) -> None:
        """Move every leadership of ``node_id`` away and take it out of every ISR."""
        coord = self.coord
        async with coord.admin_lock:
            if coord.alive(node_id):
                # it came back while this waited for the lock: it keeps its roles (a
                # lease it holds now is a new one, confirmed anew)
                log.info("REPL: node %s is back; not lost", node_id)
                return
            # any lease it held has ended: no former leadership of it needs waiting for
            for key in [k for k, nodes in self._stepping_down.items() if node_id in nodes]:
                self._stepped_down(key[0], key[1], node_id)
            for topic, record in list(coord.records.items()):
                if record.meta.replica < 2:
                    continue
                for pid in list(record.placements):
                    if node_id not in record.placements[pid]:
                        continue
                    changed = await self._without(topic, record, pid, node_id)
                    if changed is not None:
                        record = changed
                        await coord.save(topic, record)
                        log.warning(
                            "REPL: %s:%d epoch %d: leader %s, isr %s (node %s lost)",
                            topic,
                            pid,
                            record.epoch_of(pid),
                            record.placements[pid][0],
                            ",".join(record.isr_of(pid)),
                            node_id,
                        )
                        await self._apply(topic, record, pid)

    async def _without(
        self, topic: str, record: TopicRecord, pid: int, node_id: str
    ) -> TopicRecord | None:
        """The record with ``node_id`` out of the partition's leadership and ISR (None
        if nothing changes)."""
        placement = record.placements[pid]
        isr = record.isr_of(pid)
        nodes = self.coord.nodes()
        if placement[0] == node_id:
            chosen = await self._elect(topic, record, pid, [n for n in placement if n != node_id])
            if isinstance(chosen, str):
                log.error(
                    "REPL: %s:%d: leader %s lost and no leader can be elected yet (%s); "
                    "the partition waits for more of %s",
                    topic,
                    pid,
                    node_id,
                    chosen,
                    ",".join(placement),
                )
                self._leaderless.add((topic, pid))
                return None
            self._leaderless.discard((topic, pid))
            leader, new_isr = chosen
            new_placement = (leader, *[n for n in placement if n != leader])
        elif node_id in isr:
            new_isr = tuple(n for n in isr if n != node_id)
            new_placement = placement
        else:
            return None
        if len(new_isr) <= record.meta.replica // 2:
            spare = self._spare(record, new_placement, nodes)
            if spare is not None:
                log.warning(
                    "REPL: %s:%d: isr %s is too small to write; %s replaces %s",
                    topic,
                    pid,
                    ",".join(new_isr),
                    spare,
                    node_id,
                )
                new_placement = (*[n for n in new_placement if n != node_id], spare)
        return record.with_replicas(pid, new_placement, new_isr, f"node {node_id} lost")

    def _spare(
        self, record: TopicRecord, placement: tuple[str, ...], nodes: dict[str, Peer]
    ) -> str | None:
        """A live node that can take a replica of a partition placed on ``placement``."""
        in_topic = {n for held in record.placements.values() for n in held}
        load = self.coord.load()
        free = [
            n
            for n in sorted(nodes)
            if n not in placement and (record.meta.allow_multi or n not in in_topic)
        ]
        return min(free, key=lambda n: (load[n], n)) if free else None

    async def _apply(self, topic: str, record: TopicRecord, pid: int) -> None:
        """Tell the partition's nodes their roles; create it where it is new."""
        await self.tell(topic, record, pid)
        nodes = self.coord.nodes()
        for node in record.placements[pid]:
            peer = nodes.get(node)
            if peer is not None and not self.coord.holds(peer, topic, pid):
                self.coord.ask_to_create(peer, topic, pid, record)

    # -- reports from leaders ---------------------------------------------------------

    async def isr_leave(self, topic: str, pid: int, node: str, epoch: int | None = None) -> str:
        """A leader reports ``node`` behind: take it out of the ISR."""
        coord = self.coord
        async with coord.admin_lock:
            record = coord.records.get(topic)
            if record is None or pid not in record.placements:
                return "unknown partition"
            if epoch is not None and epoch != record.epoch_of(pid):
                return f"stale epoch {epoch} (now {record.epoch_of(pid)})"
            isr = record.isr_of(pid)
            placement = record.placements[pid]
            if node not in isr and node in placement and node != placement[0]:
                # a replica the leader counted as joining, whose join never got here: a
                # new epoch without it tells the leader to stop waiting for it
                new = record.with_replicas(pid, placement, isr, f"{node} not in sync")
                await coord.save(topic, new)
                await self._apply(topic, new, pid)
                return "OK"
            if node not in isr or node == placement[0]:
                return "not in the isr"
            new = record.with_replicas(
                pid,
                record.placements[pid],
                tuple(n for n in isr if n != node),
                f"{node} behind the leader",
            )
            await coord.save(topic, new)
            log.warning(
                "REPL: %s:%d epoch %d: %s left the isr (behind the leader)",
                topic,
                pid,
                new.epoch_of(pid),
                node,
            )
            await self._apply(topic, new, pid)
            return "OK"

    async def isr_join(self, topic: str, pid: int, node: str, epoch: int | None = None) -> str:
        """A leader reports ``node`` caught up: it joins the ISR. (The leader counts it
        in its commit point from the report on, so the ISR here is never larger than
        the one the leader commits by.)"""
        coord = self.coord
        async with coord.admin_lock:
            record = coord.records.get(topic)
            if record is None or pid not in record.placements:
                return "unknown partition"
            if epoch is not None and epoch != record.epoch_of(pid):
                return f"stale epoch {epoch} (now {record.epoch_of(pid)})"
            isr = record.isr_of(pid)
            placement = record.placements[pid]
            if node in isr or node not in placement:
                return "not a catching-up replica"
            if not coord.alive(node):
                # a stream that looks caught up from a node this nsqlookupd judged lost
                # (a stopped process keeps its sockets open): refused, with a new epoch
                # so that the leader stops counting it in its commit point at once
                new = record.with_replicas(pid, placement, isr, f"{node} not alive")
                await coord.save(topic, new)
                log.warning(
                    "REPL: %s:%d epoch %d: join of %s refused: it is not alive",
                    topic,
                    pid,
                    new.epoch_of(pid),
                    node,
                )
                await self._apply(topic, new, pid)
                return "not alive"
            new = record.with_replicas(
                pid, record.placements[pid], (*isr, node), f"{node} caught up"
            )
            await coord.save(topic, new)
            log.info("REPL: %s:%d epoch %d: %s joined the isr", topic, pid, new.epoch_of(pid), node)
            await self._apply(topic, new, pid)
            return "OK"

    # -- moving leaderships (maintenance) ---------------------------------------------

    async def move_leader(self, topic: str, pid: int, to: str | None = None) -> str:
        """Give a partition's leadership to another in-sync replica (``to``, or the
        first other one). The old leader becomes a follower: it cuts what it had not
        committed (those publishes were never acknowledged), catches up and rejoins
        the ISR. Returns the new leader."""
        coord = self.coord
        async with coord.admin_lock:
            return await self._move_leader(topic, pid, to)

    async def _move_leader(self, topic: str, pid: int, to: str | None) -> str:
        coord = self.coord
        record = coord.records.get(topic)
        if record is None or pid not in record.placements:
            raise ValueError("unknown partition")
        if record.meta.replica < 2:
            raise ValueError("the topic is not replicated")
        placement = record.placements[pid]
        old = placement[0]
        nodes = coord.nodes()
        isr = [n for n in record.isr_of(pid) if n != old and n in nodes]
        if to is not None:
            if to not in isr:
                raise ValueError(f"{to} is not a live in-sync replica")
            isr = [to]
        # only one that holds every committed record (not one that restarted and has
        # not caught up yet)
        states = await self._log_states(topic, pid, isr, nodes)
        ready = [n for n in isr if n in states and states[n].intact]
        if ready:
            new = ready[0]
        elif to is not None:
            raise ValueError(f"{to} has not caught up with the leader since it started")
        else:
            raise ValueError("no other live in-sync replica that holds every committed record")
        new_isr = (new, *[n for n in record.isr_of(pid) if n not in (new, old) and n in nodes])
        new_placement = (new, *[n for n in placement if n not in (new, old)], old)
        changed = record.with_replicas(pid, new_placement, new_isr, f"moved from {old}")
        # the new leader is confirmed once the old one took its new role (or is lost);
        # the old one stops acknowledging before the change is recorded
        held = self._await_step_down(topic, pid, old)
        try:
            await self._fence(topic, pid, old, record.epoch_of(pid), nodes)
            await coord.save(topic, changed)
        except BaseException:
            if held:  # nothing moved: the fenced leader is confirmed again
                self._stepped_down(topic, pid, old)
            raise
        log.warning(
            "REPL: %s:%d epoch %d: leadership moved from %s to %s",
            topic,
            pid,
            changed.epoch_of(pid),
            old,
            new,
        )
        await self._apply(topic, changed, pid)
        return new

    async def drain(self, node_id: str) -> list[str]:
        """Move every leadership of ``node_id`` away (before maintenance); the
        partitions moved, as ``topic:partition``. Partitions with no other live
        in-sync replica stay and are listed as errors in the log."""
        coord = self.coord
        moved: list[str] = []
        async with coord.admin_lock:
            for topic, record in list(coord.records.items()):
                if record.meta.replica < 2:
                    continue
                for pid, placement in sorted(record.placements.items()):
                    if placement and placement[0] == node_id:
                        try:
                            await self._move_leader(topic, pid, None)
                            moved.append(f"{topic}:{pid}")
                        except ValueError as err:
                            log.error("REPL: drain %s: %s:%d stays: %s", node_id, topic, pid, err)
        return moved

    # -- fencing: leaders confirmed within their lease --------------------------------

    def confirm_roles(self, node_id: str) -> list[dict[str, Any]] | None:
        """The roles of every replicated partition placed on ``node_id``, for a node
        that holds a new lease (``/cluster/node/roles``); None if the node is not alive
        here (judged lost, or being judged: it must reconnect first).

        Each role has ``"confirmed"``: true where the node leads and may acknowledge
        writes within the lease it asked in. Nothing moves a leadership away from a
        live node without telling it first, and a node is judged lost only after its
        lease has ended, so a leadership confirmed now holds until that lease ends.
        False where a former leader has not yet stepped down.

        Not under the admin lock: a node may ask while the coordinator waits for its
        answer to a role (its reads are of one moment: no await). An election that is
        being decided sets what keeps a stale answer out first: the node being judged
        (a loss), or the former leader stepping down (a move)."""
        coord = self.coord
        if not coord.may_decide() or not coord.alive(node_id) or node_id in self._judging:
            return None
        nodes = coord.nodes()
        roles: list[dict[str, Any]] = []
        for topic, record in sorted(coord.records.items()):
            if record.meta.replica < 2:
                continue
            for pid, placement in sorted(record.placements.items()):
                if node_id not in placement:
                    continue
                role = self.role(topic, record, pid, nodes)
                if role is None:
                    continue
                role["topic"] = topic
                role["partition"] = pid
                waiting = [
                    n
                    for n in self._stepping_down.get((topic, pid), ())
                    if coord.alive(n) or n in self._judging
                ]
                role["confirmed"] = placement[0] == node_id and not waiting
                roles.append(role)
        return roles

    async def leader_unreachable(
        self, topic: str, pid: int, reporter: str, epoch: int | None
    ) -> str:
        """An in-sync follower cannot hear its leader (its stream stayed silent for the
        node timeout). Once the followers reporting it within a node timeout could
        write without the leader (more than half of the replicas), the leadership moves
        to the one of them with the newest log, as after a loss; the leader, if alive,
        must step down before the new one is confirmed."""
        coord = self.coord
        async with coord.admin_lock:
            record = coord.records.get(topic)
            if record is None or pid not in record.placements:
                return "unknown partition"
            if epoch != record.epoch_of(pid):
                return f"stale epoch {epoch} (now {record.epoch_of(pid)})"
            placement = record.placements[pid]
            leader, isr = placement[0], record.isr_of(pid)
            if record.meta.replica < 2:
                return "the topic is not replicated"
            if reporter == leader or reporter not in isr:
                return "not an in-sync follower"
            loop = asyncio.get_running_loop()
            now = loop.time()
            window = coord.timing.node_timeout
            for key in [k for k in self._unreachable if k[:2] == (topic, pid) and k[2] != epoch]:
                del self._unreachable[key]
            reports = self._unreachable.setdefault((topic, pid, epoch), {})
            reports[reporter] = now
            nodes = coord.nodes()
            voters = sorted(
                n for n, at in reports.items() if now - at <= window and n in isr and n in nodes
            )
            if len(voters) <= record.meta.replica // 2:
                log.warning(
                    "REPL: %s:%d epoch %d: %s cannot hear leader %s (%d of %d needed)",
                    topic,
                    pid,
                    epoch,
                    reporter,
                    leader,
                    len(voters),
                    record.meta.replica // 2 + 1,
                )
                return "OK"
            chosen = await self._elect(topic, record, pid, voters)
            if isinstance(chosen, str):
                log.warning("REPL: %s:%d: leader %s unreachable: %s", topic, pid, leader, chosen)
                return "OK"
            new, new_isr = chosen
            new_placement = (new, *[n for n in placement if n not in (new, leader)], leader)
            changed = record.with_replicas(
                pid, new_placement, new_isr, f"leader {leader} unreachable from {','.join(voters)}"
            )
            # until it steps down or is judged lost, it may hold a lease
            held = self._await_step_down(topic, pid, leader)
            try:
                await self._fence(topic, pid, leader, epoch, nodes)
                await coord.save(topic, changed)
            except BaseException:
                if held:
                    self._stepped_down(topic, pid, leader)
                raise
            del self._unreachable[(topic, pid, epoch)]
            log.warning(
                "REPL: %s:%d epoch %d: leader %s unreachable from %s: %s leads, isr %s",
                topic,
                pid,
                changed.epoch_of(pid),
                leader,
                ",".join(voters),
                new,
                ",".join(new_isr),
            )
            await self._apply(topic, changed, pid)
            return "OK"

    async def leader_restarted(self, topic: str, pid: int, node: str) -> tuple[str, int]:
        """A node that led the partition when it stopped asks for an election: it may
        have lost records it acknowledged (a power cut takes what was not fsynced), so
        it does not take the leadership back on its own. Returns ("OK", the epoch whose
        role says who leads now) once decided: elected now (it may be the node again,
        in a new epoch), or another node leads already; else why not yet (too few
        replicas answer: the node asks again)."""
        coord = self.coord
        async with coord.admin_lock:
            record = coord.records.get(topic)
            if record is None or pid not in record.placements or record.meta.replica < 2:
                return "OK", 0  # nothing to elect (nor to confirm it for)
            placement = record.placements[pid]
            if placement[0] != node:
                return "OK", record.epoch_of(pid)  # its role says who leads
            chosen = await self._elect(topic, record, pid, list(placement))
            if isinstance(chosen, str):
                log.warning(
                    "REPL: %s:%d: leader %s restarted; no leader can be elected yet: %s",
                    topic,
                    pid,
                    node,
                    chosen,
                )
                return chosen, record.epoch_of(pid)
            self._leaderless.discard((topic, pid))
            leader, new_isr = chosen
            new_placement = (leader, *[n for n in placement if n != leader])
            # (no step-down to wait for: the node has not led since it started)
            changed = record.with_replicas(pid, new_placement, new_isr, f"leader {node} restarted")
            await coord.save(topic, changed)
            log.warning(
                "REPL: %s:%d epoch %d: leader %s restarted: %s leads, isr %s",
                topic,
                pid,
                changed.epoch_of(pid),
                node,
                leader,
                ",".join(new_isr),
            )
            await self._apply(topic, changed, pid)
            return "OK", changed.epoch_of(pid)

    async def _fence(
        self, topic: str, pid: int, leader: str, epoch: int, nodes: dict[str, Peer]
    ) -> None:
        """Ask a leader that is being replaced to stop acknowledging at once (best
        effort: if it does not answer, its successor still waits for it to step down
        or be judged lost before it is confirmed)."""
        peer = nodes.get(leader)
        if peer is None:
            return
        try:
            await asyncio.wait_for(
                self.coord.client.fence(peer.info, topic, pid, epoch), self.coord.timing.lease
            )
        except (NsqdCallError, TimeoutError) as err:
            log.warning("REPL: %s:%d: fencing %s failed: %s", topic, pid, leader, err)

    async def _log_states(
        self, topic: str, pid: int, candidates: list[str], nodes: dict[str, Peer]
    ) -> dict[str, LogState]:
        """What each live candidate that answers says of its log."""
        candidates = [n for n in candidates if n in nodes]
        out: dict[str, LogState] = {}
        answers = await asyncio.gather(
            *(self.coord.client.partition_state(nodes[n].info, topic, pid) for n in candidates),
            return_exceptions=True,
        )
        for n, answer in zip(candidates, answers, strict=True):
            state = log_state(answer)
            if state is not None:
                out[n] = state
            else:
                log.warning("REPL: %s:%d: no state from %s: %s", topic, pid, n, answer)
        return out

    async def _elect(
        self, topic: str, record: TopicRecord, pid: int, candidates: list[str]
    ) -> tuple[str, tuple[str, ...]] | str:
        """Elect among ``candidates`` (the live ones that answer): (the new leader, the
        new ISR), or why no leader can be elected yet. See the module's docstring."""
        states = await self._log_states(topic, pid, candidates, self.coord.nodes())
        return choose(states, record.isr_of(pid), record.placements[pid], record.meta.replica)

    # -- views ------------------------------------------------------------------------

    def leaders(self, topic: str) -> dict[int, str] | None:
        """For a replicated topic, the leader of each partition (None otherwise)."""
        record = self.coord.records.get(topic)
        if record is None or record.meta.replica < 2:
            return None
        return {pid: nodes[0] for pid, nodes in record.placements.items() if nodes}
