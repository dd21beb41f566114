"""Node sessions: which nsqd nodes are alive, as the nsqlookupd of a cluster see them.

A node's *session* with an nsqlookupd is its registration connection (TCP protocol V1,
with the PINGs that keep it active). A single nsqlookupd (the embedded store) keeps its
sessions in memory: they are its connections, and a node is alive while one is open.

Several nsqlookupd over etcd (:class:`EtcdNodeSessions`) also keep them in etcd, so that
the leading one judges a node by every nsqlookupd's view, not only by its own
connections: each nsqlookupd puts ``nodes/<node id>/<its lookupd id>`` (the node's
addresses, as JSON) under its own lease (the one of its leadership session) while the
node is connected to it, and deletes it when the connection closes; a key of an
nsqlookupd that dies goes with its lease. Every nsqlookupd mirrors the ``nodes/`` prefix.
A node is alive while this nsqlookupd holds a connection from it or another nsqlookupd
holds a session key for it; its session *ends* when neither is left. So:

* a node that loses its connection to the leading nsqlookupd only (a network cut, a
  reconnect) keeps its leaderships while another nsqlookupd still sees it;
* an nsqlookupd that takes the lead judges the nodes whose sessions ended while it
  followed, including nodes that never connected to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from nsqx.lookupd.etcd_client import EtcdClient, EtcdError, prefix_end
from nsqx.lookupd.etcd_store import RESYNC_DELAY_MAX, EtcdKeys
from nsqx.lookupd.registration_db import Peer

log = logging.getLogger("nsqx.lookupd")

#: Called with a node id when the node's last session (anywhere) ended.
EndedHook = Callable[[str], None]


def session_value(peer: Peer) -> bytes:
    """What a node's session key holds: where the node is and what it runs."""
    info = peer.info
    return json.dumps(
        {
            "node_id": peer.node_id,
            "broadcast_address": info.broadcast_address,
            "tcp_port": info.tcp_port,
            "http_port": info.http_port,
            "version": info.version,
            "connection": peer.id,
        },
        separators=(",", ":"),
    ).encode()


class NodeSessions:
    """This nsqlookupd's sessions: the partition-aware nodes connected to it."""

    #: True when the sessions of other nsqlookupd are known too (etcd).
    shared = False

    def __init__(self) -> None:
        # node id -> connection id -> the connection's peer
        self._local: dict[str, dict[str, Peer]] = {}
        self._on_ended: EndedHook | None = None

    def on_ended(self, hook: EndedHook) -> None:
        """Call ``hook(node_id)`` when a node's last session held elsewhere ends (only
        with :attr:`shared` sessions: this nsqlookupd's own connections are reported
        by the coordinator)."""
        self._on_ended = hook

    def opened(self, peer: Peer) -> None:
        """A partition-aware node identified on a connection of this nsqlookupd."""
        self._local.setdefault(peer.node_id, {})[peer.id] = peer

    def closed(self, peer: Peer, not_before: float = 0.0) -> None:
        """That connection closed; a lease the node got through it may run until
        ``not_before`` (loop time): other nsqlookupd must not judge it lost before."""
        conns = self._local.get(peer.node_id)
        if conns is not None and conns.pop(peer.id, None) is not None and not conns:
            del self._local[peer.node_id]

    def local(self, node_id: str) -> bool:
        """Whether the node has a connection to this nsqlookupd."""
        return node_id in self._local

    def holders(self, node_id: str) -> list[str]:
        """The other nsqlookupd that hold a session of the node (ids)."""
        return []

    def published(self, node_id: str) -> bool:
        """Whether the other nsqlookupd can see this one's session of the node (with
        etcd: its key is written under the current lease). A lease granted before
        would not keep the leading nsqlookupd from judging the node lost."""
        return True

    def alive(self, node_id: str) -> bool:
        """Whether the node has a session with any nsqlookupd."""
        return self.local(node_id) or bool(self.holders(node_id))

    def view(self) -> dict[str, list[str]]:
        """Node id -> the nsqlookupd holding its sessions (``"local"`` for this one)."""
        return {n: ["local"] for n in sorted(self._local)}

    def start(self) -> None:
        """Start following the sessions of other nsqlookupd (none here)."""

    def use_lease(self, lease: int) -> None:
        """This nsqlookupd's session lease changed (0: none)."""

    async def close(self) -> None:
        """Stop following and publishing."""


class EtcdNodeSessions(NodeSessions):
    """Sessions published in etcd under this nsqlookupd's lease, and mirrored."""

    shared = True

    def __init__(self, client: EtcdClient, keys: EtcdKeys, lookupd_id: str) -> None:
        super().__init__()
        self.client = client
        self.keys = keys
        self.lookupd_id = lookupd_id
        self._lease = 0
        # node id -> lookupd id -> the stored value: every session key in etcd
        self._remote: dict[str, dict[str, bytes]] = {}
        #: Set once the prefix was listed (the view of the other nsqlookupd is known).
        self.synced = asyncio.Event()
        # node ids whose key must be put (connected) or deleted (not) with the lease
        self._dirty: set[str] = set()
        # node ids whose key is in etcd under the current lease
        self._written: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- this nsqlookupd's own sessions -------------------------------------------------

    def opened(self, peer: Peer) -> None:
        first = not self.local(peer.node_id)
        super().opened(peer)
        if first:
            self._mark(peer.node_id)

    def closed(self, peer: Peer, not_before: float = 0.0) -> None:
        super().closed(peer)
        if not self.local(peer.node_id):
            # the key goes once any lease the node got here has surely ended (and the
            # publish loop deletes it only if no new connection came meanwhile)
            loop = asyncio.get_running_loop()
            if not_before > loop.time():
                loop.call_at(not_before, self._mark, peer.node_id)
            else:
                self._mark(peer.node_id)

    def use_lease(self, lease: int) -> None:
        """A new lease (after the leadership session was granted one): every session
        of this nsqlookupd is put again under it. 0: the lease is gone, and so are the
        keys it carried."""
        self._lease = lease
        self._written.clear()
        if lease:
            self._dirty.update(self._local)
            self._wake.set()

    def _mark(self, node_id: str) -> None:
        self._dirty.add(node_id)
        self._wake.set()

    async def _publish_loop(self) -> None:
        """Put or delete the keys of this nsqlookupd's sessions, one at a time and in
        order, so that a close never overtakes the open before it."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty and self._lease:
                node_id = self._dirty.pop()
                key = self.keys.node_session(node_id, self.lookupd_id)
                lease = self._lease
                conns = self._local.get(node_id)
                try:
                    if conns:
                        peer = next(reversed(conns.values()))
                        await self.client.put(key, session_value(peer), lease)
                        if lease == self._lease:
                            self._written.add(node_id)
                    else:
                        self._written.discard(node_id)
                        await self.client.delete(key)
                except EtcdError as err:
                    # the leadership's keepalive decides whether the lease is gone; a
                    # new lease puts every session again
                    log.info("NODES: session key of %s not written: %s", node_id, err)
                    self._dirty.add(node_id)
                    await asyncio.sleep(0.2)

    # -- every nsqlookupd's sessions ----------------------------------------------------

    def published(self, node_id: str) -> bool:
        return node_id in self._written

    def holders(self, node_id: str) -> list[str]:
        # this nsqlookupd's own key is not counted: its connections are the truth (the
        # key may lag behind them while etcd is slow or away)
        return sorted(h for h in self._remote.get(node_id, ()) if h != self.lookupd_id)

    def view(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node_id in sorted(set(self._local) | set(self._remote)):
            held = self.holders(node_id)
            out[node_id] = (["local"] if self.local(node_id) else []) + held
        return {n: h for n, h in out.items() if h}

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._publish_loop(), name="lookupd-node-sessions-put"),
                asyncio.create_task(self._mirror_loop(), name="lookupd-node-sessions-watch"),
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _parse(self, key: bytes) -> tuple[str, str] | None:
        prefix = self.keys.node_sessions_prefix
        if not key.startswith(prefix):
            return None
        node, sep, holder = key[len(prefix) :].decode(errors="replace").rpartition("/")
        return (node, holder) if sep and node and holder else None

    def _set(self, remote: dict[str, dict[str, bytes]]) -> None:
        """Take a new view; report the nodes whose last session ended with it."""
        before = {n for n in self._remote if self.holders(n)}
        self._remote = remote
        for node_id in sorted(before):
            if not self.holders(node_id):
                self._ended(node_id)

    def _ended(self, node_id: str) -> None:
        if self.local(node_id) or self._on_ended is None:
            return
        try:
            self._on_ended(node_id)
        except Exception:
            log.exception("NODES: handling the end of the session of %s failed", node_id)

    async def _mirror_loop(self) -> None:
        prefix = self.keys.node_sessions_prefix
        delay = 0.1
        while True:
            try:
                revision, kvs = await self.client.range_prefix(prefix)
                remote: dict[str, dict[str, bytes]] = {}
                for kv in kvs:
                    if (parsed := self._parse(kv.key)) is not None:
                        remote.setdefault(parsed[0], {})[parsed[1]] = kv.value
                self._set(remote)
                self.synced.set()
                delay = 0.1
                async for msg in self.client.watch(prefix, prefix_end(prefix), revision + 1):
                    if msg.compact_revision:
                        break  # list again
                    remote = {n: dict(h) for n, h in self._remote.items()}
                    for ev in msg.events:
                        if (parsed := self._parse(ev.kv.key)) is None:
                            continue
                        node_id, holder = parsed
                        if ev.deleted:
                            held = remote.get(node_id, {})
                            held.pop(holder, None)
                            if not held:
                                remote.pop(node_id, None)
                        else:
                            remote.setdefault(node_id, {})[holder] = ev.kv.value
                    self._set(remote)
            except EtcdError as err:
                log.debug("NODES: following node sessions broke: %s", err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESYNC_DELAY_MAX)
