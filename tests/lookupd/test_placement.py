"""Placement of partitions on nodes (pure functions, no network)."""

from __future__ import annotations

from collections import Counter

import pytest

from nsqx.lookupd.placement import NoNodeAvailable, enough_nodes, place_partitions
from nsqx.wire.topic_meta import TopicMeta


@pytest.mark.parametrize(
    ("meta", "nodes", "ok"),
    [
        (TopicMeta(2), 2, True),
        (TopicMeta(3), 2, False),
        (TopicMeta(2, replica=2), 3, False),
        (TopicMeta(2, replica=2), 4, True),
        (TopicMeta(8, multipart=True), 1, True),
        (TopicMeta(8, ordered=True, replica=2), 2, True),
        (TopicMeta(8, ordered=True, replica=3), 2, False),
    ],
)
def test_enough_nodes_is_youzans_rule(meta: TopicMeta, nodes: int, ok: bool) -> None:
    assert enough_nodes(meta, nodes) is ok


def test_one_partition_per_node_unless_multi() -> None:
    placed = place_partitions(
        range(3), replica=1, allow_multi=False, nodes=["c", "a", "b"], existing={}
    )
    assert placed == {0: ("a",), 1: ("b",), 2: ("c",)}
    with pytest.raises(NoNodeAvailable):
        place_partitions([3], replica=1, allow_multi=False, nodes=["a", "b", "c"], existing=placed)


def test_multi_spreads_evenly_and_keeps_what_is_placed() -> None:
    existing = {0: ("a",), 1: ("a",)}
    placed = place_partitions(
        range(2, 8), replica=1, allow_multi=True, nodes=["a", "b", "c"], existing=existing
    )
    # the emptier nodes first, then round the three
    assert [placed[p][0] for p in range(2, 8)] == ["b", "c", "b", "c", "a", "b"]
    counts = Counter(held[0] for held in [*existing.values(), *placed.values()])
    assert counts == {"a": 3, "b": 3, "c": 2}


def test_replicas_are_on_different_nodes_and_leaders_spread() -> None:
    placed = place_partitions(
        range(6), replica=2, allow_multi=True, nodes=["a", "b", "c"], existing={}
    )
    assert all(len(set(held)) == 2 for held in placed.values())
    leaders = Counter(held[0] for held in placed.values())
    assert leaders == {"a": 2, "b": 2, "c": 2}
    replicas = Counter(n for held in placed.values() for n in held)
    assert replicas == {"a": 4, "b": 4, "c": 4}
    with pytest.raises(NoNodeAvailable):
        place_partitions([0], replica=3, allow_multi=True, nodes=["a", "b"], existing={})


def test_load_of_other_topics_breaks_ties() -> None:
    placed = place_partitions(
        [0], replica=1, allow_multi=False, nodes=["a", "b"], existing={}, load={"a": 5}
    )
    assert placed == {0: ("b",)}
