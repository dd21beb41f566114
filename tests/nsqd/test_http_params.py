"""A state-changing request of nsqd's HTTP API that names a parameter its endpoint does
not take is refused with a 400 that names it, and changes nothing (nsqx.nsqd.http_params);
what NSQ 1.3's and Youzan's clients and tools send is still taken; an error message names
only parameters that exist."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from nsqx.nsqd import http_params
from nsqx.nsqd.channel_policy import SETTINGS
from nsqx.nsqd.http import ROUTES
from nsqx.nsqd.nsqd import NSQD

from rawnsq import Raw, run, start_nsqd

Call = Callable[..., Awaitable[tuple[int, Any]]]


@asynccontextmanager
async def served() -> AsyncIterator[tuple[NSQD, Call]]:
    nsqd = await start_nsqd(http_address="127.0.0.1:0")
    assert nsqd.http_address is not None
    base = f"http://127.0.0.1:{nsqd.http_address[1]}"
    try:
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
                async with http.request(method, base + path, data=body) as r:
                    text = await r.read()
                    try:
                        return r.status, json.loads(text) if text else None
                    except ValueError:
                        return r.status, text.decode()

            yield nsqd, call
    finally:
        await nsqd.close()


def test_a_misspelt_parameter_is_refused_by_name_and_changes_nothing() -> None:
    """The issue's case: ext=true made a plain topic with 200; extend=true is the name."""

    async def go() -> None:
        async with served() as (nsqd, call):
            status, doc = await call("POST", "/topic/create?topic=x&ext=true")
            assert status == 400
            assert doc["message"].startswith("UNKNOWN_ARG_EXT: /topic/create takes no ext")
            assert "extend" in doc["message"]
            assert "x" not in nsqd.topics
            status, _ = await call("POST", "/topic/create?topic=x&extend=true")
            assert status == 200 and nsqd.topics["x"].meta.ext

            await call("POST", "/channel/create?topic=x&channel=c")
            cases = [
                ("POST", "/pub?topic=x&delay=1000", b"m", "DELAY"),
                ("POST", "/mpub?topic=x&defer=1000", b"m", "DEFER"),  # (NSQ master's)
                ("POST", "/topic/pause?topic=x&channel=c", b"", "CHANNEL"),
                ("POST", "/topic/empty?topic=x&force=1", b"", "FORCE"),
                ("POST", "/topic/delete?topic=x&really=yes", b"", "REALLY"),
                ("POST", "/channel/pause?topic=x&channel=c&all=1", b"", "ALL"),
                ("POST", "/channel/delete?topic=x&channel=c&Channel=c", b"", "CHANNEL"),
                ("POST", "/channel/setorder?topic=x&channel=c&ordered=true", b"", "ORDERED"),
                ("POST", "/channel/config?topic=x&channel=c&max_attempt=5", b"", "MAX_ATTEMPT"),
                ("POST", "/channel/deadletter/replay?topic=x&channel=c&count=5", b"", "COUNT"),
                ("POST", "/message/trace/enable?topic=x&slow=1", b"", "SLOW"),
                ("POST", "/drain?timeout=5", b"", "TIMEOUT"),
                ("PUT", "/config/log_level?level=debug", b"debug", "LEVEL"),
            ]
            for method, path, body, name in cases:
                status, doc = await call(method, path, body)
                assert status == 400, (path, doc)
                assert doc["message"].startswith(f"UNKNOWN_ARG_{name}: "), (path, doc)
            # nothing changed
            part = nsqd.topics["x"].default_partition
            ch = part.channels["c"]
            assert part.log.end == 0 and not nsqd.topics["x"].paused
            assert not ch.paused and not ch.ordered_flag and not ch.policy.active
            assert not nsqd.draining and not nsqd.topics["x"].trace_enabled

    run(go())


def test_an_error_that_names_a_request_names_one_that_works() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            await call("POST", "/topic/create?topic=y")
            await call("POST", "/channel/create?topic=y&channel=c")
            q = "/channel/config?topic=y&channel=c&max_attempts=2&dead_letter_format=ext"
            status, doc = await call("POST", q)
            assert status == 400
            code, _, advice = doc["message"].partition(": ")
            assert code == "DEAD_LETTER_TOPIC_NOT_EXT"
            assert advice == "create it first with POST /topic/create?topic=y.dead&extend=true"
            status, _ = await call("POST", advice.split("POST ")[1])
            assert status == 200 and nsqd.topics["y.dead"].meta.ext
            status, doc = await call("POST", q)
            assert status == 200, doc

    run(go())


#: what other NSQ software sends to nsqd (their sources: nsqio/nsq 1.3 nsqadmin and
#: nsq_to_*, gnsq's NsqdHTTPClient, pynsq, youzan/nsq's nsqadmin and nsqlookupd, and
#: nsqx's own nsqlookupd and admin)
SENT_BY_OTHERS = [
    "/pub?topic=o&defer=10",  # gnsq publish(defer=)
    "/pub?topic=o&partition=0",  # Youzan
    "/mpub?topic=o&binary=true",  # gnsq multipublish(binary=True), pynsq
    "/mpub?topic=o&partition=0",
    "/topic/create?topic=o2",
    "/topic/create?topic=o3&partition=0&partition_num=1&orderedmulti=false&extend=false"
    "&multipart=false&disable_channel_auto_create=false&retention=0&syncdisk=0&replicator=1",
    "/channel/create?topic=o&channel=c&partition=0",
    "/channel/pause?topic=o&channel=c&partition=0",  # Youzan's nsqadmin adds partition
    "/channel/unpause?topic=o&channel=c",
    "/channel/empty?topic=o&channel=c&partition=0",
    "/topic/pause?topic=o&partition=0",
    "/topic/unpause?topic=o",
    "/topic/empty?topic=o&partition=0",
    "/channel/setorder?topic=o&channel=c&partition=0&order=false",
    "/channel/config?topic=o&channel=c&partition=0&max_attempts=3&overflow=",
    "/channel/deadletter/replay?topic=o&channel=c&partition=0&n=10",
    "/message/trace/enable?topic=o&channel=c",
    "/message/trace/disable?topic=o",
    "/channel/delete?topic=o&channel=c&partition=0",
    "/topic/delete?topic=o&partition=0",
]


def test_what_nsq_and_youzan_clients_and_tools_send_is_taken() -> None:
    async def go() -> None:
        async with served() as (nsqd, call):
            pub = await Raw.connect(nsqd)
            await pub.publish("o", b"first")
            await call("POST", "/channel/create?topic=o&channel=c")
            for path in SENT_BY_OTHERS:
                body = b"m" if "pub?" in path else b""
                if "binary" in path:
                    body = struct.pack(">II", 1, 1) + b"m"
                status, doc = await call("POST", path, body)
                assert status == 200, (path, doc)
            await pub.close()

    run(go())


def test_every_state_changing_endpoint_has_its_parameters_listed() -> None:
    """A new POST or PUT endpoint cannot slip past the check: each is in the table, and
    /channel/config takes exactly the policy's settings beside its channel."""
    changing = {(m, p) for p, methods in ROUTES.items() for m in methods if m in ("POST", "PUT")}
    listed = {(m, p) for m, p in http_params.PARAMS}
    assert changing <= listed | {("PUT", "/config/")}
    assert ("PUT", "/config/") in listed
    assert http_params.PARAMS["POST", "/channel/config"] == {
        "topic",
        "channel",
        "partition",
        *SETTINGS,
    }


@pytest.mark.parametrize(
    ("method", "path", "params", "want"),
    [
        ("POST", "/topic/create", {"topic": ["t"], "extend": ["true"]}, None),
        ("GET", "/stats", {"anything": ["1"]}, None),  # reads are not checked
        ("PUT", "/config/log_level", {}, None),
        ("PUT", "/config/log_level", {"x": ["1"]}, "UNKNOWN_ARG_X"),
        ("POST", "/drain", {"a": ["1"], "b": ["2"]}, "UNKNOWN_ARG_A"),
        ("POST", "/nosuch", {"a": ["1"]}, None),  # (404 NOT_FOUND is the router's)
    ],
)
def test_the_check_itself(
    method: str, path: str, params: dict[str, list[str]], want: str | None
) -> None:
    got = http_params.refusal(method, path, params)
    assert (got.split(":")[0] if got else None) == want
