"""--max-dpub-timeout bounds DPUB and HTTP /pub?defer apart from REQ (nsq #1499).

NSQ 1.3 bounds both by --max-req-timeout; nsqx does too unless --max-dpub-timeout is
set. A real nsqd on free loopback ports, over TCP and HTTP.
"""

from __future__ import annotations

import aiohttp
import pytest

from nsqx.cli.goflags import FlagError
from nsqx.cli.nsqd_flags import parse_nsqd_args
from nsqx.wire import commands as c

from rawnsq import Raw, run, start_nsqd


def test_dpub_may_defer_longer_than_req_and_no_longer_than_its_own_limit() -> None:
    async def go() -> None:
        nsqd = await start_nsqd(
            http_address="127.0.0.1:0", max_req_timeout=2.0, max_dpub_timeout=10.0
        )
        try:
            assert nsqd.http_address is not None
            base = f"http://127.0.0.1:{nsqd.http_address[1]}"
            # a REQ is still clamped to --max-req-timeout: one consumer holds a message
            consumer = await Raw.connect(nsqd)
            await consumer.subscribe("t", "c", rdy=1)
            pub = await Raw.connect(nsqd)
            pub.send(c.dpub("t", 5000, b"later"))  # over REQ's 2 s, under DPUB's 10 s
            assert await pub.response() == b"OK"
            pub.send(c.dpub("t", 10000, b"at the limit"))
            assert await pub.response() == b"OK"
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{base}/pub?topic=t&defer=9000", data=b"h") as r:
                    assert r.status == 200
                async with http.post(f"{base}/pub?topic=t&defer=10001", data=b"h") as r:
                    assert r.status == 400
                    assert (await r.json())["message"] == "INVALID_DEFER"
            pub.send(c.dpub("t", 10001, b"too late"))
            assert await pub.error() == b"E_INVALID DPUB timeout 10001 out of range 0-10000"
            assert await pub.closed()
            assert nsqd.topics["t"].default_partition.channels["c"].deferred_count == 3
            await consumer.close()
        finally:
            await nsqd.close()

    run(go())


def test_without_it_dpub_keeps_nsq13s_bound() -> None:
    async def go() -> None:
        nsqd = await start_nsqd(max_req_timeout=2.0)
        try:
            pub = await Raw.connect(nsqd)
            pub.send(c.dpub("t", 2000, b"ok"))
            assert await pub.response() == b"OK"
            pub.send(c.dpub("t", 2001, b"too late"))
            assert await pub.error() == b"E_INVALID DPUB timeout 2001 out of range 0-2000"
        finally:
            await nsqd.close()

    run(go())


def test_the_flag() -> None:
    assert parse_nsqd_args([]).max_dpub_timeout == 0.0
    opts = parse_nsqd_args(["--max-dpub-timeout=24h", "--max-req-timeout=1h"])
    assert opts.dpub_limit() == 24 * 3600.0
    assert parse_nsqd_args(["--max-req-timeout=90s"]).dpub_limit() == 90.0
    with pytest.raises(FlagError, match="--max-dpub-timeout must not be negative"):
        parse_nsqd_args(["--max-dpub-timeout=-1s"])
