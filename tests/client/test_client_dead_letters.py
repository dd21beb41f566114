"""nsqx.client leaves giving up to the channel when its policy has max_attempts
(docs/dead-letters.md, docs/client.md): nsqd tells a consumer that asked (IDENTIFY
``channel_policy``) the channel's max_attempts when it subscribes and whenever it
changes, and the consumer's own max_attempts then does not apply; without a policy,
and against Go's nsqd, it gives up as go-nsq does."""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.wire import commands as cmd
from nsqx.wire.frames import CHANNEL_POLICY, FRAME_RESPONSE
from workernode import raw_on, start_workers

from nsqdproc import GO_NSQD, start_go_nsqd
from rawnsq import Raw, run, start_nsqd, wait_for


def addr(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


async def configure(nsqd: NSQD, query: str) -> None:
    assert nsqd.http_address is not None
    url = f"http://127.0.0.1:{nsqd.http_address[1]}/channel/config?topic=t&channel=c&{query}"
    async with aiohttp.ClientSession() as http, http.post(url) as r:
        assert r.status == 200, await r.text()


class Failing:
    """A handler that fails every delivery of ``poison`` (REQ 0, no backoff)."""

    def __init__(self) -> None:
        self.attempts: list[int] = []
        self.given_up: list[Message] = []

    def __call__(self, m: Message) -> None:
        if m.body == b"poison":
            self.attempts.append(m.attempts)
            m.requeue(0, backoff=False)

    def consumer(self, address: str, **options: Any) -> Consumer:
        return Consumer(
            "t",
            "c",
            self,
            nsqd_tcp_addresses=address,
            on_giving_up=self.given_up.append,
            **options,
        )


def test_a_default_consumer_leaves_giving_up_to_the_channels_max_attempts() -> None:
    """The issue's case: max_attempts=7 on the channel, the client's default 5: the
    message is delivered 7 times and becomes a dead letter; the client gives up on
    nothing."""

    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0")
        failing = Failing()
        async with failing.consumer(addr(nsqd)) as c:
            await wait_for(lambda: "t" in nsqd.topics, what="the subscription")
            # (set while subscribed: the consumer is told)
            await configure(nsqd, "max_attempts=7")
            async with Producer(addr(nsqd)) as p:
                await p.publish("t", b"poison")
            ch = nsqd.topics["t"].default_partition.channels["c"]
            await wait_for(lambda: ch.dead_letter_count == 1, what="the dead letter")
        assert failing.attempts == [1, 2, 3, 4, 5, 6, 7]
        assert failing.given_up == [] and c.stats.given_up == 0
        assert nsqd.topics["t.dead"].default_partition.log.end == 1
        await nsqd.close()

    run(body())


def test_a_consumer_subscribing_to_a_channel_with_a_policy_is_told_at_once() -> None:
    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0")
        async with Producer(addr(nsqd)) as p:
            await p.publish("t", b"poison")
        assert nsqd.http_address is not None
        base = f"http://127.0.0.1:{nsqd.http_address[1]}"
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base}/channel/create?topic=t&channel=c") as r,
        ):
            assert r.status == 200
        await configure(nsqd, "max_attempts=3")
        failing = Failing()
        # an explicit max_attempts below the channel's changes nothing either
        async with failing.consumer(addr(nsqd), max_attempts=1):
            ch = nsqd.topics["t"].default_partition.channels["c"]
            await wait_for(lambda: ch.dead_letter_count == 1, what="the dead letter")
        assert failing.attempts == [1, 2, 3] and failing.given_up == []
        await nsqd.close()

    run(body())


def test_without_a_policy_the_consumer_gives_up_as_go_nsq_does() -> None:
    """No policy (or a policy lifted while subscribed): max_attempts is the client's."""

    async def body() -> None:
        nsqd = await start_nsqd(http_address="127.0.0.1:0")
        async with Producer(addr(nsqd)) as p:
            await p.publish("t", b"poison")
        failing = Failing()
        async with failing.consumer(addr(nsqd), max_attempts=3) as c:
            await wait_for(lambda: failing.attempts, what="the first delivery")
            await configure(nsqd, "max_attempts=10")
            await configure(nsqd, "max_attempts=")  # (lifted: the client's again)
            await wait_for(lambda: failing.given_up, what="the giving-up hook")
        assert failing.attempts == [1, 2, 3] and failing.given_up[0].attempts == 4
        assert c.stats.given_up == 1
        ch = nsqd.topics["t"].default_partition.channels["c"]
        assert ch.dead_letter_count == 0
        await nsqd.close()

    run(body())


@pytest.mark.skipif(not GO_NSQD.exists(), reason="Go's nsqd 1.3.0 is not in ../shared")
def test_against_gos_nsqd_the_consumer_gives_up_as_before() -> None:
    """Go's nsqd takes the IDENTIFY field it does not know and says nothing of
    channels: the consumer's max_attempts applies (NSQ 1.3's behaviour)."""
    go = start_go_nsqd(Path(tempfile.mkdtemp(prefix="nsqx-test-")))
    address = "{}:{}".format(*go.tcp_address)
    try:

        async def body() -> None:
            async with Producer(address) as p:
                await p.publish("t", b"poison")
            failing = Failing()
            async with failing.consumer(address, max_attempts=2) as c:
                await wait_for(lambda: failing.given_up, what="the giving-up hook")
            assert failing.attempts == [1, 2] and failing.given_up[0].attempts == 3
            assert c.stats.given_up == 1

        run(body())
    finally:
        go.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers need Linux")
def test_a_consumer_on_another_worker_than_its_channel_is_told_too(tmp_path: Path) -> None:
    """With --workers, a connection served through a proxy (it landed on a worker that
    does not own its partition, and does not move) is told its channel's policy as a
    direct one is (nsqx.nsqd.workers.proxy)."""
    node = start_workers(tmp_path, "--worker-handoff=false", "--http-address=127.0.0.1:0")
    try:
        topic = "pt"
        stranger = (owner_of(topic, 0, 2) + 1) % 2

        async def body() -> None:
            raw = await raw_on(node, stranger)
            answer = await raw.identify(channel_policy=True)
            assert answer["channel_policy"] is True
            raw.send(cmd.sub(topic, "c"))
            frames = [await raw.frame()]
            url = f"{node.http_url}/channel/config?topic={topic}&channel=c&max_attempts=4"
            async with aiohttp.ClientSession() as http, http.post(url) as r:
                assert r.status == 200, await r.text()
            frames.append(await raw.frame())
            assert frames == [
                (FRAME_RESPONSE, b"OK"),
                (FRAME_RESPONSE, CHANNEL_POLICY + b'{"max_attempts":4}'),
            ]
            await raw.close()

        run(body())
    finally:
        node.stop(signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers need Linux")
def test_a_consumer_fed_from_every_shard_is_told_by_each(tmp_path: Path) -> None:
    """--worker-shards: a plain SUB reads every worker's shard of the topic (a fan-in),
    each shard's channel tells it its policy (here and through the other worker); the
    SUB's answer comes first, once every shard said OK."""
    node = start_workers(tmp_path, "--worker-shards", "--http-address=127.0.0.1:0")
    try:

        async def body() -> None:
            seed = await Raw.connect(node.tcp_address)
            await seed.publish("sh", b"seed")  # (made: sharded over both workers)
            await seed.close()
            async with aiohttp.ClientSession() as http:
                for q in (
                    "/channel/create?topic=sh&channel=c",
                    "/channel/config?topic=sh&channel=c&max_attempts=4",
                ):
                    async with http.post(node.http_url + q) as r:
                        assert r.status == 200, await r.text()
            raw = await Raw.connect(node.tcp_address)
            await raw.identify(channel_policy=True)
            raw.send(cmd.sub("sh", "c"))
            frames = [await raw.frame() for _ in range(3)]
            notice = (FRAME_RESPONSE, CHANNEL_POLICY + b'{"max_attempts":4}')
            assert frames == [(FRAME_RESPONSE, b"OK"), notice, notice]
            await raw.close()

        run(body())
    finally:
        node.stop(signal.SIGKILL)
