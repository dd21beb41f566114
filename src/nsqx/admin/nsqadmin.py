"""NSQAdmin: the admin server's life: HTTP listener, cluster client, history sampler.

It holds one aiohttp client session for the cluster (timeouts from
``--http-client-*``), the :class:`~nsqx.admin.history.History` that its sampler task
fills every ``--history-interval``, and the notifier. ``start`` binds the listener
(port 0 picks a free one; :attr:`http_port` tells which); ``close`` stops all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

import aiohttp
from aiohttp import web

from nsqx.admin import upstream_auth
from nsqx.admin.history import History, sample_from_rows
from nsqx.admin.http import make_app
from nsqx.admin.notify import Notifier
from nsqx.admin.options import AdminOptions
from nsqx.cluster_secret import load_secret
from nsqx.clusterinfo.info import ClusterInfo, UpstreamError
from nsqx.wire import members

__all__ = ["NSQAdmin"]

log = logging.getLogger("nsqx.admin")

#: how long the admin shows a tombstone it set: NSQ's default --tombstone-lifetime.
#: nsqlookupd itself forgets it as soon as the node deletes the topic (which the
#: tombstone action asks for), so its /nodes would never show it.
TOMBSTONE_MEMORY = 45.0


class NSQAdmin:
    """The web admin of one cluster (see :mod:`nsqx.admin`)."""

    def __init__(self, options: AdminOptions) -> None:
        options.validate()
        self.options = options
        self.history = History(options.history_interval, options.history_length)
        self.notifier: Notifier | None = None
        self._session: aiohttp.ClientSession | None = None
        self._cluster: ClusterInfo | None = None
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self.http_host = ""
        self.http_port = 0
        #: (topic, node) -> when this admin tombstoned the topic on the node
        self._tombstones: dict[tuple[str, str], float] = {}

    @property
    def cluster(self) -> ClusterInfo:
        assert self._cluster is not None, "start() first"
        return self._cluster

    def _ssl(self) -> ssl.SSLContext | bool:
        opts = self.options
        if not (
            opts.http_client_tls_root_ca_file
            or opts.http_client_tls_cert
            or opts.http_client_tls_insecure_skip_verify
        ):
            return True
        ctx = ssl.create_default_context(cafile=opts.http_client_tls_root_ca_file or None)
        if opts.http_client_tls_insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if opts.http_client_tls_cert:
            ctx.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
        return ctx

    def tombstoned(self, topic: str, node: str) -> None:
        """Remember a tombstone this admin set (see :data:`TOMBSTONE_MEMORY`)."""
        self._tombstones[(topic, node)] = time.monotonic()

    def tombstones_of(self, node: str) -> list[str]:
        """The topics this admin tombstoned on ``node`` in the last 45 s."""
        horizon = time.monotonic() - TOMBSTONE_MEMORY
        for key in [k for k, at in self._tombstones.items() if at < horizon]:
            del self._tombstones[key]
        return sorted(t for t, n in self._tombstones if n == node)

    async def start(self) -> None:
        """Bind the HTTP listener and start sampling; OSError if the address is taken,
        ValueError if the cluster secret's file cannot be read."""
        opts = self.options
        opts.cluster_secret = load_secret(opts.cluster_secret, opts.cluster_secret_file)
        opts.http_auth_secret = upstream_auth.load_secret(
            opts.http_auth_secret, opts.http_auth_secret_file
        )
        bearer = upstream_auth.trace_config(
            opts.http_auth_secret, opts.http_auth_forward, opts.notification_http_endpoint
        )
        timeout = aiohttp.ClientTimeout(
            total=opts.http_client_request_timeout, sock_connect=opts.http_client_connect_timeout
        )
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(ssl=self._ssl()),
            headers={
                "User-Agent": f"nsqadmin (nsqx) aiohttp/{aiohttp.__version__}",
                **members.headers(opts.cluster_secret),
            },
            trace_configs=[bearer] if bearer is not None else None,
        )
        self._cluster = ClusterInfo(
            self._session,
            opts.nsqlookupd_http_addresses,
            opts.nsqd_http_addresses,
            node_timeout=opts.node_timeout,
        )
        if opts.notification_http_endpoint:
            self.notifier = Notifier(opts.notification_http_endpoint, self._session)
            self.notifier.start()
        if opts.graphite_url or opts.proxy_graphite:
            log.warning(
                "--graphite-url/--proxy-graphite are accepted but not used: the admin "
                "draws rates from its own samples of /stats (--history-interval)"
            )
        self._runner = web.AppRunner(make_app(self), access_log=None)
        await self._runner.setup()
        host, _, port = opts.http_address.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        site = web.TCPSite(self._runner, host, int(port or 0))
        try:
            await site.start()
        except BaseException:
            await self.close()
            raise
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname() if sockets else (host, int(port or 0))
        self.http_host, self.http_port = str(bound[0]), int(bound[1])
        log.info("HTTP: listening on %s:%d", self.http_host, self.http_port)
        self._sampler = asyncio.ensure_future(self._sample_forever())

    async def sample_once(self) -> None:
        """Read every nsqd's /stats once and add the totals to the history."""
        ci = self.cluster
        producers, _ = await ci.producers()
        rows, _ = await ci.node_stats(producers, include_clients=False)
        self.history.add(sample_from_rows(time.time(), rows))

    async def _sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.sample_once()
            except UpstreamError as err:
                log.warning("history: %s", err)
            except Exception:
                log.exception("history sampling failed")
            next_at += self.options.history_interval
            # a slow round is not made up for: the next one starts on the grid
            while next_at <= loop.time():
                next_at += self.options.history_interval
            await asyncio.sleep(next_at - loop.time())

    async def close(self) -> None:
        """Stop sampling, close the listener, send queued notifications, close the session."""
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._cluster is not None:
            await self._cluster.close()
        if self.notifier is not None:
            await self.notifier.close()
            self.notifier = None
        if self._session is not None:
            await self._session.close()
            self._session = None
