"""Frames and message layout: encode/decode round trips, incremental decoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.wire import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    FrameDecoder,
    Message,
    ProtocolError,
    decode_message,
    encode_error,
    encode_frame,
    encode_message,
    encode_message_batch,
    encode_message_frame,
    encode_response,
)
from nsqx.wire import frames as f
from nsqx.wire.frames import encode_policy_notice, policy_notice_attempts, with_attempts

ids = st.binary(min_size=16, max_size=16)
messages = st.builds(
    Message,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**16 - 1),
    ids,
    st.binary(max_size=300),
)


def test_frame_layout() -> None:
    assert encode_response(b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert (
        encode_error(ProtocolError("E_INVALID", "x"))
        == b"\x00\x00\x00\x0f\x00\x00\x00\x01E_INVALID x"
    )
    frame = encode_message_frame(1, 1, b"0123456789abcdef", b"body")
    assert frame[:8] == (30 + 4).to_bytes(4, "big") + FRAME_MESSAGE.to_bytes(4, "big")
    assert decode_message(frame[8:]) == Message(1, 1, b"0123456789abcdef", b"body")


def test_the_layout_constants_are_the_spec() -> None:
    """The named offsets every module slices with, against NSQ's spec written out."""
    frame = encode_message_frame(-2, 0x0102, b"0123456789abcdef", b"body")
    ts, attempts, mid, body = b"\xff" * 7 + b"\xfe", b"\x01\x02", b"0123456789abcdef", b"body"
    assert (
        frame == (4 + 26 + 4).to_bytes(4, "big") + b"\x00\x00\x00\x02" + ts + attempts + mid + body
    )
    assert frame[f.FRAME_TYPE_AT : f.FRAME_DATA_AT] == b"\x00\x00\x00\x02"
    assert frame[f.TIMESTAMP_AT : f.ATTEMPTS_AT] == ts
    assert frame[f.ATTEMPTS_AT : f.ID_AT] == attempts
    assert frame[f.ID_AT : f.ID_END] == mid and frame[f.BODY_AT :] == body
    data = frame[f.FRAME_DATA_AT :]
    assert data[f.MSG_TIMESTAMP_AT : f.MSG_ATTEMPTS_AT] == ts
    assert data[f.MSG_ATTEMPTS_AT : f.MSG_ID_AT] == attempts
    assert data[f.MSG_ID_AT : f.MSG_ID_END] == mid and data[f.MSG_BODY_AT :] == body
    assert f.MSG_ID_END - f.MSG_ID_AT == f.MSG_ID_LENGTH and f.MSG_BODY_AT == f.MESSAGE_HEADER_SIZE
    # a Youzan client's 16 id bytes: the u64 id, then the trace id
    assert f.MSG_TRACE_AT == f.MSG_ID_AT + 8
    assert (f.MSG_EXT_VER_AT, f.MSG_EXT_LEN_AT, f.MSG_EXT_AT) == (26, 27, 29)
    assert f.EXT_VER_AT == f.TRACE_AT + 8 and f.EXT_AT == f.EXT_LEN_AT + 2


@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@given(st.lists(st.tuples(ids, st.binary(max_size=100)), max_size=20), st.integers(0, 2**62))
def test_batch_equals_single_frames(items: list[tuple[bytes, bytes]], ts: int) -> None:
    mids = [i for i, _ in items]
    bodies = [b for _, b in items]
    chunk, stride = encode_message_batch(ts, mids, bodies)
    frames = [encode_message_frame(ts, 1, i, b) for i, b in items]
    assert chunk == b"".join(frames)
    if len({len(b) for b in bodies}) == 1:
        assert stride == len(frames[0])
    else:
        assert stride == 0


def test_batch_refuses_ids_and_bodies_of_different_lengths() -> None:
    with pytest.raises(ValueError):
        encode_message_batch(0, [b"0" * 16], [])


@given(messages, st.integers(0, 2**16 - 1))
def test_with_attempts(msg: Message, attempts: int) -> None:
    frame = encode_message_frame(msg.timestamp, msg.attempts, msg.id, msg.body)
    assert with_attempts(frame, attempts) == encode_message_frame(
        msg.timestamp, attempts, msg.id, msg.body
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]), st.binary(max_size=200)
        ),
        max_size=20,
    ),
    st.lists(st.integers(1, 50), max_size=40),
)
def test_decoder_reassembles_any_split(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    out: list[tuple[int, bytes]] = []
    pos = 0
    for cut in cuts:
        out += dec.feed(stream[pos : pos + cut])
        pos += cut
    out += dec.feed(stream[pos:])
    assert out == frames
    assert dec.buffered == 0


def test_decoder_rejects_bad_size() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\x00\x00\x00\x02\x00\x00\x00\x00")
    with pytest.raises(ProtocolError):
        FrameDecoder(max_frame_size=100).feed(b"\x00\x00\x10\x00\x00\x00\x00\x00")


def test_decode_short_message() -> None:
    with pytest.raises(ProtocolError):
        decode_message(b"short")


@pytest.mark.parametrize("max_attempts", [0, 1, 7, 65535])
def test_a_channel_policy_notice_round_trips(max_attempts: int) -> None:
    frame = encode_policy_notice(max_attempts)
    dec = FrameDecoder()
    ((ftype, data),) = dec.feed(frame)
    assert ftype == FRAME_RESPONSE and policy_notice_attempts(data) == max_attempts


@pytest.mark.parametrize(
    "data",
    [
        b"OK",
        b"_heartbeat_",
        b"_channel_policy_ {",
        b'_channel_policy_ {"x":1}',
        b'_channel_policy_ {"max_attempts":"7"}',
        b'_channel_policy_ {"max_attempts":true}',
    ],
)
def test_what_is_not_a_policy_notice(data: bytes) -> None:
    assert policy_notice_attempts(data) is None
