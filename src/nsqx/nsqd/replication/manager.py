"""ReplicationManager: nsqd's replicated partitions, their health checks and reports.

Twice a second it looks at every partition this node leads: an ISR member that has been
behind for ``--replication-lag-timeout`` is reported to the coordinator (nsqlookupd:
``POST /partition/isr/leave``), a replica that caught up is reported too
(``/partition/isr/join``), and the channels' positions go to the followers. A follower
that has not heard its leader for the node timeout says so
(``/partition/leader/unreachable``).

It also holds the node's lease (nsqx.nsqd.replication.lease): the answered PINGs of
nsqlookupd. A leader acknowledges writes only within the lease, and only once the
coordinator confirmed its leadership in the lease's generation (``POST
/cluster/node/roles``, asked whenever a leadership or a generation is new).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from nsqx.nsqd.channel_policy import ReplayMark, parse_mark_key
from nsqx.nsqd.replication.lease import NodeLease
from nsqx.nsqd.replication.replica import PartitionReplica, StaleEpoch
from nsqx.nsqd.replication.state import ReplicaRole
from nsqx.wire import members
from nsqx.wire import replication as rp

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition

log = logging.getLogger("nsqx.replication")

#: the checks of followers' silence and leaders' lag run this often (seconds); the
#: channels' positions and idle leaders' commit points go out every CURSORS_EVERY
TICK = 0.1
CURSORS_EVERY = 0.5
#: deferred messages of one channel its leader sends followers at most (the earliest
#: due), twice a second: a channel usually has few; those beyond come again at once
#: after a failover (a DPUB's time is in its record: it holds anyway)
MAX_DEFERRED_SENT = 2_000
#: at most one report of a kind per partition and node this often (seconds)
REPORT_EVERY = 1.0
#: between two asks for confirmation that failed (seconds)
CONFIRM_RETRY = 0.2
#: what _ask_roles answers when the leading nsqlookupd does not confirm leaderships
LEGACY: list[Any] = []
#: what _post_restart answers when the coordinator cannot elect yet
_WAIT = object()

#: where each report goes on nsqlookupd
REPORT_PATHS = {
    "leave": "/partition/isr/leave",
    "join": "/partition/isr/join",
    "unreachable": "/partition/leader/unreachable",
    "resign": "/topic/partition/move",
}
#: where a node that led a partition when it stopped asks for an election
RESTARTED_PATH = "/partition/leader/restarted"
#: seconds between two restart reports that the coordinator could not act on yet (too
#: few replicas back to elect safely)
RESTART_RETRY = 0.5


class ReplicationManager:
    """Every replicated partition of one nsqd."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.lag_timeout = nsqd.options.replication_lag_timeout
        #: a write not held by the ISR after this long is not acknowledged
        self.commit_timeout = max(3 * self.lag_timeout, 5.0)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._reported: dict[tuple[str, int, str, str], float] = {}
        self._cursors_at = 0.0
        self._cursors_sent: dict[tuple[str, int], bytes] = {}
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: the answered PINGs of nsqlookupd: how long leaders may acknowledge
        self.lease = NodeLease()
        workers = nsqd.workers
        if workers is not None and not workers.lead and nsqd.options.nsqlookupd_tcp_addresses:
            # a worker hears of leases from its lead worker: none until the lead says
            # its lookupds grant none (nsqx.nsqd.lookup: LookupManager._lead_state)
            self.lease.required = True
        self._confirming: asyncio.Task[None] | None = None
        # set by each new generation of the lease and each confirmation answered
        self._lease_news = asyncio.Event()
        #: leaders with writes waiting while the lease ran out or was unconfirmed
        self.blocked: set[PartitionReplica] = set()
        #: replicas whose restart report is out
        self._restart_reports: set[PartitionReplica] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task that is kept until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def http_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=2.0, sock_read=None),
                # its reports and confirmations are members-only calls
                headers=members.headers(self.nsqd.options.cluster_secret),
            )
        return self._session

    def attach(self, part: Partition) -> PartitionReplica:
        """A replicated partition was opened or created here."""
        replica = PartitionReplica(self, part)
        self.replicas[part.key] = replica
        if self._started:
            replica.start()
        return replica

    def detach(self, part: Partition) -> None:
        replica = self.replicas.pop(part.key, None)
        if replica is not None:
            self.blocked.discard(replica)
            self.spawn(replica.close())

    # -- the lease and the confirmation of leaderships --------------------------------

    def may_acknowledge(self, replica: PartitionReplica) -> bool:
        """Whether ``replica``'s leader may acknowledge now: within the lease, with its
        leadership confirmed in this generation of it (without any nsqlookupd granting
        leases, as before them: once the coordinator told the role)."""
        lease = self.lease
        if not lease.required:
            return replica.confirmed
        return lease.valid(time.monotonic()) and replica.confirmed_gen == lease.generation

    def may_write(self, replica: PartitionReplica) -> bool:
        """Whether ``replica``'s leader takes a write now: it may acknowledge, or it
        was confirmed and its lease lapsed only a moment ago (the answer then waits for
        the lease; see PartitionReplica.write_error)."""
        lease = self.lease
        if not lease.required:
            return replica.confirmed
        if replica.confirmed_gen < 0:
            return False
        now = time.monotonic()
        return now < lease.until + self.nsqd.lookup.node_timeout() / 2

    def lease_granted(self, sent: float, duration: float) -> None:
        """An nsqlookupd answered a PING sent at ``sent`` (time.monotonic) with a lease."""
        lease = self.lease
        if lease.grant(sent, duration):
            log.info("REPL: lease granted (generation %d)", lease.generation)
            self.confirm_soon()
            self._lease_news.set()
        if self.blocked:
            # (the lease may be valid again within its generation: a late answer)
            for replica in list(self.blocked):
                if self.may_acknowledge(replica) and replica.leader is not None:
                    self.blocked.discard(replica)
                    replica.leader.recompute()

    def lease_lapsed(self) -> None:
        """The lease can no longer be known (a worker whose link to its node's lead
        worker broke): held as lapsed, so nothing is acknowledged until the next grant,
        which starts a new generation and so asks for confirmations again."""
        if self.lease.until > 0.0:
            log.warning("REPL: lease lapsed (the lead worker is unreachable)")
        self.lease.lapse()

    async def wait_confirmed(self, replica: PartitionReplica, timeout: float) -> None:
        """Return once ``replica`` (if it leads) is confirmed in the current lease (which
        it waits for if none is held yet, as right after start), or after
        ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while replica in self._unconfirmed():
            self.confirm_soon()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._lease_news.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._lease_news.wait()
            except TimeoutError:
                return

    def confirm_soon(self) -> None:
        """Ask the coordinator to confirm the leaderships not confirmed in this lease."""
        if self._confirming is None and self._started:
            self._confirming = asyncio.create_task(self._confirm(), name="replication-confirm")

    def _unconfirmed(self) -> list[PartitionReplica]:
        gen = self.lease.generation
        return [
            r
            for r in self.replicas.values()
            if r.leader is not None and r.confirmed_gen != gen and self.lease.required
        ]

    async def _confirm(self) -> None:
        try:
            while self._unconfirmed():
                gen = self.lease.generation
                if not self.lease.valid(time.monotonic()):
                    return  # the next grant starts a new generation and asks again
                # a fence that arrives while the question is out voids its answer
                fences = {r: r.fences for r in self.replicas.values()}
                roles = await self._ask_roles()
                if roles is None:
                    await asyncio.sleep(CONFIRM_RETRY)
                    continue
                if self.lease.generation != gen or not self.lease.valid(time.monotonic()):
                    continue  # the lease ran out meanwhile: the answer may be stale
                if roles is LEGACY:
                    # the leading nsqlookupd is older than confirmations (a rolling
                    # upgrade): as before them, the coordinator's word is enough
                    for r in self._unconfirmed():
                        if r.confirmed and fences.get(r) == r.fences and r.leader is not None:
                            r.confirmed_gen = gen
                            self.blocked.discard(r)
                            r.leader.recompute()
                else:
                    self._apply_confirmed(roles, gen, fences)
                self._lease_news.set()
                if self._unconfirmed():
                    await asyncio.sleep(CONFIRM_RETRY)  # e.g. a former leader stepping down
        finally:
            self._confirming = None

    def _apply_confirmed(
        self, roles: list[Any], gen: int, fences: dict[PartitionReplica, int]
    ) -> None:
        """Take the leaderships the coordinator confirmed, and the roles in which this
        node no longer leads (a step down whose telling did not arrive), when they say
        where the leader is (this nsqlookupd may not know: the leader registered with
        another one; the role's own telling will say)."""
        me = self.nsqd.node_id
        for doc in roles:
            if not isinstance(doc, dict):
                continue
            if doc.get("leader") != me and not doc.get("leader_http"):
                continue
            topic, pid = doc.get("topic"), doc.get("partition")
            if not isinstance(topic, str) or not isinstance(pid, int):
                continue
            replica = self.replicas.get((topic, pid))
            if replica is None or fences.get(replica) != replica.fences:
                continue
            try:
                role = ReplicaRole.from_json(doc)
                replica.apply_role(role)
            except (ValueError, StaleEpoch) as err:
                log.info("REPL: %s: confirmed role not taken: %s", replica.part, err)
                continue
            if doc.get("confirmed") is True and replica.leader is not None:
                if replica.confirmed_gen != gen:
                    log.info(
                        "REPL: %s: leadership confirmed (epoch %d, lease generation %d)",
                        replica.part,
                        role.epoch,
                        gen,
                    )
                replica.confirmed_gen = gen
                self.blocked.discard(replica)
                replica.leader.recompute()

    async def _ask_roles(self) -> list[Any] | None:
        """This node's roles as the leading nsqlookupd confirms them; None if none
        answered; LEGACY if none answered but one does not know the question (an
        nsqlookupd older than confirmations, in a rolling upgrade)."""
        session = self.http_session()
        params = {"node": self.nsqd.node_id}
        unknown = False
        for address in self.nsqd.lookup.lookupd_http_addresses():
            url = f"http://{address}/cluster/node/roles"
            try:
                async with session.post(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=2.0)
                ) as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        doc = json.loads(body)
                        roles = doc.get("roles") if isinstance(doc, dict) else None
                        if isinstance(roles, list):
                            return roles
                    unknown = unknown or resp.status == 404
                    log.debug("REPL: %s answered %d %s", url, resp.status, body[:200])
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                log.debug("REPL: %s: %s", url, err)
        return LEGACY if unknown else None

    def start(self) -> None:
        """nsqd is listening and knows its node id: follow, and start checking."""
        self._started = True
        for replica in self.replicas.values():
            replica.start()
        self._task = asyncio.create_task(self._tick_loop(), name="replication-tick")

    async def close(self) -> None:
        for task in (self._task, self._confirming):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas.values()))
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- checks -----------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.tick()
            except Exception:
                log.exception("REPL: check failed")

    def tick(self) -> None:
        silent_limit = self.nsqd.lookup.node_timeout()
        now = time.monotonic()
        cursors = now - self._cursors_at >= CURSORS_EVERY
        if cursors:
            self._cursors_at = now
        if self._unconfirmed() and self.lease.valid(now):
            self.confirm_soon()
        if self.blocked and self.lease.required and now > self.lease.until + silent_limit:
            # out of lease for as long as it takes to be judged lost: it probably was;
            # the writes it holds are closed unanswered (the publishers look up again)
            for replica in list(self.blocked):
                if replica.leader is not None:
                    replica.leader.expire(0.0)
        for key, replica in list(self.replicas.items()):
            leader = replica.leader
            role = replica.role
            follower = replica.follower
            if (
                follower is not None
                and role is not None
                and replica.confirmed
                and follower.silent_for(now) >= silent_limit
            ):
                self._report(replica, "unreachable", replica.node_id)
            if leader is None or role is None or not replica.confirmed:
                continue
            durable_ack = replica.durable_ack
            if durable_ack != leader.durable_ack:
                leader.set_durable_ack(durable_ack)
            leader.expire(self.commit_timeout)
            lagging = leader.lagging(self.lag_timeout)
            # only while the rest of the ISR can still write: a leader that hears no
            # follower is more likely the one cut off, and shrinking the ISR below a
            # write quorum stops writes anyway; the followers' reports then decide
            # (nsqlookupd moves the leadership to them)
            if len(role.isr) - sum(1 for n in lagging if n in role.isr) > role.replica // 2:
                for node in lagging:
                    self._report(replica, "leave", node)
            for node in leader.caught_up():
                # counted in the commit point from now on (the coordinator's ISR must
                # never hold a node this leader does not wait for)
                leader.joining[node] = role.epoch
                self._report(replica, "join", node)
            if not cursors:
                continue
            leader.heartbeat()
            part = replica.part
            channels: dict[str, tuple[int, bool]] = {}
            deferred: dict[str, list[rp.Deferred]] = {}
            for name, ch in part.channels.items():
                if ch.ephemeral:
                    continue
                channels[name] = (ch.low_water(), ch.ordered_flag)
                entries = ch.deferred_for_replicas(MAX_DEFERRED_SENT)
                if entries:
                    deferred[name] = entries
            marks = {
                name: shared
                for name, ch in part.channels.items()
                if ch.replay_marks
                and not ch.ephemeral
                and (shared := self._shared_marks(ch.replay_marks))
            }
            message = rp.encode_cursors(
                rp.Cursors(
                    channels,
                    part.hold_from,
                    replay_marks=marks,
                    deferred=deferred,
                    now_ms=time.time_ns() // 1_000_000,
                )
            )
            if self._cursors_sent.get(key) != message or leader.streams:
                self._cursors_sent[key] = message
                leader.send_cursors(message)

    def report_restart(self, replica: PartitionReplica) -> None:
        """This node led ``replica``'s partition when it stopped: ask the coordinator
        for an election that knows it (its log may have lost acknowledged records to a
        power cut), until it answers (nsqx.lookupd.replicas: Replicas.leader_restarted)."""
        if replica in self._restart_reports or not self._started:
            return
        self._restart_reports.add(replica)
        self.spawn(self._report_restart(replica))

    async def _report_restart(self, replica: PartitionReplica) -> None:
        part = replica.part
        try:
            while replica.reelect_pending and self.replicas.get(part.key) is replica:
                role = replica.role
                if role is None:
                    return
                answer = await self._post_restart(replica, role.epoch)
                if answer is not _WAIT:
                    log.info(
                        "REPL: %s: led it when this node stopped; the coordinator's answer: %s",
                        part,
                        f"epoch {answer}" if isinstance(answer, int) else "unknown report",
                    )
                    replica.reelected(answer if isinstance(answer, int) else None)
                    return
                await asyncio.sleep(RESTART_RETRY)
        finally:
            self._restart_reports.discard(replica)

    async def _post_restart(self, replica: PartitionReplica, epoch: int) -> int | object | None:
        """The epoch the coordinator elected in, None if no nsqlookupd knows the report
        (the previous release), _WAIT if it cannot elect yet or none answered."""
        part = replica.part
        params = {
            "topic": part.name,
            "partition": str(part.id),
            "node": self.nsqd.node_id,
            "epoch": str(epoch),
        }
        session = self.http_session()
        unknown = False
        for address in self.nsqd.lookup.lookupd_http_addresses():
            url = f"http://{address}{RESTARTED_PATH}"
            try:
                async with session.post(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=5.0)
                ) as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        doc = json.loads(body)
                        got = doc.get("epoch") if isinstance(doc, dict) else None
                        if isinstance(got, int):
                            return got
                    unknown = unknown or resp.status == 404
                    log.info("REPL: %s answered %d %s", url, resp.status, body[:200])
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                log.info("REPL: %s: %s", url, err)
        return None if unknown else _WAIT

    def _shared_marks(self, marks: dict[str, ReplayMark]) -> dict[str, ReplayMark]:
        """A channel's replay marks in dead-letter topics replicated here (the same log
        on every replica; a topic of this node alone has its own marks on each)."""
        out = {}
        for key, mark in marks.items():
            name, pid = parse_mark_key(key)
            topic = self.nsqd.topics.get(name)
            part = topic.partitions.get(pid) if topic is not None else None
            if part is not None and part.replica is not None:
                out[key] = mark
        return out

    def resign(self, replica: PartitionReplica, err: OSError) -> None:
        """Ask for this leadership to move (its log cannot be written)."""
        log.error("REPL: %s: cannot write (%s): asking to move the leadership", replica.part, err)
        self._report(replica, "resign", replica.node_id)

    def _report(self, replica: PartitionReplica, action: str, node: str) -> None:
        part = replica.part
        key = (part.name, part.id, action, node)
        now = time.monotonic()
        if now - self._reported.get(key, 0.0) < REPORT_EVERY:
            return
        self._reported[key] = now
        assert replica.role is not None
        epoch = replica.role.epoch
        if action == "unreachable":
            log.warning(
                "REPL: %s: telling the coordinator leader %s is unreachable (epoch %d)",
                part,
                replica.role.leader,
                epoch,
            )
        else:
            log.warning(
                "REPL: %s: asking the coordinator: %s %s (epoch %d)", part, action, node, epoch
            )
        self.spawn(self._post_report(replica, action, node, epoch))

    async def _post_report(
        self, replica: PartitionReplica, action: str, node: str, epoch: int
    ) -> None:
        part = replica.part
        params = {"topic": part.name, "partition": str(part.id), "node": node, "epoch": str(epoch)}
        if action == "resign":
            params = {"topic": part.name, "partition": str(part.id), "move_leader": "true"}
        session = self.http_session()
        for address in self.nsqd.lookup.lookupd_http_addresses():
            url = f"http://{address}{REPORT_PATHS[action]}"
            try:
                async with session.post(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=3.0)
                ) as resp:
                    if resp.status == 200:
                        return
                    text = (await resp.read())[:200]
                    log.info("REPL: %s answered %d %s", url, resp.status, text)
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                log.info("REPL: %s: %s", url, err)
        # (a join stays counted by the leader until a newer role says how it ended: a
        # refusal here may be of a repeat after the coordinator already took it)
