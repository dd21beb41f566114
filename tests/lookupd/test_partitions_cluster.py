"""A partitioned topic across real processes: nsqlookupd places partitions on two nsqd,
they register them, /lookup tells writers and readers where each partition is."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsqx.wire import commands as c
from nsqx.wire.frames import FRAME_MESSAGE, FRAME_RESPONSE, FrameDecoder, decode_youzan_message

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def until(cond: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Conn:
    """A blocking protocol V2 connection (enough for a test)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"  V2")
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, bytes]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> tuple[int, bytes]:
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def response(self) -> bytes:
        ftype, data = self.frame()
        assert ftype == FRAME_RESPONSE, data
        return data

    def close(self) -> None:
        self.sock.close()


def test_lookupd_places_partitions_and_lookup_finds_them(
    lookupd_factory: Any, nsqd_factory: Any, tmp_path: Path
) -> None:
    lookupd = lookupd_factory(f"--data-path={tmp_path}")
    nodes = [
        nsqd_factory(
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
        )
        for _ in range(2)
    ]
    until(lambda: len(lookupd.json("/nodes")["producers"]) == 2, what="both nsqd registered")
    # not multipart: one partition per node at most (Youzan's rule)
    status, _, body = lookupd.post("/topic/create?topic=orders&partition_num=4&replicator=1")
    assert status == 400 and b"No node is available" in body
    status, _, body = lookupd.post("/topic/create?topic=orders&partition_num=2&replicator=1")
    assert status == 200, body
    # the same again is fine; other settings for an existing topic are refused
    assert lookupd.post("/topic/create?topic=orders&partition_num=2&replicator=1")[0] == 200
    status, _, body = lookupd.post(
        "/topic/create?topic=orders&partition_num=2&replicator=1&extend=true"
    )
    assert status == 400 and b"already exist" in body

    def lookup(access: str) -> Any:
        status, _, body = lookupd.get(
            f"/lookup?topic=orders&access={access}&metainfo=true", headers=V1
        )
        assert status == 200, body
        return json.loads(body)

    status, _, body = lookupd.post(
        "/topic/create?topic=many&partition_num=4&replicator=1&orderedmulti=true&multipart=true"
    )
    assert status == 200, body
    answer = until(lambda: (a := lookup("w")) and len(a["partitions"]) == 2 and a, what="leaders")
    assert answer["meta"]["partition_num"] == 2 and not answer["meta"]["ordered"]
    by_port = {n.tcp_port: n for n in nodes}
    placed = {int(p): info["tcp_port"] for p, info in answer["partitions"].items()}
    assert set(placed.values()) == set(by_port)  # spread over both nodes
    # each partition is on the node lookupd names: publish there, read it back
    for pid, port in sorted(placed.items()):
        conn = Conn(port)
        conn.send(c.pub_trace("orders", pid, 1000 + pid, b"hello %d" % pid))
        resp = conn.response()
        msg_id, trace = struct.unpack_from(">QQ", resp, 2)
        assert msg_id >> 50 == pid and trace == 1000 + pid
        conn.send(c.identify({"desired_tag": ""}))
        assert conn.response() == b"OK"
        conn.close()
        sub = Conn(port)
        sub.send(c.identify({"desired_tag": ""}))
        assert sub.response() == b"OK"
        sub.send(c.sub_advanced("orders", "ch", pid, c.ConsumeStart("msgcount", 0)))
        assert sub.response() == b"OK"
        sub.send(c.rdy(1))
        ftype, data = sub.frame()
        assert ftype == FRAME_MESSAGE
        m = decode_youzan_message(data, False, True)
        assert (m.body, m.trace_id) == (b"hello %d" % pid, 1000 + pid)
        sub.close()
    # a partition that is not on a node is refused there
    pid, port = next(iter(placed.items()))
    other = next(p for p in by_port if p != port)
    conn = Conn(other)
    conn.send(c.pub("orders", b"x", pid))
    ftype, data = conn.frame()
    assert (ftype, data) == (1, b"E_TOPIC_NOT_EXIST ")
    # the ordered multipart topic: 4 partitions on 2 nodes, ordered in its meta
    many = until(
        lambda: (
            (
                a := json.loads(
                    lookupd.get("/lookup?topic=many&metainfo=true&access=r", headers=V1)[2]
                )
            )
            and len(a["partitions"]) == 4
            and a
        ),
        what="the ordered topic's partitions",
    )
    assert many["meta"]["ordered"] and many["meta"]["multi_part"]
    # an NSQ 1.3 lookup of the same topic: producers only, as NSQ answers
    plain = json.loads(lookupd.get("/lookup?topic=orders")[2])
    assert set(plain) == {"channels", "producers"}
    assert {p["tcp_port"] for p in plain["producers"]} == set(by_port)
    # a node restarted: its partitions come back from its data directory
    # (and lookupd finds them registered again)
    victim = nodes[0]
    mine = sorted(p for p, port in placed.items() if port == victim.tcp_port)
    victim.stop()
    until(
        lambda: all(
            info["tcp_port"] != victim.tcp_port for info in lookup("w")["partitions"].values()
        ),
        what="the stopped node's partitions to leave /lookup",
    )
    back = nsqd_factory(
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        f"--tcp-address=127.0.0.1:{victim.tcp_port}",
        f"--data-path={victim.data_path}",
        name="again",
    )
    assert back.tcp_port == victim.tcp_port
    until(
        lambda: (
            sorted(
                int(p)
                for p, info in lookup("w")["partitions"].items()
                if info["tcp_port"] == back.tcp_port
            )
            == mine
        ),
        what="the restarted node's partitions in /lookup",
    )
