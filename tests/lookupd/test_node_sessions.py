"""Node sessions in etcd (nsqx.lookupd.node_sessions) against a real etcd, in-process:
two nsqlookupd's views of the same nodes, a session that ends when its connection
closes, and the sessions of an nsqlookupd whose lease goes (it died)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable

from nsqx.lookupd.etcd_client import EtcdClient
from nsqx.lookupd.etcd_store import EtcdKeys
from nsqx.lookupd.node_sessions import EtcdNodeSessions, NodeSessions
from nsqx.lookupd.registration_db import Peer
from nsqx.wire.lookupd import PeerInfo

from etcdproc import EtcdProcess

_ids = itertools.count()


def peer(node: str, conn: str) -> Peer:
    info = PeerInfo("127.0.0.1", 4150, 4151, "1.3.0-nsqx", distributed_id=node)
    return Peer(conn, info, 0)


async def until(cond: Callable[[], object], what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def test_sessions_are_seen_by_every_nsqlookupd(shared_etcd: EtcdProcess) -> None:
    async def body() -> None:
        keys = EtcdKeys(f"sessions-{next(_ids)}")
        clients = [EtcdClient([shared_etcd.endpoint]) for _ in range(2)]
        a, b = (EtcdNodeSessions(c, keys, name) for c, name in zip(clients, "ab", strict=True))
        ended: dict[str, list[str]] = {"a": [], "b": []}
        a.on_ended(ended["a"].append)
        b.on_ended(ended["b"].append)
        leases = [(await c.lease_grant(60))[0] for c in clients]
        for s, lease in zip((a, b), leases, strict=True):
            s.start()
            s.use_lease(lease)
            await s.synced.wait()

        # n1 connects to a only, n2 to both
        n1, n2a, n2b = peer("n1", "c1"), peer("n2", "c2"), peer("n2", "c3")
        a.opened(n1)
        a.opened(n2a)
        b.opened(n2b)
        await until(lambda: b.holders("n1") == ["a"], "b sees a's session of n1")
        assert b.alive("n1") and not b.local("n1")
        await until(lambda: a.view() == {"n1": ["local"], "n2": ["local", "b"]}, "a's view")
        # what the key holds: where the node is
        _, kvs = await clients[0].range(keys.node_session("n1", "a"))
        assert json.loads(kvs[0].value)["node_id"] == "n1"
        assert json.loads(kvs[0].value)["tcp_port"] == 4150

        # a reconnect (new connection before the old one closed) keeps the session
        n1_again = peer("n1", "c4")
        a.opened(n1_again)
        a.closed(n1)
        await asyncio.sleep(0.2)  # nothing is to happen: give a wrong delete time to land
        assert b.holders("n1") == ["a"] and ended["b"] == []

        # n1's last connection closes: its session ends, for b (a reports it itself)
        a.closed(n1_again)
        await until(lambda: ended["b"] == ["n1"], "b hears that n1's session ended")
        assert not b.alive("n1") and ended["a"] == []

        # n2 leaves a but is still b's: alive for a, nothing ended
        a.closed(n2a)
        await until(lambda: not b.holders("n2"), "a's session of n2 gone")
        assert a.alive("n2") and a.holders("n2") == ["b"] and ended["a"] == []

        # b dies: its lease goes with its keys; a hears that n2's last session ended
        await b.close()
        await clients[1].lease_revoke(leases[1])
        await until(lambda: ended["a"] == ["n2"], "a hears n2's session end with b's lease")
        assert not a.alive("n2")

        # a new lease (a's session was renewed after a loss) puts a's sessions again
        a.opened(peer("n3", "c5"))
        await until(lambda: b.holders("n3") == [] and a.local("n3"), "n3 local to a")
        new_lease = (await clients[0].lease_grant(60))[0]
        await clients[0].lease_revoke(leases[0])
        a.use_lease(new_lease)
        c = EtcdNodeSessions(clients[1], keys, "c")
        c.start()
        await c.synced.wait()
        await until(lambda: c.holders("n3") == ["a"], "a's session of n3 under the new lease")
        await a.close()
        await c.close()
        for client in clients:
            await client.close()

    run(body)


def test_embedded_sessions_are_this_lookupds_connections() -> None:
    s = NodeSessions()
    s.opened(peer("n1", "c1"))
    s.opened(peer("n1", "c2"))
    s.closed(peer("n1", "c1"))
    assert s.alive("n1") and s.view() == {"n1": ["local"]} and s.holders("n1") == []
    s.closed(peer("n1", "c2"))
    assert not s.alive("n1") and s.view() == {}
