"""Which worker of a node owns a partition.

A partition (a topic's log, its channels and everything in flight from them) lives in
exactly one worker process. The owner is a pure function of the topic's name, the
partition and the number of workers, so every worker knows it without asking: a
partitioned topic's partitions go round the workers from a place its name chooses (its
partitions spread evenly), and a topic of NSQ 1.3 (partition 0) lands by its name.
A publish or subscription that names no partition (-1) goes to partition 0's owner,
which picks among the partitions it hosts, as a single nsqd picks among its own.
"""

from __future__ import annotations

import zlib


def owner_of(topic: str, partition: int, workers: int) -> int:
    """The index (0 to ``workers`` - 1) of the worker that owns ``topic``'s
    ``partition``."""
    if workers <= 1:
        return 0
    return (zlib.crc32(topic.encode()) + max(partition, 0)) % workers
