"""Which partition a key goes to: youzan/go-nsq's function, so that Go and Python
producers put a key on the same partition.

go-nsq hashes the key with the hasher in its config (``config.Hasher``; every Youzan
example and test sets ``murmur3.New32()`` from github.com/spaolacci/murmur3, that is
MurmurHash3 x86 32-bit with seed 0), over the key's bytes as given, and takes
``int(hash) % partition_num``. Go's ``int`` is 64-bit on the platforms it runs on, so
the unsigned 32-bit hash is never negative there: the partition is simply
``hash % partition_num``.
"""

from __future__ import annotations

import struct

__all__ = ["murmur3_32", "partition_for_key", "shard_key_bytes"]

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593

ShardKey = bytes | bytearray | memoryview | str


def murmur3_32(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data`` (Austin Appleby's; spaolacci/murmur3's
    ``Sum32WithSeed``), an unsigned 32-bit integer."""
    data = bytes(data)
    h = seed & _M32
    n = len(data)
    body = n & ~3
    # 4-byte blocks, little-endian (the reference reads them natively on x86)
    for (k,) in struct.iter_unpack("<I", data[:body]):
        k = (k * _C1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * _C2) & _M32
        h ^= k
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    tail = n & 3
    if tail:
        k = 0
        if tail == 3:
            k ^= data[body + 2] << 16
        if tail >= 2:
            k ^= data[body + 1] << 8
        k ^= data[body]
        k = (k * _C1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * _C2) & _M32
        h ^= k
    # finalisation: the length, then the avalanche (fmix32)
    h ^= n & _M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def shard_key_bytes(key: ShardKey) -> bytes:
    """A sharding key's bytes: a ``str`` is UTF-8 (Go's ``[]byte(s)``), bytes as given."""
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"a sharding key is bytes or str, not {type(key).__name__}")


def partition_for_key(key: ShardKey, partition_num: int) -> int:
    """The partition go-nsq's producer picks for ``key`` on a topic of ``partition_num``
    partitions: ``murmur3_32(key, seed 0) % partition_num``."""
    if partition_num < 1:
        raise ValueError(f"partition_num must be >= 1 (got {partition_num})")
    return murmur3_32(shard_key_bytes(key)) % partition_num
