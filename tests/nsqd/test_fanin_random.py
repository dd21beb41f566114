"""Random consumers of a sharded topic (``--workers=2 --worker-shards``), each a seeded
run of publishes to either worker's shard, RDY changes, FINs one by one or by batch,
REQs and pauses, looking for a consumer with room that gets nothing while messages
wait: the fan-in (nsqx.nsqd.fanin) must move RDY to the shard that has them.

Two stalls were found this way and have tests of their own in test_worker_shards.py
(a lowered RDY that kept counting what was held as the old grant; an ask for RDY that
stood after its shard ran out). A failure names its seed and the last steps: run the
seed again with ``NSQX_FANIN_SEEDS=<seed>``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from nsqd.test_worker_shards import make_sharded, rdy_picture
from nsqx.wire import Message
from nsqx.wire import commands as c
from workernode import raw_on, start_workers

from nsqdproc import NsqdProcess
from rawnsq import run

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers need Linux (and /proc here)"
)

#: seeds run in CI; each is about a second of real publishes and deliveries
SEEDS = range(1, 25)
STEPS = 120
#: a consumer with room and messages waiting gets one within this (seconds): the fan-in
#: moves RDY within about its IDLE_AFTER and the scan interval (0.1 s)
STALL = 5.0


async def consume_at_random(node: NsqdProcess, seed: int) -> None:
    rnd = random.Random(seed)
    topic = f"random{seed}"
    seed_body = await make_sharded(node, topic)
    pubs = [await raw_on(node, 0), await raw_on(node, 1)]
    sub = await raw_on(node, rnd.randrange(2))
    await sub.subscribe(topic, "c")
    waiting = {seed_body}  # published (or requeued), not delivered
    held: list[Message] = []  # delivered, not finished
    rdy = top_rdy = 0
    steps: list[str] = []
    n = 0

    async def take() -> None:
        try:
            m = await sub.message(timeout=STALL)
        except AssertionError:
            picture = await asyncio.to_thread(rdy_picture, node, topic, "c")
            raise AssertionError(
                f"seed {seed}: RDY {rdy}, {len(held)} held, {len(waiting)} waiting and none"
                f" delivered in {STALL} s; {picture}; last steps {steps[-12:]}"
            ) from None
        assert m.body in waiting, f"seed {seed}: {m.body!r} delivered twice (or unknown)"
        waiting.discard(m.body)
        held.append(m)
        # (a lowered RDY does not recall what is on its way: the highest one bounds)
        assert len(held) <= top_rdy, f"seed {seed}: {len(held)} held, RDY never above {top_rdy}"

    for _ in range(STEPS):
        step = rnd.choice(["pub", "pub", "rdy", "batch", "one", "req", "fin", "pause"])
        if step == "pub":
            w, k = rnd.randrange(2), rnd.randint(1, 5)
            bodies = [b"%d-%d" % (seed, n + i) for i in range(k)]
            n += k
            await pubs[w].publish(topic, *bodies)
            waiting.update(bodies)
            step = f"pub {k} on worker {w}"
        elif step == "rdy":
            rdy = rnd.randint(0, 5)
            top_rdy = max(top_rdy, rdy)
            sub.send(c.rdy(rdy))
            step = f"rdy {rdy}"
        elif step == "batch":  # RDY's worth (or all there is), then FIN them together
            while len(held) < rdy and waiting:
                await take()
            sub.send(b"".join(c.fin(m.id) for m in held))
            held.clear()
        elif step in ("one", "req") and len(held) < rdy and waiting:
            await take()
            m = held.pop()
            if step == "one":
                sub.send(c.fin(m.id))
            else:
                sub.send(c.req(m.id, 0))
                waiting.add(m.body)
        elif step == "fin":
            sub.send(b"".join(c.fin(m.id) for m in held))
            held.clear()
        elif step == "pause":  # (long enough, at times, for a shard to count as idle)
            await asyncio.sleep(rnd.choice([0.01, 0.06, 0.15]))
        steps.append(step)
    if rdy == 0:
        rdy = top_rdy = max(top_rdy, 3)
        sub.send(c.rdy(rdy))
    while waiting:
        await take()
        sub.send(c.fin(held.pop().id))
    for raw in (*pubs, sub):
        await raw.close()


def seeds() -> list[int]:
    given = os.environ.get("NSQX_FANIN_SEEDS")
    return [int(s) for s in given.split(",")] if given else list(SEEDS)


def test_random_consumers_are_never_left_waiting(tmp_path: Path) -> None:
    """Every message is delivered once, no consumer with room waits while messages
    wait, and none ever holds more than the highest RDY it set."""
    node = start_workers(
        tmp_path, "--worker-shards", "--http-address=127.0.0.1:0", "--msg-timeout=300s"
    )
    try:

        async def go() -> None:
            for seed in seeds():
                await consume_at_random(node, seed)

        run(go(), timeout=600)
    except BaseException:
        print("".join(node.log[-60:]))
        raise
    finally:
        node.stop(signal.SIGKILL)
