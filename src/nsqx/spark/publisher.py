"""A blocking MPUB publisher for Spark tasks: pipelined batches, every OK checked."""

from __future__ import annotations

import socket
from collections import deque

from nsqx.wire import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2, OK, FrameDecoder
from nsqx.wire import commands as cmd

#: keep an MPUB body under nsqd's default --max-body-size (5 MiB)
MAX_BATCH_BYTES = 4 * 1024 * 1024


class PublishError(Exception):
    """nsqd refused a publish or the connection failed; nothing after it is known."""


class BlockingPublisher:
    """Publishes MPUB batches over one TCP connection, up to ``window`` unanswered.

    ``publish`` returns once every batch it sent is acknowledged, or raises
    :class:`PublishError`: a Spark task then fails and is retried (at-least-once).
    """

    def __init__(self, address: str, timeout: float = 30.0, window: int = 8) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.window = window
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as err:
            raise PublishError(f"cannot connect to nsqd {address}: {err}") from err
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder()
        self._pending = 0
        #: what each unanswered command published (named in an error), oldest first
        self._what: deque[str] = deque()
        self._send(MAGIC_V2)

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as err:
            raise PublishError(f"nsqd {self.address}: {err}") from err

    def _await_one(self) -> None:
        """Read until at least one more batch is answered."""
        before = self._pending
        while self._pending == before:
            for ftype, payload in self._frames():
                if ftype == FRAME_RESPONSE and payload == HEARTBEAT:
                    self._send(cmd.nop())
                elif ftype == FRAME_RESPONSE and payload[:2] == OK:
                    # (MPUB_EXT with a ##trace_id may be answered with OK and the trace)
                    self._pending -= 1
                    self._what.popleft()
                elif ftype == FRAME_ERROR:
                    what = f" ({self._what[0]})" if self._what and self._what[0] else ""
                    raise PublishError(
                        f"nsqd {self.address}: {payload.decode(errors='replace')}{what}"
                    )
                else:
                    raise PublishError(f"nsqd {self.address}: unexpected frame type {ftype}")

    def _frames(self) -> list[tuple[int, bytes]]:
        try:
            data = self._sock.recv(65536)
        except OSError as err:
            raise PublishError(f"nsqd {self.address}: {err}") from err
        if not data:
            raise PublishError(f"nsqd {self.address} closed the connection")
        return self._decoder.feed(data)

    def publish(self, topic: str, bodies: list[bytes], batch_size: int = 200) -> None:
        """Publish ``bodies`` in MPUB batches of at most ``batch_size`` messages."""
        batch: list[bytes] = []
        size = 0
        for body in bodies:
            if batch and (len(batch) >= batch_size or size + len(body) + 4 > MAX_BATCH_BYTES):
                self._mpub(topic, batch)
                batch, size = [], 0
            batch.append(body)
            size += len(body) + 4
        if batch:
            self._mpub(topic, batch)
        self.flush()

    def _mpub(self, topic: str, batch: list[bytes]) -> None:
        self.send(cmd.mpub(topic, batch) if len(batch) > 1 else cmd.pub(topic, batch[0]))

    def send(self, command: bytes, what: str = "") -> None:
        """Send one publish command (answered by one OK), waiting first while ``window``
        are unanswered; ``what`` names it in the error should nsqd refuse it. Commands
        on one connection are executed in order."""
        while self._pending >= self.window:
            self._await_one()
        self._send(command)
        self._pending += 1
        self._what.append(what)

    def flush(self) -> None:
        """Wait until every batch sent is acknowledged."""
        while self._pending > 0:
            self._await_one()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
