"""NSQD: the daemon: topics, client connections, listeners and the scan loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from nsqx import NSQ_VERSION
from nsqx.cluster_secret import load_secret
from nsqx.nsqd import clock, dead_letters
from nsqx.nsqd.auth import AuthClient
from nsqx.nsqd.channel_policy import ChannelPolicy, PolicyError
from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.http import HTTPServer
from nsqx.nsqd.lookup import LookupManager
from nsqx.nsqd.loop_monitor import LoopMonitor, freeze_startup_heap
from nsqx.nsqd.loopturn import LoopTurn
from nsqx.nsqd.metadata import (
    ChannelMetadata,
    DataDirLock,
    MetadataMergeLock,
    TopicMetadata,
    merge_metadata,
    read_metadata,
    write_metadata,
)
from nsqx.nsqd.options import NsqdOptions, split_address
from nsqx.nsqd.replication.manager import ReplicationManager
from nsqx.nsqd.stats import GcPauses, version_string
from nsqx.nsqd.statsd import statsd_loop
from nsqx.nsqd.syncer import Checkpointer, LogSyncer
from nsqx.nsqd.tls import build_server_context
from nsqx.nsqd.topic import Topic
from nsqx.nsqd.tracer import Tracer
from nsqx.nsqd.workers.forwarding import WorkerSet
from nsqx.nsqd.workers.http_handoff import HTTP_STATE
from nsqx.nsqd.workers.spec import WorkerSpec
from nsqx.store.data_format import DataFormatError, open_data_dir
from nsqx.store.disklog import remove_file
from nsqx.store.durable_file import makedirs_durable, write_durable
from nsqx.wire.names import is_valid_name
from nsqx.wire.topic_meta import DEFAULT_META, TopicMeta

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.partition import Partition

log = logging.getLogger("nsqx.nsqd")

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

#: How often changed channel cursors are written (to the page cache, which survives a
#: killed process): a crash may deliver again messages finished within this window.
#: They are fsynced every --sync-timeout, for power loss.
CHECKPOINT_INTERVAL = 0.1
#: How often consumed log segments are looked for and deleted.
RECLAIM_INTERVAL = 1.0
#: The file in the data directory that keeps this node's id for nsqlookupd.
NODE_ID_FILE = "nsqd.node_id"
#: How often a drain looks whether every message in flight was answered.
DRAIN_POLL_INTERVAL = 0.02


def _saved_meta(name: str, saved: dict[str, Any] | None) -> TopicMeta:
    """A topic's meta as nsqd.dat keeps it; the defaults (and an error logged) if that
    cannot be read, so that one damaged entry does not stop nsqd."""
    try:
        return TopicMeta.from_json(saved)
    except ValueError as err:
        log.error("TOPIC(%s): unreadable settings in nsqd.dat (%s); using the defaults", name, err)
        return DEFAULT_META


def _log_failed_removal(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("STORE: could not delete a reclaimed file: %s", fut.exception())


class NSQD:
    """The nsqd daemon: owns topics and clients, runs the TCP listener and one scan
    loop that checks every channel's timers (in-flight timeouts, deferred messages) and
    every client's heartbeat in batches, every --queue-scan-interval (100ms)."""

    def __init__(self, options: NsqdOptions, worker: WorkerSpec | None = None) -> None:
        self.options = options
        #: one of several worker processes of this node (--workers), or None: the node
        self.worker = worker
        #: this worker's peers and the forwarding between them (None: a single process)
        self.workers: WorkerSet | None = None
        #: some topic may be sharded (--worker-shards, or one loaded from nsqd.dat): a
        #: SUB naming no partition then looks for a fan-in (nsqx.nsqd.fanin)
        self.sharding = False
        if worker is not None and worker.count > 1:
            self.workers = WorkerSet(self, worker)
            if self.workers.handoff is not None:
                self.workers.handoff.adopt = self._adopt_client
            self.sharding = self.workers.shards is not None
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
        #: called with the new list after PUT /config/nsqlookupd_tcp_addresses
        self.on_lookupd_addresses_changed: list[Callable[[list[str]], None]] = []
        self._statsd_task: asyncio.Task[None] | None = None
        self._gc_timed = False
        self._client_seq = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._scan_task: asyncio.Task[None] | None = None
        self._exiting = False
        self._draining = False
        #: the deregistration from nsqlookupd a drain began (close() waits for it)
        self._deregistering: asyncio.Task[None] | None = None
        #: per-read and per-iteration work: read budgets, the group commit, busy polling
        self.turn = LoopTurn(options.busy_poll)
        #: the loop's turns, timer lateness and scan rounds, for /stats and /metrics
        self.loop_monitor = LoopMonitor(self.turn)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loading = False
        self.data_path = options.data_path or os.getcwd()
        self._lock = DataDirLock(self.data_path)
        #: one per durable partition, by (topic, partition)
        self.syncers: dict[tuple[str, int], LogSyncer] = {}
        #: trace events (PUB_TRACE, /message/trace/enable), kept for /message/trace
        self.tracer = Tracer()
        self.checkpointer = Checkpointer(self)
        #: Called with every TopologyEvent (e.g. to register with nsqlookupd).
        self.watchers: list[Callable[[TopologyEvent], None]] = []
        #: Registration with --lookupd-tcp-address (set_lookupd_addresses changes them).
        self.lookup = LookupManager(self)
        #: Replicated partitions (topics with replicator > 1, led by nsqlookupd).
        self.replication = ReplicationManager(self)
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
        #: how nsqlookupd knows this node (set by start(); see _node_id)
        self.node_id = ""

    @property
    def exiting(self) -> bool:
        """True once close() began: publishing is refused from then on."""
        return self._exiting

    @property
    def draining(self) -> bool:
        """True once a drain began (SIGTERM, POST /drain): subscribed clients get no
        new messages, and nsqlookupd no longer lists this node."""
        return self._draining

    @property
    def health_error(self) -> str | None:
        """Set when storage fails to write: /ping then answers 500 "NOK - <error>";
        cleared by the next write that succeeds. (Kept by the compiled LoopTurn, which
        each partition's commit reads directly.)"""
        return self.turn.health_error

    @health_error.setter
    def health_error(self, value: str | None) -> None:
        self.turn.health_error = value

    def health(self) -> str:
        """``OK``, or ``NOK - <error>`` after a failed write (NSQ's GetHealth)."""
        if self.health_error is None:
            for (name, _), syncer in self.syncers.items():
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

    def _adopt_client(self, sock: socket.socket, state: dict[str, Any]) -> None:
        """Serve a client connection another worker moved here (its topic is ours): a
        TCP client with what it negotiated, or an HTTP one with the bytes read of it."""
        if HTTP_STATE in state:
            factory = self.http.adopted(state[HTTP_STATE])
            if factory is None:
                sock.close()  # closing: as a connection not yet accepted would be
            else:
                self.spawn(self._adopted(sock, factory))
            return
        client = ClientV2(self)
        client.adopt(state)
        self.spawn(self._adopted(sock, lambda: client))

    async def _adopted(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(factory, sock=sock)
        except OSError as err:  # closed by its client meanwhile
            log.debug("WORKERS: could not adopt a moved connection: %s", err)
            sock.close()

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    # -- topics -----------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic named ``name``, created on first use as NSQ 1.3 does: one partition
        (0), default settings."""
        topic = self.topics.get(name)
        try:
            if topic is None:
                topic = self._new_topic(name, DEFAULT_META)
                shards = self.workers.shards if self.workers is not None else None
                if shards is not None:
                    shards.made(topic)  # one shard per worker (--worker-shards)
                else:
                    topic.add_partition(0)
            elif not topic.partitions:
                topic.add_partition(0)
        except OSError as err:  # its files cannot be made: a full or read-only disk
            self.health_error = f"failed to create topic {name}: {err}"
            raise
        return topic

    def _new_topic(self, name: str, meta: TopicMeta) -> Topic:
        if not is_valid_name(name):
            raise ValueError(f"invalid topic name {name!r}")
        topic = self.topics[name] = Topic(self, name, meta)
        log.info("TOPIC(%s): created", name)
        return topic

    def create_partition(self, name: str, pid: int, meta: TopicMeta) -> Partition:
        """Host partition ``pid`` of topic ``name`` with these settings (nsqlookupd's
        placement, or /topic/create on a single node): made if missing, and the topic's
        settings updated."""
        meta.validate()
        if not 0 <= pid < meta.partition_num:
            raise ValueError(f"partition {pid} out of range 0-{meta.partition_num - 1}")
        topic = self.topics.get(name)
        if topic is None:
            topic = self._new_topic(name, meta)
        else:
            topic.set_meta(meta)
        part = topic.add_partition(pid)
        if meta.replica > 1:
            part.replicate()
        if not self._loading and not topic.ephemeral:
            self.persist_metadata()
        return part

    def find_partition(self, name: str, pid: int) -> Partition | None:
        """An existing local partition (pid -1: the topic's default one), or None."""
        topic = self.topics.get(name)
        return topic.partition(pid) if topic is not None else None

    def partition_added(self, part: Partition) -> None:
        if part.log.durable:  # only a file has something to fsync
            self.syncers[part.key] = LogSyncer(part.log)

    def partition_removed(self, part: Partition) -> None:
        self.syncers.pop(part.key, None)

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is not None:
            pids = list(topic.partitions)
            topic.delete()
            log.info("TOPIC(%s): deleted", name)
            for pid in pids:
                self.topology_changed(
                    TopologyEvent("delete", name, None, pid), persist=not topic.ephemeral
                )
            if not pids and not topic.ephemeral:
                self.persist_metadata()

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

    def metadata_changed(self) -> None:
        """PartitionHost's: nsqd.dat is written again (a failure is logged: the next
        write has it)."""
        try:
            self.persist_metadata()
        except OSError:
            log.exception("failed to persist metadata")

    def persist_metadata(self) -> None:
        """Write nsqd.dat: non-ephemeral topics and channels and their paused state, and
        a partitioned topic's settings and local partitions."""
        topics = []
        for t in self.topics.values():
            if t.ephemeral:
                continue

            def metas(channels: dict[str, Any]) -> list[ChannelMetadata]:
                return [
                    ChannelMetadata(
                        c.name, c.paused, c.ordered_flag, c.policy.changed_json(), c.replay_marks
                    )
                    for c in channels.values()
                    if not c.ephemeral
                ]

            meta = TopicMetadata(t.name, t.paused, metas(t.channels), sharded=t.sharded)
            if t.meta.partitioned or t.sharded or list(t.partitions) != [0]:
                meta.settings = t.meta.to_json()
                meta.partitions = {pid: metas(p.channels) for pid, p in t.partitions.items()}
            topics.append(meta)
        workers = self.workers
        if workers is None:
            write_metadata(self.data_path, topics, NSQ_VERSION)
            return
        # one file for the node: each worker rewrites its own partitions' entries
        with MetadataMergeLock(self.data_path):
            merged = merge_metadata(read_metadata(self.data_path), topics, workers.owns)
            write_metadata(self.data_path, merged, NSQ_VERSION)

    def load_metadata(self) -> None:
        """Recreate the topics and channels of nsqd.dat (on start)."""
        self._loading = True
        legacy: list[tuple[Channel, int]] = []
        try:
            for tm in read_metadata(self.data_path):
                if not is_valid_name(tm.name):
                    log.warning("skipping invalid topic name %r in metadata", tm.name)
                    continue
                workers = self.workers
                if workers is not None:
                    # this worker's partitions only (another worker owns the rest)
                    if tm.partitions is None:
                        if not workers.owns(tm.name, 0):
                            continue
                    else:
                        tm.partitions = {
                            pid: chans
                            for pid, chans in tm.partitions.items()
                            if workers.owns(tm.name, pid)
                        }
                        if not tm.partitions:
                            continue
                if tm.partitions is None:
                    # (not get_topic: a topic loaded is not made; whether it becomes
                    # sharded is decided once its channels and pauses are loaded,
                    # nsqx.nsqd.workers.shards)
                    topic = self._new_topic(tm.name, DEFAULT_META)
                    partitions = {0: tm.channels}
                else:
                    meta = _saved_meta(tm.name, tm.settings)
                    topic = self._new_topic(tm.name, meta)
                    topic.sharded = tm.sharded
                    self.sharding |= tm.sharded
                    partitions = tm.partitions
                for pid, channels in partitions.items():
                    part = topic.add_partition(pid)
                    for cm in channels:
                        if is_valid_name(cm.name):
                            ch = part.get_channel(cm.name)
                            ch.paused = cm.paused
                            if cm.ordered:
                                ch.set_ordered(True)
                            if cm.policy:
                                try:
                                    ch.set_policy(ChannelPolicy.from_json(cm.policy))
                                except PolicyError as err:
                                    log.warning("CHANNEL(%s): bad policy %s", cm.name, err)
                            ch.replay_marks = dict(cm.replay_marks)
                            if cm.legacy_replay_mark:
                                legacy.append((ch, cm.legacy_replay_mark))
                if tm.paused:
                    topic.pause()
            for ch, mark in legacy:  # (once every dead-letter topic is loaded)
                dead_letters.adopt_legacy_mark(self, ch, mark)
        finally:
            self._loading = False

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the data directory, restore metadata, bind the listeners, start timers."""
        log.info("%s", version_string())  # as nsqd's first line, plus compiled or not
        # a bad certificate or key stops the start, as in nsqd
        self.tls_context = build_server_context(self.options)
        opts = self.options
        opts.cluster_secret = load_secret(opts.cluster_secret, opts.cluster_secret_file)
        if self.tls_context is None and self.tls_required:
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        if self.worker is None:
            # (a worker's supervisor holds the directory and checked its format)
            makedirs_durable(self.data_path)
            self._lock.acquire()
            try:
                open_data_dir(self.data_path, "nsqx nsqd")  # a format this release reads
            except DataFormatError:
                self._lock.release()
                raise
        self.load_metadata()
        if self.workers is not None:
            await self.workers.start()
        if self.worker is not None:
            await self._listen_inherited(self.worker)
        else:
            await self._listen()
        GcPauses.install()
        self._gc_timed = True
        self.loop_monitor.start()
        self._scan_task = asyncio.create_task(self._scan_loop())
        if self.options.statsd_address:
            self._statsd_task = asyncio.create_task(statsd_loop(self))
        self.node_id = self._node_id()
        self.replication.start()
        # last, once every listener is bound: IDENTIFY announces the real ports (only
        # the lead worker connects; the others send it their topology)
        self.lookup.start()
        # the start's long-lived objects out of the collector's way (the tail: see there)
        if freeze_startup_heap():
            log.debug("GC: froze %d start-up objects", gc.get_freeze_count())

    async def _listen(self) -> None:
        """Bind the TCP, HTTP and HTTPS listeners of the options."""
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

    async def _listen_inherited(self, spec: WorkerSpec) -> None:
        """A worker listens on the sockets its supervisor bound (SO_REUSEPORT: the
        kernel spreads the node's connections over its workers)."""
        loop = asyncio.get_running_loop()
        if spec.tcp_fd >= 0:
            sock = socket.socket(fileno=spec.tcp_fd)
            server = await loop.create_server(lambda: ClientV2(self), sock=sock, backlog=1024)
            name = sock.getsockname()
            if isinstance(name, tuple):
                self.tcp_address = (name[0], name[1])
            self._servers.append(server)
        if spec.http_fd >= 0:
            self.http_address = await self.http.start_socket(
                socket.socket(fileno=spec.http_fd), node_address=True
            )
        if spec.internal_http_fd >= 0:
            await self.http.start_socket(socket.socket(fileno=spec.internal_http_fd))
        if spec.https_fd >= 0 and self.tls_context is not None:
            self.https_address = await self.http.start_socket(
                socket.socket(fileno=spec.https_fd), self.tls_context
            )

    def _node_id(self) -> str:
        """This node's id for nsqlookupd (its distributed_id): chosen at the first start
        (broadcast address and TCP port) and kept in the data directory, so that the
        partitions nsqlookupd placed here stay this node's if its port changes."""
        path = os.path.join(self.data_path, NODE_ID_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                node_id = f.read().strip()
            if node_id:
                return node_id
        except FileNotFoundError:
            pass
        port = self.tcp_address[1] if self.tcp_address else 0
        node_id = f"{self.options.broadcast_address}:{port}"
        write_durable(path, (node_id + "\n").encode())
        return node_id

    async def _scan_loop(self) -> None:
        opts = self.options
        interval = opts.queue_scan_interval
        last_checkpoint = last_reclaim = clock.monotonic()
        monitor = self.loop_monitor
        while True:
            await asyncio.sleep(interval)
            now = clock.monotonic()
            now_ns = int(now * 1_000_000_000)
            for topic in list(self.topics.values()):
                for part in list(topic.partitions.values()):
                    for channel in list(part.channels.values()):
                        channel.scan(now, now_ns)
                    part.trim()
            for client in list(self.clients):
                client.tick(now)
            for (name, _), syncer in self.syncers.items():
                owner = self.topics.get(name)
                every = owner.meta.sync_every if owner is not None else 0
                if syncer.due(every or opts.sync_every, opts.sync_timeout, now):
                    syncer.request()
            if now - last_checkpoint >= CHECKPOINT_INTERVAL:
                last_checkpoint = now
                self.checkpointer.run_round()
            if now - last_reclaim >= RECLAIM_INTERVAL:
                last_reclaim = now
                for topic in list(self.topics.values()):
                    for part in list(topic.partitions.values()):
                        part.reclaim()
            # the round is one turn of the loop: how long it held the loop
            monitor.scan_took(clock.monotonic() - now)

    def remove_later(self, path: str) -> None:
        """Unlink a file in a thread (a reclaimed 100 MB segment takes 5-30 ms to unlink:
        the event loop would stall meanwhile)."""
        loop = self._loop or asyncio.get_running_loop()
        fut = loop.run_in_executor(None, remove_file, path)
        fut.add_done_callback(_log_failed_removal)

    def sync_partitions(self, keys: set[tuple[str, int]]) -> asyncio.Future[list[None]]:
        """A future done once every write so far to these partitions is fsynced."""
        futures = [self.syncers[k].request() for k in keys if k in self.syncers]
        return asyncio.gather(*futures)

    def dead_letter(
        self,
        channel: Channel,
        frame: bytes,
        attempts: int,
        first_ns: int,
        last_ns: int,
        on_done: Callable[[BaseException | None], None],
    ) -> None:
        """Publish a message's dead letter (nsqx.nsqd.dead_letters.publish)."""
        dead_letters.publish(self, channel, frame, attempts, first_ns, last_ns, on_done)

    def acknowledged(self, keys: set[tuple[str, int]]) -> asyncio.Future[Any]:
        """The one barrier before a publish is answered: a future done once every write
        so far to these partitions is fsynced (with --sync-before-ack) and, for a
        replicated partition, held by its ISR (CommitFailed if it will not be)."""
        futures: list[asyncio.Future[None]] = []
        sync = self.options.sync_before_ack
        for key in keys:
            if sync and key in self.syncers:
                futures.append(self.syncers[key].request())
            replica = self.replication.replicas.get(key)
            if replica is not None:
                futures.append(replica.wait_commit(replica.part.log.end))
        if len(futures) == 1:
            return futures[0]  # (the usual case: no gather to make and to wait through)
        return asyncio.gather(*futures)

    # -- draining -------------------------------------------------------------------

    def start_drain(self) -> None:
        """Begin a drain, once (see docs/drain.md): leave nsqlookupd, so that consumers
        stop finding this node; stop delivering to every subscribed client and tell it
        so with CLOSE_WAIT, the answer to CLS (a client subscribing from now on gets it
        after its SUB's OK). Clients go on answering (FIN, REQ, TOUCH) what they hold;
        publishing goes on (the messages wait in the log for the restart). A drain is
        not undone: what follows is :meth:`close`."""
        if self._draining or self._exiting:
            return
        self._draining = True
        log.info(
            "NSQ: draining: %d messages in flight to consumers; no new deliveries",
            self.in_flight_count(),
        )
        self._deregistering = asyncio.get_running_loop().create_task(self.lookup.close())
        if self.workers is not None:
            self.workers.subs.drain_started()
        for client in list(self.clients):
            client.drain()

    def in_flight_count(self) -> int:
        """Messages in flight to consumers, over every channel of this process."""
        return sum(
            channel.in_flight_count
            for topic in self.topics.values()
            for part in topic.partitions.values()
            for channel in part.channels.values()
        )

    def _drain_left(self) -> int:
        """What a drain still waits for: messages in flight, and the subscriptions
        proxied to another worker, whose messages are counted there (each is waited for
        until its client closes)."""
        proxied = sum(1 for c in self.clients if c.proxied and not c.closed)
        # a consumer of every shard: what the other workers' shards may have in flight
        # to it (until they confirm none)
        shards = sum(c.remote_shards_held for c in self.clients if not c.closed)
        return self.in_flight_count() + proxied + shards

    async def drain(self, timeout: float) -> bool:
        """Drain (:meth:`start_drain`) and wait until every message in flight to a
        consumer was answered, or ``timeout`` seconds passed. True when nothing was
        left in flight; what is left is delivered again after the restart (the channel
        cursors keep it)."""
        self.start_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = self._drain_left()
            if not left:
                log.info("NSQ: drained: nothing in flight")
                return True
            if loop.time() >= deadline:
                log.warning(
                    "NSQ: drain timeout (%gs): %d messages still in flight are delivered "
                    "again after the restart",
                    timeout,
                    self.in_flight_count(),
                )
                return False
            await asyncio.sleep(DRAIN_POLL_INTERVAL)

    async def close(self) -> None:
        """Stop listening, close every client, stop the timers."""
        if self._exiting:
            return
        self._exiting = True
        self.turn.exiting = True
        if self._deregistering is not None:
            await self._deregistering
        await self.lookup.close()
        await self.replication.close()
        if self.workers is not None:
            await self.workers.close()
        for server in self._servers:
            server.close()
        await self.http.close()
        if self._statsd_task is not None:
            self._statsd_task.cancel()
        self.loop_monitor.stop()
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
        if self.worker is None:
            self._lock.release()
        if self.options.tcp_address and "/" in self.options.tcp_address:
            try:
                os.unlink(self.options.tcp_address)
            except OSError:
                pass
