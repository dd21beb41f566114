"""Leadership: which of several nsqlookupd sharing an etcd coordinates the cluster.

Each nsqlookupd holds an etcd *session*: a lease of ``ttl`` seconds, renewed every
``ttl/3``, that carries its node key (``lookupd/nodes/<id>``, listed by ``/listlookup``).
The one that creates the leader key (``lookupd/leader``, a transaction that succeeds
only if the key is absent) under its lease leads: it runs the coordinator's
administration and reconciliation (:meth:`Coordinator.start_leading`). The others
watch the leader key and campaign again when it goes.

Stepping down comes first. The leader stops leading (``on_deposed``, which stops the
coordinator's work) as soon as a renewal fails or etcd says the lease is gone, and at
the latest ``margin`` seconds before the lease could expire counting from the send
time of its last successful renewal, which is before etcd could let anyone else take
the key. Its writes carry the leader key's create revision as a fence
(:meth:`Leadership.fence`), so a write that is still on its way when it loses is
refused by etcd itself. After losing its session an nsqlookupd revokes the old lease as
soon as etcd answers (which deletes its keys, so that a former leader's key does not
block the others for a TTL) and starts a new session. On a clean shutdown it revokes
its lease at once, so another nsqlookupd takes over without waiting for the TTL.

Leadership changes are logged (``LEADER:`` lines). The leader's *epoch* is the leader
key's create revision: it grows with every new leadership and is what
``/listlookup``'s ``lookupdleader.Epoch`` shows.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from nsqx.lookupd.etcd_client import (
    EtcdClient,
    EtcdError,
    cmp_create_revision,
    op_put,
    op_range,
)
from nsqx.lookupd.etcd_store import EtcdKeys
from nsqx.lookupd.meta_store import MetaStoreError

log = logging.getLogger("nsqx.lookupd")

#: Youzan's zero NsqLookupdNodeInfo: /listlookup's leader while none is known.
NO_NODE_JSON: dict[str, Any] = {
    "ID": "",
    "NodeIP": "",
    "TcpPort": "",
    "HttpPort": "",
    "RpcPort": "",
    "Epoch": 0,
}


class SessionLost(Exception):
    """The lease is gone, or etcd stopped answering: the session is over."""


@dataclass(frozen=True)
class LookupdNode:
    """One nsqlookupd as ``/listlookup`` shows it (Youzan's NsqLookupdNodeInfo)."""

    id: str
    ip: str
    tcp_port: int
    http_port: int
    epoch: int = 0

    @classmethod
    def make(cls, ip: str, tcp_port: int, http_port: int) -> LookupdNode:
        """Youzan's node id is ``ip:rpc_port:tcp_port:nsqlookup``; nsqx has no RPC port."""
        return cls(f"{ip}::{tcp_port}:nsqlookup", ip, tcp_port, http_port)

    def to_json(self) -> dict[str, Any]:
        return {
            "ID": self.id,
            "NodeIP": self.ip,
            "TcpPort": str(self.tcp_port),
            "HttpPort": str(self.http_port),
            "RpcPort": "",
            "Epoch": self.epoch,
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, epoch: int = 0) -> LookupdNode | None:
        """A node from its stored JSON (``epoch`` replaces the stored one); None if bad."""
        try:
            obj = json.loads(raw)
            return cls(
                str(obj["ID"]), str(obj["NodeIP"]), int(obj["TcpPort"]), int(obj["HttpPort"]), epoch
            )
        except (ValueError, KeyError, TypeError):
            return None


class Leadership:
    """This nsqlookupd's etcd session and its campaign for the leader key.

    ``on_elected`` runs when it wins (the coordinator starts leading: it loads the
    records fresh and starts reconciling); ``on_deposed`` when it loses (stop at once).
    Neither runs twice in a row.
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: EtcdKeys,
        node: LookupdNode,
        ttl: int,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        on_lease: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.node = node
        self.ttl = ttl
        #: Seconds before the earliest possible expiry of the lease at which a leader
        #: steps down if no renewal came back.
        self.margin = max(0.5, ttl / 10)
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        # told each new lease (and 0 when it is gone): the node sessions go under it
        self._on_lease = on_lease or (lambda lease: None)
        #: True while this nsqlookupd leads.
        self.leading = False
        #: The leader as last seen (this node included), None while unknown.
        self.leader: LookupdNode | None = None
        self._epoch = 0
        self._deadline = 0.0
        self._lease = 0
        self._stale_lease = 0
        self._nodes: list[LookupdNode] = []
        self._task: asyncio.Task[None] | None = None

    # -- views ------------------------------------------------------------------------

    def fence(self) -> int | None:
        """While this nsqlookupd leads and its lease cannot have expired: the leader
        key's create revision (the store's writes compare it); otherwise None."""
        if self.leading and asyncio.get_running_loop().time() < self._deadline:
            return self._epoch
        return None

    def session_deadline(self) -> float:
        """The loop time before which this nsqlookupd's session lease (and so every key
        it carries, the node sessions among them) cannot expire; 0 without a session."""
        return self._deadline if self._lease else 0.0

    async def nodes(self) -> list[LookupdNode]:
        """Every nsqlookupd with a session (as last seen, if etcd does not answer)."""
        try:
            # an HTTP answer waits on this: not for long
            _, kvs = await self.client.range_prefix(self.keys.nodes_prefix, timeout=1.0)
        except EtcdError as err:
            log.debug("LEADER: cannot list nsqlookupd nodes: %s", err)
            return list(self._nodes)
        nodes = [n for kv in kvs if (n := LookupdNode.decode(kv.value)) is not None]
        self._nodes = sorted(nodes, key=lambda n: n.id)
        return list(self._nodes)

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Open a session and campaign, in the background, until :meth:`close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lookupd-leadership")

    async def close(self) -> None:
        """Stop leading, and revoke the lease so that another nsqlookupd leads at once."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._step_down("shutting down")
        for lease in (self._lease, self._stale_lease):
            if lease:
                try:
                    await self.client.lease_revoke(lease, timeout=1.0)
                except EtcdError as err:
                    log.info("LEADER: could not revoke lease %x: %s", lease, err)
        self._lease = self._stale_lease = 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.1
        while True:
            began = loop.time()
            reason = "session ended"
            try:
                await self._session()
            except (EtcdError, SessionLost, MetaStoreError) as err:
                reason = str(err)
            except Exception as err:
                # a bug must not end leadership elections for this process
                log.exception("LEADER: session failed")
                reason = repr(err)
            await self._step_down(reason)
            if self.leader is not None:
                log.info("LEADER: no session with etcd (%s); campaigning again", reason)
            self.leader = None
            if self._lease:
                self._stale_lease, self._lease = self._lease, 0
                self._on_lease(0)
            # a session that lasted was a good one: start again quickly
            delay = 0.1 if loop.time() - began > self.ttl else min(delay * 2, 2.0)
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        """One lease: register this node, then keep the lease and campaign until either
        fails (raises why)."""
        loop = asyncio.get_running_loop()
        if self._stale_lease:
            # a former session's keys (maybe the leader key) go now, not a TTL later
            await self.client.lease_revoke(self._stale_lease, timeout=1.0)
            self._stale_lease = 0
        sent = loop.time()
        lease, ttl = await self.client.lease_grant(self.ttl)
        self._lease = lease
        self._deadline = sent + ttl - self.margin
        await self.client.put(self.keys.node(self.node.id), self.node.encode(), lease)
        self._on_lease(lease)
        keep = asyncio.create_task(self._keepalive(lease), name="lookupd-lease-keepalive")
        campaign = asyncio.create_task(self._campaign(lease), name="lookupd-campaign")
        try:
            done, _ = await asyncio.wait({keep, campaign}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            raise SessionLost("session ended")
        finally:
            for task in (keep, campaign):
                task.cancel()
            await asyncio.gather(keep, campaign, return_exceptions=True)

    async def _keepalive(self, lease: int) -> None:
        """Renew the lease every ttl/3; raise SessionLost when a renewal fails, when
        etcd says the lease is gone, or when the deadline comes without a renewal."""
        loop = asyncio.get_running_loop()
        interval = self.ttl / 3
        while True:
            await asyncio.sleep(interval)
            sent = loop.time()
            remaining = self._deadline - sent
            if remaining <= 0:
                raise SessionLost("no lease renewal in time")
            try:
                async with asyncio.timeout(remaining):
                    ttl = await self.client.lease_keepalive(lease, timeout=remaining)
            except TimeoutError:
                raise SessionLost("etcd did not renew the lease in time") from None
            except EtcdError as err:
                raise SessionLost(f"lease renewal failed: {err}") from None
            if ttl <= 0:
                raise SessionLost("the lease expired")
            self._deadline = sent + ttl - self.margin

    async def _campaign(self, lease: int) -> None:
        """Take the leader key when it is free; otherwise wait until it goes."""
        key = self.keys.leader
        while True:
            res = await self.client.txn(
                [cmp_create_revision(key, 0)],
                [op_put(key, self.node.encode(), lease)],
                [op_range(key)],
            )
            if res.succeeded:
                epoch = res.revision
                self._epoch = epoch
                self.leading = True
                self.leader = replace(self.node, epoch=epoch)
                log.warning(
                    "LEADER: %s now leads cluster %s (epoch %d)",
                    self.node.id,
                    self.keys.cluster_id,
                    epoch,
                )
                await self._on_elected()
            else:
                found = res.range_kvs(0)
                if not found:
                    continue  # it went in between: try again
                kv = found[0]
                epoch = kv.create_revision
                leader = LookupdNode.decode(kv.value, epoch)
                if leader != self.leader:
                    log.info(
                        "LEADER: %s leads cluster %s (epoch %d)",
                        leader.id if leader else "?",
                        self.keys.cluster_id,
                        epoch,
                    )
                self.leader = leader
            await self._wait_gone(epoch, res.revision + 1)
            if self.leading:
                await self._step_down("the leader key was deleted or replaced")
            self.leader = None

    async def _wait_gone(self, epoch: int, start: int) -> None:
        """Return when the leader key of ``epoch`` is deleted or replaced."""
        key = self.keys.leader
        while True:
            try:
                async for msg in self.client.watch(key, None, start):
                    for ev in msg.events:
                        if ev.deleted or ev.kv.create_revision != epoch:
                            return
                    start = max(start, msg.revision + 1)
                    if msg.compact_revision:
                        break
            except EtcdError as err:
                # the keepalive decides whether the session is over; the watch retries
                log.debug("LEADER: watch of the leader key broke: %s", err)
                await asyncio.sleep(0.2)
            revision, kvs = await self.client.range(key)
            if not kvs or kvs[0].create_revision != epoch:
                return
            start = revision + 1

    async def _step_down(self, reason: str) -> None:
        if not self.leading:
            return
        self.leading = False
        self._epoch = 0
        log.warning("LEADER: %s steps down: %s", self.node.id, reason)
        try:
            await self._on_deposed()
        except Exception:
            log.exception("LEADER: stopping the coordinator failed")
