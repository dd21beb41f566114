"""``mode=channel``: reading through an NSQ channel, for servers without range reads.

The query's driver-side source runner holds one subscription (nsqx.client's blocking
consumer). Each ``read(start)`` first FINs what the batches up to ``start`` took (Spark
only advances ``start`` past a batch after its sink committed it), then takes what has
arrived, up to ``maxBatchMessages``. ``commit(end)`` FINs as well. Nothing is FINed before
its batch is committed, so nothing is lost; after a failure, unFINed messages come again
(at-least-once: make the sink idempotent on ``id``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from nsqx.spark.options import NsqOptions

#: how long a read waits for the first message of a batch, and for the next one
FIRST_WAIT = 1.0
NEXT_WAIT = 0.05


class NsqChannelStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches taken from a channel; the offset counts messages taken."""

    def __init__(self, opts: NsqOptions) -> None:
        self.opts = opts
        self._consumer: Any = None
        # end offset of a batch -> its messages, FINed once Spark is past that batch
        self._pending: dict[int, list[Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader for its planner: the subscription stays here
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_pending"] = {}
        return state

    def _subscribe(self) -> Any:
        if self._consumer is None:
            from nsqx.client.sync import BlockingConsumer

            opts = self.opts
            assert opts.topic is not None and opts.channel is not None
            self._consumer = BlockingConsumer(
                opts.topic,
                opts.channel,
                nsqd_tcp_addresses=opts.nsqd_tcp,
                lookupd_http_addresses=opts.lookupd_http,
                # two batches may wait for their commit at once
                max_in_flight=2 * opts.max_batch_messages,
                msg_timeout=opts.msg_timeout_ms / 1000,
                # the query decides; the client never gives up on a message by itself
                max_attempts=0,
            )
        return self._consumer

    def initialOffset(self) -> dict[str, int]:
        return {"taken": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow ends when a read finds nothing new: nothing else to pin."""

    def _finish_upto(self, offset: int) -> None:
        for end in sorted(k for k in self._pending if k <= offset):
            for msg in self._pending.pop(end):
                msg.finish()

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        consumer = self._subscribe()
        taken = int(start["taken"])
        self._finish_upto(taken)
        opts = self.opts
        rows: list[tuple[Any, ...]] = []
        msgs: list[Any] = []
        wait = FIRST_WAIT
        deadline = time.monotonic() + FIRST_WAIT
        while len(msgs) < opts.max_batch_messages:
            msg = consumer.get(timeout=wait)
            if msg is None:
                if msgs or time.monotonic() >= deadline:
                    break
                continue
            msgs.append(msg)
            rows.append(
                (
                    opts.topic,
                    "",
                    0,
                    taken + len(rows),
                    msg.id.decode("ascii"),
                    0,
                    datetime.fromtimestamp(msg.timestamp / 1e9, tz=UTC),
                    msg.attempts,
                    msg.body,
                    None,
                )
            )
            wait = NEXT_WAIT
        end = taken + len(rows)
        if msgs:
            self._pending[end] = msgs
        return iter(rows), {"taken": end}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[Any, ...]]:
        # A channel cannot replay: after a restart the unFINed messages are delivered
        # again by nsqd (attempts > 1) and land in a later batch.
        return iter([])

    def commit(self, end: dict[str, int]) -> None:
        self._finish_upto(int(end["taken"]))
