"""A read's FINs to a sharded topic are grouped by shard (nsqx.nsqd.client_v2
._fanin_fin): ``_one_prefix`` says when they all share the first one's shard prefix, so
that they go to it as one batch; anything else takes the id-by-id path."""

from __future__ import annotations

from nsqx.nsqd.client_v2 import _one_prefix
from nsqx.nsqd.fanin import HEX_ID_LEN
from nsqx.nsqd.guid import PARTITION_SHIFT, make_ids


def test_ids_of_one_shard_share_a_prefix() -> None:
    for partition in (0, 1, 7):
        ids = make_ids(5, 300, partition)
        assert all(len(i) == HEX_ID_LEN for i in ids)
        assert _one_prefix(ids)


def test_ids_of_two_shards_or_malformed_ones_do_not() -> None:
    ids = make_ids(5, 10, 1)
    assert not _one_prefix(ids + make_ids(5, 1, 2))
    assert not _one_prefix([*make_ids(5, 1, 2), *ids])
    assert not _one_prefix([*ids, ids[0][:-1]])  # a short one
    # two bits of the sequence share the prefix with the partition: where they change,
    # one shard has two prefixes, and its FINs take the id-by-id path (still correct)
    pair = make_ids((3 << (PARTITION_SHIFT - 2)) - 2, 2, 1)
    assert pair[0][:4] != pair[1][:4]
    assert not _one_prefix(pair)
