"""Placement: which nsqd nodes hold each partition of a topic (pure functions).

The rules are Youzan's (consistence/data_placement_mgr.go, ``allocTopicLeaderAndISR``):

* the replicas of one partition are on different nodes;
* a topic that is neither ordered nor multipart has at most one partition replica per
  node, so it needs ``partition_num x replica`` nodes (one partition per nsqd is what
  old clients expect);
* otherwise partitions spread evenly: each replica goes to the node with the fewest
  partitions of this topic, then (for a leader) the fewest leaders of this topic, then
  the fewest partitions of all topics, then the smallest node id, so that the result
  is deterministic.

Youzan weighs nodes by measured load factors; a new nsqx cluster has no such history,
so counts stand in for load. Partitions already placed never move: moving one would
move its data, which is replication's job (the next issue), not placement's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from nsqx.wire.topic_meta import TopicMeta


class NoNodeAvailable(Exception):
    """Not enough nodes for the requested partitions and replicas."""


def enough_nodes(meta: TopicMeta, node_count: int) -> bool:
    """Youzan's admission rule: ``replica`` nodes at least, and for a topic that allows
    one partition per node only, ``partition_num x replica`` nodes."""
    if node_count < meta.replica:
        return False
    return meta.allow_multi or node_count >= meta.replica * meta.partition_num


def place_partitions(
    partitions: Iterable[int],
    *,
    replica: int,
    allow_multi: bool,
    nodes: Sequence[str],
    existing: Mapping[int, Sequence[str]],
    load: Mapping[str, int] | None = None,
) -> dict[int, tuple[str, ...]]:
    """Choose ``replica`` nodes (leader first) for each partition in ``partitions``.

    ``existing`` is the topic's current placement (it counts, and is not changed);
    ``load`` is every node's number of partition replicas over all topics. Raises
    :class:`NoNodeAvailable` if a partition cannot get ``replica`` distinct nodes
    under the rules above.
    """
    order = sorted(set(nodes))
    in_topic: Counter[str] = Counter(n for held in existing.values() for n in held)
    leaders: Counter[str] = Counter(held[0] for held in existing.values() if held)
    total: Counter[str] = Counter(load or {})
    placed: dict[int, tuple[str, ...]] = {}
    for partition in partitions:
        chosen: list[str] = []
        for slot in range(replica):
            candidates = [n for n in order if n not in chosen and (allow_multi or in_topic[n] == 0)]
            if not candidates:
                raise NoNodeAvailable(
                    f"partition {partition}: no node left for replica {slot + 1} of {replica}"
                )
            is_leader = slot == 0
            best = min(
                candidates,
                key=lambda n: (in_topic[n], leaders[n] if is_leader else 0, total[n], n),
            )
            chosen.append(best)
            in_topic[best] += 1
            total[best] += 1
            if is_leader:
                leaders[best] += 1
        placed[partition] = tuple(chosen)
    return placed
