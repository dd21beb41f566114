"""The server's command parser: pipelining, partial reads, limits, NSQ's errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.wire import MAGIC_V2, CommandParser, ParserLimits, ProtocolError
from nsqx.wire import commands as c
from nsqx.wire.commands import TLSRequiredParser

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)
ids = st.from_regex(r"[0-9a-f]{16}", fullmatch=True).map(str.encode)
bodies = st.binary(min_size=1, max_size=200)

# (encoded bytes, expected event)
command = st.one_of(
    st.builds(lambda t, b: (c.pub(t, b), c.Pub(t, b)), names, bodies),
    st.builds(
        lambda t, bs: (c.mpub(t, bs), c.Mpub(t, bs)),
        names,
        st.lists(bodies, min_size=1, max_size=10),
    ),
    st.builds(
        lambda t, d, b: (c.dpub(t, d, b), c.Dpub(t, d, b)), names, st.integers(0, 3600_000), bodies
    ),
    st.builds(lambda t, ch: (c.sub(t, ch), c.Sub(t, ch)), names, names),
    st.builds(lambda n: (c.rdy(n), c.Rdy(n)), st.integers(0, 2500)),
    st.builds(lambda i: (c.fin(i), c.Fin([i])), ids),
    st.builds(lambda i, t: (c.req(i, t), c.Req(i, t)), ids, st.integers(0, 3600_000)),
    st.builds(lambda i: (c.touch(i), c.Touch(i)), ids),
    st.just((c.nop(), c.Nop())),
    st.just((c.cls(), c.Cls())),
    st.builds(
        lambda d: (c.identify(d), c.Identify(c.identify(d)[13:])), st.just({"client_id": "x"})
    ),
)


def merge_fins(events: list[object]) -> list[object]:
    """Consecutive FINs may arrive as one Fin event, consecutive PUBs of one topic as one
    Pubs event: compare them as single commands."""
    out: list[object] = []
    for ev in events:
        if isinstance(ev, c.Pubs):
            out.extend(c.Pub(ev.topic, b, ev.partition) for b in ev.bodies)
        elif isinstance(ev, c.Fin) and out and isinstance(out[-1], c.Fin):
            out[-1] = c.Fin(out[-1].ids + ev.ids)
        else:
            out.append(ev)
    return out


def feed_all(parser: CommandParser, data: bytes) -> list[object]:
    """feed(), going on after each IDENTIFY (where the parser pauses for the server)."""
    events: list[object] = list(parser.feed(data))
    while events and isinstance(events[-1], c.Identify):
        more = parser.feed(b"")
        if not more:
            break
        events += more
    return events


def feed_split(parser: CommandParser, data: bytes, cuts: list[int]) -> list[object]:
    events: list[object] = []
    pos = 0
    for cut in cuts:
        events += feed_all(parser, data[pos : pos + cut])
        pos += cut
    events += feed_all(parser, data[pos:])
    return events


@settings(max_examples=300)
@given(st.lists(command, max_size=30), st.lists(st.integers(1, 64), max_size=50))
def test_encoded_commands_parse_back_under_any_split(
    cmds: list[tuple[bytes, object]], cuts: list[int]
) -> None:
    stream = MAGIC_V2 + b"".join(b for b, _ in cmds)
    events = feed_split(CommandParser(), stream, cuts)
    assert merge_fins(events) == merge_fins([e for _, e in cmds])


@settings(max_examples=500)
@given(st.binary(max_size=400), st.lists(st.integers(1, 64), max_size=20), st.booleans())
def test_arbitrary_bytes_yield_events_or_one_error(
    data: bytes, cuts: list[int], magic: bool
) -> None:
    parser = CommandParser(ParserLimits(max_msg_size=100, max_body_size=300))
    events = feed_split(parser, (MAGIC_V2 if magic else b"") + data, cuts)
    errors = [e for e in events if isinstance(e, ProtocolError)]
    assert len(errors) <= 1
    if errors:
        assert events[-1] is errors[0]
        assert parser.dead
        assert parser.feed(b"NOP\n") == []
    assert parser.buffered <= len(data) + 4


def parse(data: bytes, limits: ParserLimits | None = None) -> list[object]:
    return CommandParser(limits).feed(MAGIC_V2 + data)


def error_of(data: bytes, limits: ParserLimits | None = None) -> str:
    events = parse(data, limits)
    assert isinstance(events[-1], ProtocolError), events
    return str(events[-1])


def test_bad_magic() -> None:
    events = CommandParser().feed(b"GET / HTTP/1.1\r\n")
    assert str(events[-1]) == "E_BAD_PROTOCOL"


def test_fin_run_is_one_event() -> None:
    ids_ = [b"%016x" % i for i in range(100)]
    assert parse(c.fin_many(ids_)) == [c.Fin(ids_)]


def test_crlf_lines_accepted() -> None:
    assert parse(b"NOP\r\nFIN 0123456789abcdef\r\n") == [c.Nop(), c.Fin([b"0123456789abcdef"])]


def test_events_before_an_error_are_kept() -> None:
    events = parse(c.pub("t", b"x") + b"WHAT\n" + c.nop())
    assert events[0] == c.Pub("t", b"x")
    assert str(events[1]) == "E_INVALID invalid command WHAT"
    assert len(events) == 2


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"SUB a\n", "E_INVALID SUB insufficient number of parameters"),
        (b"SUB a/b c\n", 'E_BAD_TOPIC SUB topic name "a/b" is not valid'),
        (
            b"SUB a c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s t u v w x y z\n",
            None,
        ),
        (b"SUB a c!\n", 'E_BAD_CHANNEL SUB channel name "c!" is not valid'),
        (b"RDY x\n", "E_INVALID RDY could not parse count x"),
        (b"RDY -1\n", "E_INVALID RDY could not parse count -1"),
        (b"RDY 2501\n", "E_INVALID RDY count 2501 out of range 0-2500"),
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"FIN abc\n", "E_INVALID Invalid Message ID"),
        (b"REQ 0123456789abcdef\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ 0123456789abcdef x\n", "E_INVALID REQ could not parse timeout x"),
        (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
        (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
        (b"PUB a+b\n", 'E_BAD_TOPIC PUB topic name "a+b" is not valid'),
        (b"PUB t\n\x00\x00\x00\x00", "E_BAD_MESSAGE PUB invalid message body size 0"),
        (b"PUB t\n\x00\x10\x00\x01", "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
        (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
        (b"DPUB t x\n", "E_INVALID DPUB could not parse timeout x"),
        (b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        (b"MPUB t\n\xff\xff\xff\xff", "E_BAD_BODY MPUB invalid body size -1"),
        (b"MPUB t\n\x00\x50\x00\x01", "E_BAD_BODY MPUB body too big 5242881 > 5242880"),
        (b"MPUB t\n\x00\x00\x00\x04\x00\x00\x00\x00", "E_BAD_BODY MPUB invalid message count 0"),
        (
            b"MPUB t\n\x00\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00\x00",
            "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        ),
        (
            b"MPUB t\n\x00\x00\x00\x08\x00\x00\x00\x02\x00\x00\x00\x00",
            "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        ),
        (
            b"MPUB t\n\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00\x00\x05x",
            "E_BAD_MESSAGE MPUB failed to read message body",
        ),
        (b"IDENTIFY\n\x00\x00\x00\x00", "E_BAD_BODY IDENTIFY invalid body size 0"),
        (b"IDENTIFY\n\x00\x50\x00\x01", "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880"),
        (b"AUTH x\n", "E_INVALID AUTH invalid number of parameters"),
        (b"HELLO\n", "E_INVALID invalid command HELLO"),
    ],
)
def test_errors_as_nsqd_sends_them(data: bytes, expected: str | None) -> None:
    events = parse(data)
    if expected is None:
        assert events and not isinstance(events[-1], ProtocolError)
    else:
        assert str(events[-1]) == expected
        assert events[-1].fatal  # type: ignore[union-attr]


def test_oversized_body_refused_from_size_prefix_without_buffering() -> None:
    parser = CommandParser()
    header = b"PUB t\n" + struct.pack(">i", 50 * 1024 * 1024)
    events = parser.feed(MAGIC_V2 + header)
    assert str(events[-1]).startswith("E_BAD_MESSAGE PUB message too big")
    assert parser.buffered == 0


def test_large_body_collected_in_chunks() -> None:
    body = b"x" * 1_000_000
    data = MAGIC_V2 + c.pub("t", body) + c.nop()
    parser = CommandParser()
    events: list[object] = []
    for i in range(0, len(data), 65536):
        events += parser.feed(data[i : i + 65536])
    assert events == [c.Pub("t", body), c.Nop()]


def test_line_too_long() -> None:
    parser = CommandParser(ParserLimits(max_line=100))
    events = parser.feed(MAGIC_V2 + b"A" * 101)
    assert str(events[-1]).startswith("E_INVALID command line too long")


def test_mpub_trailing_bytes_rejected() -> None:
    body = struct.pack(">ii", 1, 1) + b"x" + b"junk"
    assert error_of(b"MPUB t\n" + struct.pack(">i", len(body)) + body).startswith("E_BAD_BODY")


def test_non_fatal_codes() -> None:
    assert not ProtocolError("E_FIN_FAILED").fatal
    assert not ProtocolError("E_REQ_FAILED").fatal
    assert not ProtocolError("E_TOUCH_FAILED").fatal
    assert ProtocolError("E_INVALID").fatal


@given(
    st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30),
    st.booleans(),
)
def test_mpub_fast_and_slow_paths_agree(bodies: list[bytes], same_size: bool) -> None:
    if same_size:
        bodies = [b.ljust(40, b"z") for b in bodies]
    raw = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    assert c.parse_mpub_body(raw, 1000) == bodies


def test_mpub_equal_stride_with_a_lying_prefix_falls_back() -> None:
    # total length fits "2 messages of 4 bytes" but the second prefix says 3
    raw = struct.pack(">ii", 2, 4) + b"aaaa" + struct.pack(">i", 3) + b"bbbb"
    with pytest.raises(ProtocolError):
        c.parse_mpub_body(raw, 1000)


def test_parser_pauses_after_identify() -> None:
    """What follows IDENTIFY may be TLS or compressed: the server takes it or goes on."""
    parser = CommandParser()
    tail = b"\x16\x03\x01 not a command"
    events = parser.feed(MAGIC_V2 + b"NOP\n" + c.identify({"tls_v1": True}) + tail)
    assert [type(e) for e in events] == [c.Nop, c.Identify]
    assert parser.buffered == len(tail)
    assert parser.take_buffered() == tail
    assert parser.buffered == 0
    # nothing negotiated: feeding again continues with the commands behind IDENTIFY
    parser = CommandParser()
    split_at = len(MAGIC_V2) + 5
    data = MAGIC_V2 + c.identify({}) + c.nop() + c.rdy(3)
    assert [type(e) for e in parser.feed(data[:split_at])] == []
    assert [type(e) for e in parser.feed(data[split_at:])] == [c.Identify]
    assert parser.feed(b"") == [c.Nop(), c.Rdy(3)]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"PUB t\n\x00\x00\x00\x01x", "E_INVALID cannot PUB in current state (TLS required)"),
        (b"PUB bad!topic\n", "E_INVALID cannot PUB in current state (TLS required)"),
        (b"FOO bar\r\n", "E_INVALID cannot FOO in current state (TLS required)"),
        (b"AUTH\n", "E_INVALID cannot AUTH in current state (TLS required)"),
    ],
)
def test_tls_required_parser_refuses_all_but_identify(data: bytes, error: str) -> None:
    events = TLSRequiredParser().feed(MAGIC_V2 + data)
    assert [str(e) for e in events] == [error]


def test_tls_required_parser_accepts_identify_then_refuses() -> None:
    parser = TLSRequiredParser()
    events = parser.feed(MAGIC_V2 + c.identify({}) + c.nop())
    assert [type(e) for e in events] == [c.Identify]
    events = parser.feed(b"")
    assert [str(e) for e in events] == ["E_INVALID cannot NOP in current state (TLS required)"]


def test_wire_req_clamp_keeps_what_was_asked() -> None:
    """The parser (sans-IO) clamps and says what was asked, for the server's log line."""
    p = c.CommandParser(c.ParserLimits(max_req_timeout_ms=1000))
    mid = b"0123456789abcdef"
    evs = p.feed(
        MAGIC_V2
        + b"REQ %s 999\nREQ %s 1000\nREQ %s 1001\nREQ %s 10000000000000\nREQ %s 18446744073709551616\n"
        % (mid, mid, mid, mid, mid)
    )
    assert evs == [
        c.Req(mid, 999),
        c.Req(mid, 1000),
        c.Req(mid, 1000, 1_001_000_000),
        c.Req(mid, 0, -8446744073709551616),
        c.Req(mid, 0),  # wraps to exactly 0 in Go's uint64: in range, nothing to log
    ]


def test_found_by_fuzzing_answers_do_not_depend_on_how_tcp_cut_the_input() -> None:
    """Two differences between a stream parsed whole and the same stream in pieces,
    found by tests/fuzz (the 'commands' target)."""
    # a FIN whose "id" has spaces: Go splits the line at spaces, so it is a bad id
    # whether or not a second FIN line follows in the same read
    bad = b"FIN 01234UB c ef 100\n"
    for data in (bad, bad + b"FIN 0123456789abcdef\n"):
        (err,) = c.CommandParser().feed(MAGIC_V2 + data)[:1]
        assert isinstance(err, ProtocolError) and str(err) == "E_INVALID Invalid Message ID"
    # --tls-required: a line too long is refused as too long, complete or not
    limits = ParserLimits(max_line=64)
    long_line = b"X" * 100
    for data in (long_line, long_line + b"\n"):
        (err,) = TLSRequiredParser(limits).feed(MAGIC_V2 + data)
        assert str(err) == "E_INVALID command line too long (> 64 bytes)"


def test_pubs_in_a_row_with_one_line_are_one_event() -> None:
    """PUBs with the same command line in one read are one Pubs event (published
    together, each answered); another command or another topic ends the run."""
    pubs = c.pub("t", b"a") + c.pub("t", b"bb") + c.pub("t", b"c")
    events = CommandParser().feed(MAGIC_V2 + pubs + c.nop() + c.pub("t", b"d") + c.pub("u", b"e"))
    assert events == [
        c.Pubs("t", [b"a", b"bb", b"c"]),
        c.Nop(),
        c.Pub("t", b"d"),
        c.Pub("u", b"e"),
    ]
    # the next read continues with the line checked already; a partition is part of it
    parser = CommandParser()
    assert parser.feed(MAGIC_V2 + c.pub("t", b"a", 3)) == [c.Pub("t", b"a", 3)]
    assert parser.feed(c.pub("t", b"b", 3) * 2 + c.pub("t", b"c")) == [
        c.Pubs("t", [b"b", b"b"], 3),
        c.Pub("t", b"c"),
    ]


def test_pubs_run_keeps_the_checks() -> None:
    """A repeated PUB line still has its body checked: too big is refused as ever, and
    a body split across reads is waited for."""
    parser = CommandParser(ParserLimits(max_msg_size=4))
    assert parser.feed(MAGIC_V2 + c.pub("t", b"ok")) == [c.Pub("t", b"ok")]
    whole = c.pub("t", b"wait")
    assert parser.feed(whole[:-2]) == []
    assert parser.feed(whole[-2:]) == [c.Pub("t", b"wait")]
    events = parser.feed(c.pub("t", b"fine") + c.pub("t", b"toobig"))
    assert events[0] == c.Pub("t", b"fine")
    assert isinstance(events[1], ProtocolError)
    assert events[1].code == "E_BAD_MESSAGE"


def test_a_repeated_mpub_line_keeps_the_checks() -> None:
    """An MPUB line seen before skips its line's checks (Go's bench_writer sends one
    MPUB of one message per round trip) but not its body's: each broken body gets the
    error a first MPUB with it gets, and a body split across reads is waited for."""
    limits = ParserLimits(max_msg_size=4, max_body_size=40)
    one = c.mpub("t", [b"ok"], 2)
    bad_bodies = [
        b"MPUB t 2\n" + struct.pack(">II", 4, 0),  # count 0
        b"MPUB t 2\n" + struct.pack(">III", 8, 1, 5) + b"x" * 4,  # size past the body
        c.mpub("t", [b"toobig"], 2),  # a message over max_msg_size
        b"MPUB t 2\n" + struct.pack(">I", 41) + b"x" * 41,  # a body over max_body_size
        b"MPUB t 2\n" + struct.pack(">I", 0),  # no body
        # sizes with the high bit set are negative to Go (int32), never huge
        b"MPUB t 2\n" + struct.pack(">I", 0x80000008) + b"x" * 8,  # the body's
        b"MPUB t 2\n" + struct.pack(">III", 12, 1, 0xFFFFFFFC) + b"x" * 4,  # one message's
        b"MPUB t 2\n" + struct.pack(">III", 12, 0x80000001, 4) + b"x" * 4,  # the count
    ]
    for bad in bad_bodies:
        fresh = CommandParser(limits).feed(MAGIC_V2 + bad)
        parser = CommandParser(limits)
        assert parser.feed(MAGIC_V2 + one) == [c.Mpub("t", [b"ok"], 2)]
        again = parser.feed(one + bad)
        assert again[0] == c.Mpub("t", [b"ok"], 2)
        assert isinstance(fresh[-1], ProtocolError) and isinstance(again[-1], ProtocolError)
        assert str(again[-1]) == str(fresh[-1])
    parser = CommandParser(limits)
    assert parser.feed(MAGIC_V2 + one) == [c.Mpub("t", [b"ok"], 2)]
    two = c.mpub("t", [b"ab", b"cd"], 2)
    assert parser.feed(two[:-3]) == []
    assert parser.feed(two[-3:] + one) == [c.Mpub("t", [b"ab", b"cd"], 2), c.Mpub("t", [b"ok"], 2)]
    # another topic or partition is another line: checked, and remembered in turn
    assert parser.feed(c.mpub("u", [b"x"]) + c.mpub("u", [b"y"]) + one) == [
        c.Mpub("u", [b"x"]),
        c.Mpub("u", [b"y"]),
        c.Mpub("t", [b"ok"], 2),
    ]
    # a line ending in "\r" is taken as such each time
    crlf = b"MPUB t\r\n" + struct.pack(">III", 9, 1, 1) + b"z"
    assert parser.feed(crlf * 2) == [c.Mpub("t", [b"z"])] * 2


def test_a_repeated_pub_line_keeps_the_size_checks() -> None:
    """A PUB line seen before skips its line's checks, not its body size's: a size with
    the high bit set (negative to Go) or over the limit gets the error it gets first."""
    limits = ParserLimits(max_msg_size=4, max_body_size=40)
    one = c.pub("t", b"ok")
    for bad in (
        b"PUB t\n" + struct.pack(">I", 0xFFFFFFFF),
        b"PUB t\n" + struct.pack(">I", 0x80000002) + b"xx",
        b"PUB t\n" + struct.pack(">I", 5) + b"x" * 5,
        b"PUB t\n" + struct.pack(">I", 0),
    ):
        fresh = CommandParser(limits).feed(MAGIC_V2 + bad)
        parser = CommandParser(limits)
        assert parser.feed(MAGIC_V2 + one) == [c.Pub("t", b"ok")]
        again = parser.feed(one + bad)
        assert again[0] == c.Pub("t", b"ok")
        assert isinstance(fresh[-1], ProtocolError) and isinstance(again[-1], ProtocolError)
        assert str(again[-1]) == str(fresh[-1])


def test_binary_id_req_without_a_timeout_requeues_at_once() -> None:
    """Youzan's binary ids: ``REQ <16 bytes>\\n`` is a REQ of 0 ms. Its empty timeout is a
    slice whose start is past its end, which mypyc's runtime (2.4 and earlier) turns into
    a SystemError: the parser guards that slice (run compiled by ``make compiled``)."""
    parser = CommandParser()
    parser.binary_ids = True
    parser.feed(MAGIC_V2)
    events = parser.feed(b"REQ 0123456789abcdef\nNOP\n")
    assert [type(e).__name__ for e in events] == ["Req", "Nop"]
    assert events[0].timeout_ms == 0  # type: ignore[union-attr]
