"""NSQLookupd: the discovery daemon: the registry, its TCP listener and its HTTP API."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from nsqx.cluster_secret import load_secret
from nsqx.lookupd.coordinator import Coordinator
from nsqx.lookupd.etcd_client import EtcdClient
from nsqx.lookupd.etcd_store import EtcdKeys, EtcdMetaStore
from nsqx.lookupd.http import LookupdHTTP
from nsqx.lookupd.leadership import Leadership, LookupdNode
from nsqx.lookupd.liveness import LivenessMonitor, Timing
from nsqx.lookupd.lookup_protocol_v1 import LookupProtocolV1
from nsqx.lookupd.meta_store import FileMetaStore, MemoryMetaStore, MetaStore
from nsqx.lookupd.node_sessions import EtcdNodeSessions
from nsqx.lookupd.nsqd_client import NsqdClient
from nsqx.lookupd.options import LookupdOptions
from nsqx.lookupd.registration_db import RegistrationDB
from nsqx.store.data_format import open_data_dir

log = logging.getLogger("nsqx.lookupd")

#: How long shutdown waits for in-flight HTTP requests.
HTTP_SHUTDOWN_TIMEOUT = 2.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); an empty host means all."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class NSQLookupd:
    """nsqlookupd: nsqd nodes register their topics and channels over TCP (protocol V1);
    consumers and operators ask over HTTP where topics are. It is also the coordinator
    of partitioned topics (:class:`~nsqx.lookupd.coordinator.Coordinator`)."""

    def __init__(self, options: LookupdOptions) -> None:
        self.options = options
        self.db = RegistrationDB()
        self.coordinator = Coordinator(
            self.db,
            NsqdClient(
                options.http_client_connect_timeout,
                options.http_client_request_timeout,
                options.cluster_secret,
            ),
            options.inactive_producer_timeout,
            Timing(options.node_timeout),
        )
        #: Closes the connections of nodes silent for the node timeout.
        self.liveness = LivenessMonitor(self.coordinator.timing, lambda: list(self.clients))
        #: With ``--etcd-endpoints``: the etcd client and this node's leadership.
        self.etcd: EtcdClient | None = None
        self.leadership: Leadership | None = None
        #: Open TCP connections (closed on shutdown).
        self.clients: set[LookupProtocolV1] = set()
        #: Bound addresses, known after start().
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._server: asyncio.AbstractServer | None = None
        self._runner: web.AppRunner | None = None
        self._closed = False

    @property
    def tcp_port(self) -> int:
        return self.tcp_address[1] if self.tcp_address else 0

    @property
    def http_port(self) -> int:
        return self.http_address[1] if self.http_address else 0

    def _open_store(self) -> MetaStore:
        opts = self.options
        if opts.etcd_endpoints:
            self.etcd = EtcdClient(opts.etcd_endpoint_list())
            keys = EtcdKeys(opts.cluster_id)
            log.info(
                "META: topic meta in etcd %s under %s; one nsqlookupd leads",
                opts.etcd_endpoints,
                keys.root.decode(),
            )
            if opts.data_path:
                log.info("META: --data-path is not used for the meta with --etcd-endpoints")
            # node sessions in etcd too, under this node's lease (its id once bound)
            self.coordinator.sessions = EtcdNodeSessions(self.etcd, keys, "")
            return EtcdMetaStore(self.etcd, keys)
        if self.options.data_path:
            open_data_dir(self.options.data_path, "nsqx nsqlookupd")  # one it reads
            store = FileMetaStore.open(self.options.data_path)
            log.info("META: topic meta in %s", store.path)
            return store
        log.info(
            "META: no --data-path: the meta and placement of partitioned topics are kept"
            " in memory only, and lost when nsqlookupd stops"
        )
        return MemoryMetaStore()

    async def start(self) -> None:
        """Open the meta store, bind the TCP and HTTP listeners (port 0 picks a free
        port). Raises OSError or ValueError (an unreadable meta file or cluster secret
        file) if it cannot."""
        opts = self.options
        opts.cluster_secret = load_secret(opts.cluster_secret, opts.cluster_secret_file)
        self.coordinator.client.use_secret(opts.cluster_secret)
        store = self._open_store()
        # a shared store is followed by all and written by the leader only; without
        # etcd reachable this nsqlookupd still starts, serves lookups and keeps trying
        await self.coordinator.start(store, leading=not store.shared)
        store.follow(self.coordinator.record_changed)
        try:
            await self._listen()
        except BaseException:
            await self.close()
            raise
        if isinstance(store, EtcdMetaStore) and self.etcd is not None:
            node = LookupdNode.make(self.options.broadcast_address, self.tcp_port, self.http_port)
            sessions = self.coordinator.sessions
            assert isinstance(sessions, EtcdNodeSessions)
            sessions.lookupd_id = node.id
            sessions.start()
            self.leadership = Leadership(
                self.etcd,
                store.keys,
                node,
                int(self.options.etcd_lease_ttl),
                self.coordinator.start_leading,
                self.coordinator.stop_leading,
                sessions.use_lease,
            )
            store.fence = self.leadership.fence
            self.coordinator.session_deadline = self.leadership.session_deadline
            leadership = self.leadership
            self.coordinator.leadership_valid = lambda: leadership.fence() is not None
            self.leadership.start()
        self.liveness.start()

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = split_address(self.options.tcp_address)
        self._server = await loop.create_server(
            lambda: LookupProtocolV1(self), host, port, reuse_address=True
        )
        sockname = self._server.sockets[0].getsockname()
        self.tcp_address = (sockname[0], sockname[1])
        log.info("TCP: listening on %s:%d", sockname[0], sockname[1])
        host, port = split_address(self.options.http_address)
        runner = web.AppRunner(
            LookupdHTTP(self).app(), access_log=None, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound = runner.addresses[0]
        self.http_address = (bound[0], bound[1])
        log.info("HTTP: listening on %s:%d", bound[0], bound[1])

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._closed:
            return
        self._closed = True
        if self.leadership is not None:
            # first: another nsqlookupd may lead while this one closes its listeners
            await self.leadership.close()
        await self.liveness.close()
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()
        await self.coordinator.close()
        if self.etcd is not None:
            await self.etcd.close()
