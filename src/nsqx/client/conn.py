"""Connection: one TCP connection to nsqd, as an asyncio Protocol.

It opens the connection and runs the handshake (magic, IDENTIFY with feature
negotiation, TLS, compression, AUTH, optionally SUB), then hands every read's frames
to its owner (a consumer or a producer) in one call. Writes are coalesced: commands
queued during one event-loop iteration leave in one ``transport.write``.

Compression plugs in as two transforms (see :mod:`nsqx.client.codec`): every read
passes through ``decompress`` before frame decoding, every write through ``compress``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable
from typing import Any, cast

from nsqx.client.codec import codec_factory
from nsqx.client.config import Config
from nsqx.client.errors import (
    AuthError,
    ConnectionClosedError,
    HandshakeError,
    NSQServerError,
)
from nsqx.client.rdy import DEFAULT_MAX_RDY_COUNT
from nsqx.wire import commands
from nsqx.wire.frames import (
    FRAME_DATA_AT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    FrameDecoder,
    policy_notice_attempts,
)

log = logging.getLogger("nsqx.client")

Frames = list[tuple[int, bytes]]
FramesCallback = Callable[["Connection", Frames], None]
LostCallback = Callable[["Connection", BaseException | None], None]

_FRAME_HEAD = struct.Struct(">ii")
_NOP = commands.nop()


def split_address(address: str, default_port: int = 4150) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``, or a bare host) -> ``(host, port)``."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"bad address {address!r}: no host")
    try:
        return host, int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad address {address!r}: port is not a number") from None


class Connection(asyncio.Protocol):
    """A connection to one nsqd: handshake, frame decoding, coalesced writes, timeouts.

    After :meth:`connect`, every read's frames go to ``on_frames(conn, frames)``; the
    owner answers heartbeats through :meth:`handle_control`. ``on_lost(conn, exc)`` is
    called once when the connection ends, whoever closed it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: Config,
        *,
        on_frames: FramesCallback | None = None,
        on_lost: LostCallback | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.key = f"{host}:{port}"
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.on_frames = on_frames
        self.on_lost = on_lost
        #: The IDENTIFY response (empty when nsqd answered a plain OK).
        self.features: dict[str, Any] = {}
        self.max_rdy_count = DEFAULT_MAX_RDY_COUNT
        #: Seconds nsqd waits for an answer to a message before it requeues it.
        self.msg_timeout = 60.0
        #: The AUTH response, when nsqd asked for AUTH.
        self.auth: dict[str, Any] | None = None
        self.tls = False
        self.compression = ""
        #: True once close() was called or the connection was lost.
        self.closed = False
        #: Why the connection ended (None for a clean close).
        self.error: BaseException | None = None
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self._handshaking = True
        self._hbuf = bytearray()
        self._hwaiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._decoder = FrameDecoder()
        self._decompress: Callable[[bytes], bytes] | None = None
        self._compress: Callable[[bytes], bytes] | None = None
        self._out: list[bytes] = []
        self._fins: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._reads = 0
        self._read_timer: asyncio.TimerHandle | None = None
        self._reads_seen = 0
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_drained = 0
        self._bytes_written = 0

    def __repr__(self) -> str:
        return f"<Connection {self.key}{' closed' if self.closed else ''}>"

    # -- opening ------------------------------------------------------------------------

    async def connect(
        self,
        *,
        subscribe: tuple[str, str] | bytes | None = None,
        identify: dict[str, Any] | None = None,
    ) -> None:
        """Open the TCP connection and run the handshake; SUB when ``subscribe`` is given
        (``(topic, channel)``, or a whole SUB / SUB_ORDERED / SUB_ADVANCED command).
        ``identify`` adds fields to the config's IDENTIFY body.

        Raises :class:`ConnectionClosedError` (cannot connect, closed), asyncio's
        TimeoutError, :class:`HandshakeError`, or :class:`NSQServerError` (an error
        frame such as E_BAD_TOPIC or E_AUTH_FAILED). On any error the socket is closed.
        """
        cfg = self.config
        local: tuple[str, int] | None = None
        if cfg.local_addr:
            local = split_address(cfg.local_addr, 0)
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: self, self.host, self.port, local_addr=local),
                cfg.dial_timeout,
            )
        except TimeoutError:
            self._unopened()
            raise ConnectionClosedError(f"{self.key}: connect timed out") from None
        except OSError as exc:
            self._unopened()
            raise ConnectionClosedError(f"{self.key}: cannot connect: {exc}") from exc
        try:
            await self._handshake(subscribe, identify)
        except BaseException as exc:
            self.abort(exc if isinstance(exc, Exception) else None)
            raise
        self._handshaking = False

    def start_reading(self) -> None:
        """Hand frames that arrived with the handshake's last response to the owner.

        Owners call it once they are ready for frames (right after :meth:`connect`).
        """
        rest = bytes(self._hbuf)
        self._hbuf.clear()
        if rest:
            self._feed(rest)

    def _unopened(self) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)

    async def _handshake(
        self, subscribe: tuple[str, str] | bytes | None, identify: dict[str, Any] | None
    ) -> None:
        cfg = self.config
        body = cfg.identify_body()
        if identify:
            body.update(identify)
        self.write(MAGIC_V2 + commands.identify(body))
        data = await self._response("IDENTIFY")
        if data != OK:
            try:
                features = json.loads(data)
            except ValueError:
                features = None
            if not isinstance(features, dict):
                raise HandshakeError(f"{self.key}: bad IDENTIFY response {data[:200]!r}")
            self.features = features
            self.max_rdy_count = int(features.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT))
            if features.get("msg_timeout"):
                self.msg_timeout = int(features["msg_timeout"]) / 1000
        features = self.features
        if cfg.tls_v1:
            if not features.get("tls_v1"):
                raise HandshakeError(f"{self.key}: TLS was asked for but nsqd does not offer it")
            await self._upgrade_tls()
        for name in ("snappy", "deflate"):
            if getattr(cfg, name) and features.get(name):
                level = int(features.get("deflate_level") or cfg.deflate_level)
                codec = codec_factory(name)(level)
                self._install(codec.decompress, codec.compress)
                self.compression = name
                await self._ok(f"{name} upgrade")
        if features.get("auth_required"):
            if not cfg.auth_secret:
                raise AuthError("E_AUTH_REQUIRED", f"{self.key}: nsqd requires auth_secret")
            self.write(commands.auth(cfg.auth_secret))
            data = await self._response("AUTH")
            try:
                self.auth = json.loads(data)
            except ValueError:
                raise HandshakeError(f"{self.key}: bad AUTH response {data[:200]!r}") from None
        elif cfg.auth_secret:
            # The protocol forbids AUTH when nsqd did not ask for it.
            log.warning("%s: auth_secret is set but nsqd does not require AUTH", self.key)
        if subscribe is not None:
            if isinstance(subscribe, bytes):
                self.write(subscribe)
            else:
                self.write(commands.sub(*subscribe))
            await self._ok("SUB")
        self._arm_read_timer()

    async def _upgrade_tls(self) -> None:
        cfg = self.config
        assert self.transport is not None
        if self._hbuf:
            raise HandshakeError(f"{self.key}: data before the TLS handshake")
        try:
            transport = await self.loop.start_tls(
                self.transport,
                self,
                cfg.ssl_context(),
                server_hostname=cfg.tls_server_name or self.host,
                ssl_handshake_timeout=cfg.dial_timeout + cfg.read_timeout,
            )
        except (OSError, ValueError) as exc:
            raise HandshakeError(f"{self.key}: TLS handshake failed: {exc}") from exc
        if transport is None:
            raise ConnectionClosedError(f"{self.key}: closed during the TLS handshake")
        self.transport = transport
        self.tls = True
        await self._ok("TLS upgrade")

    def _install(
        self, decompress: Callable[[bytes], bytes], compress: Callable[[bytes], bytes]
    ) -> None:
        """Put a codec on the stream; bytes already read belong to the new stream."""
        self._decompress = decompress
        self._compress = compress
        if self._hbuf:
            rest = decompress(bytes(self._hbuf))
            self._hbuf = bytearray(rest)

    async def _response(self, what: str) -> bytes:
        ftype, data = await self._next_frame(what)
        if ftype == FRAME_ERROR:
            raise NSQServerError.from_frame(data)
        if ftype != FRAME_RESPONSE:
            raise HandshakeError(f"{self.key}: unexpected frame type {ftype} during {what}")
        return data

    async def _ok(self, what: str) -> None:
        data = await self._response(what)
        if data != OK:
            raise HandshakeError(f"{self.key}: expected OK after {what}, got {data[:200]!r}")

    async def _next_frame(self, what: str) -> tuple[int, bytes]:
        frame = self._take_frame()
        if frame is not None:
            return frame
        if self.closed:
            raise ConnectionClosedError(f"{self.key}: closed during {what}")
        self._hwaiter = self.loop.create_future()
        try:
            return await asyncio.wait_for(self._hwaiter, self.config.read_timeout)
        except TimeoutError:
            raise HandshakeError(f"{self.key}: no response to {what}") from None
        finally:
            self._hwaiter = None

    def _take_frame(self) -> tuple[int, bytes] | None:
        """One whole frame from the handshake buffer (heartbeats answered and skipped)."""
        buf = self._hbuf
        while len(buf) >= 8:
            size, ftype = _FRAME_HEAD.unpack_from(buf, 0)
            if size < 4:
                raise HandshakeError(f"{self.key}: bad frame size {size}")
            if len(buf) < 4 + size:
                return None
            data = bytes(buf[FRAME_DATA_AT : 4 + size])
            del buf[: 4 + size]
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                self.write(_NOP)
                continue
            if ftype == FRAME_RESPONSE and (n := policy_notice_attempts(data)) is not None:
                self.channel_policy(n)  # (nsqd may tell it before SUB's answer)
                continue
            return ftype, data
        return None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._decompress is not None:
            try:
                data = self._decompress(data)
            except Exception as exc:
                # a corrupt compressed stream cannot be resynchronised
                log.error("%s: cannot decompress data from nsqd: %s", self.key, exc)
                self.abort(exc)
                return
        self._reads += 1
        if self._handshaking:
            self._hbuf += data
            waiter = self._hwaiter
            if waiter is not None and not waiter.done():
                try:
                    frame = self._take_frame()
                except HandshakeError as exc:
                    waiter.set_exception(exc)
                    return
                if frame is not None:
                    waiter.set_result(frame)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except Exception as exc:
            log.error("%s: undecodable data from nsqd: %s", self.key, exc)
            self.abort(exc)
            return
        if frames and self.on_frames is not None:
            self.on_frames(self, frames)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.error is None:
            self.error = exc
        for timer in (self._read_timer, self._write_timer, self._flush_handle):
            if timer is not None:
                timer.cancel()
        self._read_timer = self._write_timer = self._flush_handle = None
        waiter = self._hwaiter
        if waiter is not None and not waiter.done():
            why = f": {self.error}" if self.error else " by nsqd"
            waiter.set_exception(ConnectionClosedError(f"{self.key}: closed{why}"))
        if not self.lost.done():
            self.lost.set_result(None)
        # owners hear only of connections that were handed to them (connect() returned)
        if self.on_lost is not None and not self._handshaking:
            callback, self.on_lost = self.on_lost, None
            callback(self, self.error)

    def pause_writing(self) -> None:
        # Our writes pile up: fine while nsqd keeps reading them (a pipelining producer
        # can be far ahead), but a connection where nothing drains for write_timeout
        # is dead (go-nsq's write deadline).
        if self._write_timer is None:
            self._arm_write_timer()

    def _drained(self) -> int:
        """Bytes the kernel has taken from us so far."""
        assert self.transport is not None
        return self._bytes_written - self.transport.get_write_buffer_size()

    def _arm_write_timer(self) -> None:
        self._write_drained = self._drained()
        self._write_timer = self.loop.call_later(self.config.write_timeout, self._check_writes)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _check_writes(self) -> None:
        self._write_timer = None
        if self.closed or self.transport is None:
            return
        if self._drained() > self._write_drained:
            self._arm_write_timer()  # draining, slowly: keep waiting
            return
        log.error("%s: no write drained for %.1fs, closing", self.key, self.config.write_timeout)
        self.abort(ConnectionClosedError(f"{self.key}: write timeout"))

    def _arm_read_timer(self) -> None:
        self._read_timer = self.loop.call_later(self.config.read_timeout, self._check_reads)
        self._reads_seen = self._reads

    def _check_reads(self) -> None:
        self._read_timer = None
        if self.closed:
            return
        if self._reads == self._reads_seen:
            log.error("%s: nothing read for %.1fs, closing", self.key, self.config.read_timeout)
            self.abort(ConnectionClosedError(f"{self.key}: read timeout"))
            return
        self._arm_read_timer()

    # -- frames -------------------------------------------------------------------------

    def handle_control(self, ftype: int, data: bytes) -> NSQServerError | bytes | None:
        """Common handling of a frame that is not a message.

        Heartbeats are answered (NOP) and give None, as a channel's policy notice does
        (see :meth:`channel_policy`). An error frame gives the error (a fatal one also
        closes the connection). Any other response gives its payload.
        """
        if ftype == FRAME_RESPONSE:
            if data == HEARTBEAT:
                self.queue(_NOP)
                return None
            n = policy_notice_attempts(data)
            if n is not None:
                self.channel_policy(n)
                return None
            return data
        if ftype == FRAME_ERROR:
            err = NSQServerError.from_frame(data)
            if err.fatal:
                log.error("%s: nsqd sent a fatal error: %s", self.key, err)
                self.close(err)
            else:
                log.warning("%s: %s", self.key, err)
            return err
        if ftype == FRAME_MESSAGE:  # pragma: no cover - owners handle messages
            return None
        log.error("%s: unknown frame type %d, closing", self.key, ftype)
        self.abort(HandshakeError(f"{self.key}: unknown frame type {ftype}"))
        return None

    def channel_policy(self, max_attempts: int) -> None:
        """nsqd says the subscribed channel's max_attempts (0: none), unasked (IDENTIFY
        ``channel_policy``): a consumer's connection acts on it; others ignore it."""

    # -- writing ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write now (after anything queued)."""
        if self._out or self._fins:
            self._out.append(data)
            self.flush()
            return
        self._write(data)

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if self._compress is not None:
            data = self._compress(data)
        self._bytes_written += len(data)
        transport.write(data)

    def queue(self, data: bytes) -> None:
        """Write ``data`` with whatever else is queued in this loop iteration."""
        if self._fins:
            # keep the order of commands: FINs queued earlier go first
            self._out.append(commands.fin_many(self._fins))
            self._fins.clear()  # the same list: owners may hold a reference to it
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self.flush)

    def queue_fin(self, msg_id: bytes) -> None:
        """FIN ``msg_id`` with whatever else is queued in this loop iteration."""
        self._fins.append(msg_id)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self.flush)

    def queue_fins(self, msg_ids: list[bytes]) -> None:
        """FIN every id of ``msg_ids`` with whatever else is queued in this loop
        iteration (one FIN command list, one write)."""
        self._fins.extend(msg_ids)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write everything queued, in one write."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        out = self._out
        if self._fins:
            out.append(commands.fin_many(self._fins))
            self._fins.clear()
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._write(data)

    # -- closing ------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Flush what is queued and close."""
        if self.error is None:
            self.error = error
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        else:
            self.connection_lost(None)

    def abort(self, error: BaseException | None = None) -> None:
        """Close at once, dropping what is not written yet."""
        if self.error is None:
            self.error = error
        if self.transport is not None and not self.lost.done():
            self.closed = True
            self.transport.abort()
        elif not self.lost.done():
            self.connection_lost(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self.lost)
