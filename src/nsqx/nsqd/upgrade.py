"""UpgradedStream: TLS and/or compression between a connection's socket and its ClientV2.

A plain connection has no layer at all: the socket transport calls ClientV2 directly
and ClientV2 writes to the socket transport, so the common path costs nothing extra.
When IDENTIFY negotiates TLS, snappy or deflate, ClientV2 puts an UpgradedStream in
between: it becomes the socket transport's protocol (decrypt, then decompress, then hand
the commands to ClientV2) and ClientV2's transport (compress, then encrypt, then write).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any

from nsqx.nsqd.tls import TLSSession
from nsqx.wire.compression import CompressionError, Compressor, Decompressor
from nsqx.wire.errors import E_IDENTIFY_FAILED, ProtocolError
from nsqx.wire.frames import encode_error

if TYPE_CHECKING:
    from nsqx.nsqd.client_v2 import ClientV2

log = logging.getLogger("nsqx.nsqd")

#: Largest piece of decompressed input handed to the command parser at once. A small
#: compressed read can expand a thousandfold: pieces bound the memory, and between them
#: the connection yields when it used its read budget (see ClientV2.data_received), as
#: a plain connection does between reads, so a compressed publisher cannot starve the
#: channels' pumps.
MAX_DECOMPRESSED_PIECE = 64 * 1024


def _ssl_reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc).lower().replace("_", " ")


class UpgradedStream(asyncio.Protocol, asyncio.Transport):
    """The socket's protocol and the client's transport once a connection is upgraded."""

    def __init__(self, client: ClientV2, raw: asyncio.Transport) -> None:
        asyncio.Transport.__init__(self)
        self.client = client
        self.raw = raw
        self.tls: TLSSession | None = None
        self.compressor: Compressor | None = None
        self.decompressor: Decompressor | None = None
        # compressed output waiting for the TLS handshake to complete (the OKs)
        self._queued: list[bytes] = []
        self._tls_wrote = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._paused = False

    # -- setup (from ClientV2's IDENTIFY) ----------------------------------------------

    def start_tls(self, context: ssl.SSLContext, timeout: float) -> None:
        """Expect the client's TLS handshake next; it must complete within ``timeout``."""
        self.tls = TLSSession(context)
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(timeout, self._handshake_timed_out)

    def start_compression(self, compressor: Compressor, decompressor: Decompressor) -> None:
        """Compress what is written from now on; decompress what is read from now on."""
        self.compressor = compressor
        self.decompressor = decompressor

    # -- asyncio.Transport (used by ClientV2) ------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            return
        out = bytes(data)
        if self.compressor is not None:
            out = self.compressor.compress(out)
        tls = self.tls
        if tls is None:
            self.raw.write(out)
        elif not tls.established:
            self._queued.append(out)
        else:
            tls.send(out)
            self.raw.write(tls.outgoing())

    def pause_reading(self) -> None:
        self._paused = True
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self._paused = False
        self.raw.resume_reading()
        dec = self.decompressor
        if dec is not None and dec.pending and not self._closed:
            # input decompressed no further while paused
            try:
                self._pump(b"")
            except CompressionError as err:
                self._corrupt(err)

    def is_reading(self) -> bool:
        return self.raw.is_reading()

    def is_closing(self) -> bool:
        return self._closed or self.raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object" and self.tls is not None and self.tls.established:
            return self.tls.ssl_object
        return self.raw.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size()

    def close(self) -> None:
        """Say close_notify when TLS is up (as Go's tls.Conn.Close does), then close."""
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        tls = self.tls
        if tls is not None and tls.established and not self.raw.is_closing():
            alert = tls.close_notify()
            if alert:
                self.raw.write(alert)
        self.raw.close()

    def abort(self) -> None:
        self._closed = True
        self._cancel_timer()
        self.raw.abort()

    # -- asyncio.Protocol (called by the socket transport) -----------------------------

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client.closed or self._closed:
            return
        tls = self.tls
        try:
            if tls is not None:
                was_established = tls.established
                data = tls.receive(data)
                out = tls.outgoing()
                if out:
                    self._tls_wrote = True
                    self.raw.write(out)
                if not was_established:
                    if not tls.established:
                        return
                    self._established()
            if self.decompressor is None:
                if data:
                    client.receive_plain(data)
            else:
                self._pump(data)
            if tls is not None and tls.peer_closed and not client.closed:
                client.close()
        except ssl.SSLError as exc:
            self._tls_failed(exc)
        except CompressionError as err:
            self._corrupt(err)

    def _pump(self, data: bytes) -> None:
        """Decompress ``data`` piece by piece into the client, until it pauses."""
        dec = self.decompressor
        client = self.client
        assert dec is not None
        piece = dec.decompress(data, MAX_DECOMPRESSED_PIECE)
        while True:
            if piece:
                client.receive_plain(piece)
            if client.closed or not dec.pending or self._paused:
                break
            piece = dec.decompress(b"", MAX_DECOMPRESSED_PIECE)
        if dec.eof and not dec.pending and not client.closed:
            log.info("[%s] - the compressed stream ended; closing", client)
            client.close()

    def _corrupt(self, err: CompressionError) -> None:
        log.error("[%s] - %s", self.client, err)
        # the output stream is intact: the client can still read why
        self.client.fail(err)

    def eof_received(self) -> bool | None:
        return self.client.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cancel_timer()
        self.client.connection_lost(exc)

    def pause_writing(self) -> None:
        self.client.pause_writing()

    def resume_writing(self) -> None:
        self.client.resume_writing()

    # -- TLS ---------------------------------------------------------------------------

    def _established(self) -> None:
        tls = self.tls
        assert tls is not None
        self._cancel_timer()
        version, cipher = tls.describe()
        log.debug("[%s] TLS established (%s, %s)", self.client, version, cipher)
        self.client.tls_established()
        queued, self._queued = self._queued, []
        for out in queued:
            tls.send(out)
        out = tls.outgoing()
        if out:
            self.raw.write(out)

    def _tls_failed(self, exc: ssl.SSLError) -> None:
        tls = self.tls
        assert tls is not None
        client = self.client
        if tls.established:
            # garbage or a forged record after the handshake: an alert, and hang up
            log.error("[%s] - TLS error: %s", client, exc)
            alert = tls.outgoing()
            if alert:
                self.raw.write(alert)
            self._closed = True
            self.raw.close()
            client.connection_closed()
            return
        # as nsqd: the handshake failed, so the error frame goes out in the clear (a
        # client that never started TLS can read it); a TLS alert first only if the
        # handshake had got as far as answering
        alert = tls.outgoing()
        if alert and self._tls_wrote:
            self.raw.write(alert)
        self._fail_handshake(f"IDENTIFY failed {_ssl_reason(exc)}")

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        tls = self.tls
        if tls is not None and not tls.established and not self._closed:
            self._fail_handshake("IDENTIFY failed TLS handshake timed out")

    def _fail_handshake(self, description: str) -> None:
        err = ProtocolError(E_IDENTIFY_FAILED, description)
        log.error("[%s] - %s", self.client, err)
        self._closed = True
        self._cancel_timer()
        self.raw.write(encode_error(err))
        self.raw.close()
        self.client.connection_closed()

    def _cancel_timer(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
