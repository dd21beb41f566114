"""Youzan's extensions in the client, without a network: message layouts read back what
nsqd's frame builder wrote, lookup answers, ext headers, trace answers, the connections
a consumer wants for a lookup answer, and the new options."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.client import (
    ConfigError,
    Consumer,
    LookupResult,
    Message,
    TopicMeta,
    TraceResult,
    ext_header,
    start_at_count,
    start_at_end,
    start_at_offset,
    start_at_time,
)
from nsqx.client.config import Config
from nsqx.client.discovery import parse_lookup, parse_lookup_result
from nsqx.client.message import YouzanMessage, message_class
from nsqx.wire.frames import (
    ATTEMPTS_AT,
    FRAME_DATA_AT,
    ID_AT,
    TIMESTAMP_AT,
    decode_youzan_message,
    encode_extended_batch,
    encode_message_batch,
    youzan_frame,
)

HEX_ID = b"%016x" % (3 << 50 | 41)


@given(
    body=st.binary(min_size=1, max_size=64),
    trace=st.integers(0, 2**64 - 1),
    ext=st.binary(max_size=40),
    ver=st.sampled_from([0, 2, 4]),
    with_ext=st.booleans(),
    detail=st.one_of(st.none(), st.tuples(st.integers(0, 2**63), st.integers(1, 2**31))),
    attempts=st.integers(1, 600),
)
def test_message_classes_read_what_nsqd_writes(
    body: bytes,
    trace: int,
    ext: bytes,
    ver: int,
    with_ext: bool,
    detail: tuple[int, int] | None,
    attempts: int,
) -> None:
    ext = ext if ver else b""
    record, _ = encode_extended_batch(
        1_700_000_000_000_000_000, [HEX_ID], [body], [trace], [ver], [ext]
    )
    frame = youzan_frame(record, with_ext, detail)
    data = frame[TIMESTAMP_AT:ATTEMPTS_AT] + attempts.to_bytes(2, "big") + frame[ID_AT:]
    expected = decode_youzan_message(data, with_ext, detail is not None)
    msg = message_class(True, with_ext, detail is not None)(data)
    assert isinstance(msg, YouzanMessage)
    assert msg.id == expected.id and len(msg.id) == 16
    assert msg.internal_id == expected.internal_id == 3 << 50 | 41
    assert msg.hex_id == HEX_ID
    assert msg.trace_id == trace
    assert msg.body == body
    assert msg.attempts == attempts
    assert msg.timestamp == 1_700_000_000_000_000_000
    assert (msg.ext_ver, msg.ext) == ((ver, ext) if with_ext else (0, b""))
    assert (msg.offset, msg.raw_size) == (detail if detail is not None else (-1, 0))


def test_vanilla_messages_keep_their_hex_id() -> None:
    frames, _ = encode_message_batch(5, [HEX_ID], [b"body"])
    msg = message_class(False)(frames[FRAME_DATA_AT:])
    assert type(msg) is Message
    assert msg.id == msg.hex_id == HEX_ID
    assert msg.internal_id == 3 << 50 | 41
    assert (msg.trace_id, msg.offset, msg.raw_size, msg.ext, msg.ext_header) == (0, -1, 0, b"", {})
    assert msg.partition is None and msg.tag == ""


def test_ext_header_of_a_message() -> None:
    header = b'{"##client_dispatch_tag":"red","##trace_id":"7","k":"v"}'
    cls = message_class(True, True, True)
    msg = cls.make_youzan(1, b"b", trace_id=7, ext_ver=4, ext=header, offset=10, raw_size=20)  # type: ignore[attr-defined]
    assert msg.ext_header == {"##client_dispatch_tag": "red", "##trace_id": "7", "k": "v"}
    assert msg.tag == "red" and msg.trace_id == 7 and msg.body == b"b"
    tagged = cls.make_youzan(1, b"b", ext_ver=2, ext=b"blue")  # type: ignore[attr-defined]
    assert tagged.ext_header == {"##client_dispatch_tag": "blue"} and tagged.tag == "blue"
    broken = cls.make_youzan(1, b"b", ext_ver=4, ext=b"[1]")  # type: ignore[attr-defined]
    assert broken.ext_header == {}
    assert "attempts=1" in repr(broken) and "0000000000000001" in repr(broken)


YOUZAN_ANSWER: dict[str, Any] = {
    # the shape of Youzan's client guide (seeds/004), with two partitions
    "status_code": 200,
    "status_txt": "OK",
    "data": {
        "channels": ["BaseConsumer"],
        "meta": {
            "partition_num": 2,
            "replica": 1,
            "extend_support": True,
            "ordered": True,
            "multi_part": False,
            "disable_channel_auto_create": False,
        },
        "partitions": {
            "0": {
                "id": "10.9.52.215:33122",
                "remote_address": "10.9.52.215:33122",
                "hostname": "qabb-qa-sqs4",
                "broadcast_address": "10.9.52.215",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "0.3.7-HA.1.5.4.1",
                "distributed_id": "10.9.52.215:4250:4150:338437",
            },
            "1": {"broadcast_address": "10.9.52.216", "tcp_port": 4150, "http_port": 4151},
            "x": {"broadcast_address": "10.9.52.217", "tcp_port": 4150},
        },
        "producers": [
            {"broadcast_address": "10.9.52.215", "tcp_port": 4150, "http_port": 4151},
            {"broadcast_address": "10.9.52.216", "tcp_port": 4150, "http_port": 4151},
        ],
    },
}


def test_youzan_lookup_answer() -> None:
    result = parse_lookup_result(YOUZAN_ANSWER)
    assert result.producers == {"10.9.52.215:4150", "10.9.52.216:4150"}
    assert dict(result.partitions) == {0: "10.9.52.215:4150", 1: "10.9.52.216:4150"}
    assert result.meta == TopicMeta(2, 1, ext=True, ordered=True)
    assert result.channels == ("BaseConsumer",)
    assert result.partitioned and result.partition_num == 2
    # the old parser still reads the producers
    assert parse_lookup(YOUZAN_ANSWER) == {"10.9.52.215:4150", "10.9.52.216:4150"}


def test_nsq_lookup_answer_has_no_partitions() -> None:
    body = {"channels": [], "producers": [{"broadcast_address": "::1", "tcp_port": 4150}]}
    result = parse_lookup_result(body)
    assert result.producers == {"[::1]:4150"} and not result.partitions
    assert result.meta is None and not result.partitioned and result.partition_num == 1
    # one plain partition listed by nsqx's lookupd: not partitioned either
    one = parse_lookup_result(
        {
            "meta": {"partition_num": 1},
            "partitions": {"0": {"broadcast_address": "h", "tcp_port": 1}},
            "producers": [],
        }
    )
    assert not one.partitioned and one.partition_num == 1


def test_lookup_answers_merge() -> None:
    a = LookupResult(frozenset({"a:1"}), {0: "a:1"}, None, ("c1",))
    b = LookupResult(frozenset({"b:1"}), {0: "b:1", 1: "b:1"}, TopicMeta(2), ("c1", "c2"))
    merged = a.merge(b)
    assert merged.producers == {"a:1", "b:1"}
    assert dict(merged.partitions) == {0: "a:1", 1: "b:1"}
    assert merged.meta == TopicMeta(2) and merged.channels == ("c1", "c2")


def test_ext_header_json() -> None:
    assert ext_header() == b"{}"
    assert ext_header({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    data = ext_header({"k": "v"}, tag="red", trace_id=12)
    assert json.loads(data) == {"k": "v", "##client_dispatch_tag": "red", "##trace_id": "12"}
    assert ext_header({"##trace_id": "5", "##client_dispatch_tag": "t"}) == (
        b'{"##client_dispatch_tag":"t","##trace_id":"5"}'
    )
    for bad in (
        {"##other": "x"},
        {"##trace_id": 5},
        {"##trace_id": str(2**64)},
        {"##client_dispatch_tag": 1},
    ):
        with pytest.raises(ValueError):
            ext_header(bad)
    with pytest.raises(ValueError):
        ext_header({"##trace_id": "1"}, trace_id=2)
    with pytest.raises(ValueError):
        ext_header(tag="x" * 101)
    with pytest.raises(ValueError):
        ext_header({"k": "x" * 70000})
    with pytest.raises(ValueError):
        ext_header(trace_id=-1)


def test_trace_result() -> None:
    data = b"OK" + struct.pack(">QQQI", 2 << 50 | 9, 77, 1234, 56)
    r = TraceResult.from_response(data)
    assert r == (2 << 50 | 9, 77, 1234, 56) and r.partition == 2
    with pytest.raises(ValueError):
        TraceResult.from_response(b"OK")


def test_start_positions() -> None:
    assert str(start_at_time(1700000000.7)) == "timestamp:1700000000"
    assert str(start_at_offset(99)) == "virtual_queue:99"
    assert str(start_at_count(3)) == "msgcount:3"
    assert str(start_at_end()) == "special:-1"
    with pytest.raises(ValueError):
        start_at_offset(-1)
    with pytest.raises(ValueError):
        start_at_count(-1)


def _targets(result: LookupResult, **kwargs: Any) -> set[tuple[str, int | None]]:
    consumer = Consumer("t", "c", lookupd_http_addresses=["l:1"], **kwargs)
    return consumer._targets(result)


def test_consumer_targets_for_a_lookup_answer() -> None:
    nsq = LookupResult(frozenset({"a:1", "b:1"}))
    assert _targets(nsq) == {("a:1", None), ("b:1", None)}
    # an ordered consumer cannot use NSQ 1.3's answer
    assert _targets(nsq, enable_ordered=True) == set()
    parted = LookupResult(
        frozenset({"a:1", "b:1", "c:1"}), {0: "a:1", 1: "b:1", 2: "a:1"}, TopicMeta(3)
    )
    # one connection per partition, plus NSQ 1.3's SUB where no partition is listed
    assert _targets(parted) == {("a:1", 0), ("b:1", 1), ("a:1", 2), ("c:1", None)}
    assert _targets(parted, enable_ordered=True) == {("a:1", 0), ("b:1", 1), ("a:1", 2)}
    assert _targets(parted, partitions=[1, 2]) == {("b:1", 1), ("a:1", 2)}
    # a plain topic with one partition per nsqd (nsqx's lookupd for NSQ 1.3 topics)
    plain = LookupResult(frozenset({"a:1", "b:1"}), {0: "a:1"}, TopicMeta(1))
    assert _targets(plain) == {("a:1", None), ("b:1", None)}
    assert _targets(plain, enable_trace=True) == {("a:1", 0)}
    ordered = LookupResult(frozenset({"a:1"}), {0: "a:1"}, TopicMeta(1, ordered=True))
    assert _targets(ordered) == {("a:1", 0)}


def test_youzan_options() -> None:
    c = Config(desired_tag="red", ext_filter={"type": 1, "filter_ext_key": "k", "filter_data": "v"})
    body = c.identify_body()
    assert body["desired_tag"] == "red" and body["ext_filter"]["filter_data"] == "v"
    assert "desired_tag" not in Config().identify_body()
    assert "ext_filter" not in Config().identify_body()
    for bad, text in (
        ({"desired_tag": "x" * 101}, "desired_tag"),
        ({"ext_filter": {"type": 9}}, "ext_filter"),
        ({"ordered_check": "maybe"}, "ordered_check"),
        ({"enable_ordered": True, "sample_rate": 10}, "sample_rate"),
        ({"pub_max_retry": -1}, "pub_max_retry"),
    ):
        with pytest.raises(ConfigError, match=text):
            Config(**bad)
    assert Config.from_dict({"pub-retry-delay": "250ms"}).pub_retry_delay == 0.25
    with pytest.raises(ConfigError, match="need partitions"):
        Consumer("t", "c", nsqd_tcp_addresses=["a:1"], enable_ordered=True)
    with pytest.raises(ConfigError, match="exclude"):
        Consumer(
            "t", "c", lookupd_http_addresses=["a:1"], enable_ordered=True, start=start_at_end()
        )
