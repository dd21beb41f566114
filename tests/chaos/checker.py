"""The verdict of one chaos run: what was acknowledged, lost, invented, duplicated,
reordered, acknowledged by a node after it was replaced, and how long writes stopped.

- lost: acknowledged and never delivered, or requeued and never delivered again (must
  be 0);
- phantoms: delivered but never published (must be 0);
- duplicates: deliveries beyond the first (allowed: at-least-once);
- order: for each key of an ordered topic, the first deliveries come in the order the
  messages were published (each acknowledged before the next was sent), and every
  acknowledged one is there (must hold);
- fenced acks: acknowledgements a publisher received from a node at a moment when,
  by nsqlookupd's epoch history, another node already led that partition (must be 0);
- writes resumed after: the longest stretch without any acknowledgement on a partition,
  from the fault on (a publisher keeps each partition busy all the time);
- the epoch and ISR history of every partition;
- reused ids: message ids delivered with more than one body (must be 0);
- early: deferred messages delivered more than EARLY_SLACK before their time: a DPUB's
  delay counted from when the publish was sent, a REQ's from when it was sent (must be 0
  where the run checks schedules);
- moved back: redeliveries of a message that a consumer had finished more than
  POSITION_WINDOW before the fault (a channel's position moved back past it; must be 0
  where the run checks positions);
- where the run checks it, writes must resume on every partition (a partition still
  out of service at the end fails the run);
- for a run that allows a loss window (one nsqd without --sync-before-ack: it fsyncs
  every --sync-timeout): the lost messages acknowledged before that window, which must
  be none; for a damaged segment: at most ``max_lost`` lost (the batch the damage hit).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.workload import Delivery, Records


@dataclass
class Verdict:
    scenario: str
    acknowledged: int
    refused: int
    unknown: int
    delivered: int
    lost: int
    phantoms: int
    duplicates: int
    order_violations: int
    #: None: unknown (the target keeps no epoch history to check against)
    fenced_acks: int | None
    resumed_after: float
    history: dict[str, list[str]] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    #: False: some partition took no write at the end of the run (for at least
    #: STALLED s): writes did not resume within the window; resumed_after is then
    #: that stall so far, a lower bound
    writes_resumed: bool = True
    #: the cluster under test (run.py --target)
    target: str = "nsqx"
    reused_ids: int = 0
    early: int = 0
    moved_back: int = 0
    #: lost messages acknowledged before the allowed loss window (None: no window)
    lost_outside_window: int | None = None
    #: the most lost messages allowed (a damaged batch); None: 0, or the window's rule
    max_lost: int | None = None
    #: the checks beyond the first four that decide ok: "schedule", "positions",
    #: "resumed" (every partition takes writes again before publishing stops)
    strict: tuple[str, ...] = ()

    @property
    def lost_ok(self) -> bool:
        if self.max_lost is not None:
            return self.lost <= self.max_lost
        if self.lost_outside_window is not None:
            return self.lost_outside_window == 0
        return self.lost == 0

    @property
    def ok(self) -> bool:
        return (
            self.lost_ok
            and self.phantoms == 0
            and self.order_violations == 0
            and self.fenced_acks in (0, None)
            and self.reused_ids == 0
            and ("schedule" not in self.strict or self.early == 0)
            and ("positions" not in self.strict or self.moved_back == 0)
            and ("resumed" not in self.strict or self.writes_resumed)
        )

    def row(self) -> str:
        return (
            f"{self.scenario:<34} {self.acknowledged:>8} {self.lost:>5} {self.phantoms:>8} "
            f"{self.duplicates:>5} {self.order_violations:>6} "
            f"{'n/a' if self.fenced_acks is None else self.fenced_acks:>6} "
            f"{f'{self.resumed_after:8.2f}s' if self.writes_resumed else 'never':>9} "
            f"{self.reused_ids:>6} {self.early:>6} {self.moved_back:>6}  "
            f"{'ok' if self.ok else 'FAILED'}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "acknowledged": self.acknowledged,
            "refused": self.refused,
            "unknown": self.unknown,
            "delivered": self.delivered,
            "lost": self.lost,
            "phantoms": self.phantoms,
            "duplicates": self.duplicates,
            "order_violations": self.order_violations,
            "fenced_acks": self.fenced_acks,
            "resumed_after": round(self.resumed_after, 3),
            "writes_resumed": self.writes_resumed,
            "reused_ids": self.reused_ids,
            "early": self.early,
            "moved_back": self.moved_back,
            "lost_outside_window": self.lost_outside_window,
            "max_lost": self.max_lost,
            "target": self.target,
            "ok": self.ok,
            "history": self.history,
            "details": self.details[:50],
        }


HEADER = (
    f"{'scenario':<34} {'acked':>8} {'lost':>5} {'phantoms':>8} {'dups':>5} "
    f"{'order':>6} {'fenced':>6} {'resumed':>9} {'reused':>6} {'early':>6} {'back':>6}"
)

#: how much before its time a deferred message may come (the deferred timer's batching)
EARLY_SLACK = 0.25
#: how long before a fault a finished message may be delivered again (a channel's
#: position is checkpointed and replicated twice a second; fsynced every --sync-timeout)
POSITION_WINDOW = 2.5


#: seconds without an acknowledgement on a partition, when publishing stops, that mean
#: its writes had not resumed
STALLED = 3.0


def leader_at(changes: list[dict[str, Any]], at_ms: float) -> str | None:
    """The leader by the epoch history at a moment (None before the first entry)."""
    leader = None
    for ch in changes:
        if ch["at"] <= at_ms:
            leader = ch["leader"]
        else:
            break
    return leader


def judge(
    scenario: str,
    rec: Records,
    histories: dict[str, dict[str, Any]],
    node_name: dict[str, str],
    fault_at: float,
    ordered_topics: set[str],
    *,
    fenced_known: bool = True,
    stopped_at: float | None = None,
    loss_window: float | None = None,
    max_lost: int | None = None,
    strict: tuple[str, ...] = (),
) -> Verdict:
    """``histories``: topic -> nsqlookupd's /partition/history partitions; ``node_name``:
    node id -> host name; ``fault_at``: when the fault began (time.time).
    ``fenced_known=False``: the histories cannot tell (fenced acks: None, "n/a");
    ``stopped_at``: when publishing stopped, so that a partition still without writes
    then counts as "writes never resumed" (not as resumed after its last gap)."""
    details: list[str] = []
    acked = rec.acked()
    outcomes = [a.outcome for s in rec.sent.values() for a in s.attempts]
    refused = sum(1 for o in outcomes if o.startswith("refused"))
    unknown = sum(1 for o in outcomes if o.startswith("unknown"))
    first: dict[bytes, int] = {}
    for i, d in enumerate(rec.delivered):
        first.setdefault(d.body, i)
    # lost: never finished (a message requeued with a delay must come back and be FINed)
    finished_bodies = {d.body for d in rec.delivered if d.fin}
    lost_bodies = [s.body for s in acked if s.body not in finished_bodies]
    for body in lost_bodies[:10]:
        s = rec.sent[body]
        details.append(f"lost {body!r}: {[(a.node, a.outcome) for a in s.attempts]}")
    lost_outside_window = None
    if loss_window is not None:
        lost_outside_window = 0
        for body in lost_bodies:
            a = rec.sent[body].acked
            assert a is not None
            if a.done < fault_at - loss_window:
                lost_outside_window += 1
                if lost_outside_window <= 5:
                    details.append(
                        f"lost outside the {loss_window:g}s window: {body!r} acknowledged "
                        f"{fault_at - a.done:.2f}s before the fault"
                    )
    if lost_bodies:
        per_topic: dict[str, int] = defaultdict(int)
        for body in lost_bodies:
            per_topic[rec.sent[body].topic] += 1
        details.insert(0, f"lost per topic: {dict(per_topic)}")

    # reused ids: one id, several bodies
    bodies_of: dict[tuple[str, bytes], set[bytes]] = defaultdict(set)
    for d in rec.delivered:
        if d.id:
            bodies_of[(d.topic, d.id)].add(d.body)
    reused = [(k, v) for k, v in bodies_of.items() if len(v) > 1]
    for (topic, mid), bodies in reused[:5]:
        details.append(f"id {mid!r} of {topic} reused: {sorted(bodies)[:3]!r}")

    # early: a deferred message delivered before its time
    early = 0
    worst_early = 0.0
    for d in rec.delivered:
        s = rec.sent.get(d.body)
        if s is None or not s.defer_ms or s.acked is None:
            continue
        # the earliest its time can be: the first attempt's send plus the delay
        due = s.attempts[0].sent + s.defer_ms / 1000
        if d.at < due - EARLY_SLACK:
            early += 1
            worst_early = max(worst_early, due - d.at)
    requeued_early = 0
    for d in rec.delivered:
        req = rec.requeued.get((d.topic, d.id, d.body))
        if req is None or d.at <= req[0]:
            continue
        due = req[0] + req[1]
        if d.at < due - EARLY_SLACK:
            requeued_early += 1
            worst_early = max(worst_early, due - d.at)
    early += requeued_early
    if early:
        details.append(
            f"{early} deferred deliveries early ({requeued_early} after a REQ), by up to "
            f"{worst_early:.2f}s"
        )

    # moved back: finished well before the fault, delivered again after it
    moved_back = 0
    worst_back = 0.0
    # (the same message: its id and body; a body published twice is two messages, an id
    # given again is counted above)
    finished: dict[tuple[str, bytes, bytes], Delivery] = {}
    back_parts: dict[str, int] = defaultdict(int)
    for d in rec.delivered:
        before = finished.get((d.topic, d.id, d.body))
        if before is None:
            if d.fin:
                finished[(d.topic, d.id, d.body)] = d
        elif before.at < fault_at - POSITION_WINDOW and d.at >= fault_at:
            moved_back += 1
            worst_back = max(worst_back, fault_at - before.at)
            back_parts[f"{d.topic}:{d.pid} from {before.node} then {d.node}"] += 1
    if moved_back:
        details.append(
            f"{moved_back} redeliveries of messages finished before the fault, up to "
            f"{worst_back:.1f}s before it: {dict(back_parts)}"
        )
    phantoms = [b for b in first if b not in rec.sent]
    for body in phantoms[:10]:
        details.append(f"phantom {body!r}")
    duplicates = len(rec.delivered) - len(first)

    # order: per key of an ordered topic, first deliveries in publication order
    order_violations = 0
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)  # key -> [(first idx, seq)]
    for body, idx in first.items():
        s = rec.sent.get(body)
        if s is None or s.topic not in ordered_topics or s.key is None or s.seq is None:
            continue
        by_key[s.key].append((idx, s.seq))
    for key, seen in by_key.items():
        seqs = [seq for _, seq in sorted(seen)]
        for a, b in itertools.pairwise(seqs):
            if b < a:
                order_violations += 1
                if len(details) < 40:
                    details.append(f"order: key {key}: seq {b} first delivered after {a}")

    # fenced acks: an acknowledgement received from a node that was no longer the leader
    fenced: int | None = 0
    for s in acked if fenced_known else []:
        a = s.acked
        assert a is not None
        changes = (histories.get(s.topic) or {}).get(str(s.pid), {}).get("history", [])
        leader = leader_at(changes, a.done * 1000)
        if leader is None:
            continue
        if node_name.get(leader, leader) != a.node:
            fenced += 1
            if len(details) < 50:
                details.append(
                    f"fenced ack: {s.body!r} acknowledged by {a.node} at {a.done:.3f} "
                    f"while {node_name.get(leader, leader)} led"
                )

    # writes resumed after: the longest stretch without an acknowledgement per partition
    # from the fault on
    resumed = 0.0
    by_part: dict[tuple[str, int], list[float]] = defaultdict(list)
    for s in acked:
        a = s.acked
        assert a is not None
        by_part[(s.topic, s.pid)].append(a.done)
    stalls: dict[tuple[str, int], tuple[float, float]] = {}
    for part, times in by_part.items():
        times.sort()
        prev = fault_at
        for t in times:
            if t < fault_at:
                continue
            resumed = max(resumed, t - prev)
            prev = t
        if stopped_at is not None and stopped_at - prev > STALLED:
            stalls[part] = (prev, stopped_at - prev)
    if not fenced_known:
        fenced = None
    if stalls:
        resumed = max(gap for _, gap in stalls.values())
        for (topic, pid), (last, gap) in sorted(stalls.items()):
            details.append(
                f"writes never resumed on {topic}:{pid} within the window: last ack "
                f"{last - fault_at:+.2f}s from the fault, none in the {gap:.2f}s until "
                f"publishing stopped"
            )

    history: dict[str, list[str]] = {}
    for topic, parts in histories.items():
        for pid, part in sorted(parts.items()):
            lines = []
            for ch in part.get("history", []):
                rel = ch["at"] / 1000 - fault_at
                isr = ",".join(node_name.get(n, n) for n in ch["isr"])
                lines.append(
                    f"e{ch['epoch']} {node_name.get(ch['leader'], ch['leader'])} [{isr}] "
                    f"{rel:+.2f}s {ch['reason']}"
                )
            history[f"{topic}:{pid}"] = lines
    return Verdict(
        scenario,
        len(acked),
        refused,
        unknown,
        len(rec.delivered),
        len(lost_bodies),
        len(phantoms),
        duplicates,
        order_violations,
        fenced,
        resumed,
        history,
        details,
        writes_resumed=not stalls,
        reused_ids=len(reused),
        early=early,
        moved_back=moved_back,
        lost_outside_window=lost_outside_window,
        max_lost=max_lost,
        strict=strict,
    )
