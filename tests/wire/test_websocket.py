"""nsqx.wire.websocket: the client's handshake and frames (RFC 6455), sans-IO."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.wire import websocket as ws


def server_frame(opcode: int, payload: bytes, final: bool = True, mask: bytes = b"") -> bytes:
    """A frame as a server (or, with ``mask``, a client) writes it."""
    n = len(payload)
    b0 = (0x80 if final else 0) | opcode
    m = 0x80 if mask else 0
    if n < 126:
        head = bytes((b0, m | n))
    elif n < 1 << 16:
        head = bytes((b0, m | 126)) + struct.pack(">H", n)
    else:
        head = bytes((b0, m | 127)) + struct.pack(">Q", n)
    return head + mask + (ws.unmask(payload, mask) if mask else payload)


def feed_in_pieces(reader: ws.FrameReader, data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    at = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        out += reader.feed(data[at:cut])
        at = cut
    return out


messages_st = st.lists(
    st.tuples(
        st.sampled_from([ws.OP_BINARY, ws.OP_TEXT]), st.binary(max_size=300), st.integers(1, 3)
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(messages_st, st.lists(st.integers(0, 5000), max_size=12), st.booleans())
def test_messages_come_out_whole_however_the_bytes_are_cut(
    messages: list[tuple[int, bytes, int]], cuts: list[int], masked: bool
) -> None:
    data = b""
    for opcode, payload, parts in messages:
        # split into ``parts`` fragments, a ping between the first two
        size = len(payload) // parts + 1
        chunks = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
        for i, chunk in enumerate(chunks):
            op = opcode if i == 0 else ws.OP_CONTINUATION
            data += server_frame(
                op, chunk, i == len(chunks) - 1, b"\x01\x02\x03\x04" if masked else b""
            )
            if i == 0 and len(chunks) > 1:
                data += server_frame(ws.OP_PING, b"hi")
    got = feed_in_pieces(ws.FrameReader(), data, cuts)
    want: list[tuple[int, bytes]] = []
    for opcode, payload, parts in messages:
        size = len(payload) // parts + 1
        if len(range(0, len(payload), size)) > 1:
            want.append((ws.OP_PING, b"hi"))
        want.append((opcode, payload))
    assert got == want


def test_lengths_of_every_encoding() -> None:
    reader = ws.FrameReader()
    for n in (0, 125, 126, 65535, 65536, 300_000):
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        assert reader.feed(server_frame(ws.OP_BINARY, payload)) == [(ws.OP_BINARY, payload)]


def test_a_big_frame_in_many_reads_is_joined_once() -> None:
    payload = b"x" * 1_000_000
    data = server_frame(ws.OP_BINARY, payload) + server_frame(ws.OP_BINARY, b"next")
    reader = ws.FrameReader()
    out = []
    for i in range(0, len(data), 65536):
        out += reader.feed(data[i : i + 65536])
    assert out == [(ws.OP_BINARY, payload), (ws.OP_BINARY, b"next")]


def test_the_client_masks_its_frames() -> None:
    payload = b"an ack \x00\xff" * 20
    frame = ws.client_frame(ws.OP_BINARY, payload)
    assert frame[1] & 0x80  # masked
    assert payload not in frame
    assert ws.FrameReader().feed(frame) == [(ws.OP_BINARY, payload)]
    long = b"y" * 70_000
    assert ws.FrameReader().feed(ws.client_frame(ws.OP_BINARY, long)) == [(ws.OP_BINARY, long)]
    assert ws.FrameReader().feed(ws.client_frame(ws.OP_PONG, b"")) == [(ws.OP_PONG, b"")]


@pytest.mark.parametrize(
    "data",
    [
        bytes((0x80 | 0x40 | ws.OP_BINARY, 0)),  # a reserved bit
        bytes((0x80 | 0x3, 0)),  # an unknown opcode
        bytes((0x80 | 0xB, 0)),  # an unknown control opcode
        bytes((ws.OP_PING, 0)),  # a fragmented control frame
        server_frame(ws.OP_PING, b"x" * 126),  # a long control frame
        server_frame(ws.OP_CONTINUATION, b"x"),  # a continuation of nothing
        server_frame(ws.OP_BINARY, b"a", final=False) + server_frame(ws.OP_BINARY, b"b"),
        server_frame(ws.OP_BINARY, b"x" * 2000),  # over max_size
    ],
)
def test_broken_frames_are_refused(data: bytes) -> None:
    with pytest.raises(ws.WebSocketError):
        ws.FrameReader(max_size=1000).feed(data)


def test_a_message_over_the_limit_in_fragments_is_refused() -> None:
    reader = ws.FrameReader(max_size=1000)
    reader.feed(server_frame(ws.OP_BINARY, b"x" * 600, final=False))
    with pytest.raises(ws.WebSocketError):
        reader.feed(server_frame(ws.OP_CONTINUATION, b"x" * 600))


def test_handshake() -> None:
    request, key = ws.client_handshake("127.0.0.1:4151", "/replication/stream?topic=t")
    assert request.startswith(b"GET /replication/stream?topic=t HTTP/1.1\r\n")
    assert b"\r\nSec-WebSocket-Key: " + key + b"\r\n" in request
    assert request.endswith(b"\r\n\r\n")
    # RFC 6455's own example
    assert ws.accept_value(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    good = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n"
        b"Sec-WebSocket-Accept: " + ws.accept_value(key)
    )
    ws.check_handshake(good, key)
    for bad in (
        good.replace(b"101 Switching Protocols", b"404 Not Found"),
        good.replace(b"Upgrade: websocket", b"Upgrade: h2c"),
        good.replace(ws.accept_value(key), ws.accept_value(b"other")),
        b"SSH-2.0-OpenSSH",
    ):
        with pytest.raises(ws.WebSocketError):
            ws.check_handshake(bad, key)


def receive_like_a_buffered_protocol(
    reader: ws.FrameReader, data: bytes, sizes: list[int]
) -> list[tuple[int, bytes]]:
    """What asyncio.BufferedProtocol does with the reader: the next read goes where
    direct_buffer() says, if anywhere, at most ``sizes[i]`` bytes at a time."""
    out: list[tuple[int, bytes]] = []
    at = i = 0
    while at < len(data):
        size = sizes[i % len(sizes)] if sizes else 1000
        i += 1
        target = reader.direct_buffer()
        if target is not None:
            n = min(len(target), size, len(data) - at)
            target[:n] = data[at : at + n]
            out += [(op, bytes(p)) for op, p in reader.direct_filled(n)]
        else:
            n = min(size, len(data) - at)
            out += [(op, bytes(p)) for op, p in reader.feed(data[at : at + n])]
        at += n
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3000), st.booleans(), st.booleans()), max_size=6),
    st.lists(st.integers(1, 4000), min_size=1, max_size=8),
)
def test_big_frames_received_straight_into_their_buffer(
    frames: list[tuple[int, bool, bool]], sizes: list[int]
) -> None:
    data = b""
    want = []
    for n, masked, fragmented in frames:
        payload = bytes(i % 251 for i in range(n))
        mask = b"\x09\x08\x07\x06" if masked else b""
        if fragmented and n > 1:
            data += server_frame(ws.OP_BINARY, payload[: n // 2], False, mask)
            data += server_frame(ws.OP_PONG, b"")
            data += server_frame(ws.OP_CONTINUATION, payload[n // 2 :], True, mask)
            want.append((ws.OP_PONG, b""))
        else:
            data += server_frame(ws.OP_BINARY, payload, True, mask)
        want.append((ws.OP_BINARY, payload))
    # direct at 100 bytes: most frames here go the direct way, in pieces; with reuse,
    # into one buffer the reader keeps (each payload copied out before the next read)
    for reuse in (False, True):
        reader = ws.FrameReader(direct=100, reuse=reuse)
        assert receive_like_a_buffered_protocol(reader, data, sizes) == want


def test_the_leaders_frame_heads_read_back() -> None:
    """nsqx.wire.replication.ws_binary_head: what a leader writes before a message."""
    from nsqx.wire.replication import ws_binary_head

    reader = ws.FrameReader()
    for n in (0, 1, 125, 126, 65535, 65536, 200_000):
        payload = b"z" * n
        assert reader.feed(ws_binary_head(n) + payload) == [(ws.OP_BINARY, payload)]
    with pytest.raises(ValueError):
        ws_binary_head(-1)


def test_feeding_a_reader_that_reuses_its_buffer_keeps_each_message() -> None:
    """A caller that only feeds (never receives into direct_buffer) gets every message
    intact, also when the next big one arrives in the same bytes."""
    one, two = b"1" * 60_000, b"2" * 50_000
    data = server_frame(ws.OP_BINARY, one) + server_frame(ws.OP_BINARY, two)
    reader = ws.FrameReader(reuse=True)
    out = reader.feed(data[:20_000])
    out += reader.feed(data[20_000:80_000])  # the end of one, the start of two
    out += reader.feed(data[80_000:])
    assert [(op, bytes(p)) for op, p in out] == [(ws.OP_BINARY, one), (ws.OP_BINARY, two)]
