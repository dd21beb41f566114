"""Message: fields decoded from the frame, answers given once."""

from __future__ import annotations

import pytest

from nsqx.client import Message, MessageRespondedError
from nsqx.wire.frames import Message as WireMessage
from nsqx.wire.frames import encode_message


def test_fields_come_from_the_frame():
    data = encode_message(WireMessage(1_700_000_000_000_000_000, 3, b"0123456789abcdef", b"body"))
    m = Message(data)
    assert m.id == b"0123456789abcdef"
    assert m.body == b"body"
    assert m.attempts == 3
    assert m.timestamp == 1_700_000_000_000_000_000
    assert "attempts=3" in repr(m)


def test_answers_are_given_once():
    m = Message.make(b"0123456789abcdef", b"x")
    assert not m.has_responded
    m.touch()
    m.finish()
    assert m.has_responded
    with pytest.raises(MessageRespondedError):
        m.finish()
    with pytest.raises(MessageRespondedError):
        m.requeue()
    with pytest.raises(MessageRespondedError):
        m.touch()


def test_enable_async():
    m = Message.make(b"0123456789abcdef", b"x")
    assert not m.is_async
    m.enable_async()
    assert m.is_async
    m2 = Message.make(b"0123456789abcdef", b"x")
    m2.disable_auto_response()
    assert m2.is_async
