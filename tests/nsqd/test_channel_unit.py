"""Channel alone, on fakes of its consumers: they record what they are sent (the
:class:`~nsqx.nsqd.channel.Consumer` protocol).

The partition is a real one in memory (an ``#ephemeral`` topic) of an nsqd that is
never started: no socket, no listener, no scan loop (a compiled Channel only takes a
real Partition). The clocks are frozen and moved by the test, and the pump is run
directly, so every delivery and deadline is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakeclock import FrozenClock
from nsqx.nsqd.channel import Channel
from nsqx.nsqd.guid import make_ids, seq_of
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.partition import Partition
from nsqx.store.log import split_chunks
from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import decode_message
from nsqx.wire.identify import ClientSettings

TIMEOUT = 10.0  # s: the fake consumers' msg_timeout


def publish(part: Partition, *bodies: bytes) -> list[bytes]:
    """Publish to a memory partition (appended at once); the messages' ids."""
    p = part.publish(list(bodies))
    return make_ids(p.seq, len(bodies), part.id, part.id_base)


class FakeConsumer:
    """A subscribed client: its RDY, and every message it was sent (id -> attempts)."""

    def __init__(
        self,
        name: str,
        rdy: int,
        buffer_delay: float = 0.0,
        journal: list[tuple[FakeConsumer, bytes, int]] | None = None,
    ) -> None:
        self.remote_address = name
        self.msg_timeout = TIMEOUT
        self.sample_rate = 0
        self.settings = ClientSettings()
        self.rdy = rdy
        self.buffer_delay = buffer_delay
        self.got: list[tuple[bytes, int]] = []
        self.flushes: list[bool] = []
        self.closed = False
        #: deliveries to several consumers, in order
        self.journal = journal if journal is not None else []

    def send(self, frames: list[bytes], ids: list[bytes], flush: bool) -> float:
        msgs = [decode_message(f[8:]) for f in split_chunks(frames)]
        assert [m.id for m in msgs] == ids
        self.got.extend((m.id, m.attempts) for m in msgs)
        self.journal.extend((self, m.id, m.attempts) for m in msgs)
        self.flushes.append(flush)
        return 0.0 if flush else self.buffer_delay

    def close(self) -> None:
        self.closed = True

    def fail(self, err: ProtocolError) -> None:
        self.closed = True

    @property
    def ids(self) -> list[bytes]:
        return [i for i, _ in self.got]


@pytest.fixture
def clock() -> Iterator[FrozenClock]:
    with FrozenClock() as c:
        yield c


@pytest.fixture
def idle_nsqd(tmp_path: Path) -> NSQD:
    """An nsqd that is never started: topics and channels, no socket, no loop task."""
    return NSQD(NsqdOptions(data_path=str(tmp_path)))


def in_loop(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` inside a running loop (a channel schedules its pump on it)."""

    async def body() -> Any:
        return fn()

    return asyncio.run(body())


def setup(nsqd: NSQD, *consumers: FakeConsumer) -> tuple[Partition, Channel]:
    part = nsqd.get_topic("t#ephemeral").default_partition
    ch = part.get_channel("ch")
    for c in consumers:
        subscribe(ch, c)
    return part, ch


def subscribe(ch: Channel, c: FakeConsumer) -> None:
    """``c`` subscribes, then says its RDY (as a client must: RDY comes after SUB)."""
    ch.add_client(c)
    ch.ready_changed(c, c.rdy)


def deliver(ch: Channel) -> None:
    """Run the pump until it has nothing more to hand out."""
    for _ in range(4):
        ch.pump()


def test_round_robin_to_spare_rdy(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        a, b = FakeConsumer("a", 3), FakeConsumer("b", 5)
        part, ch = setup(idle_nsqd, a, b)
        publish(part, *[b"m%d" % i for i in range(6)])
        deliver(ch)
        assert (len(a.got), len(b.got)) == (3, 3)  # an even share each
        assert sorted(a.ids + b.ids) == make_ids(0, 6)
        publish(part, *[b"n%d" % i for i in range(6)])
        deliver(ch)
        assert (len(a.got), len(b.got)) == (3, 5)  # never more than RDY
        assert ch.in_flight_count == 8 and ch.depth == 4
        # the last batch that filled a consumer's RDY is written at once
        assert a.flushes[-1] and b.flushes[-1]
        ch.ready_changed(b, 0)
        ch.finish(a, a.ids)
        deliver(ch)
        assert len(a.got) == 6 and ch.depth == 1

    in_loop(body)


def test_fin_req_touch_and_their_errors(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        a, b = FakeConsumer("a", 1), FakeConsumer("b", 1)
        part, ch = setup(idle_nsqd, a, b)
        m1, m2 = publish(part, b"1", b"2")
        deliver(ch)
        mine, theirs = (m1, m2) if a.ids == [m1] else (m2, m1)
        assert ch.finish(a, [theirs]) == [(theirs, "client does not own message")]
        assert ch.touch(a, theirs, 60) == "client does not own message"
        assert ch.requeue(a, b"0" * 16, 0) == "ID not in flight"
        # ids are the client's bytes: not hex is not in flight either (found by fuzzing)
        for bad in (b"0123\xff\xff\xff9999999PY", b"z" * 16):
            assert ch.requeue(a, bad, 0) == "ID not in flight"
            assert ch.requeue(a, bad, 1000) == "ID not in flight"
            assert ch.touch(a, bad, 60) == "ID not in flight"
            assert ch.finish(a, [bad]) == [(bad, "ID not in flight")]
        assert ch.requeue(a, mine, 0) is None
        deliver(ch)
        assert a.got[-1] == (mine, 2)  # again, as its second attempt
        assert ch.finish(a, [mine]) == []
        assert ch.finish(a, [mine]) == [(mine, "ID not in flight")]
        held = ch.held_by(a)
        assert held is not None
        assert (held.finish_count, held.requeue_count) == (1, 1)
        assert ch.touch(b, theirs, 60) is None

    in_loop(body)


def test_req_with_a_delay_waits_for_its_time(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        a = FakeConsumer("a", 5)
        part, ch = setup(idle_nsqd, a)
        (m,) = publish(part, b"later")
        deliver(ch)
        assert ch.requeue(a, m, 5000) is None
        assert ch.deferred_count == 1 and ch.in_flight_count == 0
        clock.advance(4.999)
        ch.scan(clock.now, int(clock.now * 1e9))
        deliver(ch)
        assert len(a.got) == 1
        clock.advance(0.001)
        ch.scan(clock.now, int(clock.now * 1e9))
        deliver(ch)
        assert a.got == [(m, 1), (m, 2)] and ch.deferred_count == 0

    in_loop(body)


def test_timeouts_touch_and_buffered_output(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        a = FakeConsumer("a", 2, buffer_delay=0.25)
        part, ch = setup(idle_nsqd, a)
        m1, m2 = publish(part, b"1", b"2")
        deliver(ch)
        assert a.flushes == [True]  # RDY filled: nothing else would follow
        b = FakeConsumer("b", 10, buffer_delay=0.25)
        subscribe(ch, b)
        (m3,) = publish(part, b"3")
        deliver(ch)
        assert b.got == [(m3, 1)] and b.flushes == [False]
        clock.advance(5)
        assert ch.touch(a, m1, 12) is None  # to 15, clamped to 0 + 12
        clock.advance(5)  # 10: m2's deadline; m3's is 10.25 (buffered: the clock
        ch.scan(clock.now, int(clock.now * 1e9))  # starts when the client sees it)
        assert ch.timeout_count == 1 and ch.in_flight_count == 2
        clock.advance(0.25)
        ch.scan(clock.now, int(clock.now * 1e9))
        assert ch.timeout_count == 2
        clock.advance(1.75)  # 12: m1's clamp
        ch.scan(clock.now, int(clock.now * 1e9))
        assert ch.timeout_count == 3 and ch.in_flight_count == 0
        held_a, held_b = ch.held_by(a), ch.held_by(b)
        assert held_a is not None and held_b is not None
        assert (held_a.timeout_count, held_b.timeout_count) == (2, 1)
        deliver(ch)
        assert sorted(a.got[2:] + b.got[1:]) == [(m1, 2), (m2, 2), (m3, 2)]

    in_loop(body)


def test_ordered_one_in_flight_next_after_fin(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        journal: list[tuple[FakeConsumer, bytes, int]] = []
        a, b = FakeConsumer("a", 10, journal=journal), FakeConsumer("b", 10, journal=journal)
        part, ch = setup(idle_nsqd, a, b)
        ch.set_ordered(True)
        ids = publish(part, b"1", b"2", b"3")
        deliver(ch)
        assert ch.in_flight_count == 1 and len(journal) == 1
        first, mid, _ = journal[0]
        assert mid == ids[0] and first.flushes == [True]
        # REQ with a delay is ignored: it stays in flight, the order holds
        assert ch.requeue(first, ids[0], 1000) is None
        assert ch.in_flight_count == 1 and ch.deferred_count == 0
        # REQ 0 sends it again, before the next one
        assert ch.requeue(first, ids[0], 0) is None
        deliver(ch)
        assert journal[-1][1:] == (ids[0], 2)
        for want in ids:
            holder, mid, _ = journal[-1]
            assert mid == want and ch.in_flight_count == 1
            assert ch.finish(holder, [want]) == []
            deliver(ch)
        assert [m for _, m, _ in journal] == [ids[0], *ids]
        assert ch.in_flight_count == 0 and ch.depth == 0

    in_loop(body)


def test_a_consumer_that_leaves_has_its_messages_requeued(
    clock: FrozenClock, idle_nsqd: NSQD
) -> None:
    def body() -> None:
        a, b = FakeConsumer("a", 2), FakeConsumer("b", 2)
        part, ch = setup(idle_nsqd, a, b)
        ids = publish(part, b"1", b"2", b"3", b"4")
        deliver(ch)
        assert len(a.got) == 2 and ch.depth == 0
        ch.remove_client(a)
        assert ch.held_by(a) is None and ch.in_flight_count == 2 and ch.depth == 2
        assert ch.finish(b, b.ids) == []
        deliver(ch)
        assert sorted(b.ids) == sorted(ids)
        assert sorted(b.got[2:]) == sorted((m, 2) for m in a.ids)
        ch.remove_client(a)  # twice is harmless
        # the channel's state is the checkpoint's: two in flight at b
        state = ch.cursor_state()
        assert state.cursor == 4 and sorted(state.pending[::3]) == sorted(seq_of(m) for m in a.ids)

    in_loop(body)


def test_a_deleted_channel_closes_its_consumers(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    def body() -> None:
        a = FakeConsumer("a", 2)
        part, ch = setup(idle_nsqd, a)
        publish(part, b"1")
        deliver(ch)
        ch.close()
        assert a.closed and ch.in_flight_count == 0 and not ch.clients

    in_loop(body)


def test_seek_forgets_the_queue_keeps_what_is_in_flight(
    clock: FrozenClock, idle_nsqd: NSQD
) -> None:
    def body() -> None:
        a = FakeConsumer("a", 1)
        part, ch = setup(idle_nsqd, a)
        m1, m2, _m3 = publish(part, b"1", b"2", b"3")
        deliver(ch)
        assert ch.requeue(a, m1, 0) is None
        ch.seek(2)
        assert ch.depth == 1 and ch.in_flight_count == 0 and ch.dirty
        deliver(ch)
        assert a.ids == [m1, make_ids(2, 1)[0]] and m2 not in a.ids

    in_loop(body)


def test_a_replica_keeps_its_leaders_deferred_messages(clock: FrozenClock, idle_nsqd: NSQD) -> None:
    """A follower's channel takes its leader's position and deferred messages (each due
    as long after now as it was after the leader's now): when it leads, the log's read
    passes them, and they come when due; the rest of the log comes at once."""

    def body() -> None:
        part, ch = setup(idle_nsqd)
        ids = publish(part, b"0", b"1", b"2", b"3")
        leader_now_ms = 5_000  # (the leader's clock need not agree with this one)
        ch.take_leader_state(1, [(2, 1, leader_now_ms + 3000)], leader_now_ms)
        assert ch.cursor == 1 and ch.deferred_count == 1 and ch.depth == 2
        # the same state again changes nothing (a leader sends it twice a second)
        ch.take_leader_state(1, [(2, 1, leader_now_ms + 3000)], leader_now_ms + 500)
        assert ch.deferred_count == 1
        a = FakeConsumer("a", 10)
        subscribe(ch, a)
        deliver(ch)
        assert a.ids == [ids[1], ids[3]]  # 2 waits for its time
        clock.advance(2.999)
        ch.scan(clock.now, int(clock.now * 1e9))
        deliver(ch)
        assert len(a.got) == 2
        clock.advance(0.001)
        ch.scan(clock.now, int(clock.now * 1e9))
        deliver(ch)
        assert a.got[-1] == (ids[2], 2)  # its second attempt, as on the leader
        assert ch.deferred_count == 0 and not ch.ahead

    in_loop(body)


def test_the_earliest_deferred_messages_go_to_the_replicas(
    clock: FrozenClock, idle_nsqd: NSQD
) -> None:
    def body() -> None:
        part, ch = setup(idle_nsqd)
        publish(part, *[b"%d" % i for i in range(50)])
        for i in range(50):
            ch.flight.defer(i, 1, int(clock.now * 1e9) + (97 * i % 50 + 1) * 1_000_000)
        wall = clock.wall_start_ns // 1_000_000
        earliest = ch.deferred_for_replicas(5)
        assert [due - wall for _, _, due in earliest] == [1, 2, 3, 4, 5]
        assert len(ch.deferred_for_replicas(100)) == 50

    in_loop(body)
