"""Channel: a cursor over its topic's log that delivers to its subscribed clients."""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import time
from array import array
from collections import deque
from typing import TYPE_CHECKING

from nsqx.nsqd.e2e import new_window
from nsqx.nsqd.guid import seq_of
from nsqx.store.cursor import CursorState, read_cursor, write_cursor
from nsqx.store.log import split_chunks
from nsqx.wire.frames import with_attempts
from nsqx.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.nsqd.client_v2 import ClientV2
    from nsqx.nsqd.topic import Topic

log = logging.getLogger("nsqx.nsqd")

# a message's id inside its frame: size(4) type(4) timestamp(8) attempts(2) id(16)
_ID = slice(18, 34)


class Channel:
    """Channel maintains a cursor into the topic's log, the requeued and deferred
    messages, and hands messages to subscribed clients with spare RDY.

    Delivery is one pump per channel, scheduled once per loop iteration however many
    events asked for it. It takes requeued messages first, then the log, and gives
    each ready client a fair share in one batch: one list slice, one dict update and
    one write per client. In-flight messages live in their client's insertion-ordered
    dict (id -> deadline) so timeouts are found by scanning its head; messages that
    were delivered more than once are the only ones with an attempts entry here.
    """

    def __init__(self, topic: Topic, name: str, start: int) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name) or topic.ephemeral
        self.log = topic.log
        #: Next log sequence to deliver.
        self.cursor = start
        self.clients: list[ClientV2] = []
        #: (seq, attempts so far) ready to go again, ahead of the log.
        self.requeued: deque[tuple[int, int]] = deque()
        #: heap of (due wall-clock ns, seq, attempts so far).
        self.deferred: list[tuple[int, int, int]] = []
        #: attempts of in-flight messages delivered more than once.
        self.attempts: dict[bytes, int] = {}
        self.paused = False
        self.deleted = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: publish-to-FIN latencies; None unless --e2e-processing-latency-percentile is set
        self.e2e = new_window(topic.nsqd.options)
        self._pump_scheduled = False
        self._rr = 0
        self._loop = asyncio.get_running_loop()
        #: set when the cursor state changed since the last checkpoint
        self.dirty = False
        #: size and time of the last checkpoint (to pace very large ones)
        self.checkpoint_size = 0
        self.checkpoint_at = 0.0
        self.cursor_path: str | None = None
        if topic.durable and not self.ephemeral:
            self.cursor_path = os.path.join(topic.channel_dir, f"{name}.cursor")
            self._restore()

    # -- checkpoints ------------------------------------------------------------------

    def _restore(self) -> None:
        assert self.cursor_path is not None
        try:
            state = read_cursor(self.cursor_path)
        except ValueError as err:
            log.error("CHANNEL(%s): %s; starting at the oldest message", self.name, err)
            state = CursorState(self.log.start, self.log.start)
        if state is None:
            return
        lo, hi = self.log.start, self.log.end
        self.cursor = min(max(state.cursor, lo), hi)
        for seq, attempts, due in state.entries():
            if not lo <= seq < hi:
                continue  # gone from the log (deleted segment, or lost with the page cache)
            if due:
                self.deferred.append((due, seq, attempts))
            else:
                self.requeued.append((seq, attempts))
        heapq.heapify(self.deferred)

    def cursor_state(self) -> CursorState:
        """The checkpoint of this channel now (see nsqx.store.cursor)."""
        pending = array("q")
        attempts_of = self.attempts.get
        for c in self.clients:
            for table in (c.inflight, c.irregular):
                for mid in table:
                    pending.extend((seq_of(mid), attempts_of(mid, 1), 0))
        for seq, attempts in self.requeued:
            pending.extend((seq, attempts, 0))
        for due, seq, attempts in self.deferred:
            pending.extend((seq, attempts, due))
        confirmed = min(pending[::3], default=self.cursor)
        return CursorState(min(confirmed, self.cursor), self.cursor, pending)

    def checkpoint(self, fsync: bool = True) -> None:
        """Write the cursor file now, if the channel is durable."""
        if self.cursor_path is None or self.deleted:
            return
        self.dirty = False
        write_cursor(self.cursor_path, self.cursor_state(), fsync)

    # -- state ------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages waiting (not in flight, not deferred)."""
        return len(self.requeued) + max(self.topic.visible_end - self.cursor, 0)

    @property
    def in_flight_count(self) -> int:
        return sum(len(c.inflight) + len(c.irregular) for c in self.clients)

    @property
    def deferred_count(self) -> int:
        return len(self.deferred)

    def low_water(self) -> int:
        """The oldest log sequence this channel may still deliver."""
        low = self.cursor
        if self.requeued:
            low = min(low, min(s for s, _ in self.requeued))
        if self.deferred:
            low = min(low, min(s for _, s, _ in self.deferred))
        for c in self.clients:
            if c.inflight:
                low = min(low, min(map(seq_of, c.inflight)))
            if c.irregular:
                low = min(low, min(map(seq_of, c.irregular)))
        return low

    # -- clients ----------------------------------------------------------------------

    def add_client(self, client: ClientV2) -> None:
        self.clients.append(client)

    def remove_client(self, client: ClientV2) -> None:
        """A client left: whatever it had in flight goes back to the front at once."""
        try:
            self.clients.remove(client)
        except ValueError:
            return
        self._requeue_all(client)
        if self.clients:
            self.notify()
        elif self.ephemeral and is_ephemeral(self.name):
            self.topic.delete_channel(self.name)

    def _requeue_all(self, client: ClientV2) -> None:
        for table in (client.inflight, client.irregular):
            if table:
                pop = self.attempts.pop
                self.requeued.extend((seq_of(mid), pop(mid, 1)) for mid in table)
                table.clear()
        client.touched.clear()

    def detach(self) -> None:
        """nsqd is stopping: stop delivering (state stays on disk)."""
        self.paused = True

    def close(self) -> None:
        """Deleted: close subscribers, forget everything, remove the cursor file."""
        self.deleted = True
        for c in list(self.clients):
            c.close()
        self.clients.clear()
        self.requeued.clear()
        self.deferred.clear()
        self.attempts.clear()
        if self.cursor_path is not None:
            try:
                os.remove(self.cursor_path)
            except FileNotFoundError:
                pass

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.notify()

    def empty(self) -> None:
        """Drop every queued and deferred message (in-flight ones stay in flight)."""
        self.requeued.clear()
        self.deferred.clear()
        self.cursor = max(self.cursor, self.topic.visible_end)
        self.dirty = True

    def advance_to(self, seq: int) -> None:
        """Count everything below ``seq`` as consumed (a range consumer, such as a Spark
        query, reports its progress); messages in flight stay in flight."""
        self.cursor = max(self.cursor, seq)
        if self.requeued:
            self.requeued = deque(e for e in self.requeued if e[0] >= seq)
        if self.deferred:
            self.deferred = [e for e in self.deferred if e[1] >= seq]
            heapq.heapify(self.deferred)
        self.dirty = True

    def drop_before(self, seq: int) -> None:
        """Memory bound of ephemeral channels: forget queued messages below ``seq``."""
        self.cursor = max(self.cursor, seq)
        self.dirty = True

    # -- delivery ---------------------------------------------------------------------

    def notify(self) -> None:
        """Something may be deliverable: run the pump once this loop iteration."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        if self.paused or self.deleted or not self.clients:
            return
        ready = [(c, spare) for c in self.clients if (spare := c.spare()) > 0]
        if not ready:
            return
        if len(ready) > 1:
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr :] + ready[: self._rr]
        now = time.monotonic()
        left = len(ready)
        for c, spare in ready:
            avail = len(self.requeued) + self.topic.visible_end - self.cursor
            if avail <= 0:
                break
            # an even share of what is there, so that one client cannot take it all
            share = min(spare, -(-avail // left))
            left -= 1
            frames, ids = self._take(share)
            if frames:
                c.send_messages(frames, ids, now)

    def _take(self, k: int) -> tuple[list[bytes], list[bytes]]:
        frames: list[bytes] = []
        ids: list[bytes] = []
        requeued = self.requeued
        if requeued:
            get = self.log.get
            while requeued and len(ids) < k:
                seq, attempts = requeued.popleft()
                frame = get(seq)
                if frame is None:  # dropped (ephemeral overflow or emptied)
                    continue
                if attempts:
                    frame = with_attempts(frame, attempts + 1)
                    self.attempts[frame[_ID]] = attempts + 1
                frames.append(frame)
                ids.append(frame[_ID])
        end = self.topic.visible_end
        while len(ids) < k and self.cursor < end:
            lo = self.cursor
            f, i = self.log.read(lo, min(k - len(ids), end - lo))
            if not i:
                self.cursor = max(lo, self.log.start)
                if self.cursor == lo:
                    break
                continue
            hi = lo + len(i)
            self.cursor = hi
            self.dirty = True
            self.message_count += hi - lo
            deferred = self.log.deferred_between(lo, hi)
            if deferred:
                f, i = self._defer_from_log(deferred, lo, f, i)
            if frames:
                frames.extend(f)
                ids.extend(i)
            else:
                frames, ids = f, i
        return frames, ids

    def _defer_from_log(
        self, deferred: list[tuple[int, int]], lo: int, frames: list[bytes], ids: list[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        # DPUB records are held in the deferred heap until due
        now_ns = time.time_ns()
        skip = set()
        for seq, due in deferred:
            if due > now_ns:
                heapq.heappush(self.deferred, (due, seq, 0))
                skip.add(seq - lo)
        if not skip:
            return frames, ids
        frames = split_chunks(frames)
        keep = [j for j in range(len(frames)) if j not in skip]
        return [frames[j] for j in keep], [ids[j] for j in keep]

    # -- acknowledgements -------------------------------------------------------------

    def _not_in_flight(self, client: ClientV2, msg_id: bytes) -> str:
        for other in self.clients:
            if other is not client and (msg_id in other.inflight or msg_id in other.irregular):
                return "client does not own message"
        return "ID not in flight"

    def _pop_in_flight(self, client: ClientV2, msg_id: bytes) -> float | None:
        deadline = client.inflight.pop(msg_id, None)
        if deadline is None and client.irregular:
            deadline = client.irregular.pop(msg_id, None)
        return deadline

    def finish(self, client: ClientV2, ids: list[bytes]) -> list[tuple[bytes, str]]:
        """FIN: forget the messages. Returns (id, reason) for those not in flight."""
        pop = client.inflight.pop
        missing = [mid for mid in ids if pop(mid, None) is None]
        if missing and client.irregular:
            irregular_pop = client.irregular.pop
            missing = [mid for mid in missing if irregular_pop(mid, None) is None]
        if self.attempts:
            attempts_pop = self.attempts.pop
            for mid in ids:
                attempts_pop(mid, None)
        if client.touched:
            touched_pop = client.touched.pop
            for mid in ids:
                touched_pop(mid, None)
        client.finish_count += len(ids) - len(missing)
        self.dirty = True
        if self.e2e is not None:
            self.e2e.record(self.log, ids if not missing else [m for m in ids if m not in missing])
        self.notify()
        return [(mid, self._not_in_flight(client, mid)) for mid in missing]

    def requeue(self, client: ClientV2, msg_id: bytes, timeout_ms: int) -> str | None:
        """REQ: back to the queue now (0) or after ``timeout_ms``. Returns an error."""
        if self._pop_in_flight(client, msg_id) is None:
            return self._not_in_flight(client, msg_id)
        client.touched.pop(msg_id, None)
        attempts = self.attempts.pop(msg_id, 1)
        self.dirty = True
        self.requeue_count += 1
        client.requeue_count += 1
        if timeout_ms <= 0:
            self.requeued.append((seq_of(msg_id), attempts))
            self.notify()
        else:
            due = time.time_ns() + timeout_ms * 1_000_000
            heapq.heappush(self.deferred, (due, seq_of(msg_id), attempts))
            self.notify()  # the client's RDY has room again
        return None

    def touch(self, client: ClientV2, msg_id: bytes, max_msg_timeout: float) -> str | None:
        """TOUCH: restart the message's timeout, up to max-msg-timeout since delivery."""
        timeout = client.msg_timeout
        deadline = self._pop_in_flight(client, msg_id)
        if deadline is None:
            return self._not_in_flight(client, msg_id)
        delivered = client.touched.get(msg_id)
        if delivered is None:
            delivered = client.touched[msg_id] = deadline - timeout
        now = time.monotonic()
        new = min(now + timeout, delivered + max_msg_timeout)
        inflight = client.inflight
        # the in-flight dict must stay ordered by deadline; a clamped one goes aside
        if not inflight or new >= next(reversed(inflight.values())):
            inflight[msg_id] = new
        else:
            client.irregular[msg_id] = new
        return None

    # -- timers -----------------------------------------------------------------------

    def scan(self, now: float, now_ns: int) -> None:
        """Time out in-flight messages and release due deferred ones (batched)."""
        moved = False
        for c in self.clients:
            expired = c.expired(now)
            if expired:
                pop = self.attempts.pop
                self.requeued.extend((seq_of(mid), pop(mid, 1)) for mid in expired)
                self.timeout_count += len(expired)
                c.timeout_count += len(expired)
                moved = True
        deferred = self.deferred
        while deferred and deferred[0][0] <= now_ns:
            _, seq, attempts = heapq.heappop(deferred)
            self.requeued.append((seq, attempts))
            moved = True
        if moved:
            self.notify()
