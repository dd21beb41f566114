"""NSQD: the daemon: topics, client connections, listeners and the scan loop."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any

from nsqx import NSQ_VERSION
from nsqx.nsqd.auth import AuthClient
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.http import HTTPServer
from nsqx.nsqd.lookup import LookupManager
from nsqx.nsqd.metadata import ChannelMeta, DataDirLock, TopicMeta, read_metadata, write_metadata
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.stats import GcPauses
from nsqx.nsqd.statsd import statsd_loop
from nsqx.nsqd.syncer import Checkpointer, LogSyncer
from nsqx.nsqd.tls import build_server_context
from nsqx.nsqd.topic import Topic
from nsqx.store.disklog import DiskLog
from nsqx.wire.names import is_valid_name

log = logging.getLogger("nsqx.nsqd")

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

#: Bytes read from all clients in one event-loop iteration before busy readers yield,
#: so that channel pumps (which run once per iteration) keep pace with publishers.
#: Measured (bench/server_bench.py, both phase): 64 KiB keeps consumers level with a
#: flooding publisher (513k in / 511k out); 256 KiB let ingest win (619k in / 320k out).
READ_BUDGET_PER_ITERATION = 64 * 1024
#: How often changed channel cursors are written (to the page cache, which survives a
#: killed process): a crash may deliver again messages finished within this window.
#: They are fsynced every --sync-timeout, for power loss.
CHECKPOINT_INTERVAL = 0.1
#: How often consumed log segments are looked for and deleted.
RECLAIM_INTERVAL = 1.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); an empty host means all."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class NSQD:
    """The nsqd daemon: owns topics and clients, runs the TCP listener and one scan
    loop that checks every channel's timers (in-flight timeouts, deferred messages) and
    every client's heartbeat in batches, every --queue-scan-interval (100ms)."""

    def __init__(self, options: NsqdOptions) -> None:
        self.options = options
        self.parser_limits = options.parser_limits()
        self.server_limits = options.server_limits()
        self.topics: dict[str, Topic] = {}
        self.clients: set[ClientV2] = set()
        self.start_time = int(time.time())
        self.tcp_address: tuple[str, int] | None = None
        #: where the HTTP API listens (None: off, or a unix socket)
        self.http_address: tuple[str, int] | None = None
        self.https_address: tuple[str, int] | None = None
        self.http = HTTPServer(self)
        #: set when storage fails to write: /ping then answers 500 "NOK - <error>"
        self.health_error: str | None = None
        #: called with the new list after PUT /config/nsqlookupd_tcp_addresses
        self.on_lookupd_addresses_changed: list[Callable[[list[str]], None]] = []
        self._statsd_task: asyncio.Task[None] | None = None
        self._gc_timed = False
        self._client_seq = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._scan_task: asyncio.Task[None] | None = None
        self._exiting = False
        self._read_this_turn = 0
        self._budget_reset_scheduled = False
        self._loading = False
        self.data_path = options.data_path or os.getcwd()
        self._lock = DataDirLock(self.data_path)
        self.syncers: dict[str, LogSyncer] = {}
        self.checkpointer = Checkpointer(self)
        #: Called with every TopologyEvent (e.g. to register with nsqlookupd).
        self.watchers: list[Callable[[TopologyEvent], None]] = []
        #: Registration with --lookupd-tcp-address (set_lookupd_addresses changes them).
        self.lookup = LookupManager(self)
        #: The server TLS context (built in start() from --tls-cert/--tls-key).
        self.tls_context: ssl.SSLContext | None = None
        #: --tls-required (true or tcp-https): TCP clients must upgrade before anything.
        self.tls_required = options.tls_required != "false"
        #: How long a client has for its TLS handshake (nsqd: 5s).
        self.tls_handshake_timeout = 5.0
        self.auth: AuthClient | None = None
        if options.auth_http_addresses:
            self.auth = AuthClient(
                options.auth_http_addresses,
                options.http_client_connect_timeout,
                options.http_client_request_timeout,
            )
        self._tasks: set[asyncio.Task[None]] = set()

    def spend_read_budget(self, nbytes: int) -> bool:
        """Count bytes read in this loop iteration; True once over the budget."""
        if not self._budget_reset_scheduled:
            self._budget_reset_scheduled = True
            asyncio.get_running_loop().call_soon(self._reset_read_budget)
        self._read_this_turn += nbytes
        return self._read_this_turn >= READ_BUDGET_PER_ITERATION

    def _reset_read_budget(self) -> None:
        self._read_this_turn = 0
        self._budget_reset_scheduled = False

    @property
    def exiting(self) -> bool:
        """True once close() began: publishing is refused from then on."""
        return self._exiting

    def health(self) -> str:
        """``OK``, or ``NOK - <error>`` after a failed write (NSQ's GetHealth)."""
        if self.health_error is None:
            for name, syncer in self.syncers.items():
                if syncer.log.sync_error is not None:
                    return f"NOK - fsync of topic {name} failed: {syncer.log.sync_error}"
            return "OK"
        return f"NOK - {self.health_error}"

    def lookupd_addresses_changed(self) -> None:
        """options.nsqlookupd_tcp_addresses was replaced: tell the subscribers."""
        addresses = list(self.options.nsqlookupd_tcp_addresses)
        for hook in list(self.on_lookupd_addresses_changed):
            try:
                hook(addresses)
            except Exception:
                log.exception("lookupd address hook failed")

    def set_log_level(self, level: str) -> None:
        """Change the log verbosity at run time (PUT /config/log_level)."""
        logging.getLogger("nsqx").setLevel(_LOG_LEVELS.get(level, logging.INFO))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a background coroutine (an auth query), keeping a reference to it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    # -- topics -----------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic named ``name``, created on first use."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            topic = self.topics[name] = Topic(self, name)
            if isinstance(topic.log, DiskLog):
                self.syncers[name] = LogSyncer(topic.log)
            log.info("TOPIC(%s): created", name)
            self.topology_changed(TopologyEvent("create", name), persist=not topic.ephemeral)
        return topic

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is not None:
            topic.delete()
            self.syncers.pop(name, None)
            log.info("TOPIC(%s): deleted", name)
            self.topology_changed(TopologyEvent("delete", name), persist=not topic.ephemeral)

    def topology_changed(self, event: TopologyEvent, persist: bool = True) -> None:
        """Tell the watchers, and rewrite the metadata file when it lists the change."""
        if self._loading:
            return
        for watcher in list(self.watchers):
            try:
                watcher(event)
            except Exception:
                log.exception("topology watcher failed on %s", event)
        if persist:
            self.persist_metadata()

    # -- metadata ---------------------------------------------------------------------

    def persist_metadata(self) -> None:
        """Write nsqd.dat: non-ephemeral topics and channels and their paused state."""
        topics = [
            TopicMeta(
                t.name,
                t.paused,
                [ChannelMeta(c.name, c.paused) for c in t.channels.values() if not c.ephemeral],
            )
            for t in self.topics.values()
            if not t.ephemeral
        ]
        write_metadata(self.data_path, topics, NSQ_VERSION)

    def load_metadata(self) -> None:
        """Recreate the topics and channels of nsqd.dat (on start)."""
        self._loading = True
        try:
            for tm in read_metadata(self.data_path):
                if not is_valid_name(tm.name):
                    log.warning("skipping invalid topic name %r in metadata", tm.name)
                    continue
                topic = self.get_topic(tm.name)
                for cm in tm.channels:
                    if is_valid_name(cm.name):
                        ch = topic.get_channel(cm.name)
                        ch.paused = cm.paused
                if tm.paused:
                    topic.pause()
        finally:
            self._loading = False

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data directory, restore metadata, bind the listeners, start timers."""
        # a bad certificate or key stops the start, as in nsqd
        self.tls_context = build_server_context(self.options)
        if self.tls_context is None and self.tls_required:
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        os.makedirs(self.data_path, exist_ok=True)
        self._lock.acquire()
        self.load_metadata()
        loop = asyncio.get_running_loop()
        addr = self.options.tcp_address
        if addr:
            if "/" in addr:
                server = await loop.create_unix_server(lambda: ClientV2(self), addr)
                log.info("TCP: listening on %s", addr)
            else:
                host, port = split_address(addr)
                server = await loop.create_server(
                    lambda: ClientV2(self), host, port, reuse_address=True, backlog=1024
                )
                sockname = server.sockets[0].getsockname()
                self.tcp_address = (sockname[0], sockname[1])
                log.info("TCP: listening on %s:%d", sockname[0], sockname[1])
            self._servers.append(server)
        if self.options.http_address:
            self.http_address = await self.http.start(self.options.http_address)
        if self.tls_context is not None and self.options.https_address:
            # HTTPS shares the TCP upgrade's context, as nsqd does
            self.https_address = await self.http.start(self.options.https_address, self.tls_context)
        GcPauses.install()
        self._gc_timed = True
        self._scan_task = asyncio.create_task(self._scan_loop())
        if self.options.statsd_address:
            self._statsd_task = asyncio.create_task(statsd_loop(self))
        # last, once every listener is bound: IDENTIFY announces the real ports
        self.lookup.start()

    async def _scan_loop(self) -> None:
        opts = self.options
        interval = opts.queue_scan_interval
        last_checkpoint = last_reclaim = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            now_ns = time.time_ns()
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    channel.scan(now, now_ns)
                topic.trim()
            for client in list(self.clients):
                client.tick(now)
            for syncer in self.syncers.values():
                if syncer.due(opts.sync_every, opts.sync_timeout, now):
                    syncer.request()
            if now - last_checkpoint >= CHECKPOINT_INTERVAL:
                last_checkpoint = now
                self.checkpointer.run_round()
            if now - last_reclaim >= RECLAIM_INTERVAL:
                last_reclaim = now
                for topic in list(self.topics.values()):
                    topic.reclaim()

    def sync_topics(self, names: set[str]) -> asyncio.Future[list[None]]:
        """A future done once every write so far to these topics is fsynced."""
        futures = [self.syncers[n].request() for n in names if n in self.syncers]
        return asyncio.gather(*futures)

    async def close(self) -> None:
        """Stop listening, close every client, stop the timers."""
        if self._exiting:
            return
        self._exiting = True
        await self.lookup.close()
        for server in self._servers:
            server.close()
        await self.http.close()
        if self._statsd_task is not None:
            self._statsd_task.cancel()
        if self._gc_timed:
            GcPauses.uninstall()
            self._gc_timed = False
        for client in list(self.clients):
            client.close()
        if self._scan_task is not None:
            self._scan_task.cancel()
        for server in self._servers:
            await server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self.auth is not None:
            await self.auth.close()
        try:
            self.persist_metadata()
        except OSError:
            log.exception("failed to persist metadata")
        await self.checkpointer.drain()
        for topic in list(self.topics.values()):
            try:
                topic.close()  # cursors checkpointed, logs fsynced
            except OSError:
                log.exception("TOPIC(%s): failed to close cleanly", topic.name)
        self._lock.release()
        if self.options.tcp_address and "/" in self.options.tcp_address:
            try:
                os.unlink(self.options.tcp_address)
            except OSError:
                pass
