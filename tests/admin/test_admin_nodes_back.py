"""A node that starts after nsqadmin, or comes back, shows at the next page that asks
for it (the page asks it itself once its last try is a second old), without waiting
for the background probe; a node that accepts connections and never answers costs a
page at most ``--node-timeout``, and the page answers with what the others said.

The admin runs in this process (its JSON API over real HTTP) so that its background
probe can be put an hour away: what brings a node back here is the page alone.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from nsqx.admin import AdminOptions, NSQAdmin
from nsqx.clusterinfo.info import NodeHealth

from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import run

HOUR = 3600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def admin_of(*nsqd_http: str) -> AsyncIterator[tuple[NSQAdmin, aiohttp.ClientSession]]:
    admin = NSQAdmin(
        AdminOptions(
            http_address="127.0.0.1:0",
            nsqd_http_addresses=list(nsqd_http),
            node_timeout=1.0,
            history_interval=HOUR,  # (no sampling: only the pages ask the nodes)
            history_length=HOUR,
        )
    )
    await admin.start()
    # the background probe an hour away: only a page's own ask can bring a node back
    admin.cluster.health = NodeHealth(first_backoff=HOUR, max_backoff=HOUR)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{admin.http_port}") as http:
            yield admin, http
    finally:
        await admin.close()


async def get(http: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
    async with http.get(path) as resp:
        return resp.status, await resp.json()


async def until_answered(http: aiohttp.ClientSession, path: str, timeout: float = 30) -> Any:
    """Ask ``path`` again and again (as a page refreshing) until it answers 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status, data = await get(http, path)
        if status == 200:
            return data
        assert loop.time() < deadline, f"{path} never answered: {status} {data}"
        await asyncio.sleep(0.1)


def test_a_node_that_starts_after_the_admin_shows_at_the_next_page(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there yet
    node = f"127.0.0.1:{port}"

    async def go() -> None:
        async with admin_of(node) as (_, http):
            status, data = await get(http, "/api/topics")
            assert status == 502 and "UPSTREAM_ERROR" in data["message"], data
            nsqd: NsqdProcess = await asyncio.to_thread(
                start_nsqd, tmp_path / "late", f"--http-address={node}"
            )
            try:
                await asyncio.to_thread(nsqd_pub, nsqd, "late")
                data = await until_answered(http, "/api/topics")
                assert data["topics"] == ["late"] and "not_answering" not in data, data
                status, data = await get(http, "/api/nodes")
                assert status == 200 and data["nodes"][0]["health"] == "OK", data
                # stopped, then back on the same address: the same again
                await asyncio.to_thread(nsqd.stop, signal.SIGKILL)
                status, data = await get(http, "/api/topics")
                assert status == 502, data
                again: NsqdProcess = await asyncio.to_thread(
                    start_nsqd, tmp_path / "late", f"--http-address={node}"
                )
                try:
                    data = await until_answered(http, "/api/topics")
                    assert data["topics"] == ["late"], data
                finally:
                    await asyncio.to_thread(again.stop, signal.SIGKILL)
            finally:
                if nsqd.alive():
                    await asyncio.to_thread(nsqd.stop, signal.SIGKILL)

    run(go(), timeout=120)


def nsqd_pub(nsqd: NsqdProcess, topic: str) -> None:
    import urllib.request

    req = urllib.request.Request(f"{nsqd.http_url}/pub?topic={topic}", data=b"x", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def test_a_node_that_never_answers_does_not_hold_the_pages(tmp_path: Path) -> None:
    """An address that accepts connections and never answers, beside a good nsqd: every
    page answers with the good node's topics and names the silent one, asked again once
    a second and given up on after --node-timeout each time."""

    async def go() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # and never a byte back

        silent = await asyncio.start_server(hold, "127.0.0.1", 0)
        silent_node = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
        good: NsqdProcess = await asyncio.to_thread(
            start_nsqd, tmp_path / "good", "--http-address=127.0.0.1:0"
        )
        try:
            await asyncio.to_thread(nsqd_pub, good, "fine")
            good_node = f"127.0.0.1:{good.http_port}"
            async with admin_of(good_node, silent_node) as (_, http):
                loop = asyncio.get_running_loop()
                asked_again = False
                started = loop.time()
                # pages over more than a second: the silent node is asked again (and
                # again not answered) while every page still answers
                while loop.time() - started < (2.5 if asked_again else 30):
                    before = len(accepted)
                    status, data = await get(http, "/api/topics")
                    assert status == 200 and data["topics"] == ["fine"], data
                    assert data["message"].startswith("WARNING:"), data
                    (down,) = data["not_answering"]
                    assert down["node"] == silent_node, down
                    asked_again = asked_again or (before > 0 and len(accepted) > before)
                    await asyncio.sleep(0.2)
                assert asked_again, "the silent node was never asked again"
        finally:
            await asyncio.to_thread(good.stop, signal.SIGKILL)
            silent.close()
            for w in accepted:
                w.close()

    run(go(), timeout=120)
