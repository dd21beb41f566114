"""PartitionReplica: one replicated partition's role on this node, and its replication.

A partition of a topic with ``replicator`` > 1 gets one. It holds the role the
coordinator gave (nsqx.nsqd.replication.state) and runs the leader's side
(:class:`LeaderReplication`) or the follower's (:class:`FollowerReplication`).

Writes are accepted and acknowledged only by a leader whose role the coordinator
confirmed within this node's current lease (nsqx.nsqd.replication.lease: a restarted
node, or one whose lease ran out, waits for the coordinator, which may have elected
another leader meanwhile) and whose ISR is large enough; otherwise a publisher gets
E_FAILED_ON_NOT_LEADER or E_FAILED_ON_NOT_WRITABLE and looks up again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.replication.follower import FollowerReplication
from nsqx.nsqd.replication.leader import CommitFailed, CommitWaiter, LeaderReplication
from nsqx.nsqd.replication.state import (
    FOLLOWER,
    LEADER,
    ReplicaRole,
    read_role,
    write_role,
)
from nsqx.nsqd.waiters import future_waiter
from nsqx.wire import members
from nsqx.wire.errors import E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, ProtocolError

if TYPE_CHECKING:
    from nsqx.nsqd.partition import Partition
    from nsqx.nsqd.replication.manager import ReplicationManager
    from nsqx.nsqd.syncer import LogSyncer
    from nsqx.store.log import MessageLog

log = logging.getLogger("nsqx.replication")

__all__ = ["CommitFailed", "PartitionReplica", "StaleEpoch"]


class StaleEpoch(Exception):
    """A role older than the one this node holds."""


class PartitionReplica:
    """The replication state and work of one partition on this node."""

    def __init__(self, manager: ReplicationManager, part: Partition) -> None:
        self.manager = manager
        self.part = part
        assert part.topic.directory is not None
        self.path = os.path.join(part.topic.directory, f"replica.p{part.id}.json")
        self.role: ReplicaRole | None = read_role(self.path)
        #: the coordinator sent a role since this process started
        self.confirmed = False
        #: the lease generation in which the coordinator confirmed this node's
        #: leadership (-1: not confirmed); see ReplicationManager.may_acknowledge
        self.confirmed_gen = -1
        #: how many times the coordinator fenced this leadership (an answer to a
        #: confirmation asked before a fence does not confirm)
        self.fences = 0
        self.leader: LeaderReplication | None = None
        self.follower: FollowerReplication | None = None
        self.started = False
        self._syncer: LogSyncer | None = None
        #: this process holds every record committed in the partition (what the
        #: coordinator's election needs of an in-sync replica): a restart may have
        #: lost unsynced records, so False until this node leads by a decision made
        #: after it started, or catches up with its leader's commit point
        self.intact = False
        #: this node led the partition when it stopped: it may have lost records it
        #: acknowledged (a power cut), so it leads again only after the coordinator
        #: has held an election that knew it restarted (see reelected; set by start,
        #: once the node knows its id)
        self.reelect_pending = False
        #: the epoch of that election: an older role does not make this node lead
        self.reelect_epoch = 0

    def __repr__(self) -> str:
        return f"<replica {self.part} {self.role_name}>"

    @property
    def node_id(self) -> str:
        return self.manager.nsqd.node_id

    @property
    def role_name(self) -> str:
        if self.role is None:
            return "none"
        return self.role.role_of(self.node_id) or "none"

    def start(self) -> None:
        """Follow the saved leader (if this node was a follower); a saved leadership
        waits for the coordinator's word."""
        self.started = True
        role = self.role
        if role is not None and role.role_of(self.node_id) == FOLLOWER:
            self._follow(role.leader_http)
        if role is not None and role.role_of(self.node_id) == LEADER and self.leader is None:
            self.reelect_pending = True
            self.manager.report_restart(self)

    # -- durability -------------------------------------------------------------------

    @property
    def durable_ack(self) -> bool:
        """Whether a publish waits for a write quorum's fsyncs (the topic's
        replication_ack, else nsqd's --replication-ack)."""
        setting = self.part.topic.meta.replication_ack or self.manager.nsqd.options.replication_ack
        return setting == "durable"

    def syncer(self) -> LogSyncer | None:
        """This partition's fsyncs (nsqd.syncer), told to report here as its durable end
        moves (None before nsqd made it)."""
        syncer = self._syncer
        if syncer is None:
            syncer = self.manager.nsqd.syncers.get(self.part.key)
            if syncer is not None:
                syncer.on_durable = self.durable_advanced
                self._syncer = syncer
        return syncer

    def sync_soon(self) -> None:
        """Have this log fsynced (group-committed with whatever else is waiting)."""
        syncer = self.syncer()
        if syncer is not None:
            syncer.kick()

    @property
    def durable_end(self) -> int:
        """Every record below this sequence is fsynced here (as far as known)."""
        syncer = self.syncer()
        return syncer.durable_end if syncer is not None else 0

    def durable_advanced(self, end: int) -> None:
        """An fsync made every record below ``end`` durable here: a leader may commit
        more; a follower tells its leader."""
        if self.leader is not None:
            self.leader.durable_advanced(end)
        elif self.follower is not None:
            self.follower.durable_advanced(end)

    def log_cut(self, end: int) -> None:
        """The log was truncated or reset to ``end`` (records from there are not
        durable until fsynced again)."""
        syncer = self.syncer()
        if syncer is not None:
            syncer.truncated(end)

    # -- the coordinator's decisions --------------------------------------------------

    def apply_role(self, role: ReplicaRole) -> None:
        """Take the coordinator's role (StaleEpoch if it is older than the one held)."""
        old = self.role
        if old is not None and role.epoch < old.epoch:
            raise StaleEpoch(f"epoch {role.epoch} < {old.epoch}")
        me = self.node_id
        history = old.history if old is not None else ()
        new = role.role_of(me)
        if new == LEADER and self.leader is None and self._must_wait_for_election(role):
            # (kept, not acted on: it leads once the coordinator's election says so)
            if role != old:
                self._save(role.with_history(history))
            self.role = role.with_history(history)
            self.confirmed = True
            self._stop_following()
            return
        if new != LEADER:
            self.reelect_pending = False  # someone else leads: nothing to re-elect
        if new == LEADER and self.leader is None:
            log_ = self.part.log
            if not history or history[-1][0] < role.epoch:
                # leaderships that begin past this log's end have no record here (a
                # power cut took what followed): the new one begins at the end
                end = log_.end
                history = (*(h for h in history if h[1] <= end), (role.epoch, end))
        role = role.with_history(history)
        if role != old:
            self._save(role)
        self.role = role
        self.confirmed = True
        if old is None or old.epoch != role.epoch or new != self.role_name_of(old):
            log.info(
                "REPL: %s: epoch %d, %s (leader %s, isr %s)",
                self.part,
                role.epoch,
                new or "not a replica",
                role.leader,
                ",".join(role.isr),
            )
        if new == LEADER:
            self._stop_following()
            if self.leader is None:
                self.leader = LeaderReplication(self, self.part.visible_end)
                self.intact = True  # (elected holding every committed record)
                self.leader.own_durable = self.durable_end
                self.sync_soon()  # (what it holds from before may not be fsynced yet)
                # a new leadership is confirmed within the lease before it acknowledges
                self.confirmed_gen = -1
                self.manager.confirm_soon()
            else:
                self.leader.role_changed(role.epoch)
            self.leader.recompute()
        else:
            self.confirmed_gen = -1
            self._stop_leading()
            if new == FOLLOWER:
                if self.follower is None or self.follower.leader_http != role.leader_http:
                    self._stop_following()
                    self._follow(role.leader_http)
            else:
                self._stop_following()

    def _must_wait_for_election(self, role: ReplicaRole) -> bool:
        """Whether a role that makes this node lead must wait: it led when it stopped
        and the coordinator has not yet answered its restart report (it is asked now),
        or the role is older than the election that answered it."""
        if not self.started:
            return True  # (start() decides, once the node knows its id)
        if self.reelect_pending:
            self.manager.report_restart(self)
            return True
        return role.epoch < self.reelect_epoch

    def reelected(self, epoch: int | None) -> None:
        """The coordinator answered the restart report: it elected (or found elected)
        whoever leads in ``epoch``; None: it does not know the report (an nsqlookupd of
        the previous release), so the saved leadership stands, as before."""
        if not self.reelect_pending:
            return
        self.reelect_pending = False
        if epoch is not None:
            self.reelect_epoch = epoch
        role = self.role
        if role is not None and role.role_of(self.node_id) == LEADER:
            log.info("REPL: %s: re-election answered (epoch %s)", self.part, epoch)
            if role.epoch >= self.reelect_epoch:
                self.apply_role(role)

    def member_headers(self) -> dict[str, str]:
        """What this node sends as a member of the cluster (its secret)."""
        return members.headers(self.manager.nsqd.options.cluster_secret)

    def node_timeout(self) -> float:
        """After how long a silent node counts as lost (nsqlookupd's --node-timeout)."""
        return self.manager.nsqd.lookup.node_timeout()

    def _save(self, role: ReplicaRole) -> None:
        """Keep the role on disk. A disk that cannot take it (full) does not stop the
        role from taking effect here: stepping down must not wait for the disk, and a
        restarted node confirms its role with the coordinator anyway."""
        try:
            write_role(self.path, role)
        except OSError as err:
            log.error("REPL: %s: cannot save the role (epoch %d): %s", self.part, role.epoch, err)

    def role_name_of(self, role: ReplicaRole) -> str | None:
        return role.role_of(self.node_id)

    def adopt_history(self, history: tuple[tuple[int, int], ...]) -> None:
        """A follower takes its leader's epoch history (when the stream opens)."""
        if self.role is not None and self.role.history != history:
            self.role = self.role.with_history(history)
            self._save(self.role)

    def _follow(self, leader_http: str) -> None:
        if not self.started:
            return
        self.follower = FollowerReplication(self, leader_http)

    def _stop_following(self) -> None:
        if self.follower is not None:
            self.follower.stop()
            self.follower = None

    def _stop_leading(self) -> None:
        if self.leader is None:
            return
        self.leader.close()
        self.leader = None
        # consumers must move to the new leader: close their connections
        err = ProtocolError(E_FAILED_ON_NOT_LEADER, "not the leader of this partition")
        for ch in self.part.channels.values():
            for client in list(ch.clients):
                client.fail(err)

    # -- the write path ---------------------------------------------------------------

    def write_error(self) -> str | None:
        """None if a publish may be written here, else the error code to answer.

        A leader whose lease merely lapsed (a late PING answer under load) takes the
        write and holds its answer until the lease is back and confirmed: a lapse costs
        latency, not refusals. A leadership not confirmed yet, or a lease out for long
        (nsqlookupd away, or this node cut off: it may be replaced), refuses at once."""
        if self.leader is None:
            return E_FAILED_ON_NOT_LEADER
        role = self.role
        if role is None or not role.quorum_ok or not self.manager.may_write(self):
            return E_FAILED_ON_NOT_WRITABLE
        return None

    def may_acknowledge(self) -> bool:
        """Whether this leader may acknowledge writes now (the lease, confirmed)."""
        return self.manager.may_acknowledge(self)

    def fence(self, epoch: int) -> bool:
        """Stop acknowledging as leader of ``epoch`` (the coordinator is about to move
        the leadership): from now on writes are refused and the leadership must be
        confirmed again (it is, if the move does not happen). False if this node does
        not lead in that epoch."""
        if self.leader is None or self.role is None or self.role.epoch != epoch:
            return False
        if self.confirmed_gen >= 0:
            log.info("REPL: %s: fenced in epoch %d (its leadership is moving)", self.part, epoch)
        self.confirmed_gen = -1
        self.fences += 1
        self.manager.confirm_soon()
        return True

    def write_failed(self, err: OSError) -> None:
        """Writing to this partition's log failed (a full or failing disk): a leader
        asks the coordinator to move its leadership to an in-sync replica, whose disk
        may take the writes; it follows from then on, and catches up once it can."""
        if self.leader is not None and self.role is not None and self.confirmed:
            self.manager.resign(self, err)

    def appended(self) -> None:
        if self.leader is not None:
            self.leader.appended()

    def when_committed(self, seq: int, waiter: CommitWaiter) -> None:
        """Call ``waiter(None)`` once every record below ``seq`` is held by the ISR,
        ``waiter(CommitFailed)`` if this node stops leading first (or does not lead)."""
        if self.leader is None:
            waiter(CommitFailed("not the leader"))
        else:
            self.leader.when_committed(seq, waiter)

    def wait_commit(self, seq: int) -> asyncio.Future[None]:
        """Done once every record below ``seq`` is held by the ISR (CommitFailed if this
        node stops leading first)."""
        fut, done = future_waiter()
        self.when_committed(seq, done)
        return fut

    def follower_progress(self, node: str, end: int) -> None:
        """A follower acknowledged ``end`` (hook for stats)."""

    # -- views ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        role = self.role
        log_ = self.part.log
        out: dict[str, Any] = {
            "role": self.role_name,
            "epoch": role.epoch if role else 0,
            "leader": role.leader if role else "",
            "isr": list(role.isr) if role else [],
            "replicas": list(role.replicas) if role else [],
            "confirmed": self.confirmed,
            "intact": self.intact,
            "history": [list(h) for h in role.history] if role else [],
            "lease": {
                "required": self.manager.lease.required,
                "valid": self.manager.lease.valid(time.monotonic()),
                "generation": self.manager.lease.generation,
                "confirmed_generation": self.confirmed_gen,
            },
            "end": log_.end,
            # (what an election compares: a torn tail's skipped sequences hold nothing)
            "records_end": records_end(log_),
            "durable": self.durable_end,
            "commit": self.part.visible_end,
            "ack": "durable" if self.durable_ack else "written",
            "channels": {name: ch.cursor for name, ch in self.part.channels.items()},
        }
        leader = self.leader
        if leader is not None:
            out["followers"] = {
                node: {
                    "acked": acked,
                    "durable": acked if node in leader.legacy else leader.durable.get(node, 0),
                    "lag": max(log_.end - acked, 0),
                }
                for node, acked in leader.acked.items()
            }
        if self.follower is not None:
            out["connected"] = self.follower.connected
        return out

    async def close(self) -> None:
        if self.leader is not None:
            self.leader.close()
            self.leader = None
        if self.follower is not None:
            await self.follower.close()
            self.follower = None


def records_end(log_: MessageLog) -> int:
    """Just past the log's last record: its end, less the sequences skipped after a torn
    or damaged tail, which no record holds (the store never gives them again, so the
    end moved past them). Found with a few ``resume_at`` calls, by bisection."""
    end = log_.end
    if end <= log_.start or log_.batch_start(end - 1) is not None:
        return end
    lo, hi = log_.start, end - 1
    if log_.resume_at(lo) >= end:
        return log_.start  # no record at all
    # the last sequence from which a record follows below the end: the last record
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if log_.resume_at(mid) < end:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1
