"""The client's side of a WebSocket (RFC 6455), sans-IO: the opening handshake and
frames, for the replication stream's follower (nsqx.nsqd.replication.follower).

A follower receives its leader's stored batches, tens of kilobytes to a megabyte per
message, many times a second, and answers each read with a few bytes. Here a received
frame is one join of the pieces it arrived in, and the reader hands back every frame a
read completed, so that the follower appends them all and acknowledges once; aiohttp's
client (or wsproto) spends more per message than the follower's whole work on it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import struct

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_LEN16 = struct.Struct(">H")
_LEN64 = struct.Struct(">Q")
#: the most a handshake response's head may take
MAX_HEAD = 16 * 1024
#: the biggest payload a reader that reuses its buffer receives into the same one
REUSE_MAX = 8 << 20

#: a message's payload: bytes, or a view of the reader's buffer (``reuse``)
Payload = bytes | bytearray | memoryview


class WebSocketError(ValueError):
    """The peer broke the protocol (a bad handshake, frame or size)."""


def client_handshake(
    host: str, target: str, headers: dict[str, str] | None = None
) -> tuple[bytes, bytes]:
    """The opening request for ``target`` (path and query) on ``host`` ("host:port"),
    with extra ``headers``, and the key whose answer :func:`check_handshake` expects."""
    key = base64.b64encode(os.urandom(16))
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n{extra}"
    ).encode("latin-1")
    return request + b"Sec-WebSocket-Key: " + key + b"\r\n\r\n", key


def accept_value(key: bytes) -> bytes:
    """The Sec-WebSocket-Accept a server answers ``key`` with."""
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


def check_handshake(head: bytes, key: bytes) -> None:
    """Check the server's answer (its status line and headers, up to the blank line):
    WebSocketError unless it accepted the upgrade for ``key``."""
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/"):
        raise WebSocketError(f"not an HTTP response: {lines[0][:80]!r}")
    if status[1] != "101":
        raise WebSocketError(f"the upgrade was refused: {lines[0][:80]}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if headers.get("upgrade", "").lower() != "websocket":
        raise WebSocketError("the answer does not upgrade to websocket")
    if headers.get("sec-websocket-accept", "").encode("latin-1") != accept_value(key):
        raise WebSocketError("a wrong Sec-WebSocket-Accept")


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final frame from the client: masked, as RFC 6455 requires of a client."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 1 << 16:
        head = bytes((0x80 | opcode, 0x80 | 126)) + _LEN16.pack(n)
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + _LEN64.pack(n)
    mask = random.getrandbits(32)
    # XOR the payload with the key repeated, as one big integer (no loop per byte)
    stream = (mask.to_bytes(4, "big") * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
    return head + mask.to_bytes(4, "big") + masked


def unmask(payload: Payload, mask: bytes) -> bytes:
    """``payload`` XORed with the 4-byte ``mask`` repeated (masking is its own inverse)."""
    n = len(payload)
    stream = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


class FrameReader:
    """Cuts the bytes a client receives into messages: ``feed`` returns the (opcode,
    payload) of each one the bytes completed, fragmented ones joined; control frames
    (ping, pong, close) come as they arrive, also between fragments. WebSocketError on
    a frame that breaks RFC 6455 or a message over ``max_size`` bytes (0: no limit).

    A frame of ``direct`` bytes or more whose head has arrived is received straight into
    a buffer of its own: :meth:`direct_buffer` says where the next bytes go (a reader
    that can receive into it, an asyncio.BufferedProtocol, saves a copy of the payload),
    :meth:`direct_filled` how many went there. With ``reuse``, such a payload is a view
    of one buffer the reader keeps (no allocation, no zeroing per message), valid until
    the next call: a caller that keeps a message copies it."""

    def __init__(self, max_size: int = 0, direct: int = 16 * 1024, reuse: bool = False) -> None:
        self.max_size = max_size
        self.direct = direct
        self.reuse = reuse
        self._spare: bytearray | None = None
        #: the payload being received straight into its buffer: its frame's first byte,
        #: mask, buffer and how much of it is filled
        self._target: bytearray | memoryview | None = None
        self._target_b0 = 0
        self._target_mask = b""
        self._target_filled = 0
        self._pieces: list[bytes] = []  # received, not yet cut (the first from _off)
        self._off = 0
        self._buffered = 0
        #: the fragments of a message not yet finished, and its opcode
        self._fragments: list[Payload] = []
        self._fragment_op = -1

    def feed(self, data: bytes) -> list[tuple[int, Payload]]:
        out: list[tuple[int, Payload]] = []
        target = self._target
        if target is not None:  # (a caller that does not use direct_buffer)
            n = min(len(data), len(target) - self._target_filled)
            target[self._target_filled : self._target_filled + n] = data[:n]
            out += self.direct_filled(n)
            data = data[n:]
            if self._target is not None:
                return out
            if data and self.reuse:
                # the next frame may be received into the same buffer: keep a copy
                out = [(op, bytes(p) if isinstance(p, memoryview) else p) for op, p in out]
        if data:
            self._pieces.append(data)
            self._buffered += len(data)
        while self._buffered >= 2:
            if len(self._pieces[0]) - self._off < 14 and len(self._pieces) > 1:
                self._join()  # (a head split across reads: rare)
            head, off = self._pieces[0], self._off
            b0, b1 = head[off], head[off + 1]
            if b0 & 0x70:
                raise WebSocketError("reserved bits set (no extension was agreed)")
            length = b1 & 0x7F
            pos = 2
            if length == 126:
                if self._buffered < 4:
                    break
                length = _LEN16.unpack_from(head, off + 2)[0]
                pos = 4
            elif length == 127:
                if self._buffered < 10:
                    break
                length = _LEN64.unpack_from(head, off + 2)[0]
                pos = 10
            if b0 & 0x08 and length > 125:
                raise WebSocketError("a long control frame")
            masked = bool(b1 & 0x80)
            if masked:
                pos += 4
            if self.max_size and length > self.max_size:
                raise WebSocketError(f"a frame of {length} bytes (at most {self.max_size})")
            end = pos + length
            if self._buffered < end:
                if length >= self.direct and self._buffered >= pos:
                    self._start_direct(b0, pos, length)
                break  # (joined once it is all here: no copy per read of a big frame)
            if len(head) - off < end:
                self._join()
                head, off = self._pieces[0], 0
            payload = head[off + pos : off + end]
            if masked:
                payload = unmask(payload, head[off + pos - 4 : off + pos])
            off += end
            self._buffered -= end
            if off == len(head):
                del self._pieces[0]
                off = 0
            self._off = off
            message = self._frame(b0 & 0x0F, bool(b0 & 0x80), payload)
            if message is not None:
                out.append(message)
        return out

    def direct_buffer(self) -> memoryview | None:
        """Where the rest of a big frame's payload is to be received (exactly that much),
        or None: give the next bytes to :meth:`feed`."""
        target = self._target
        if target is None:
            return None
        return memoryview(target)[self._target_filled :]

    def direct_filled(self, n: int) -> list[tuple[int, Payload]]:
        """``n`` bytes were received into :meth:`direct_buffer`: the messages that
        completed (the frame's own, once it is whole)."""
        target = self._target
        assert target is not None and 0 <= n <= len(target) - self._target_filled
        self._target_filled += n
        if self._target_filled < len(target):
            return []
        self._target = None
        payload: Payload = target
        if self._target_mask:
            payload = unmask(payload, self._target_mask)
        b0 = self._target_b0
        message = self._frame(b0 & 0x0F, bool(b0 & 0x80), payload)
        return [message] if message is not None else []

    def _start_direct(self, b0: int, pos: int, length: int) -> None:
        # the head (and what came of the payload) is all buffered: move the payload's
        # start into a buffer of the frame's size, where the rest is received
        if len(self._pieces) > 1:
            self._join()
        head, off = self._pieces[0], self._off
        target: bytearray | memoryview
        if self.reuse and length <= REUSE_MAX:
            spare = self._spare
            if spare is None or len(spare) < length:
                spare = self._spare = bytearray(max(length, 2 * len(spare or b"")))
            target = memoryview(spare)[:length]
        else:
            target = bytearray(length)
        have = len(head) - off - pos
        target[:have] = head[off + pos :]
        self._target = target
        self._target_b0 = b0
        self._target_mask = head[off + pos - 4 : off + pos] if head[off + 1] & 0x80 else b""
        self._target_filled = have
        self._pieces = []
        self._off = 0
        self._buffered = 0

    def _join(self) -> None:
        pieces = self._pieces
        pieces[0] = pieces[0][self._off :]
        self._pieces = [b"".join(pieces)]
        self._off = 0

    def _frame(self, opcode: int, final: bool, payload: Payload) -> tuple[int, Payload] | None:
        if opcode >= 0x8:
            if not final or len(payload) > 125:
                raise WebSocketError("a fragmented or long control frame")
            if opcode not in (OP_CLOSE, OP_PING, OP_PONG):
                raise WebSocketError(f"unknown control opcode {opcode}")
            return opcode, payload
        if opcode == OP_CONTINUATION:
            if self._fragment_op < 0:
                raise WebSocketError("a continuation frame outside a message")
        elif opcode in (OP_TEXT, OP_BINARY):
            if self._fragment_op >= 0:
                raise WebSocketError("a new message inside a fragmented one")
            if final:
                return opcode, payload
            self._fragment_op = opcode
        else:
            raise WebSocketError(f"unknown opcode {opcode}")
        # (a fragment is kept across calls: never a view of the reused buffer)
        self._fragments.append(bytes(payload) if isinstance(payload, memoryview) else payload)
        total = sum(map(len, self._fragments))
        if self.max_size and total > self.max_size:
            raise WebSocketError(f"a message over {self.max_size} bytes")
        if not final:
            return None
        message = (self._fragment_op, b"".join(self._fragments))
        self._fragments = []
        self._fragment_op = -1
        return message
