"""Fuzz targets for wire/'s parsers: each takes arbitrary bytes and fails (raises
something other than the parser's documented error) only on a real defect.

Every target also checks a property beyond "does not crash": input split anywhere
parses to the same events as input in one piece, an encoder's output decodes back, a
negotiated setting is within the server's limits. The same functions run under atheris
(coverage-guided, tests/fuzz/run.py) and, without it, replay the corpus in pytest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nsqx.wire import commands as c
from nsqx.wire import lookupd as lk
from nsqx.wire.compression import (
    CompressionError,
    DeflateCompressor,
    DeflateDecompressor,
    SnappyCompressor,
    SnappyDecompressor,
)
from nsqx.wire.errors import ProtocolError
from nsqx.wire.ext import ExtError, ExtFilter, ExtFilterSpec, header_trace_id, parse_header
from nsqx.wire.frames import (
    FrameDecoder,
    decode_message,
    decode_youzan_message,
)
from nsqx.wire.identify import ServerLimits, negotiate
from nsqx.wire.range import decode_range, decode_range_frames


class Input:
    """Structured choices read from the front of fuzz bytes (what atheris's
    FuzzedDataProvider does, in a form that also runs without atheris)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        b = self.data[self.pos]
        self.pos += 1
        return b

    def below(self, n: int) -> int:
        return self.byte() % n if n > 0 else 0

    def flag(self) -> bool:
        return bool(self.byte() & 1)

    def cuts(self) -> list[int]:
        """Up to 15 chunk sizes (1-64) to split the rest of the input at."""
        return [1 + self.below(64) for _ in range(self.below(16))]

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut into pieces of the given sizes, the remainder last."""
    pieces: list[bytes] = []
    pos = 0
    for cut in cuts:
        if pos >= len(data):
            break
        pieces.append(data[pos : pos + cut])
        pos += cut
    pieces.append(data[pos:])
    return pieces


# -- protocol V2 commands (nsqd's side) -------------------------------------------------


def _merge_fins(events: list[Any]) -> list[Any]:
    """Consecutive FINs may come as one Fin event or several, and PUBs with one command
    line as one Pubs event or several (depending on the reads): compare the ids, and
    PUB by PUB."""
    out: list[Any] = []
    for ev in events:
        if isinstance(ev, c.Fin) and out and isinstance(out[-1], c.Fin):
            out[-1] = c.Fin(out[-1].ids + ev.ids)
        elif isinstance(ev, c.Pubs):
            out.extend(c.Pub(ev.topic, bytes(b), ev.partition) for b in ev.bodies)
        else:
            out.append(ev)
    return out


def _normalise(ev: Any) -> Any:
    # bodies may be memoryviews or bytes depending on where a chunk ended
    if isinstance(ev, ProtocolError):
        return ("error", str(ev), ev.fatal)
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in ev)


def _feed_commands(parser: c.CommandParser, pieces: list[bytes]) -> list[Any]:
    events: list[Any] = []
    for piece in pieces:
        got = parser.feed(piece)
        # after an IDENTIFY the parser waits for the server: nothing was negotiated here
        while got and isinstance(got[-1], c.Identify):
            events += got
            got = parser.feed(b"")
        events += got
    return events


def fuzz_commands(data: bytes) -> None:
    """CommandParser (and TLSRequiredParser): only ProtocolError, at most one and last;
    nothing after it; the same events however the input is split."""
    inp = Input(data)
    limits = c.ParserLimits(
        max_msg_size=1 + inp.below(2048),
        max_body_size=1 + inp.below(8192),
        max_rdy_count=inp.below(3000),
        max_req_timeout_ms=inp.below(5000),
        max_line=64 + inp.below(512),  # nsqd: 16384; a FIN line is 21 bytes
    )
    kind = inp.below(3)
    binary_ids = inp.flag()
    cuts = inp.cuts()
    stream = c.MAGIC_V2 + inp.rest() if inp.flag() else inp.rest()
    outcomes = []
    for pieces in ([stream], split(stream, cuts)):
        parser: c.CommandParser = (
            c.TLSRequiredParser(limits) if kind == 2 else c.CommandParser(limits)
        )
        parser.binary_ids = binary_ids
        events = _feed_commands(parser, pieces)
        for i, ev in enumerate(events):
            assert isinstance(ev, (ProtocolError, *_COMMAND_TYPES)), ev
            if isinstance(ev, ProtocolError):
                assert i == len(events) - 1, "events after an error"
                assert ev.fatal
                assert parser.dead and parser.feed(b"REQ x 1\nNOP\n") == []
            if isinstance(ev, c.Rdy):
                assert 0 <= ev.value <= limits.max_rdy_count
            if isinstance(ev, c.Req):
                assert 0 <= ev.timeout_ms <= limits.max_req_timeout_ms
            if isinstance(ev, (c.Pub, c.Dpub)):
                assert 0 < len(ev.body) <= limits.max_msg_size
            if isinstance(ev, c.Pubs):
                assert all(0 < len(b) <= limits.max_msg_size for b in ev.bodies)
        outcomes.append([_normalise(e) for e in _merge_fins(events)])
    whole, pieces_ = outcomes
    assert whole == pieces_, (whole, pieces_)


_COMMAND_TYPES = (
    c.Identify,
    c.Auth,
    c.Sub,
    c.Pub,
    c.Pubs,
    c.Mpub,
    c.Dpub,
    c.Rdy,
    c.Fin,
    c.Req,
    c.Touch,
    c.Cls,
    c.Nop,
    c.PubTrace,
    c.MpubTrace,
    c.PubExt,
    c.MpubExt,
)


# -- frames (the client's side) ---------------------------------------------------------


def fuzz_frames(data: bytes) -> None:
    """FrameDecoder and the message decoders: only ProtocolError; the same frames
    however the input is split."""
    inp = Input(data)
    max_size = 4 + inp.below(4096)
    with_ext, detail = inp.flag(), inp.flag()
    cuts = inp.cuts()
    stream = inp.rest()
    results = []
    for pieces in ([stream], split(stream, cuts)):
        dec = FrameDecoder(max_size)
        frames: list[tuple[int, bytes]] = []
        error = None
        try:
            for piece in pieces:
                frames += dec.feed(piece)
        except ProtocolError as err:
            error = str(err)
        results.append((frames, error))
        for ftype, payload in frames:
            assert len(payload) <= max_size - 4
            if ftype == 2:
                try:
                    msg = decode_message(payload)
                    assert len(msg.id) == 16
                except ProtocolError:
                    pass
                try:
                    yz = decode_youzan_message(payload, with_ext, detail)
                    assert len(yz.id) == 16 and len(yz.body) <= len(payload)
                except ProtocolError:
                    pass
    (f1, e1), (f2, e2) = results
    assert e1 == e2
    if e1 is None:
        # (after an error the frames of the failing feed() are not returned: how many
        # came before depends on the cut, and the client closes the connection anyway)
        assert f1 == f2


# -- IDENTIFY ---------------------------------------------------------------------------


def fuzz_identify(data: bytes) -> None:
    """IDENTIFY's body against random server limits: only ProtocolError; the settings
    and the answer are within the limits; the answer is NSQ's JSON."""
    inp = Input(data)
    max_msg_timeout = 1000 + inp.below(200) * 1000
    max_heartbeat = 1000 + inp.below(120) * 1000
    max_obs = 64 + inp.below(256) * 256
    limits = ServerLimits(
        max_msg_timeout_ms=max_msg_timeout,
        max_heartbeat_interval_ms=max_heartbeat,
        max_output_buffer_size=max_obs,
        # nsqd's flags keep its defaults within its maximums
        msg_timeout_ms=min(60_000, max_msg_timeout),
        heartbeat_interval_ms=min(30_000, max_heartbeat),
        output_buffer_size=min(16384, max_obs),
        max_deflate_level=1 + inp.below(9),
        tls_available=inp.flag(),
        snappy_available=inp.flag(),
        deflate_available=inp.flag(),
        auth_required=inp.flag(),
    )
    body = inp.rest()
    try:
        s, answer = negotiate(body, limits)
    except ProtocolError as err:
        assert err.code in ("E_BAD_BODY", "E_IDENTIFY_FAILED"), err
        return
    assert not (s.snappy and s.deflate)
    assert s.tls_v1 <= limits.tls_available
    assert s.snappy <= limits.snappy_available and s.deflate <= limits.deflate_available
    assert 0 <= s.deflate_level <= limits.max_deflate_level
    assert 0 <= s.sample_rate <= 99
    assert s.msg_timeout_ms <= limits.max_msg_timeout_ms
    assert s.heartbeat_interval_ms <= limits.max_heartbeat_interval_ms
    assert s.output_buffer_size <= limits.max_output_buffer_size
    if answer != b"OK":
        doc = json.loads(answer)
        assert doc["auth_required"] is limits.auth_required
        assert 1 <= doc["deflate_level"] <= limits.max_deflate_level
        assert doc["tls_v1"] is s.tls_v1 and doc["snappy"] is s.snappy


# -- nsqlookupd protocol V1 -------------------------------------------------------------


def fuzz_lookupd(data: bytes) -> None:
    """LookupParser (lookupd's side), ReplyDecoder and the IDENTIFY reply (nsqd's side):
    only their documented errors; the same events however the input is split."""
    inp = Input(data)
    magic = inp.flag()
    side = inp.below(3)
    cuts = inp.cuts()
    stream = inp.rest()
    if side == 0:
        results = []
        for pieces in ([(lk.MAGIC_V1 if magic else b"") + stream], None):
            if pieces is None:
                pieces = split((lk.MAGIC_V1 if magic else b"") + stream, cuts)
            parser = lk.LookupParser()
            events: list[Any] = []
            for piece in pieces:
                events += parser.feed(piece)
            for i, ev in enumerate(events):
                if isinstance(ev, ProtocolError):
                    assert i == len(events) - 1 and parser.dead
            results.append([str(e) if isinstance(e, ProtocolError) else e for e in events])
        assert results[0] == results[1], results
    elif side == 1:
        dec = lk.ReplyDecoder(max_size=1 + inp.below(4096))
        try:
            for piece in split(stream, cuts):
                dec.feed(piece)
        except ProtocolError:
            pass
    else:
        try:
            info = lk.parse_identify_reply(stream)
        except ValueError:  # json's errors are ValueErrors too
            return
        assert isinstance(info.tcp_port, int) and isinstance(info.version, str)


# -- range bodies (the Spark reader's side) ---------------------------------------------


def fuzz_range(data: bytes) -> None:
    """A range body from a server: only ProtocolError (E_BAD_RANGE)."""
    for decode in (decode_range_frames, decode_range):
        try:
            decode(data)
        except ProtocolError as err:
            assert err.code == "E_BAD_RANGE"


# -- compressed streams -----------------------------------------------------------------


def _decompress_all(
    dec: SnappyDecompressor | DeflateDecompressor, pieces: list[bytes], max_length: int
) -> bytes:
    out = []
    for piece in pieces:
        out.append(dec.decompress(piece, max_length))
        empty = 0
        while dec.pending:
            more = dec.decompress(b"", max_length)
            # a loop on "pending" must end: output, or at most one empty answer (zlib may
            # stop exactly at the limit with bytes it cannot use yet)
            empty = 0 if more else empty + 1
            assert empty < 2, "pending, yet nothing comes out"
            out.append(more)
    return b"".join(out)


def _fuzz_codec(data: bytes, make: Callable[[], Any], unmake: Callable[[], Any]) -> None:
    inp = Input(data)
    max_length = inp.below(3) * 1000  # 0: no limit
    cuts = inp.cuts()
    roundtrip = inp.flag()
    payload = inp.rest()
    if roundtrip:
        # what we send decodes back, however it is cut and paced
        comp = make()
        parts = [comp.compress(p) for p in split(payload, cuts)]
        stream = b"".join(parts)
        assert _decompress_all(unmake(), split(stream, cuts[::-1]), max_length) == payload
        return
    outs = []
    for pieces in ([payload], split(payload, cuts)):
        try:
            outs.append(_decompress_all(unmake(), pieces, max_length))
        except CompressionError as err:
            assert err.fatal
            outs.append(None)
    if outs[0] is not None and outs[1] is not None:
        # a stream cut short may hold back a partial chunk: one is a prefix of the other
        assert outs[0].startswith(outs[1]) or outs[1].startswith(outs[0])


def fuzz_snappy(data: bytes) -> None:
    """Snappy framed streams: only CompressionError; round trips are exact."""
    _fuzz_codec(data, SnappyCompressor, SnappyDecompressor)


def fuzz_deflate(data: bytes) -> None:
    """Raw deflate streams: only CompressionError; round trips are exact."""
    _fuzz_codec(data, lambda: DeflateCompressor(6), DeflateDecompressor)


# -- Youzan's ext headers and filters ---------------------------------------------------


def fuzz_ext(data: bytes) -> None:
    """PUB_EXT's JSON header and IDENTIFY's ext_filter: only ExtError / ValueError."""
    inp = Input(data)
    which = inp.below(2)
    raw = inp.rest()
    if which == 0:
        try:
            header = parse_header(raw)
            header_trace_id(header)
        except ExtError:
            pass
        return
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    try:
        flt = ExtFilter(ExtFilterSpec.from_json(doc))
    except ValueError:
        return
    for ver, ext in ((0, b""), (2, raw), (2, b'{"k":"v","a":{"b":"c"}}'), (2, b"[1]")):
        assert isinstance(flt.match(ver, ext), bool)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "commands": fuzz_commands,
    "frames": fuzz_frames,
    "identify": fuzz_identify,
    "lookupd": fuzz_lookupd,
    "range": fuzz_range,
    "snappy": fuzz_snappy,
    "deflate": fuzz_deflate,
    "ext": fuzz_ext,
}
