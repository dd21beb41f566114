"""The lookupd V1 codec (sans-IO): no sockets, no event loop."""

from __future__ import annotations

import json
import struct

import pytest

from nsqx.wire.errors import ProtocolError
from nsqx.wire.lookupd import (
    MAGIC_V1,
    Identify,
    LookupParser,
    PeerInfo,
    Ping,
    Register,
    ReplyDecoder,
    Unregister,
    encode_error_reply,
    encode_identify,
    encode_ping,
    encode_register,
    encode_reply,
    encode_unregister,
    is_error_reply,
    parse_identify_body,
    parse_identify_reply,
)

GO_NSQD_IDENTIFY = {
    "broadcast_address": "10.0.0.7",
    "hostname": "node7",
    "http_port": 4151,
    "tcp_port": 4150,
    "version": "1.3.0",
}


def identify_cmd(body: bytes | dict[str, object]) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(data)) + data


def identified() -> LookupParser:
    p = LookupParser()
    (ev,) = p.feed(MAGIC_V1 + identify_cmd(GO_NSQD_IDENTIFY))
    assert isinstance(ev, Identify)
    return p


def error_of(events: list[object]) -> str:
    assert events and isinstance(events[-1], ProtocolError), events
    return str(events[-1])


def test_go_nsqd_conversation_byte_by_byte() -> None:
    """What Go's nsqd sends on connect, fed one byte at a time, yields the same events."""
    stream = (
        MAGIC_V1
        + identify_cmd(GO_NSQD_IDENTIFY)
        + b"REGISTER orders archive\nREGISTER clicks\nPING\nUNREGISTER orders archive\n"
        + b"UNREGISTER clicks\n"
    )
    p = LookupParser()
    events = [ev for i in range(len(stream)) for ev in p.feed(stream[i : i + 1])]
    assert events == [
        Identify(PeerInfo("10.0.0.7", 4150, 4151, "1.3.0", "node7")),
        Register("orders", "archive"),
        Register("clicks", None),
        Ping(),
        Unregister("orders", "archive"),
        Unregister("clicks", None),
    ]
    assert p.identified and not p.dead


def test_magic_is_required() -> None:
    p = LookupParser()
    assert p.feed(b"  V") == []
    assert error_of(p.feed(b"2PING\n")) == "E_BAD_PROTOCOL"
    assert p.dead and p.feed(b"PING\n") == []


def test_ping_before_identify_is_fine_register_is_not() -> None:
    p = LookupParser()
    assert p.feed(MAGIC_V1 + b"PING\n") == [Ping()]
    assert error_of(p.feed(b"REGISTER t\n")) == "E_INVALID client must IDENTIFY"
    p = LookupParser()
    assert error_of(p.feed(MAGIC_V1 + b"UNREGISTER t c\n")) == "E_INVALID client must IDENTIFY"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"REGISTER\n", "E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER bad!topic\n", "E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
        (b"UNREGISTER t bad/ch\n", "E_BAD_CHANNEL UNREGISTER channel name 'bad/ch' is not valid"),
        (
            b"REGISTER " + b"x" * 65 + b"\n",
            "E_BAD_TOPIC REGISTER topic name '" + "x" * 65 + "' is not valid",
        ),
        (b"FOO bar\n", "E_INVALID invalid command FOO"),
        (b"register t\n", "E_INVALID invalid command register"),
        (b"\n", "E_INVALID invalid command "),
        (b"IDENTIFY\n", "E_INVALID cannot IDENTIFY again"),
    ],
)
def test_errors_carry_go_texts(line: bytes, error: str) -> None:
    p = identified()
    assert error_of(p.feed(line)) == error
    assert p.dead


def test_line_is_trimmed_then_split_on_single_spaces() -> None:
    p = identified()
    assert p.feed(b"  PING \r\nREGISTER t c\r\nREGISTER t  c\nREGISTER t c extra\n") == [
        Ping(),
        Register("t", "c"),
        # Go's strings.Split: a double space makes an empty channel: a topic registration
        Register("t", None),
        Register("t", "c"),
    ]
    assert p.feed(b"REGISTER t#ephemeral c#ephemeral\n") == [Register("t#ephemeral", "c#ephemeral")]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"[1,2]", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"tcp_port":"4150"}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"tcp_port":4150.0}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"tcp_port":true}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"version":1}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"tcp_port":NaN}', "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"null", "E_BAD_BODY IDENTIFY missing fields"),
        (b"{}", "E_BAD_BODY IDENTIFY missing fields"),
        (
            b'{"broadcast_address":"h","tcp_port":1,"http_port":0,"version":"1"}',
            "E_BAD_BODY IDENTIFY missing fields",
        ),
        (
            b'{"broadcast_address":"","tcp_port":1,"http_port":2,"version":"1"}',
            "E_BAD_BODY IDENTIFY missing fields",
        ),
    ],
)
def test_identify_body_errors(body: bytes, error: str) -> None:
    p = LookupParser()
    assert error_of(p.feed(MAGIC_V1 + identify_cmd(body))) == error


def test_identify_body_decodes_like_go_json() -> None:
    """Keys match case-insensitively, last duplicate wins, null and unknown keys are
    ignored, remote_address from the body is accepted but not used."""
    body = (
        b'{"BROADCAST_ADDRESS":"a","broadcast_address":"b","Tcp_Port":1,"http_port":2,'
        b'"version":"v","hostname":null,"extra":[1],"remote_address":"spoofed"}'
    )
    assert parse_identify_body(body) == PeerInfo("b", 1, 2, "v", "")


def test_identify_size_limits() -> None:
    p = LookupParser()
    neg = MAGIC_V1 + b"IDENTIFY\n" + struct.pack(">i", -1)
    assert error_of(p.feed(neg)) == "E_BAD_BODY IDENTIFY failed to read body size"
    p = LookupParser(max_identify_body=10)
    big = MAGIC_V1 + b"IDENTIFY\n" + struct.pack(">i", 11)
    assert error_of(p.feed(big)) == "E_BAD_BODY IDENTIFY failed to read body"


def test_long_lines_are_refused() -> None:
    p = identified()
    assert error_of(p.feed(b"x" * 70000)).startswith("E_INVALID command line too long")


def test_replies_have_no_frame_type() -> None:
    assert encode_reply(b"OK") == b"\x00\x00\x00\x02OK"
    err = ProtocolError("E_INVALID", "client must IDENTIFY")
    assert encode_error_reply(err) == b"\x00\x00\x00\x1eE_INVALID client must IDENTIFY"


def test_client_encoders_match_go_nsq() -> None:
    assert encode_register("t") == b"REGISTER t\n"
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_unregister("t") == b"UNREGISTER t\n"
    assert encode_unregister("t", "c") == b"UNREGISTER t c\n"
    assert encode_ping() == b"PING\n"
    info = PeerInfo("10.0.0.7", 4150, 4151, "1.3.0", "node7")
    cmd = encode_identify(info)
    body = json.dumps(GO_NSQD_IDENTIFY, separators=(",", ":")).encode()
    assert cmd == b"IDENTIFY\n" + struct.pack(">i", len(body)) + body
    # what we send, our parser (and so Go's, which reads the same fields) accepts
    assert LookupParser().feed(MAGIC_V1 + cmd) == [Identify(info)]


def test_reply_decoder_splits_stream() -> None:
    d = ReplyDecoder(max_size=100)
    stream = encode_reply(b"OK") + encode_reply(b'{"tcp_port":4160}') + encode_reply(b"E_X y")
    got = [r for i in range(len(stream)) for r in d.feed(stream[i : i + 1])]
    assert got == [b"OK", b'{"tcp_port":4160}', b"E_X y"]
    assert [is_error_reply(r) for r in got] == [False, False, True]
    with pytest.raises(ProtocolError):
        ReplyDecoder(max_size=3).feed(encode_reply(b"toolong"))


def test_identify_reply() -> None:
    reply = (
        b'{"broadcast_address":"lk","hostname":"h","http_port":4161,'
        b'"tcp_port":4160,"version":"1.3.0"}'
    )
    info = parse_identify_reply(reply)
    assert (info.broadcast_address, info.http_port, info.tcp_port) == ("lk", 4161, 4160)
    with pytest.raises(ValueError):
        parse_identify_reply(b"OK")
    with pytest.raises(ValueError):
        parse_identify_reply(b'{"http_port":"x"}')
