"""Consumer against real nsqd (in this event loop, on free loopback ports)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from nsqx.client import Config, Consumer, Message, Producer
from nsqx.client.consumer import _Link
from nsqx.nsqd.nsqd import NSQD
from nsqx.wire.frames import MSG_BODY_AT, MSG_ID_AT, MSG_ID_END, decode_message

from clienthelp import RdyWatcher
from rawnsq import run, start_nsqd, wait_for


def addr(nsqd: NSQD) -> str:
    assert nsqd.tcp_address is not None
    host, port = nsqd.tcp_address
    return f"{host}:{port}"


async def publish(nsqd: NSQD, topic: str, bodies: list[bytes]) -> None:
    async with Producer(addr(nsqd)) as p:
        for i in range(0, len(bodies), 100):
            await p.multi_publish(topic, bodies[i : i + 100])


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_plain_function_handler_finishes_on_return() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(500))
        got: list[bytes] = []
        c = Consumer("t", "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(nsqd)])
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=50,
        )
        async with c:
            await wait_for(lambda: len(got) == 500, what="500 messages")
        assert sorted(got) == sorted(bodies(500))
        assert c.stats.finished == 500 and c.stats.requeued == 0
        ch = nsqd.topics["t"].channels["c"]
        await wait_for(lambda: ch.in_flight_count == 0, what="FINs applied")
        assert ch.depth == 0
        await nsqd.close()

    run(body())


def test_coroutine_handler_runs_concurrently_within_bounds() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(60))
        running = 0
        peak = 0
        done: list[bytes] = []

        async def handler(m: Message) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            done.append(m.body)

        async with Consumer(
            "t", "c", handler, nsqd_tcp_addresses=addr(nsqd), max_in_flight=30, concurrency=8
        ) as c:
            await wait_for(lambda: len(done) == 60, what="60 messages")
        assert 1 < peak <= 8
        assert c.stats.finished == 60
        await nsqd.close()

    run(body())


def test_async_for_and_manual_answers() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(20))
        seen: list[bytes] = []
        async with Consumer("t", "c", nsqd_tcp_addresses=addr(nsqd), max_in_flight=5) as c:
            async for msg in c:
                seen.append(msg.body)
                if msg.body == b"m3" and msg.attempts == 1:
                    msg.requeue(0, backoff=False)
                else:
                    msg.finish()
                if len(seen) == 21:
                    break
        assert sorted(set(seen)) == sorted(bodies(20))
        assert seen.count(b"m3") == 2
        assert c.stats.requeued == 1
        await nsqd.close()

    run(body())


def test_exception_and_false_requeue_with_computed_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """No delay given: default_requeue_delay x attempts, capped at max_requeue_delay."""
    sent: list[bytes] = []
    original = _Link.queue

    def queue(conn: _Link, data: bytes) -> None:
        if data.startswith(b"REQ "):
            sent.append(data)
        original(conn, data)

    monkeypatch.setattr(_Link, "queue", queue)

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", [b"raise", b"false", b"explicit"])

        def handler(m: Message) -> Any:
            if m.body == b"raise":
                raise RuntimeError("boom")
            if m.body == b"false":
                return False
            m.requeue(7200, backoff=False)  # clamped to max_requeue_delay
            return None

        async with Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=10,
            default_requeue_delay=1.5,
            max_requeue_delay=600,
            max_backoff_duration=0,
        ) as c:
            await wait_for(lambda: c.stats.requeued == 3, what="3 requeues")
        delays = sorted(int(line.split()[2]) for line in sent)
        assert delays == [1500, 1500, 600_000]
        await nsqd.close()

    run(body())


def test_max_attempts_goes_to_the_giving_up_hook() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", [b"poison", b"fine"])
        given_up: list[Message] = []
        attempts: list[int] = []

        def handler(m: Message) -> None:
            if m.body == b"poison":
                attempts.append(m.attempts)
                m.requeue(0, backoff=False)

        async with Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=2,
            max_attempts=3,
            on_giving_up=given_up.append,
        ) as c:
            await wait_for(lambda: given_up, what="the giving-up hook")
        assert attempts == [1, 2, 3]
        assert given_up[0].body == b"poison" and given_up[0].attempts == 4
        assert c.stats.given_up == 1
        ch = nsqd.topics["t"].channels["c"]
        await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0, what="poison FINed")
        await nsqd.close()

    run(body())


def test_giving_up_hook_by_subclass_and_async_hook() -> None:
    class Archiving(Consumer):
        archived: list[bytes] = []

        async def giving_up(self, msg: Message) -> None:
            await asyncio.sleep(0)
            self.archived.append(msg.body)

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", [b"bad"])
        c = Archiving(
            "t",
            "c",
            lambda m: m.requeue(0, backoff=False),
            nsqd_tcp_addresses=addr(nsqd),
            max_attempts=1,
        )
        async with c:
            await wait_for(lambda: Archiving.archived == [b"bad"], what="archived")
        assert c.stats.given_up == 1 and c.stats.finished == 1
        await nsqd.close()

    run(body())


def test_batching_with_enable_async_and_is_starved() -> None:
    """A batching handler keeps messages and processes them when the consumer is starved."""

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(95))
        batch: list[Message] = []
        batches: list[int] = []
        consumer: Consumer | None = None

        def handler(m: Message) -> None:
            m.enable_async()
            batch.append(m)
            assert consumer is not None
            if consumer.is_starved():
                batches.append(len(batch))
                for x in batch:
                    x.finish()
                batch.clear()

        consumer = Consumer("t", "c", handler, nsqd_tcp_addresses=addr(nsqd), max_in_flight=20)
        async with consumer:
            await wait_for(lambda: sum(batches) + len(batch) == 95, what="all messages")
            assert batches and max(batches) <= 20
            for x in batch:
                x.finish()
        await nsqd.close()

    run(body())


def test_finish_all_answers_held_messages_of_several_connections_at_once() -> None:
    """finish_all FINs what two consumers hold (each with its own connection) in one go:
    nsqd sees every message finished, the consumers count them, an answered message is
    left alone and a message answered after finish_all raises as usual."""
    from nsqx.client import MessageRespondedError, finish_all

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(300))
        held: list[Message] = []

        def hold(m: Message) -> None:
            m.enable_async()
            held.append(m)

        consumers = [
            Consumer("t", "c", hold, nsqd_tcp_addresses=addr(nsqd), max_in_flight=300)
            for _ in range(2)
        ]
        for c in consumers:
            await c.start()
        await wait_for(lambda: len(held) == 300, what="300 messages held")
        ch = nsqd.topics["t"].channels["c"]
        assert ch.in_flight_count == 300
        held[0].requeue(0, backoff=False)  # answered already: finish_all skips it
        assert finish_all(held) == 299
        with pytest.raises(MessageRespondedError):
            held[1].finish()
        # the requeued one comes back (to either consumer) and is held again
        await wait_for(lambda: len(held) == 301, what="the requeued message again")
        assert held[-1].body == held[0].body and held[-1].attempts == 2
        assert finish_all(held) == 1
        await wait_for(lambda: ch.in_flight_count == 0, what="FINs applied")
        assert ch.depth == 0
        assert sum(c.stats.finished for c in consumers) == 300
        for c in consumers:
            await c.close()
        await nsqd.close()

    run(body())


def test_frames_handler_takes_each_read_whole_and_answers_by_id() -> None:
    """A frames handler gets each read's messages as frame data with their connection;
    they stay in flight (and count against max_in_flight) until answered through it:
    FIN, TOUCH and REQ by id, each counted; a requeued message comes again with
    attempts 2; messages over max_attempts go to the giving-up hook, not the handler."""

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(300))
        got: list[tuple[Any, list[bytes]]] = []
        given_up: list[Message] = []
        c = Consumer(
            "t",
            "c",
            frames_handler=lambda link, datas: got.append((link, datas)),
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=200,
            max_attempts=2,
            on_giving_up=given_up.append,
        )
        await c.start()
        await wait_for(lambda: sum(len(d) for _, d in got) == 200, what="200 held")
        ch = nsqd.topics["t"].channels["c"]
        assert ch.in_flight_count == 200  # nothing more than max_in_flight
        link = got[0][0]
        datas = [d for _, ds in got for d in ds]
        assert all(lk is link for lk, _ in got) and all(
            decode_message(d).attempts == 1 for d in datas
        )
        link.touch_many([d[MSG_ID_AT:MSG_ID_END] for d in datas[:10]])
        link.finish_many([d[MSG_ID_AT:MSG_ID_END] for d in datas[:150]])
        link.requeue_many([d[MSG_ID_AT:MSG_ID_END] for d in datas[150:]], 0)
        # the 100 not yet delivered and the 50 requeued (attempts 2) come
        await wait_for(lambda: sum(len(d) for _, d in got) == 350, what="the rest")
        again = [d for _, ds in got for d in ds][200:]
        assert sorted(d[MSG_BODY_AT:] for d in again) == sorted(
            [d[MSG_BODY_AT:] for d in datas[150:]]
            + sorted(set(bodies(300)) - {d[MSG_BODY_AT:] for d in datas})
        )
        assert sorted(decode_message(d).attempts for d in again) == [1] * 100 + [2] * 50
        assert c.stats.finished == 150 and c.stats.requeued == 50
        # requeued once more: a third delivery is over max_attempts=2
        link.requeue_many(
            [d[MSG_ID_AT:MSG_ID_END] for d in again if decode_message(d).attempts == 2], 0
        )
        link.finish_many(
            [d[MSG_ID_AT:MSG_ID_END] for d in again if decode_message(d).attempts == 1]
        )
        await wait_for(lambda: len(given_up) == 50, what="giving up")
        await wait_for(lambda: ch.in_flight_count == 0 and ch.depth == 0, what="all answered")
        assert sum(len(d) for _, d in got) == 350  # the handler never saw attempt 3
        await c.close()
        await nsqd.close()

    run(body())


def test_frames_handler_excludes_a_handler_and_iteration() -> None:
    from nsqx.client import ConfigError

    with pytest.raises(ConfigError):
        Consumer("t", "c", lambda m: None, frames_handler=lambda link, datas: None)
    c = Consumer("t", "c", frames_handler=lambda link, datas: None)
    with pytest.raises(TypeError):
        c.__aiter__()


def test_touch_is_sent_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[bytes] = []
    original = _Link.queue

    def queue(conn: _Link, data: bytes) -> None:
        sent.append(data)
        original(conn, data)

    monkeypatch.setattr(_Link, "queue", queue)

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", [b"a", b"b"])

        async def handler(m: Message) -> None:
            if m.body == b"b":
                m.touch()
            await asyncio.sleep(0)

        async with Consumer("t", "c", handler, nsqd_tcp_addresses=addr(nsqd), max_in_flight=2) as c:
            await wait_for(lambda: c.stats.finished == 2, what="both finished")
        touches = [s for s in sent if s.startswith(b"TOUCH")]
        assert len(touches) == 1
        await nsqd.close()

    run(body())


def test_backoff_pauses_tests_the_waters_and_recovers(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(40))
        fail = {"on": True}
        handled: list[bytes] = []

        def handler(m: Message) -> None:
            if fail["on"]:
                raise RuntimeError("downstream is down")
            handled.append(m.body)

        c = Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=10,
            backoff_multiplier=0.01,
            max_backoff_duration=0.05,
            default_requeue_delay=0,
        )
        watcher = RdyWatcher(c).install(monkeypatch)
        levels: list[int] = []
        async with c:
            await wait_for(lambda: c.backoff.level >= 2, what="backoff level 2")
            # in backoff at most one message is in flight overall
            levels.append(c.backoff.level)
            assert c.rdy.total <= 1
            fail["on"] = False
            await wait_for(lambda: len(set(handled)) == 40, what="recovery")
            await wait_for(lambda: c.backoff.level == 0, what="backoff over")
            assert c.rdy.total == 10
        assert watcher.errors == []
        assert c.stats.requeued >= 2
        await nsqd.close()

    run(body())


def test_backoff_can_be_turned_off() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(10))
        c = Consumer(
            "t",
            "c",
            lambda m: m.requeue(0),
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=10,
            max_backoff_duration=0,
            max_attempts=0,
        )
        async with c:
            await wait_for(lambda: c.stats.requeued >= 30, what="requeues")
            assert c.backoff.level == 0 and c.rdy.total == 10
        await nsqd.close()

    run(body())


def test_graceful_close_answers_everything_in_flight() -> None:
    """close() sends CLS and waits for running handlers: nothing they finished comes back."""

    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(200))
        finished: list[bytes] = []
        started = asyncio.Event()

        async def slow(m: Message) -> None:
            started.set()
            await asyncio.sleep(0.05)
            finished.append(m.body)

        c = Consumer("t", "c", slow, nsqd_tcp_addresses=addr(nsqd), max_in_flight=20)
        await c.start()
        await started.wait()
        await c.close()
        assert finished and c.stats.finished == len(finished)
        again: list[bytes] = []
        async with Consumer(
            "t",
            "c",
            lambda m: again.append(m.body),
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=50,
        ):
            await wait_for(lambda: len(finished) + len(again) >= 200, what="the rest")
        assert not set(finished) & set(again)
        assert sorted(finished + again) == sorted(bodies(200))
        await nsqd.close()

    run(body())


def test_heartbeats_are_answered() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        beats = 0
        original = _Link.handle_control

        def counting(conn: _Link, ftype: int, data: bytes) -> Any:
            nonlocal beats
            if data == b"_heartbeat_":
                beats += 1
            return original(conn, ftype, data)

        _Link.handle_control = counting  # type: ignore[method-assign]
        try:
            async with Consumer(
                "t", "c", lambda m: None, nsqd_tcp_addresses=addr(nsqd), heartbeat_interval=1
            ) as c:
                # nsqd closes a client after two unanswered heartbeats
                await wait_for(lambda: beats >= 3, timeout=15, what="3 heartbeats")
                assert len(c.connections) == 1
                client = next(iter(nsqd.clients))
                assert not client.closed
        finally:
            _Link.handle_control = original  # type: ignore[method-assign]
        await nsqd.close()

    run(body())


def test_identify_negotiates_max_rdy_count_and_msg_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        nsqd = await start_nsqd(max_rdy_count=7)
        await publish(nsqd, "t", bodies(30))
        got: list[bytes] = []
        c = Consumer(
            "t",
            "c",
            lambda m: got.append(m.body),
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=100,
            msg_timeout=5,
        )
        watcher = RdyWatcher(c).install(monkeypatch)
        async with c:
            await wait_for(lambda: len(got) == 30, what="messages")
            conn = next(iter(c._conns.values()))
            assert conn.max_rdy_count == 7 and conn.msg_timeout == 5.0
            assert c.rdy.total == 7
        assert watcher.errors == [] and watcher.max_sum == 7
        await nsqd.close()

    run(body())


def test_sampling_and_identity_reach_nsqd() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        cfg = Config(client_id="worker-7", user_agent="tests/1.0", sample_rate=50)
        async with Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=addr(nsqd), config=cfg):
            client = next(iter(nsqd.clients))
            assert client.settings.client_id == "worker-7"
            assert client.settings.user_agent == "tests/1.0"
            assert client.settings.sample_rate == 50
        await nsqd.close()

    run(body())


def test_start_without_any_address_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        c = Consumer("t", "c", lambda m: None)
        with pytest.raises(Exception, match="nsqd_tcp_addresses or lookupd_http_addresses"):
            await c.start()

    caplog.set_level(logging.ERROR)
    run(body())


def test_set_max_in_flight_pauses_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", bodies(10))
        got: list[bytes] = []
        c = Consumer("t", "c", got.append, nsqd_tcp_addresses=addr(nsqd), max_in_flight=4)
        watcher = RdyWatcher(c).install(monkeypatch)
        async with c:
            await wait_for(lambda: len(got) == 10, what="first messages")
            c.set_max_in_flight(0)
            assert c.rdy.total == 0
            await publish(nsqd, "t", [b"while-paused"])
            client = next(iter(nsqd.clients))
            await wait_for(lambda: client.rdy == 0, what="RDY 0 applied by nsqd")
            assert len(got) == 10
            c.set_max_in_flight(3)
            await wait_for(lambda: len(got) == 11, what="resumed")
        assert watcher.errors == []
        await nsqd.close()

    run(body())


def test_coroutine_failures_requeue_and_awaitables_are_awaited() -> None:
    async def body() -> None:
        nsqd = await start_nsqd()
        await publish(nsqd, "t", [b"a", b"b"])
        seen: list[tuple[bytes, int]] = []

        async def handler(m: Message) -> None:
            seen.append((m.body, m.attempts))
            if m.attempts == 1:
                raise RuntimeError("first time fails")

        async with Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=addr(nsqd),
            max_in_flight=2,
            default_requeue_delay=0,
            backoff_multiplier=0.001,
        ) as c:
            await wait_for(lambda: c.stats.finished == 2, what="second attempts finish")
        assert sorted(seen) == [(b"a", 1), (b"a", 2), (b"b", 1), (b"b", 2)]
        assert c.stats.requeued == 2

        # a plain function returning an awaitable: the result counts when it completes
        await publish(nsqd, "t2", [b"x"])
        results: list[bool] = []

        async def later(m: Message) -> bool:
            results.append(True)
            return True

        async with Consumer("t2", "c", lambda m: later(m), nsqd_tcp_addresses=addr(nsqd)) as c2:
            await wait_for(lambda: c2.stats.finished == 1, what="finished after the await")
        assert results == [True]
        await nsqd.close()

    run(body())
