"""A state machine of one channel's delivery, checked against a model (hypothesis).

Random sequences of PUB, MPUB, DPUB, consumers coming and going, RDY, FIN, REQ (now
and later), TOUCH, time passing and nsqd restarting (clean stops) drive a real nsqd
(in this process, its clients on in-memory transports, its clocks frozen and moved by
the test, so every deadline is exact). The model predicts every error frame, and each
message delivered is checked as it arrives:

- never a message that was finished, never one in flight at another consumer (a
  message comes back only after its timeout, a REQ, or its consumer leaving);
- attempts are exactly one more than the deliveries before (across restarts too);
- no consumer gets more than its RDY;
- nothing stalls: after every step, a consumer with spare RDY means no message is
  waiting;
- at the end every published message is delivered until it is finished.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from fakeclock import FrozenClock
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.options import NsqdOptions
from nsqx.wire import FRAME_ERROR, FRAME_MESSAGE, MAGIC_V2, FrameDecoder, decode_message
from nsqx.wire import commands as c

TIMEOUT = 10  # s: the consumers' msg_timeout
MAX_TIMEOUT = 16  # s: --max-msg-timeout (TOUCH's bound)
# time moves by 3 or 11 s: no sum of those is 5, 10 or 16, so no deadline is ever
# exactly "now" (the model needs no tie rule)
STEPS = (3, 11)
REQ_DELAY_MS = 5000


class FakeTransport:
    """What ClientV2 needs of a transport, in memory."""

    def __init__(self, protocol: ClientV2, n: int) -> None:
        self.protocol = protocol
        self.n = n
        self.out = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("fake", self.n) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def in_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> Any:
    """Call ``fn`` as nsqd's code expects to be called: inside the running loop."""

    async def call() -> Any:
        return fn(*args)

    return loop.run_until_complete(call())


@dataclass
class Consumer:
    proto: ClientV2
    transport: FakeTransport
    loop: asyncio.AbstractEventLoop
    rdy: int = 0
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    #: what the model says this consumer has in flight: id -> (delivered at, deadline)
    held: dict[bytes, list[float]] = field(default_factory=dict)
    #: error frames the model expects, in order
    expected_errors: list[bytes] = field(default_factory=list)

    def send(self, data: bytes) -> None:
        in_loop(self.loop, self.proto.data_received, data)

    def close(self) -> None:
        in_loop(self.loop, self.transport.close)


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FrozenClock().__enter__()
        self.data_path = tempfile.mkdtemp(prefix="nsqx-states-")
        self.nsqd = self._start()
        self.consumers: dict[int, Consumer] = {}
        self.next_consumer = 0
        self.published: list[bytes] = []  # bodies, in order: body i has sequence i
        self.attempts: dict[bytes, int] = {}  # deliveries so far, by hex id
        self.holder: dict[bytes, int] = {}  # id -> consumer that has it in flight
        self.deferred: dict[bytes, float] = {}  # id -> due (monotonic s)
        self.finished: set[bytes] = set()
        #: consumers that had an id in flight and lost it (timeout, restart): a late FIN
        self.lost: list[tuple[int, bytes]] = []

    # -- plumbing ---------------------------------------------------------------------

    def _start(self) -> NSQD:
        options = NsqdOptions(
            tcp_address="127.0.0.1:0",
            http_address="",
            https_address="",
            data_path=self.data_path,
            max_msg_timeout=MAX_TIMEOUT,
            queue_scan_interval=3600,  # the test runs the scans, at its times
            mem_queue_size=3,  # reads also come from the files
            max_bytes_per_file=600,  # and cross segments
        )
        nsqd = NSQD(options)
        self.loop.run_until_complete(nsqd.start())
        return nsqd

    def _settle(self) -> None:
        """Let the channel's pump run, then read what every consumer was sent."""
        for _ in range(3):
            self.loop.run_until_complete(asyncio.sleep(0))
        for cid, con in list(self.consumers.items()):
            frames = con.decoder.feed(bytes(con.transport.out))
            con.transport.out.clear()
            for ftype, data in frames:
                if ftype == FRAME_MESSAGE:
                    self._delivered(cid, con, data)
                elif ftype == FRAME_ERROR:
                    assert con.expected_errors, f"unexpected error {data!r}"
                    want = con.expected_errors.pop(0)
                    assert data.startswith(want), (data, want)
        for con in self.consumers.values():
            assert not con.expected_errors, con.expected_errors

    def _delivered(self, cid: int, con: Consumer, data: bytes) -> None:
        msg = decode_message(data)
        mid = msg.id
        seq = int(mid, 16) - 1  # (ids start at 1)
        assert msg.body == self.published[seq]
        assert mid not in self.finished, f"{mid!r} delivered after its FIN"
        assert mid not in self.holder, f"{mid!r} in flight at {self.holder[mid]} and sent to {cid}"
        assert self.deferred.get(mid, 0) <= self.clock.now, f"{mid!r} delivered before due"
        assert msg.attempts == self.attempts.get(mid, 0) + 1, (mid, msg.attempts)
        self.attempts[mid] = msg.attempts
        self.deferred.pop(mid, None)
        self.holder[mid] = cid
        now = self.clock.now
        con.held[mid] = [now, now + TIMEOUT]
        assert len(con.held) <= con.rdy, "more in flight than RDY"

    def _pub(self, data: bytes) -> None:
        """Publish on a connection of its own (the answers are OK: nothing to model)."""
        proto = in_loop(self.loop, ClientV2, self.nsqd)
        tr = FakeTransport(proto, -1)
        in_loop(self.loop, proto.connection_made, tr)
        in_loop(self.loop, proto.data_received, MAGIC_V2 + data)
        frames = FrameDecoder().feed(bytes(tr.out))
        assert frames and all(f == (0, b"OK") for f in frames), frames
        in_loop(self.loop, tr.close)

    def _available(self) -> list[bytes]:
        ids = [b"%016x" % (i + 1) for i in range(len(self.published))]  # (ids start at 1)
        return [
            m
            for m in ids
            if m not in self.finished
            and m not in self.holder
            and self.deferred.get(m, 0) <= self.clock.now
        ]

    def _release(self, cid: int, mid: bytes) -> None:
        """The model: ``mid`` is no longer in flight at ``cid``."""
        self.consumers[cid].held.pop(mid, None)
        self.holder.pop(mid, None)

    # -- rules ------------------------------------------------------------------------

    @rule(n=st.integers(1, 4), how=st.sampled_from(["pub", "mpub", "dpub"]))
    def publish(self, n: int, how: str) -> None:
        bodies = [b"m%d" % (len(self.published) + i) for i in range(n)]
        if how == "pub":
            self._pub(b"".join(c.pub("t", b) for b in bodies))
        elif how == "mpub":
            self._pub(c.mpub("t", bodies))
        else:
            self._pub(b"".join(c.dpub("t", REQ_DELAY_MS, b) for b in bodies))
        for i, _ in enumerate(bodies):
            mid = b"%016x" % (len(self.published) + i + 1)
            if how == "dpub":
                self.deferred[mid] = self.clock.now + REQ_DELAY_MS / 1000
        self.published += bodies
        self._settle()

    @precondition(lambda self: len(self.consumers) < 3)
    @rule(rdy=st.integers(0, 5))
    def connect(self, rdy: int) -> None:
        cid = self.next_consumer
        self.next_consumer += 1
        proto = in_loop(self.loop, ClientV2, self.nsqd)
        tr = FakeTransport(proto, cid)
        in_loop(self.loop, proto.connection_made, tr)
        con = Consumer(proto, tr, self.loop)
        self.consumers[cid] = con
        ident = c.identify({"msg_timeout": TIMEOUT * 1000, "output_buffer_size": -1})
        con.send(MAGIC_V2 + ident + c.sub("t", "ch") + c.rdy(rdy))
        con.rdy = rdy
        frames = con.decoder.feed(bytes(tr.out))
        tr.out.clear()
        assert frames[:2] == [(0, b"OK"), (0, b"OK")], frames
        for ftype, data in frames[2:]:
            assert ftype == FRAME_MESSAGE
            self._delivered(cid, con, data)
        self._settle()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), rdy=st.integers(0, 5))
    def set_rdy(self, data: st.DataObject, rdy: int) -> None:
        cid = data.draw(st.sampled_from(sorted(self.consumers)))
        con = self.consumers[cid]
        con.send(c.rdy(rdy))
        con.rdy = rdy
        self._settle()

    @precondition(lambda self: any(con.held for con in self.consumers.values()))
    @rule(data=st.data(), action=st.sampled_from(["fin", "req0", "req", "touch"]))
    def act(self, data: st.DataObject, action: str) -> None:
        cid = data.draw(st.sampled_from(sorted(k for k, v in self.consumers.items() if v.held)))
        con = self.consumers[cid]
        mid = data.draw(st.sampled_from(sorted(con.held)))
        if action == "fin":
            con.send(c.fin(mid))
            self._release(cid, mid)
            self.finished.add(mid)
        elif action in ("req0", "req"):
            delay = 0 if action == "req0" else REQ_DELAY_MS
            con.send(c.req(mid, delay))
            self._release(cid, mid)
            if delay:
                self.deferred[mid] = self.clock.now + delay / 1000
        else:
            con.send(c.touch(mid))
            delivered_at = con.held[mid][0]
            con.held[mid][1] = min(self.clock.now + TIMEOUT, delivered_at + MAX_TIMEOUT)
        self._settle()

    @precondition(lambda self: any(cid in self.consumers for cid, _ in self.lost))
    @rule(data=st.data())
    def late_fin(self, data: st.DataObject) -> None:
        """A consumer FINs a message it lost (timed out, back after a restart...)."""
        cid, mid = data.draw(st.sampled_from([e for e in self.lost if e[0] in self.consumers]))
        con = self.consumers[cid]
        if self.holder.get(mid) == cid:
            return  # it got the message again: a FIN now is a good one (act covers it)
        con.expected_errors.append(b"E_FIN_FAILED")
        con.send(c.fin(mid))
        self._settle()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.consumers)))
        con = self.consumers.pop(cid)
        for mid in list(con.held):
            self.holder.pop(mid, None)
        con.close()
        self.lost = [e for e in self.lost if e[0] != cid]
        self._settle()

    @rule(step=st.sampled_from(STEPS))
    def time_passes(self, step: int) -> None:
        self.clock.advance(step)
        now = self.clock.now
        for cid, con in self.consumers.items():
            for mid, (_, deadline) in list(con.held.items()):
                if deadline < now:
                    self._release(cid, mid)
                    self.lost.append((cid, mid))
        for topic in self.nsqd.topics.values():
            for part in topic.partitions.values():
                for ch in part.channels.values():
                    in_loop(self.loop, ch.scan, now, int(now * 1_000_000_000))
        self._settle()

    @rule()
    def restart(self) -> None:
        """A clean stop and start: in-flight messages come back, attempts kept."""
        for con in self.consumers.values():
            con.transport.closing = True
        self.loop.run_until_complete(self.nsqd.close())
        self.consumers.clear()
        self.holder.clear()
        self.lost.clear()
        self.nsqd = self._start()

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def nothing_stalls(self) -> None:
        """A consumer with room means no message is waiting for one."""
        if any(con.rdy > len(con.held) for con in self.consumers.values()):
            assert not self._available(), (self._available(), self.consumers)

    def teardown(self) -> None:
        try:
            if self.published:
                self._drain()
        finally:
            self.loop.run_until_complete(self.nsqd.close())
            self.loop.close()
            self.clock.__exit__(None, None, None)

    def _drain(self) -> None:
        """Every published message is delivered until finished: one consumer FINs
        whatever comes while time passes; all must end finished."""
        for cid in list(self.consumers):
            # one at a time: what one leaves may go to another before it leaves too
            con = self.consumers.pop(cid)
            con.close()
            self.holder = {m: h for m, h in self.holder.items() if h != cid}
            self._settle()
        self.connect(100)
        for _ in range(20):
            for cid, con in self.consumers.items():
                for mid in list(con.held):
                    con.send(c.fin(mid))
                    self._release(cid, mid)
                    self.finished.add(mid)
            if len(self.finished) == len(self.published):
                break
            self.time_passes(11)
        assert len(self.finished) == len(self.published), (
            sorted(set(self.attempts) - self.finished),
            len(self.published),
        )


ChannelMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("NSQX_STATE_EXAMPLES", "40")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestChannelStates = ChannelMachine.TestCase
