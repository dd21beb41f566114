"""A publisher's connection keeps reading while its publishes wait for the ISR, and
its answers still come in the order of its commands."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

from cluster import Conn, create_replicated, partition_state, start_cluster, until

from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_RESPONSE

from lookupdproc import http_request
from nsqdproc import NsqdProcess


def _message_count(node: NsqdProcess, topic: str) -> int:
    _, _, body = http_request(f"{node.http_url}/stats?format=json&topic={topic}")
    return sum(
        t["message_count"] for t in json.loads(body)["topics"] or [] if t["topic_name"] == topic
    )


def test_reads_go_on_while_answers_wait_for_the_isr(lookupd_factory: Any, tmp_path: Path) -> None:
    # (a long lag timeout: the stopped follower stays in the ISR)
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, count=2, lag_timeout="60s")
    port = create_replicated(lookupd, "rt", 2)
    leader = next(n for n in nodes if n.tcp_port == port)
    follower = next(n for n in nodes if n is not leader)

    conn = Conn(port)
    try:
        conn.send(c.pub("rt", b"warm"))
        assert conn.frame() == (FRAME_RESPONSE, b"OK")  # the ISR is complete and streaming

        follower.proc.send_signal(signal.SIGSTOP)
        try:
            # The first PUB waits for the stopped follower; the connection reads on: the
            # second PUB (a topic of this node alone) is stored at once...
            conn.send(c.pub("rt", b"held"))
            until(lambda: _message_count(leader, "rt") == 2, what="the first PUB read")
            conn.send(c.pub("local", b"next"))  # (another read)
            until(lambda: _message_count(leader, "local") == 1, what="the second PUB stored")
            # ...but its answer waits behind the first one's.
            conn.sock.settimeout(0.3)
            try:
                data = conn.sock.recv(1 << 16)
            except TimeoutError:
                data = None
            assert data is None, f"an answer overtook the publish waiting for the ISR: {data!r}"
            conn.sock.settimeout(10)
        finally:
            follower.proc.send_signal(signal.SIGCONT)
        assert conn.frame() == (FRAME_RESPONSE, b"OK")
        assert conn.frame() == (FRAME_RESPONSE, b"OK")
        state = partition_state(leader, "rt")
        assert state is not None and state["role"] == "leader"
        assert _message_count(leader, "rt") == 2
    finally:
        conn.close()


def test_many_pipelined_publishes_to_a_replicated_topic_are_all_answered(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """More reads in flight than a connection may hold (it stops reading, then goes on):
    every PUB answered once, in order, and every message held by the follower."""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, count=2, lag_timeout=None)
    port = create_replicated(lookupd, "rt", 2)
    follower = next(n for n in nodes if n.tcp_port != port)

    conn = Conn(port)
    sock = conn.sock
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        n = 2000
        for i in range(n):
            conn.send(c.pub("rt", b"m%d" % i))  # one segment each: many reads
        answers = [conn.frame() for _ in range(n)]
        assert answers == [(FRAME_RESPONSE, b"OK")] * n
        until(
            lambda: (partition_state(follower, "rt") or {}).get("end", 0) >= n,
            what="the follower holds every message",
        )
    finally:
        conn.close()


def test_followers_keeping_pace_with_a_steady_stream_stay_in_the_isr(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """Publishes without a pause, for several lag timeouts: the leader's log always
    holds records its followers have not acknowledged yet, but they keep pace (each
    acknowledgement covers what the leader had a moment before), so none leaves the
    ISR and no write is refused. (A follower used to count as in sync only when an
    acknowledgement reached the leader's very end: under a steady load it left the ISR
    after the lag timeout, and with replicator 3 writes failed E_FAILED_ON_NOT_WRITABLE.)"""
    lookupd, nodes, _ = start_cluster(lookupd_factory, tmp_path, lag_timeout="1s")
    port = create_replicated(lookupd, "steady", 3)
    leader = next(n for n in nodes if n.tcp_port == port)
    conn = Conn(port)
    body = c.mpub("steady", [b"x" * 200] * 100)
    window, sent, answered = 256, 0, 0
    stop = time.monotonic() + 4.0  # four lag timeouts
    try:
        while True:
            while sent - answered < window and time.monotonic() < stop:
                conn.send(body)
                sent += 1
            if answered == sent:
                break
            assert conn.frame() == (FRAME_RESPONSE, b"OK"), f"MPUB {answered} refused"
            answered += 1
        state = partition_state(leader, "steady")
        assert state is not None and len(state["isr"]) == 3, state
        assert not [line for line in leader.log if "asking the coordinator: leave" in line]
        assert state["end"] == 100 * sent
    finally:
        conn.close()
