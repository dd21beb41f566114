"""Deferred messages keep their schedule across a failover: a message REQueued with a
delay and a DPUB are held by the followers with their due times (the leader's CURSORS
carry them), so the new leader delivers them when due, not at once, and not before."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from cluster import (
    HEARTBEAT,
    Conn,
    create_replicated,
    leader_port,
    partition_state,
    start_cluster,
    until,
)

from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_MESSAGE, FRAME_RESPONSE, decode_message

from lookupdproc import http_request
from nsqdproc import NsqdProcess

#: long enough that a failover (about a second here) comes well before it
DELAY_MS = 6000


def _ok(conn: Conn) -> None:
    ftype, data = conn.frame()
    assert (ftype, data) == (FRAME_RESPONSE, b"OK"), data


def _next_message(conn: Conn) -> Any:
    while True:
        ftype, data = conn.frame()
        if ftype == FRAME_MESSAGE:
            return decode_message(data)
        if ftype == FRAME_RESPONSE and data == HEARTBEAT:
            conn.send(c.nop())


def _deferred_count(node: NsqdProcess, topic: str) -> int:
    status, _, body = http_request(f"{node.http_url}/stats?format=json&topic={topic}")
    if status != 200:
        return -1
    for t in json.loads(body)["topics"]:
        for ch in t["channels"]:
            if ch["channel_name"] == "c":
                return int(ch["deferred_count"])
    return -1


def test_a_deferred_req_and_a_dpub_keep_their_schedule_across_a_failover(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path)
    topic = "later"
    port = create_replicated(lookupd, topic, 3)
    pub = Conn(port)
    pub.send(c.pub(topic, b"req", 0))
    _ok(pub)
    published = time.monotonic()
    pub.send(c.dpub(topic, DELAY_MS, b"dpub"))
    _ok(pub)
    sub = Conn(port)
    sub.send(c.sub(topic, "c", 0))
    _ok(sub)
    sub.send(c.rdy(1))
    msg = _next_message(sub)
    assert msg.body == b"req"
    requeued = time.monotonic()
    sub.send(c.req(msg.id, DELAY_MS))
    leader = next(n for n in nodes if n.tcp_port == port)
    followers = [n for n in nodes if n is not leader]
    # the followers hold both, with their due times
    until(
        lambda: all(_deferred_count(f, topic) == 2 for f in followers),
        what="both deferred messages on the followers",
    )
    leader.stop(signal.SIGKILL)
    sub.close()
    pub.close()
    new_port = until(
        lambda: (p := leader_port(lookupd, topic)) not in (None, port) and p, what="a new leader"
    )
    until(
        lambda: any((partition_state(f, topic) or {}).get("role") == "leader" for f in followers),
        what="the new leader's role",
    )
    again = Conn(new_port, timeout=3 * DELAY_MS / 1000)
    again.send(c.sub(topic, "c", 0))
    _ok(again)
    again.send(c.rdy(10))
    got: dict[bytes, float] = {}
    while len(got) < 2:
        m = _next_message(again)
        got.setdefault(m.body, time.monotonic())
        again.send(c.fin(m.id))
    # not at once, not before their time
    assert got[b"req"] - requeued >= DELAY_MS / 1000, got[b"req"] - requeued
    assert got[b"dpub"] - published >= DELAY_MS / 1000, got[b"dpub"] - published
    again.close()
