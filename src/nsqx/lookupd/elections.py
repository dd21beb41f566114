"""Elections: which replica of a partition may lead, from what the replicas say of
their logs (sans-IO: the coordinator asks, nsqx.lookupd.replicas, and decides here).

The rule never elects a replica with less than the committed log, whatever a power cut
took from the replicas' disks (what they had not fsynced):

* an **intact in-sync replica** holds every committed record: the ISR only takes a
  replica once it holds every committed record (its leader reports it then, and counts
  it in its commit point from then on), and a replica that restarted is not intact until
  it caught up with a leader, or was elected, again (``GET nsqd/partition/state``'s
  ``intact``);
* with none such among the answers, **enough replicas** must answer that every write
  quorum includes one of them: ``replicator - quorum + 1``, the quorum being more than
  half of the replicas (2 of 3, 1 of 2, 3 of 5). Durable acknowledgement commits a
  record only once a write quorum fsynced it, so one of the answers holds it;
* among the answers, the **newest log** wins: the highest epoch that has a record in it,
  then the longest (Raft's "at least as up to date"). A log whose last record is of
  epoch e is a prefix of e's leader's log, and that leader held every record committed
  before it was elected (this rule, by induction), so the newest log holds every
  committed record that any answer holds.

The new ISR is the new leader and the intact members of the old ISR that answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LogState:
    """What a replica says of its log, for an election."""

    #: the log's end (the sequence its next record gets)
    end: int
    #: the epoch of its last record (-1: not said, an nsqd of the previous release)
    last_epoch: int
    #: it holds every committed record (an nsqd of the previous release: assumed, as
    #: that release's elections did)
    intact: bool


def last_epoch(history: object, end: int) -> int:
    """The epoch of a log's last record, from its epoch history (``[[epoch, start],
    ...]``): the newest leadership that began before its end (0 if none did; -1 if the
    history cannot be read)."""
    if not isinstance(history, list):
        return -1
    best = 0
    for entry in history:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
        ):
            return -1
        epoch, start = entry
        if start < end and epoch > best:
            best = epoch
    return best


def log_state(doc: object) -> LogState | None:
    """A LogState from a node's ``/partition/state`` answer (None if it has no end).
    Its end is where its records end (``records_end``: sequences skipped after a torn
    tail hold nothing), else its log's end (an nsqd of the previous release)."""
    if not isinstance(doc, dict):
        return None
    end = doc.get("records_end", doc.get("end"))
    if not isinstance(end, int) or isinstance(end, bool):
        return None
    intact = doc.get("intact")
    return LogState(
        end, last_epoch(doc.get("history"), end), intact if isinstance(intact, bool) else True
    )


def needed(replicator: int) -> int:
    """How many replicas must answer when no intact in-sync one does: enough that
    every write quorum (more than half of ``replicator``) includes one of them."""
    return replicator - (replicator // 2 + 1) + 1


def choose(
    states: Mapping[str, LogState],
    isr: Sequence[str],
    placement: Sequence[str],
    replicator: int,
) -> tuple[str, tuple[str, ...]] | str:
    """(the new leader, the new ISR) among the replicas that answered (``states``),
    or why none may be elected yet."""
    if not states:
        return "no replica answers"
    intact = [n for n in isr if n in states and states[n].intact]
    enough = needed(replicator)
    if not intact and len(states) < enough:
        return (
            f"{len(states)} replica(s) answered ({','.join(sorted(states))}), none an intact "
            f"in-sync one: {enough} of {replicator} needed"
        )
    # the epochs of the last records where every answer says them (a node of the
    # previous release does not: then the longest log, as that release elected)
    epochs = all(st.last_epoch >= 0 for st in states.values())
    order = list(placement)

    def newest(n: str) -> tuple[int, int, bool, bool, int]:
        # among equal logs: an intact in-sync one, then the placement's order
        st = states[n]
        rank = -order.index(n) if n in order else -len(order)
        return (st.last_epoch if epochs else 0, st.end, n in intact, n in isr, rank)

    leader = max(states, key=newest)
    return leader, (leader, *[n for n in intact if n != leader])
