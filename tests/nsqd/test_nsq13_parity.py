"""Where NSQ 1.3 changed behaviour, nsqx does what Go's nsqd 1.3.0 does.

Each case runs against nsqx's nsqd and, when ../shared/reference/go-nsq-1.3.0 exists,
against Go's nsqd 1.3.0 with the same flags and the same bytes (skipped otherwise).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from nsqx.cli.nsqd_flags import parse_nsqd_args
from nsqx.wire import FRAME_RESPONSE, MAGIC_V2
from nsqx.wire import commands as c

from nsqdproc import GO_NSQD, NsqdProcess, start_go_nsqd, start_nsqd
from rawnsq import Raw, run, wait_for
from rawnsq import start_nsqd as start_inproc

SERVERS = ["nsqx", "go"]


def _start(server: str, tmp_path: Path, *args: str) -> NsqdProcess:
    if server == "go":
        if not GO_NSQD.exists():
            pytest.skip(f"no Go nsqd at {GO_NSQD}")
        return start_go_nsqd(tmp_path / "go", *args)
    return start_nsqd(tmp_path / "nsqx", *args)


async def _log_line(nsqd: NsqdProcess, needle: str) -> str:
    await wait_for(lambda: any(needle in line for line in nsqd.log), what=f"log line {needle!r}")
    return next(line for line in nsqd.log if needle in line)


@pytest.mark.parametrize("server", SERVERS)
def test_req_above_max_req_timeout_is_clamped(server: str, tmp_path: Path) -> None:
    """REQ with a timeout above --max-req-timeout keeps the connection: the message
    comes back after --max-req-timeout, and nsqd logs the clamp (NSQ 1.2 refused it
    with E_INVALID and closed the connection)."""
    nsqd = _start(server, tmp_path, "--max-req-timeout=1s")

    async def body() -> None:
        pub = await Raw.connect(nsqd.tcp_address)
        await pub.publish("t", b"backoff")
        sub = await Raw.connect(nsqd.tcp_address)
        await sub.subscribe("t", "c", rdy=1)
        msg = await sub.message()
        sent = time.monotonic()
        sub.send(c.req(msg.id, 3_600_000))
        again = await sub.message()
        assert time.monotonic() - sent >= 0.9  # deferred by the maximum, not requeued
        assert (again.id, again.attempts, again.body) == (msg.id, 2, b"backoff")
        line = await _log_line(nsqd, "REQ timeout")
        assert "REQ timeout 3600000000000 out of range 0-1000000000. Setting to 1000000000" in line
        # a value that wraps Go's int64 nanoseconds negative is clamped to 0: at once
        sub.send(c.req(msg.id, 10**13))
        third = await sub.message()
        assert (third.id, third.attempts) == (msg.id, 3)
        line = await _log_line(nsqd, "Setting to 0")
        assert "REQ timeout -8446744073709551616 out of range 0-1000000000. Setting to 0" in line
        sub.send(c.fin(msg.id))
        sub.send(c.nop())
        assert await sub.nothing_for(0.2)  # no error frame, still connected
        await pub.publish("t", b"after")
        assert (await sub.message()).body == b"after"
        await sub.close()
        await pub.close()

    try:
        run(body())
    finally:
        nsqd.stop()


IDENTIFY_CASES: list[tuple[tuple[str, ...], dict[str, Any], int, bool]] = [
    # (flags, IDENTIFY fields, deflate_level answered, deflate answered)
    ((), {}, 6, False),
    ((), {"snappy": True}, 6, False),
    ((), {"deflate_level": 2}, 6, False),  # a level without deflate is not taken
    (("--max-deflate-level=3",), {}, 3, False),
    ((), {"deflate": True, "deflate_level": 2}, 2, True),
    ((), {"deflate": True}, 6, True),
    (("--max-deflate-level=4",), {"deflate": True, "deflate_level": 9}, 4, True),
    (("--deflate=false",), {"deflate": True, "deflate_level": 2}, 6, False),
]


async def _identify(address: tuple[str, int], fields: dict[str, Any]) -> dict[str, Any]:
    # only the first frame: with deflate, compressed bytes follow it
    r, w = await asyncio.open_connection(*address)
    w.write(MAGIC_V2 + c.identify({"feature_negotiation": True, **fields}))
    size, ftype = struct.unpack(">ii", await r.readexactly(8))
    data = await r.readexactly(size - 4)
    w.close()
    assert ftype == FRAME_RESPONSE, data
    answer: dict[str, Any] = json.loads(data)
    return answer


async def _answers(
    address: tuple[str, int] | None,
    flags: tuple[str, ...],
    cases: list[tuple[dict[str, Any], int, bool]],
) -> list[dict[str, Any]]:
    """IDENTIFY each case at ``address``, or (None) at an nsqd started in this process
    from the same flags (quicker than a process per case)."""
    inproc = None
    if address is None:
        opts = dataclasses.asdict(parse_nsqd_args(list(flags)))
        inproc = await start_inproc(
            max_deflate_level=opts["max_deflate_level"], deflate=opts["deflate"]
        )
        address = inproc.tcp_address
    assert address is not None
    out = []
    for fields, level, deflate in cases:
        answer = await _identify(address, fields)
        assert (answer["deflate_level"], answer["deflate"]) == (level, deflate), (flags, fields)
        answer.pop("version")
        out.append(answer)
    if inproc is not None:
        await inproc.close()
    return out


@pytest.mark.parametrize("server", SERVERS)
def test_identify_answers_deflate_level(server: str, tmp_path: Path) -> None:
    """IDENTIFY's deflate_level is NSQ's default (6, capped by --max-deflate-level) when
    deflate was not negotiated, and the negotiated level when it was; every other field
    of the answer is NSQ 1.3's too."""
    answers: list[dict[str, Any]] = []
    by_flags: dict[tuple[str, ...], list[tuple[dict[str, Any], int, bool]]] = {}
    for flags, fields, level, deflate in IDENTIFY_CASES:
        by_flags.setdefault(flags, []).append((fields, level, deflate))
    for i, (flags, cases) in enumerate(by_flags.items()):
        if server == "go":
            nsqd = _start(server, tmp_path / str(i), *flags)
            try:
                answers += run(_answers(nsqd.tcp_address, flags, cases))
            finally:
                nsqd.stop()
        else:
            answers += run(_answers(None, flags, cases))
    assert answers[0] == {
        "max_rdy_count": 2500,
        "max_msg_timeout": 900000,
        "msg_timeout": 60000,
        "tls_v1": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
        "snappy": False,
        "sample_rate": 0,
        "auth_required": False,
        "output_buffer_size": 16384,
        "output_buffer_timeout": 250,
    }
