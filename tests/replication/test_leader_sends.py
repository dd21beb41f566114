"""The leader's side of a stream, without the network: records appended go to each
follower in the same call, up to MAX_UNACKED messages unacknowledged; a full transport
hands the sending over to the stream's task; and the writes waiting for the ISR are
told in the call that moves the commit point (no loop iteration in between, either
way: each one was a turn of the leader's loop between a publish and its answer)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from nsqx.nsqd.guid import make_ids
from nsqx.nsqd.replication import leader as leader_mod
from nsqx.nsqd.replication.leader import (
    CommitFailed,
    FollowerStream,
    FrameWriter,
    LeaderReplication,
)
from nsqx.nsqd.replication.state import ReplicaRole
from nsqx.nsqd.waiters import future_waiter
from nsqx.store.memlog import MemoryLog
from nsqx.wire import replication as rp
from nsqx.wire import websocket as ws
from nsqx.wire.frames import encode_message_batch


class Transport:
    """Keeps what is written, as the messages a follower would read."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.reader = ws.FrameReader(max_size=1 << 24)
        self.messages: list[rp.Message] = []
        self.closing = False

    def writelines(self, parts: list[bytes]) -> None:
        for opcode, payload in self.reader.feed(b"".join(parts)):
            assert opcode == ws.OP_BINARY
            self.messages.append(rp.decode(payload))

    def is_closing(self) -> bool:
        return self.closing


class Part:
    def __init__(self) -> None:
        self.log = MemoryLog()
        self.committed_to: list[int] = []

    def committed(self, end: int) -> None:
        self.committed_to.append(end)

    def append(self, n: int) -> None:
        ids = make_ids(self.log.end, n, 0)
        chunk, stride = encode_message_batch(1000, ids, [b"m"] * n)
        self.log.append(chunk, ids, 0, stride)


def make_leader() -> tuple[LeaderReplication, Part]:
    part = Part()
    role = ReplicaRole(1, "me", "127.0.0.1:1", ("me", "f1"), ("me", "f1"), 2)
    replica: Any = SimpleNamespace(
        part=part, role=role, node_id="me", may_acknowledge=lambda: True, durable_ack=False
    )
    return LeaderReplication(replica, 0), part


def add_stream(leader: LeaderReplication, node: str = "f1") -> tuple[FollowerStream, Transport]:
    protocol = SimpleNamespace(writing_paused=False)
    transport = Transport(protocol)
    sock: Any = SimpleNamespace(closed=False)
    request: Any = SimpleNamespace(transport=transport, protocol=protocol)
    stream = FollowerStream(node, sock, leader.part.log.end, FrameWriter(sock, request))
    stream.wake.clear()  # (no send task here: what is sent, pump sent)
    leader.streams[node] = stream
    leader.acked[node] = stream.acked
    return stream, transport


def sent_ends(transport: Transport) -> list[int]:
    out = []
    for m in transport.messages:
        assert isinstance(m, rp.Batches)
        last = m.batches[-1]
        out.append(last.first + last.messages)
    return out


def test_appended_records_go_out_in_the_same_call_up_to_the_unacknowledged_limit() -> None:
    leader, part = make_leader()
    stream, transport = add_stream(leader)
    for i in range(leader_mod.MAX_UNACKED + 2):
        part.append(3)
        leader.appended()
        # sent at once while there is room, then held (they go together later)
        assert len(transport.messages) == min(i + 1, leader_mod.MAX_UNACKED)
    assert sent_ends(transport) == [3 * (i + 1) for i in range(leader_mod.MAX_UNACKED)]
    assert list(stream.unacked) == sent_ends(transport)
    assert not stream.wake.is_set()  # the task was not needed


def test_the_held_records_go_out_together_once_room_is_made() -> None:
    leader, part = make_leader()
    stream, transport = add_stream(leader)
    for _ in range(leader_mod.MAX_UNACKED + 3):
        part.append(2)
        leader.appended()
    first = stream.unacked.popleft()  # (as serve() does with an acknowledgement)
    leader.pump(stream)
    ends = sent_ends(transport)
    assert len(ends) == leader_mod.MAX_UNACKED + 1
    assert ends[-1] == part.log.end  # every held record in one message
    assert first == ends[0]


def test_a_full_transport_hands_the_sending_to_the_task() -> None:
    leader, part = make_leader()
    stream, transport = add_stream(leader)
    transport.protocol.writing_paused = True  # the first write fills it
    part.append(1)
    leader.appended()
    assert len(transport.messages) == 1
    assert stream.draining and stream.wake.is_set()
    stream.unacked.clear()
    part.append(1)
    leader.appended()
    assert len(transport.messages) == 1  # only the task sends until it drained


def test_a_send_that_fails_wakes_the_task_to_close_the_stream() -> None:
    leader, part = make_leader()
    stream, transport = add_stream(leader)
    transport.closing = True
    part.append(1)
    leader.appended()  # does not raise into the publish path
    assert stream.draining and stream.wake.is_set()
    assert transport.messages == []


def test_commit_waiters_are_told_in_the_call_that_moves_the_commit_point(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(told_in_the_call(caplog))


async def told_in_the_call(caplog: pytest.LogCaptureFixture) -> None:
    leader, part = make_leader()
    part.append(5)
    told: list[tuple[str, BaseException | None]] = []

    def broken(err: BaseException | None) -> None:
        raise RuntimeError("a waiter's bug")

    seen: list[list[int]] = []

    def first(err: BaseException | None) -> None:
        told.append(("a", err))
        seen.append(list(part.committed_to))

    leader.when_committed(3, first)
    leader.when_committed(3, broken)
    leader.when_committed(5, lambda err: told.append(("b", err)))
    fut, done = future_waiter()
    leader.when_committed(5, done)
    leader.acked["f1"] = 3
    with caplog.at_level(logging.ERROR, "nsqx.replication"):
        leader.recompute()
    assert told == [("a", None)]  # before any await: the raising waiter did not stop it
    assert seen == [[3]]  # the records were shown to channels before the answer
    assert "a commit waiter failed" in caplog.text
    assert not fut.done()
    leader.acked["f1"] = 5
    leader.recompute()
    assert told == [("a", None), ("b", None)] and fut.done()
    assert part.committed_to == [3, 5]
    # already committed: told at once
    leader.when_committed(4, lambda err: told.append(("c", err)))
    assert told[-1] == ("c", None)


def test_waiters_are_failed_when_the_leadership_ends() -> None:
    leader, part = make_leader()
    part.append(2)
    told: list[BaseException | None] = []
    leader.when_committed(2, told.append)
    leader.close()
    assert len(told) == 1 and isinstance(told[0], CommitFailed)
    leader.when_committed(2, told.append)  # after the end: failed at once
    assert isinstance(told[1], CommitFailed)
