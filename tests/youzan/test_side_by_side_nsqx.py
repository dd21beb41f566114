"""The side-by-side scenarios against nsqx's own cluster (nsqlookupd and two nsqd as
processes on free loopback ports): the answers must be the Youzan reference's
(test_side_by_side_reference.EXPECTED), except where nsqx differs on purpose, listed in
DIFFERENCES with the reason (each is in docs/partitions.md or docs/nsqlookupd.md)."""

from __future__ import annotations

import asyncio
import copy
import signal
import time
from pathlib import Path
from typing import Any

from youzan.side_by_side import CHAIN_SEGMENT_BYTES, SCENARIOS, run_scenarios
from youzan.test_side_by_side_reference import EXPECTED

from nsqdproc import start_nsqd

#: (scenario, key path) -> (nsqx's answer, why it differs from Youzan's)
DIFFERENCES: dict[tuple[str, ...], tuple[object, str]] = {
    ("trace", "rawsize - len(body)"): (
        [45, 64, 75],
        "a raw size is the distance to the next message's offset in nsqx's log: NSQ "
        "1.3's frame (body + 34) or an extended record with its trace id (body + 45), "
        "plus the next stored batch's 30-byte header for a batch's last message "
        "(docs/storage.md, Offsets)",
    ),
    ("http", "/lookup access=w before any channel"): (
        "200 partitions=1",
        "nsqd keeps what is published to a channel-less topic for its first channel, so "
        "writers need not wait for one",
    ),
    ("http", "the first channel starts at"): (
        ["n0"],
        "a topic's first channel starts at its oldest message (NSQ holds messages for "
        "the first channel); Youzan's starts at the end",
    ),
    ("http", "/topic/create", "no partition_num"): (
        "200",
        "without partition_num it is NSQ 1.3's /topic/create (a topic key), which NSQ "
        "1.3's tools and clients use",
    ),
    ("ordered", "redelivery_attempts", "restart"): (
        [2],
        "attempts count deliveries, as NSQ 1.3's do, also after the consumer's connection closed",
    ),
}


def expected_for_nsqx() -> dict[str, Any]:
    want = copy.deepcopy(EXPECTED)
    for path, (value, _why) in DIFFERENCES.items():
        node: Any = want
        for key in path[:-1]:
            node = node[key]
        assert path[-1] in node, path
        node[path[-1]] = value
    return want


def differences(got: Any, want: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Where two answers differ, key by key (readable when the test fails)."""
    if isinstance(got, dict) and isinstance(want, dict):
        out = []
        for key in sorted(set(got) | set(want)):
            if key not in got or key not in want:
                out.append(f"{'/'.join((*path, key))}: {got.get(key)!r} vs {want.get(key)!r}")
            else:
                out += differences(got[key], want[key], (*path, key))
        return out
    return [] if got == want else [f"{'/'.join(path)}: got {got!r}, want {want!r}"]


def test_nsqx_gives_the_reference_answers(lookupd_factory: Any, tmp_path: Path) -> None:
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    args = (
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--max-bytes-per-file={CHAIN_SEGMENT_BYTES}",
    )
    nodes = [start_nsqd(tmp_path / f"nsqd{i}", *args) for i in range(2)]

    async def restart(tcp: str) -> None:
        """Stop the nsqd listening on ``tcp`` (SIGTERM) and start it again on its data
        (on new ports: the scenario looks its leader up again)."""
        i = next(k for k, n in enumerate(nodes) if n.tcp_port == int(tcp.rsplit(":", 1)[1]))
        assert await asyncio.to_thread(nodes[i].stop) == 0
        nodes[i] = await asyncio.to_thread(start_nsqd, nodes[i].data_path, *args)

    try:
        deadline = time.monotonic() + 20
        while len(lookupd.json("/nodes")["producers"]) < 2:
            assert time.monotonic() < deadline, "both nsqd registered"
            time.sleep(0.05)
        results = asyncio.run(run_scenarios(lookupd.http_address, restart=restart))
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)
    assert list(results) == list(SCENARIOS)
    want = expected_for_nsqx()
    found = differences(results, want)
    assert not found, "\n".join(found)
