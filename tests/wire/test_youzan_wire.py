"""Youzan's protocol extensions in wire/: commands, message layouts, ext headers, filters."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.wire import commands as c
from nsqx.wire.errors import ProtocolError
from nsqx.wire.ext import (
    JSON_HEADER_EXT_VER,
    ExtError,
    ExtFilter,
    ExtFilterSpec,
    glob_to_regex,
    header_tag,
    header_trace_id,
    parse_header,
)
from nsqx.wire.frames import (
    FRAME_DATA_AT,
    binary_id,
    decode_message,
    decode_youzan_message,
    encode_extended_batch,
    encode_message_batch,
    equal_frame_size,
    hex_id,
    is_extended,
    record_parts,
    vanilla_frame,
    youzan_frame,
    youzan_ids,
)
from nsqx.wire.identify import ServerLimits, negotiate


def parse(data: bytes, binary: bool = False) -> list[object]:
    p = c.CommandParser(expect_magic=False)
    p.binary_ids = binary
    return list(p.feed(data))


def test_partitioned_commands() -> None:
    assert parse(b"SUB t ch 3\n") == [c.Sub("t", "ch", 3)]
    assert parse(b"SUB t ch\n") == [c.Sub("t", "ch")]
    assert parse(b"SUB_ORDERED t ch 2\n") == [c.Sub("t", "ch", 2, c.SUB_ORDERED)]
    start = c.ConsumeStart("timestamp", 1700000000)
    assert parse(b"SUB_ADVANCED t ch 1 timestamp:1700000000\n") == [
        c.Sub("t", "ch", 1, c.SUB_ADVANCED, start)
    ]
    assert parse(c.pub("t", b"x", 2)) == [c.Pub("t", b"x", 2)]
    assert parse(c.mpub("t", [b"a", b"b"], 1)) == [c.Mpub("t", [b"a", b"b"], 1)]
    # NSQ 1.3's form is unchanged
    assert parse(c.pub("t", b"x")) == [c.Pub("t", b"x")]


def test_partition_and_offset_errors() -> None:
    (err,) = parse(b"SUB t ch x\n")
    assert isinstance(err, ProtocolError) and err.fatal
    assert str(err) == (
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'
    )
    (err,) = parse(b"PUB t zz\n" + struct.pack(">i", 1) + b"x")
    assert isinstance(err, ProtocolError) and err.code == "E_BAD_PARTITION"
    (err,) = parse(b"SUB_ADVANCED t ch 0 bogus:1\n")
    assert isinstance(err, ProtocolError) and str(err) == "E_INVALID invalid consume offset:bogus:1"
    (err,) = parse(b"SUB_ADVANCED t ch 0 msgcount:x\n")
    assert str(err) == 'E_INVALID strconv.ParseInt: parsing "x": invalid syntax'


def test_trace_and_ext_publishes() -> None:
    assert parse(c.pub_trace("t", 0, 42, b"body")) == [c.PubTrace("t", 0, 42, b"body")]
    assert parse(c.mpub_trace("t", 1, [1, 2], [b"a", b"bb"])) == [
        c.MpubTrace("t", 1, [1, 2], [b"a", b"bb"])
    ]
    assert parse(c.pub_ext("t", 0, b'{"k":"v"}', b"body")) == [
        c.PubExt("t", 0, b'{"k":"v"}', b"body")
    ]
    assert parse(c.mpub_ext("t", 0, [b"{}", b""], [b"a", b"b"])) == [
        c.MpubExt("t", 0, [b"{}", b""], [b"a", b"b"])
    ]
    # a traced body must hold more than the trace id; an ext body more than its header
    (err,) = parse(b"PUB_TRACE t 0\n" + struct.pack(">i", 8) + b"\0" * 8)
    assert str(err) == "E_BAD_BODY invalid body size 8 with trace id enabled"
    (err,) = parse(b"PUB_EXT t 0\n" + struct.pack(">iH", 4, 2) + b"{}")
    assert str(err) == "E_BAD_BODY invalid body size 4 in ext json header content length"
    (err,) = parse(b"PUB_TRACE\n")
    assert str(err) == "E_INVALID insufficient number of parameters"


@given(st.binary(min_size=16, max_size=16), st.integers(0, 3_600_000))
def test_binary_ids_with_newlines_and_spaces(mid: bytes, timeout: int) -> None:
    data = c.fin(mid) + c.req(mid, timeout) + c.touch(mid) + c.fin(mid) + c.nop()
    events = parse(data, binary=True)
    assert events == [c.Fin([mid]), c.Req(mid, timeout), c.Touch(mid), c.Fin([mid]), c.Nop()]
    # byte by byte too
    p = c.CommandParser(expect_magic=False)
    p.binary_ids = True
    got: list[object] = []
    for i in range(len(data)):
        got.extend(p.feed(data[i : i + 1]))
    assert [type(e) for e in got] == [c.Fin, c.Req, c.Touch, c.Fin, c.Nop]


def test_runs_of_binary_fins_are_one_event() -> None:
    ids = [bytes([10, 32] * 8), bytes(range(16)), b"\n" * 16]
    assert parse(b"".join(c.fin(i) for i in ids), binary=True) == [c.Fin(ids)]


def test_extended_records_and_what_each_client_gets() -> None:
    ids = [b"%016x" % (1 << 50 | 7), b"%016x" % (1 << 50 | 8)]
    chunk, stride = encode_extended_batch(
        123, ids, [b"one", b"two"], [99, 0], [JSON_HEADER_EXT_VER, 0], [b'{"a":"b"}', b""]
    )
    assert stride == 0 and is_extended(chunk)
    first = chunk[: 4 + struct.unpack_from(">i", chunk)[0]]
    assert record_parts(first)[:3] == (99, JSON_HEADER_EXT_VER, b'{"a":"b"}')
    # an NSQ 1.3 client: the vanilla frame, no trace id, no ext
    v = vanilla_frame(first)
    assert struct.unpack_from(">ii", v) == (len(v) - 4, 2)
    assert decode_message(v[FRAME_DATA_AT:]) == (123, 1, ids[0], b"one")
    # a Youzan client with ext support and positions
    y = youzan_frame(first, True, (4096, len(first)))
    m = decode_youzan_message(y[FRAME_DATA_AT:], True, True)
    assert (m.trace_id, m.ext_ver, m.ext, m.offset, m.raw_size, m.body) == (
        99,
        JSON_HEADER_EXT_VER,
        b'{"a":"b"}',
        4096,
        len(first),
        b"one",
    )
    assert m.internal_id == 1 << 50 | 7 and hex_id(m.id) == ids[0]
    # a vanilla stored frame to a Youzan client: trace id 0, ext version 0
    plain, _ = encode_message_batch(5, [ids[1]], [b"p"])
    m = decode_youzan_message(youzan_frame(plain, True, None)[FRAME_DATA_AT:], True, False)
    assert (m.trace_id, m.ext_ver, m.body, m.offset) == (0, 0, b"p", -1)
    assert binary_id(ids[1], 3) == struct.pack(">QQ", 1 << 50 | 8, 3)
    assert not is_extended(plain) and vanilla_frame(plain) is plain


def test_identify_youzan_fields() -> None:
    limits = ServerLimits()
    s, resp = negotiate(b'{"feature_negotiation":true,"desired_tag":"t1"}', limits)
    assert s.youzan and s.desired_tag == "t1" and b'"desired_tag":"t1"' in resp
    s, resp = negotiate(b'{"feature_negotiation":true,"extend_support":false}', limits)
    assert s.youzan and not s.extend_support and b"desired_tag" not in resp
    s, _ = negotiate(b'{"feature_negotiation":true}', limits)
    assert not s.youzan
    spec = b'{"ext_filter":{"type":1,"filter_ext_key":"k","filter_data":"v"}}'
    s, _ = negotiate(spec, limits)
    assert s.ext_filter is not None and s.ext_filter.match(JSON_HEADER_EXT_VER, b'{"k":"v"}')
    with pytest.raises(ProtocolError, match="E_BAD_BODY IDENTIFY invalid ext_filter"):
        negotiate(b'{"ext_filter":{"type":2,"filter_ext_key":"k","filter_data":"("}}', limits)
    with pytest.raises(ProtocolError, match="invalid tag len 101"):
        negotiate(b'{"desired_tag":"' + b"x" * 101 + b'"}', limits)
    with pytest.raises(ProtocolError, match="failed to decode JSON body"):
        negotiate(b'{"extend_support":"yes"}', limits)


def test_ext_headers() -> None:
    assert parse_header(b'{"##trace_id":"12"}') == {"##trace_id": "12"}
    for bad in (b"", b"[1]", b"{"):
        with pytest.raises(ExtError) as err:
            parse_header(bad)
        assert err.value.code == "E_INVALID_JSON_HEADER"
    assert header_trace_id({"##trace_id": "18446744073709551615"}) == 2**64 - 1
    assert header_trace_id({}) is None
    for bad_value in (12, "x", "18446744073709551616"):
        with pytest.raises(ExtError) as err:
            header_trace_id({"##trace_id": bad_value})
        assert err.value.code == "INVALID_TRACE_ID"
    assert header_tag(JSON_HEADER_EXT_VER, b'{"##client_dispatch_tag":"red"}') == "red"
    assert header_tag(2, b"blue") == "blue"
    assert header_tag(0, b"") == ""


def flt(**spec: object) -> ExtFilter:
    pairs = spec.pop("filter_data_list", ())
    return ExtFilter(ExtFilterSpec(**spec, filter_data_list=tuple(pairs)))  # type: ignore[arg-type]


def test_ext_filters() -> None:
    h = JSON_HEADER_EXT_VER
    exact = flt(type=1, filter_ext_key="k", filter_data="v")
    assert exact.match(h, b'{"k":"v"}')
    assert not exact.match(h, b'{"k":"w"}') and not exact.match(h, b'{"k":1}')
    assert not exact.match(0, b"")  # only JSON headers are matched
    inverse = flt(type=1, filter_ext_key="k", filter_data="v", inverse=True)
    assert not inverse.match(h, b'{"k":"v"}') and inverse.match(0, b"")
    regexp = flt(type=2, filter_ext_key="k", filter_data="^a.c")
    assert regexp.match(h, b'{"k":"abcd"}') and not regexp.match(h, b'{"k":"xabc"}')
    glob = flt(type=3, filter_ext_key="k", filter_data="a*{x,y}?")
    assert glob.match(h, b'{"k":"aaaxz"}') and not glob.match(h, b'{"k":"aaaz"}')
    nested = flt(type=1, filter_ext_key="a.b", filter_data="c")
    assert nested.match(h, b'{"a":{"b":"c"}}')
    pairs = (("k1", "1"), ("k2", "2"))
    any_ = flt(type=4, filter_ext_key="any", filter_data_list=pairs)
    all_ = flt(type=4, filter_ext_key="all", filter_data_list=pairs)
    one = b'{"k1":"1","k2":"x"}'
    both = b'{"k1":"1","k2":"2"}'
    assert any_.match(h, one) and not all_.match(h, one) and all_.match(h, both)
    for bad in (
        {"type": 9, "filter_ext_key": "k", "filter_data": "v"},
        {"type": 1, "filter_ext_key": "", "filter_data": "v"},
        {"type": 1, "filter_ext_key": "k", "filter_data": ""},
        {"type": 4, "filter_ext_key": "some", "filter_data_list": (("k", "v"),)},
        {"type": 4, "filter_ext_key": "any"},
    ):
        with pytest.raises(ValueError):
            flt(**bad)


def test_glob_translation() -> None:
    assert glob_to_regex("a?c").match("abc")
    assert glob_to_regex("[!x]b").match("ab") and not glob_to_regex("[!x]b").match("xb")
    assert glob_to_regex("[a-c]*").match("cat")
    assert glob_to_regex(r"a\*").match("a*") and not glob_to_regex(r"a\*").match("ab")
    for bad in ("[ab", "{a,b"):
        with pytest.raises(ValueError):
            glob_to_regex(bad)


@given(st.lists(st.integers(0, (1 << 58) - 1), min_size=1, max_size=50), st.integers(0, 40))
def test_youzan_ids_rewrites_runs_of_equal_frames(seqs: list[int], size: int) -> None:
    ids = [b"%016x" % n for n in seqs]
    chunk, stride = encode_message_batch(9, ids, [b"x" * size] * len(ids))
    assert equal_frame_size(chunk) == stride
    frames = [chunk[o : o + stride] for o in range(0, len(chunk), stride)]
    want = b"".join(youzan_frame(f, False, None) for f in frames)
    assert youzan_ids(chunk, ids, stride) == want
    # frames of other sizes are not one run
    mixed, _ = encode_message_batch(9, [ids[0], ids[0]], [b"a", b"bb"])
    assert equal_frame_size(mixed) == 0


@pytest.mark.parametrize("pattern", ["^[.((?(}-1]*", "[z-a]", "[]]", "[(]", "[\\d]"])
def test_a_glob_class_is_never_regex_syntax(pattern: str) -> None:
    """Found by fuzzing (the 'ext' target): a class's characters went into the regex
    as they were, and a bad one raised re.error out of IDENTIFY."""
    try:
        rx = glob_to_regex(pattern)
    except ValueError:
        return
    assert rx.pattern.startswith("(?s)")


def test_a_glob_class_is_a_range_or_a_list() -> None:
    assert glob_to_regex("[a-c]").match("b") and not glob_to_regex("[a-c]").match("-")
    assert glob_to_regex("[(d]").match("(") and not glob_to_regex("[(d]").match("x")
    assert glob_to_regex("[\\d]").match("d") and not glob_to_regex("[\\d]").match("5")
