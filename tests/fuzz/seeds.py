"""Write the seed inputs of each fuzz target into tests/fuzz/corpus/<target>/seed-*.

    python tests/fuzz/seeds.py

Seeds are valid conversations (the fuzzer mutates from there, so it gets past the
magic and the JSON quickly). Each starts with the choice bytes its target reads first
(see wire_targets.Input). Inputs the fuzzer found are kept beside them (run.py --grow).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from nsqx.wire import commands as c  # noqa: E402
from nsqx.wire import lookupd as lk  # noqa: E402
from nsqx.wire.compression import DeflateCompressor, SnappyCompressor  # noqa: E402
from nsqx.wire.frames import (  # noqa: E402
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    encode_frame,
    encode_message_frame,
)
from nsqx.wire.range import encode_range  # noqa: E402

MID = b"0123456789abcdef"

CONVERSATIONS = [
    c.identify({"client_id": "c", "feature_negotiation": True, "heartbeat_interval": 1000}),
    c.identify({"feature_negotiation": True, "snappy": True}) + b"\xff\x06\x00\x00sNaPpY",
    c.identify({"feature_negotiation": True, "deflate": True, "deflate_level": 3}),
    c.identify({"feature_negotiation": True, "tls_v1": True}),
    c.identify({"msg_timeout": 1000, "sample_rate": 50, "output_buffer_size": -1}),
    c.identify({"extend_support": True, "desired_tag": "a", "ext_filter": {"type": 1}}),
    c.sub("t", "c") + c.rdy(10) + c.fin(MID) + c.req(MID, 100) + c.touch(MID) + c.nop(),
    c.pub("t", b"hello") + c.mpub("t", [b"a", b"bb", b"ccc"]) + c.dpub("t", 100, b"later"),
    c.pub("t", b"m") + c.sub("t", "c") + c.rdy(1) + b"FIN 0000000000000000\n" + c.cls(),
    b"SUB_ORDERED t c 0\nRDY 1\n",
    b"SUB_ADVANCED t c 0\n" + struct.pack(">i", 12) + b"timestamp:1\n",
    b"PUB_TRACE t\n" + struct.pack(">i", 12) + struct.pack(">Q", 7) + b"body",
    b"PUB_EXT t\n" + struct.pack(">i", 13) + struct.pack(">H", 9) + b'{"a":"b"}' + b"xx",
    b"AUTH\n" + struct.pack(">i", 6) + b"secret",
    b"PUB t 0\n" + struct.pack(">i", 1) + b"x" + b"REQ " + MID + b" 99999999999\n",
    b"RDY 2501\n",
    b"CLS\n",
]


def commands_seeds() -> list[bytes]:
    head = b"\xff\xff\xff\xff\xff" + b"\x00\x00\x00" + b"\x01"  # limits, kind, ids, cuts, magic
    return [head + conv for conv in CONVERSATIONS]


def nsqd_tcp_seeds() -> list[bytes]:
    # mode (0 plain, 4 deflate, 5 snappy: see live_targets), magic, no cuts
    plain = [b"\x00\x01\x00" + conv for conv in CONVERSATIONS]
    packed = [m + b"\x01\x00" + conv for m in (b"\x04", b"\x05") for conv in CONVERSATIONS[6:9]]
    return [*plain, *packed, b"\x00\x00\x00  V1\n", b"\x00\x01\x03\x05\x07"]


def nsqd_auth_seeds() -> list[bytes]:
    auth = [
        c.auth("guess") + c.pub("t", b"x"),
        c.identify({"feature_negotiation": True}) + c.auth("x") + c.sub("t", "c"),
        c.pub("t", b"x") + c.auth("a") + c.auth("b") + c.mpub("t", [b"a"]),
        b"AUTH\n" + (1 << 31).to_bytes(4, "big"),
    ]
    return [b"\x00" + conv for conv in auth + CONVERSATIONS]


def nsqd_http_seeds() -> list[bytes]:
    from fuzz.live_targets import _METHODS, _PATHS

    def req(method: str, path: str, query: bytes, body: bytes = b"") -> bytes:
        return bytes((_METHODS.index(method), _PATHS.index(path), len(query))) + query + body

    return [
        req("GET", "/ping", b""),
        req("GET", "/stats", b"format=json&topic=t&channel=c&include_clients=true"),
        req("POST", "/pub", b"topic=t", b"hello"),
        req("POST", "/pub", b"topic=t&defer=100", b"hello"),
        req("POST", "/mpub", b"topic=t", b"a\nb\nc"),
        req("POST", "/mpub", b"topic=t&binary=true", struct.pack(">ii", 1, 1) + b"x"),
        req("POST", "/topic/create", b"topic=t"),
        req("POST", "/channel/create", b"topic=t&channel=c"),
        req("POST", "/channel/setoffset", b"topic=t&channel=c", b'{"virtual_queue_offset":0}'),
        req("GET", "/message/get", b"topic=t&partition=0&search_mode=count&search_pos=0"),
        req("GET", "/range", b"topic=t&partition=0&start=0&max_messages=10"),
        req("POST", "/topic/pause", b"topic=t"),
        req("POST", "/channel/empty", b"topic=t&channel=c"),
        req("POST", "/message/trace/enable", b"topic=t"),
        req("GET", "/config/max_msg_size", b""),
        req("GET", "/metrics", b""),
        req("OPTIONS", "/pub", b""),
    ]


def identify_seeds() -> list[bytes]:
    head = b"\xff" * 4 + b"\x01\x01\x01\x00"  # limits, tls, snappy, deflate, auth
    bodies = [
        {"client_id": "x", "hostname": "h", "user_agent": "u"},
        {"feature_negotiation": True, "heartbeat_interval": -1, "output_buffer_size": -1},
        {"feature_negotiation": True, "deflate": True, "deflate_level": 9, "msg_timeout": 5000},
        {"feature_negotiation": True, "snappy": True, "tls_v1": True, "sample_rate": 99},
        {"short_id": "s", "long_id": "l", "output_buffer_timeout": 100},
        {
            "extend_support": True,
            "desired_tag": "tag",
            "ext_filter": {"type": 2, "filter_ext_key": "k", "filter_data": "v*"},
        },
    ]
    return [head + json.dumps(b).encode() for b in bodies]


def lookupd_seeds() -> list[bytes]:
    ident = lk.encode_identify(
        {
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
            "broadcast_address": "a",
            "hostname": "h",
        }
    )
    ident_p = lk.encode_identify(
        {
            "tcp_port": 1,
            "http_port": 2,
            "version": "1.3.0",
            "broadcast_address": "a",
            "hostname": "h",
            "distributed_id": "a:1",
        }
    )
    return [
        b"\x01\x00\x00"
        + ident
        + lk.encode_register("t")
        + lk.encode_register("t", "c")
        + lk.encode_ping(),
        b"\x01\x00\x00"
        + ident_p
        + lk.encode_register("t", None, 0)
        + lk.encode_unregister("t", "c", 0),
        b"\x00\x01\x00" + struct.pack(">i", 2) + b"OK" + struct.pack(">i", 5) + b"E_BAD",
        b"\x00\x02\x00"
        + json.dumps(
            {"tcp_port": 4160, "http_port": 4161, "version": "1.3.0", "partitions": True}
        ).encode(),
    ]


def range_seeds() -> list[bytes]:
    frame = encode_message_frame(1, 1, b"%016x" % 0, b"body")
    frame2 = encode_message_frame(2, 1, b"%016x" % 1, b"other body")
    return [
        encode_range(2, 100, 0, [(0, 30, frame), (1, 60, frame2)]),
        encode_range(0, 0, 0, []),
    ]


def codec_seeds(comp: object) -> list[bytes]:
    out = []
    for payload in (b"hello " * 100, bytes(range(256)), b""):
        out.append(b"\x00\x00\x01" + payload)  # a round trip
        stream = comp.compress(payload) if payload else b""  # type: ignore[attr-defined]
        out.append(b"\x01\x02\x05\x07\x00" + stream)  # decode what a peer sent
    return out


def frames_seeds() -> list[bytes]:
    msg = encode_message_frame(1, 1, MID, b"body")
    return [
        b"\xff\x0f\x00\x00"
        + encode_frame(FRAME_RESPONSE, b"OK")
        + msg
        + encode_frame(FRAME_ERROR, b"E_INVALID x"),
        b"\xff\x0f\x01\x01\x00" + encode_frame(FRAME_MESSAGE, b"\x00" * 26 + b"\x00" + b"body"),
    ]


def ext_seeds() -> list[bytes]:
    return [
        b"\x00" + b'{"##client_dispatch_tag":"a","##trace_id":"123","k":"v"}',
        b"\x01" + json.dumps({"type": 1, "filter_ext_key": "k", "filter_data": "v"}).encode(),
        b"\x01" + json.dumps({"type": 2, "filter_ext_key": "k", "filter_data": "^v.*"}).encode(),
        b"\x01"
        + json.dumps(
            {
                "type": 4,
                "filter_ext_key": "any",
                "filter_data_list": [{"filter_ext_key": "a.b", "filter_data": "c"}],
            }
        ).encode(),
    ]


def main() -> None:
    seeds = {
        "commands": commands_seeds(),
        "nsqd_tcp": nsqd_tcp_seeds(),
        "nsqd_http": nsqd_http_seeds(),
        "nsqd_auth": nsqd_auth_seeds(),
        "identify": identify_seeds(),
        "lookupd": lookupd_seeds(),
        "range": range_seeds(),
        "snappy": codec_seeds(SnappyCompressor()),
        "deflate": codec_seeds(DeflateCompressor(6)),
        "frames": frames_seeds(),
        "ext": ext_seeds(),
    }
    for target, inputs in seeds.items():
        d = HERE / "corpus" / target
        d.mkdir(parents=True, exist_ok=True)
        for data in inputs:
            (d / ("seed-" + hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)
        print(f"{target}: {len(inputs)} seeds")


if __name__ == "__main__":
    main()
