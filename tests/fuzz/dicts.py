"""libFuzzer dictionaries: the tokens of each input language (run.py passes -dict)."""

from __future__ import annotations

COMMANDS = [
    "  V2",
    "IDENTIFY\n",
    "AUTH\n",
    "SUB ",
    "PUB ",
    "MPUB ",
    "DPUB ",
    "RDY ",
    "FIN ",
    "REQ ",
    "TOUCH ",
    "CLS\n",
    "NOP\n",
    "SUB_ORDERED ",
    "SUB_ADVANCED ",
    "PUB_TRACE ",
    "MPUB_TRACE ",
    "PUB_EXT ",
    "MPUB_EXT ",
    "#ephemeral",
    "\n",
    " 0\n",
    "0123456789abcdef",
    "\xff\x06\x00\x00sNaPpY",
    "timestamp:",
    "offset:",
    "count:",
]
JSON = [
    '"feature_negotiation":true',
    '"heartbeat_interval":',
    '"output_buffer_size":',
    '"output_buffer_timeout":',
    '"sample_rate":',
    '"msg_timeout":',
    '"tls_v1":true',
    '"snappy":true',
    '"deflate":true',
    '"deflate_level":',
    '"client_id":"',
    '"hostname":"',
    '"user_agent":"',
    '"short_id":"',
    '"long_id":"',
    '"extend_support":true',
    '"desired_tag":"',
    '"ext_filter":{',
    '"type":',
    '"inverse":true',
    '"filter_ext_key":"',
    '"filter_data":"',
    '"filter_data_list":[',
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "false",
    "-1",
    "1e9",
    '"\\u0000"',
    '"##client_dispatch_tag":"',
    '"##trace_id":"',
    '"tcp_port":',
    '"http_port":',
    '"version":"',
    '"broadcast_address":"',
    '"partitions":true',
    '"distributed_id":"',
]
LOOKUPD = ["  V1", "IDENTIFY\n", "REGISTER ", "UNREGISTER ", "PING\n", "\n"]
HTTP = [
    "topic=",
    "channel=",
    "partition=",
    "defer=",
    "binary=true",
    "format=json",
    "text",
    "include_clients=",
    "include_mem=",
    "search_mode=",
    "search_pos=",
    "start=",
    "max_messages=",
    "max_bytes=",
    "end=",
    "order=",
    "virtual_queue_offset",
    "timestamp",
    "%zz",
    "%00",
    "&",
    "=",
    ";",
]

DICTS = {
    "commands": COMMANDS + JSON,
    "nsqd_tcp": COMMANDS + JSON,
    "identify": JSON,
    "ext": JSON,
    "lookupd": LOOKUPD + JSON,
    "nsqd_http": HTTP + JSON,
}


def write_dict(target: str, path: str) -> bool:
    """Write the dictionary of ``target`` to ``path`` in libFuzzer's format."""
    tokens = DICTS.get(target)
    if not tokens:
        return False
    with open(path, "w", encoding="ascii") as f:
        for tok in tokens:
            escaped = "".join(
                ch if 32 <= ord(ch) < 127 and ch not in '"\\' else f"\\x{ord(ch):02x}" for ch in tok
            )
            f.write(f'"{escaped}"\n')
    return True
