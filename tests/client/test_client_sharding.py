"""The key -> partition function: MurmurHash3 x86 32-bit, seed 0, as youzan/go-nsq's
producer with ``config.Hasher = murmur3.New32()`` (github.com/spaolacci/murmur3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.client import partition_for_key
from nsqx.client.sharding import murmur3_32

# spaolacci/murmur3's own reference table (murmur_test.go): (seed, 32-bit hash, input)
SPAOLACCI_VECTORS = [
    (0x00, 0x00000000, ""),
    (0x00, 0x248BFA47, "hello"),
    (0x00, 0x149BBB7F, "hello, world"),
    (0x00, 0xE31E8A70, "19 Jan 2038 at 3:14:07 AM"),
    (0x00, 0xD5C48BFC, "The quick brown fox jumps over the lazy dog."),
    (0x01, 0x514E28B7, ""),
    (0x01, 0xBB4ABCAD, "hello"),
    (0x01, 0x6F5CB2E9, "hello, world"),
    (0x01, 0xF50E1F30, "19 Jan 2038 at 3:14:07 AM"),
    (0x01, 0x846F6A36, "The quick brown fox jumps over the lazy dog."),
    (0x2A, 0x087FCD5C, ""),
    (0x2A, 0xE2DBD2E1, "hello"),
    (0x2A, 0x7EC7C6C2, "hello, world"),
    (0x2A, 0x58F745F6, "19 Jan 2038 at 3:14:07 AM"),
    (0x2A, 0xC02D1434, "The quick brown fox jumps over the lazy dog."),
]

# Other published vectors (SMHasher's verification values, Wikipedia's table)
OTHER_VECTORS = [
    (0x00000000, 0x2362F9DE, b"\x00\x00\x00\x00"),
    (0x9747B28C, 0x5A97808A, b"aaaa"),
    (0x9747B28C, 0x283E0130, b"aaa"),
    (0x9747B28C, 0x5D211726, b"aa"),
    (0x9747B28C, 0x7FA09EA6, b"a"),
    (0x9747B28C, 0x24884CBA, b"Hello, world!"),
    (0xFFFFFFFF, 0x81F16F39, b""),
]


@pytest.mark.parametrize(("seed", "expected", "text"), SPAOLACCI_VECTORS)
def test_murmur3_matches_spaolacci_reference(seed: int, expected: int, text: str) -> None:
    assert murmur3_32(text.encode(), seed) == expected


@pytest.mark.parametrize(("seed", "expected", "data"), OTHER_VECTORS)
def test_murmur3_matches_published_vectors(seed: int, expected: int, data: bytes) -> None:
    assert murmur3_32(data, seed) == expected


# (key, partition_num) -> partition, worked out from the vectors above by hand:
# go-nsq takes int(Sum32(key)) % partition_num, and Go's int is 64-bit, so hashes of
# 2^31 and more (0xE31E8A70, 0xD5C48BFC) stay positive.
GO_NSQ_PARTITIONS = [
    ("hello", 4, 3),  # 0x248BFA47 = 613153351
    ("hello", 3, 1),
    ("hello", 16, 7),
    ("hello", 255, 241),
    ("hello, world", 4, 3),  # 0x149BBB7F = 345750399
    ("hello, world", 3, 0),
    ("19 Jan 2038 at 3:14:07 AM", 255, 252),  # 0xE31E8A70 = 3810429552
    ("19 Jan 2038 at 3:14:07 AM", 4, 0),
    ("The quick brown fox jumps over the lazy dog.", 3, 2),  # 0xD5C48BFC = 3586427900
    ("The quick brown fox jumps over the lazy dog.", 255, 35),
    ("The quick brown fox jumps over the lazy dog.", 16, 12),
    ("", 7, 0),
]


@pytest.mark.parametrize(("key", "partition_num", "partition"), GO_NSQ_PARTITIONS)
def test_partition_for_key_is_go_nsqs(key: str, partition_num: int, partition: int) -> None:
    assert partition_for_key(key, partition_num) == partition
    assert partition_for_key(key.encode(), partition_num) == partition
    assert partition_for_key(bytearray(key.encode()), partition_num) == partition


def test_partition_for_key_refuses_what_go_nsq_cannot_take() -> None:
    with pytest.raises(ValueError):
        partition_for_key("k", 0)
    with pytest.raises(TypeError):
        partition_for_key(42, 4)  # type: ignore[arg-type]


@given(st.binary(max_size=64), st.integers(1, 255))
def test_partition_is_in_range_and_stable(key: bytes, n: int) -> None:
    p = partition_for_key(key, n)
    assert 0 <= p < n
    assert p == murmur3_32(key) % n
