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
    parse_partition_id,
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


# --- partitions (Youzan's extension) ----------------------------------------------------

NSQX_NSQD_IDENTIFY = {
    **GO_NSQD_IDENTIFY,
    "version": "1.3.0-nsqx",
    "distributed_id": "10.0.0.7:4150",
}


def partitioned() -> LookupParser:
    p = LookupParser()
    (ev,) = p.feed(MAGIC_V1 + identify_cmd(NSQX_NSQD_IDENTIFY))
    assert isinstance(ev, Identify) and ev.info.speaks_partitions
    return p


def test_partition_aware_peers_register_partitions() -> None:
    p = partitioned()
    assert p.feed(
        b"REGISTER orders 0\nREGISTER orders 2 archive\nUNREGISTER orders 2 archive\n"
        b"UNREGISTER orders 0\nREGISTER orders +3\nREGISTER orders 004 c\n"
    ) == [
        Register("orders", None, 0),
        Register("orders", "archive", 2),
        Unregister("orders", "archive", 2),
        Unregister("orders", None, 0),
        # Go's Atoi: a sign and leading zeros are fine
        Register("orders", None, 3),
        Register("orders", "c", 4),
    ]


def test_who_speaks_partitions() -> None:
    """Youzan's rule: a non-empty distributed_id, or a version containing HA."""
    assert not PeerInfo("h", 1, 2, "1.3.0").speaks_partitions
    assert PeerInfo("h", 1, 2, "1.3.0", distributed_id="h:1").speaks_partitions
    assert PeerInfo("h", 1, 2, "0.3.7-HA.1.13.0").speaks_partitions
    # an NSQ 1.3 peer's "REGISTER t 5" is a channel named 5
    assert identified().feed(b"REGISTER t 5\n") == [Register("t", "5")]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"REGISTER t\n", "E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER t x\n", "E_BAD_PARTITIONID REGISTER partition id 'x' is not valid"),
        (b"REGISTER t 255\n", "E_BAD_PARTITIONID REGISTER partition id '255' is not valid"),
        (b"REGISTER t -11\n", "E_BAD_PARTITIONID REGISTER partition id '-11' is not valid"),
        (b"REGISTER t 1.0\n", "E_BAD_PARTITIONID REGISTER partition id '1.0' is not valid"),
        # checked in Youzan's order: topic, channel, then partition
        (b"REGISTER b@d x\n", "E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
        (b"UNREGISTER t x b@d\n", "E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    ],
)
def test_partition_errors_carry_youzan_texts(line: bytes, error: str) -> None:
    p = partitioned()
    assert error_of(p.feed(line)) == error
    assert p.dead


def test_partition_ids() -> None:
    assert [parse_partition_id(x) for x in ("0", "254", "+7", "007", b"12")] == [0, 254, 7, 7, 12]
    assert [parse_partition_id(x) for x in ("255", "-1", "", " 1", "1_0", "\u0663")] == [None] * 6


def test_partitioned_encoders_and_identify() -> None:
    assert encode_register("t", partition=0) == b"REGISTER t 0\n"
    assert encode_register("t", "c", 7) == b"REGISTER t 7 c\n"
    assert encode_unregister("t", "c", 7) == b"UNREGISTER t 7 c\n"
    assert encode_unregister("t", None, 254) == b"UNREGISTER t 254\n"
    info = PeerInfo("10.0.0.7", 4150, 4151, "1.3.0-nsqx", "node7", "10.0.0.7:4150")
    cmd = encode_identify(info)
    body = json.loads(cmd[13:])
    assert list(body) == sorted(body) and body["distributed_id"] == "10.0.0.7:4150"
    assert parse_identify_body(cmd[13:]) == info
    # what we send, our parser reads as a partition-aware peer
    p = LookupParser()
    assert p.feed(MAGIC_V1 + cmd + encode_register("t", "c", 1)) == [
        Identify(info),
        Register("t", "c", 1),
    ]


def test_identify_reply_partitions_flag() -> None:
    base = b'{"broadcast_address":"lk","hostname":"h","http_port":4161,"tcp_port":4160'
    nsqx = parse_identify_reply(base + b',"partitions":true,"version":"1.3.0-nsqx"}')
    assert nsqx.partitions and nsqx.speaks_partitions
    go = parse_identify_reply(base + b',"version":"1.3.0"}')
    assert not go.partitions and not go.speaks_partitions
    youzan = parse_identify_reply(base + b',"version":"0.3.7-HA.1.13.0"}')
    assert not youzan.partitions and youzan.speaks_partitions
    with pytest.raises(ValueError):
        parse_identify_reply(base + b',"partitions":"yes","version":"1"}')
