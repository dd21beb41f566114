"""Registration with nsqlookupd: nsqd tells every configured lookupd what it has.

For each ``--lookupd-tcp-address`` a :class:`LookupPeer` keeps one connection (protocol
V1, codec in :mod:`nsqx.wire.lookupd`): it sends IDENTIFY, then REGISTER for every
channel (a bare topic REGISTER for a topic without channels), then follows nsqd's
topology events (REGISTER on create, UNREGISTER on delete) and PINGs every 15 s. When
the connection drops (a lookupd restart), it reconnects with backoff and registers
everything again; commands for a disconnected lookupd are not queued, because the full
registration sent on reconnect already includes their effect.

:class:`LookupManager` owns the peers, follows ``nsqd.watchers`` and, like NSQ, asks the
lookupds for the channels of each new topic (``GET /channels``) so that those channels
exist, and receive messages, before any consumer subscribes.

A node of several worker processes (``--workers``) is one node to nsqlookupd: only the
lead worker connects, and registers the union of every worker's partitions and channels,
which the others send it over their links (nsqx.nsqd.workers.topology). A worker that
dies keeps its registrations (as a topic a Go nsqd holds stays registered while it is
busy): the worker restarted sends what it hosts again, and only what it no longer has is
unregistered. The lead passes on to the other workers what they need of nsqlookupd: its
HTTP addresses, node timeout and the lease (their LookupManager answers from that).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from nsqx import NSQ_VERSION
from nsqx.nsqd.events import TopologyEvent
from nsqx.nsqd.workers.topology import (
    LEASE,
    NODE_STATE,
    TOPO,
    TOPO_SYNC,
    LeadLink,
    NodeState,
    item_event,
)
from nsqx.wire.errors import ProtocolError
from nsqx.wire.lookupd import (
    MAGIC_V1,
    OK,
    LookupdInfo,
    PeerInfo,
    ReplyDecoder,
    encode_identify,
    encode_ping,
    encode_register,
    encode_unregister,
    is_error_reply,
    parse_identify_reply,
)
from nsqx.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.partition import Partition
    from nsqx.nsqd.workers.links import Link

log = logging.getLogger("nsqx.nsqd")

#: nsqd heartbeats every lookupd this often (NSQ's fixed 15 s).
PING_INTERVAL = 15.0
#: Go nsqd dials lookupd with a 1 s timeout.
CONNECT_TIMEOUT = 1.0
#: A lookupd that leaves a command unanswered this long is treated as gone.
REPLY_TIMEOUT = 5.0
#: Reconnection backoff: doubles from MIN to MAX (MAX: NSQ's retry cadence, one PING).
BACKOFF_MIN = 0.1
BACKOFF_MAX = PING_INTERVAL
#: Used as the announced HTTP port when nsqd has none (lookupd refuses 0); NSQ's default.
FALLBACK_HTTP_PORT = 4151


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"lookupd address {address!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def _port_of(address: object) -> int:
    """The port of a bound ``(host, port)`` tuple, else 0."""
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1]
    return 0


def _configured_port(address: str) -> int:
    try:
        return _split(address)[1] if address and "/" not in address else 0
    except ValueError:
        return 0


class LookupPeer:
    """One nsqlookupd: a task that connects, registers, follows and reconnects."""

    def __init__(self, manager: LookupManager, address: str) -> None:
        self.manager = manager
        self.address = address
        #: lookupd's answer to IDENTIFY, while connected.
        self.info: LookupdInfo | None = None
        # replies and EOF from the reader; commands from send() once identified
        self._inbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._identified = False
        self._closed = False
        self._task = asyncio.create_task(self._run(), name=f"lookupd-peer {address}")

    def __str__(self) -> str:
        return self.address

    @property
    def connected(self) -> bool:
        """True once IDENTIFY was answered on the current connection."""
        return self._identified

    @property
    def partitioned(self) -> bool:
        """Whether this lookupd reads partitions in REGISTER (nsqx's or Youzan's)."""
        return self.info is not None and self.info.speaks_partitions

    def send(self, command: bytes) -> None:
        """Send a command if connected; otherwise it is covered by the next registration."""
        if self._identified:
            self._inbox.put_nowait(("cmd", command))

    async def close(self) -> None:
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    # -- the connection loop ------------------------------------------------------------

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        quiet = False  # after one logged failure, repeats are logged at debug level
        while not self._closed:
            writer: asyncio.StreamWriter | None = None
            was_identified = False
            try:
                host, port = _split(self.address)
                async with asyncio.timeout(CONNECT_TIMEOUT):  # (not wait_for: see _serve)
                    reader, conn = await asyncio.open_connection(host, port)
                writer = conn
                await self._session(reader, conn)
            except (OSError, TimeoutError, ProtocolError, ValueError, ConnectionError) as err:
                level = logging.DEBUG if quiet else logging.ERROR
                log.log(level, "LOOKUPD(%s): %s", self, err or type(err).__name__)
                quiet = True
            finally:
                was_identified = self._identified
                self._identified = False
                self.info = None
                self._inbox = asyncio.Queue()
                self.manager.state_changed()
                if writer is not None:
                    writer.close()
            if was_identified:
                backoff = BACKOFF_MIN
                quiet = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inbox = self._inbox
        read_task = asyncio.create_task(self._read_loop(reader, inbox))
        try:
            writer.write(MAGIC_V1 + encode_identify(self.manager.peer_info()))
            async with asyncio.timeout(REPLY_TIMEOUT):
                kind, reply = await inbox.get()
            if kind != "reply":
                raise ConnectionError("connection closed during IDENTIFY")
            if is_error_reply(reply):
                raise ConnectionError(f"IDENTIFY refused: {reply.decode(errors='replace')}")
            self.info = parse_identify_reply(reply)
            log.info("LOOKUPD(%s): peer info %s", self, self.info)
            self.manager.state_changed()
            if not self.info.broadcast_address:
                log.error("LOOKUPD(%s): no broadcast address", self)
            # from here on topology events reach the inbox; the snapshot taken in the
            # same step (no await in between) covers everything before
            self._identified = True
            await self._serve(writer, inbox, self.manager.registration_commands(self.partitioned))
        finally:
            read_task.cancel()

    async def _read_loop(
        self, reader: asyncio.StreamReader, inbox: asyncio.Queue[tuple[str, bytes]]
    ) -> None:
        decoder = ReplyDecoder(self.manager.nsqd.options.max_body_size)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for reply in decoder.feed(data):
                    inbox.put_nowait(("reply", reply))
        except (OSError, ProtocolError) as err:
            log.debug("LOOKUPD(%s): read failed: %s", self, err)
        inbox.put_nowait(("eof", b""))

    async def _serve(
        self,
        writer: asyncio.StreamWriter,
        inbox: asyncio.Queue[tuple[str, bytes]],
        commands: list[bytes],
    ) -> None:
        """Write commands in batches, match replies to them in order, PING every 15 s
        (or as often as a partition-aware nsqlookupd asks: its answers are the lease
        that lets this node's partition leaders acknowledge writes)."""
        loop = asyncio.get_running_loop()
        info = self.info
        interval = PING_INTERVAL
        lease = 0.0
        reply_timeout = REPLY_TIMEOUT
        if info is not None and info.partitions and info.heartbeat_interval_ms > 0:
            interval = info.heartbeat_interval_ms / 1000
            lease = info.lease_ms / 1000
            if info.node_timeout_ms > 0:
                # a silent nsqlookupd is left as soon as it would judge this node lost
                reply_timeout = info.node_timeout_ms / 1000
        if lease > 0:
            # from now on a leader acknowledges only within a lease
            self.manager.nsqd.replication.lease.required = True
            self.manager.state_changed()
        # commands awaiting their reply, oldest first, with when each was written
        sent: deque[tuple[bytes, float]] = deque()
        # a lease-granting lookupd is PINGed at once: the lease starts with registration
        next_ping = loop.time() + (interval if lease <= 0 else 0.0)
        reply_deadline = 0.0
        ping = encode_ping()
        while True:
            if commands:
                for cmd in commands:
                    if cmd is not ping:
                        log.debug("LOOKUPD(%s): %s", self, cmd.rstrip(b"\n").decode())
                now = loop.time()
                if not sent:
                    reply_deadline = now + reply_timeout
                # (the lease counts from before the write, on the clock leaders check)
                at = time.monotonic()
                writer.write(b"".join(commands))
                sent.extend((cmd, at) for cmd in commands)
                commands = []
                await writer.drain()
            now = loop.time()
            if now >= next_ping:
                commands.append(ping)
                next_ping = now + interval
                continue
            if sent and now >= reply_deadline:
                raise TimeoutError(f"no reply to {sent[0][0]!r} within {reply_timeout:g}s")
            timeout = min(next_ping, reply_deadline) - now if sent else next_ping - now
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation that races with the queue's answer, and close() then waits
            # for this loop for ever
            try:
                async with asyncio.timeout(timeout):
                    item = await inbox.get()
            except TimeoutError:
                continue
            items = [item]
            while not inbox.empty():
                items.append(inbox.get_nowait())
            for kind, data in items:
                if kind == "eof":
                    raise ConnectionError("connection closed by lookupd")
                if kind == "cmd":
                    commands.append(data)
                    continue
                cmd, at = sent.popleft() if sent else (b"?", 0.0)
                reply_deadline = loop.time() + reply_timeout
                if cmd is ping:
                    if lease > 0 and data == OK:
                        self.manager.lease_granted(at, lease)
                    elif data != OK:
                        log.debug("LOOKUPD(%s): PING - %s", self, data.decode(errors="replace"))
                    continue
                if is_error_reply(data):
                    log.error(
                        "LOOKUPD(%s): %s - %s",
                        self,
                        cmd.rstrip(b"\n").decode(errors="replace"),
                        data.decode(errors="replace"),
                    )


class LookupManager:
    """Registers this nsqd with every configured nsqlookupd and keeps it registered."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.peers: dict[str, LookupPeer] = {}
        #: What lookupds were told: topic -> partition -> its channels (to unregister
        #: them with it).
        self._registered: dict[str, dict[int, dict[str, None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: Any = None  # aiohttp.ClientSession, created on first use
        self._started = False
        # -- a node of several workers (nsqx.nsqd.workers.topology) --
        #: the lead's: each other worker's partitions and their channels, by worker
        self._remote: dict[int, dict[str, dict[int, dict[str, None]]]] = {}
        #: the lead's: the link each other worker opened to it (where its state goes)
        self._followers: dict[int, Link] = {}
        self._last_grant: tuple[float, float] | None = None
        #: another worker's: its link to the lead, whose word it answers from
        self._lead_link: LeadLink | None = None
        self._precreate_pending: list[tuple[str, int]] = []
        self._leases_seen = False
        workers = nsqd.workers
        if workers is not None:
            if workers.lead:
                workers.handlers[TOPO_SYNC] = self._worker_sync
                workers.handlers[TOPO] = self._worker_event
            else:
                self._lead_link = LeadLink(
                    nsqd, workers, self._lead_state, self._lead_lease, self._lead_lost
                )

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Follow topology events and connect to the configured lookupds."""
        if self._started:
            return
        self._started = True
        if self._lead_link is not None:
            # not the lead: it registers this worker's topology; channels are still
            # pre-created here, where the topic is
            self.nsqd.watchers.append(self._precreate_on_create)
            self._lead_link.start()
            return
        self._registered = {
            name: {pid: dict.fromkeys(p.channels) for pid, p in topic.partitions.items()}
            for name, topic in self.nsqd.topics.items()
        }
        for remote in self._remote.values():
            for name, parts in remote.items():
                mine = self._registered.setdefault(name, {})
                for pid, channels in parts.items():
                    mine.setdefault(pid, {}).update(channels)
        self.nsqd.watchers.append(self._on_topology)
        # PUT /config/nsqlookupd_tcp_addresses announces new lists through this hook
        # list when the HTTP API provides it; calling set_lookupd_addresses works too
        hooks = getattr(self.nsqd, "on_lookupd_addresses_changed", None)
        if isinstance(hooks, list) and self.set_lookupd_addresses not in hooks:
            hooks.append(self.set_lookupd_addresses)
        self.set_lookupd_addresses(list(self.nsqd.options.nsqlookupd_tcp_addresses))

    async def close(self) -> None:
        """Disconnect from every lookupd (which then drops this node's registrations)."""
        if self._on_topology in self.nsqd.watchers:
            self.nsqd.watchers.remove(self._on_topology)
        if self._lead_link is not None:
            self._lead_link.close()
            if self._precreate_on_create in self.nsqd.watchers:
                self.nsqd.watchers.remove(self._precreate_on_create)
        hooks = getattr(self.nsqd, "on_lookupd_addresses_changed", None)
        if isinstance(hooks, list) and self.set_lookupd_addresses in hooks:
            hooks.remove(self.set_lookupd_addresses)
        peers = list(self.peers.values())
        self.peers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(p.close() for p in peers), *self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """Register with exactly these lookupds (TCP ``host:port``) from now on.

        New addresses are connected; peers no longer listed are closed (and so drop
        this node's registrations). For ``PUT /config/nsqlookupd_tcp_addresses``.
        """
        self.nsqd.options.nsqlookupd_tcp_addresses = list(addresses)
        if not self._started or self._lead_link is not None:
            return  # (another worker than the lead connects to no lookupd)
        for address in list(self.peers):
            if address not in addresses:
                log.info("LOOKUP(%s): removing peer", address)
                peer = self.peers.pop(address)
                self._spawn(peer.close())
        for address in addresses:
            if address not in self.peers:
                log.info("LOOKUP(%s): adding peer", address)
                self.peers[address] = LookupPeer(self, address)

    def lease_granted(self, sent: float, duration: float) -> None:
        """A lookupd answered a PING sent at ``sent`` (time.monotonic) with a lease."""
        self.nsqd.replication.lease_granted(sent, duration)
        if self.nsqd.workers is not None:
            # every worker's leaders acknowledge within the node's lease
            self._last_grant = (sent, duration)
            for link in self._followers.values():
                link.send((LEASE, sent, duration))

    def node_timeout(self) -> float:
        """The longest node timeout the connected lookupds announced (2 s if none)."""
        if self._lead_link is not None:
            state = self._lead_link.state
            return state.node_timeout if state is not None else 2.0
        timeouts = [
            p.info.node_timeout_ms / 1000
            for p in self.peers.values()
            if p.info is not None and p.info.node_timeout_ms > 0
        ]
        return max(timeouts, default=2.0)

    def lookupd_http_addresses(self) -> list[str]:
        """``host:port`` of the connected lookupds' HTTP APIs (from their IDENTIFY)."""
        if self._lead_link is not None:
            state = self._lead_link.state
            return list(state.http_addresses) if state is not None else []
        out = []
        for peer in self.peers.values():
            info = peer.info
            if info is not None and info.broadcast_address:
                host = info.broadcast_address
                if ":" in host:
                    host = f"[{host}]"
                out.append(f"{host}:{info.http_port}")
        return out

    # -- what peers send --------------------------------------------------------------

    def peer_info(self) -> PeerInfo:
        """This node's IDENTIFY: broadcast address, the real ports, version, hostname."""
        opts = self.nsqd.options
        tcp_port = (
            opts.broadcast_tcp_port
            or _port_of(self.nsqd.tcp_address)
            or _configured_port(opts.tcp_address)
        )
        # the HTTP API's bound address, once nsqd serves HTTP (an attribute set by it)
        http_port = (
            opts.broadcast_http_port
            or _port_of(getattr(self.nsqd, "http_address", None))
            or _configured_port(opts.http_address)
            or FALLBACK_HTTP_PORT
        )
        return PeerInfo(
            broadcast_address=opts.broadcast_address,
            tcp_port=tcp_port,
            http_port=http_port,
            version=NSQ_VERSION,
            hostname=socket.gethostname(),
            # says "this nsqd registers partitions" to nsqx's lookupd (Go's ignores it)
            distributed_id=getattr(self.nsqd, "node_id", "")
            or f"{opts.broadcast_address}:{tcp_port}",
            replication_address=opts.replication_address,
            # PINGs as often as nsqlookupd asks: it may judge this node by time
            liveness="heartbeat",
        )

    def registration_commands(self, partitioned: bool) -> list[bytes]:
        """Everything to register with a lookupd that just answered IDENTIFY: each
        partition and its channels (``REGISTER t p [c]``) to a partition-aware lookupd;
        to an NSQ 1.3 one, each channel of any partition or the bare topic when it has
        none (NSQ's order)."""
        commands: list[bytes] = []
        for name, topic in self.nsqd.topics.items():
            if partitioned:
                for pid, part in topic.partitions.items():
                    commands.append(encode_register(name, None, pid))
                    commands.extend(encode_register(name, ch, pid) for ch in part.channels)
                continue
            channels = topic.channel_names()
            if channels:
                commands.extend(encode_register(name, ch) for ch in channels)
            else:
                commands.append(encode_register(name))
        # the other workers' (a node of several; their partitions are not the lead's,
        # a topic of NSQ 1.3 lives in one worker: nothing is registered twice but a
        # partitioned topic's name to an NSQ 1.3 lookupd, which takes repeats)
        for remote in self._remote.values():
            for name, parts in remote.items():
                if partitioned:
                    for pid, chans in parts.items():
                        commands.append(encode_register(name, None, pid))
                        commands.extend(encode_register(name, ch, pid) for ch in chans)
                    continue
                names = list(dict.fromkeys(ch for chans in parts.values() for ch in chans))
                if names:
                    commands.extend(encode_register(name, ch) for ch in names)
                elif parts:
                    commands.append(encode_register(name))
        return commands

    def _send(self, partitioned: list[bytes], vanilla: list[bytes]) -> None:
        """Commands for partition-aware lookupds, and for NSQ 1.3 ones."""
        for peer in self.peers.values():
            for command in partitioned if peer.partitioned else vanilla:
                peer.send(command)

    # -- topology events --------------------------------------------------------------

    def _on_topology(self, event: TopologyEvent) -> None:
        # A partition-aware lookupd hears of every partition and its channels. NSQ 1.3's
        # registration names topics and channels only: a topic is registered while any
        # of its partitions is here, a channel while any partition has it.
        topic, channel, pid = event.topic, event.channel, event.partition
        parts = self._registered.setdefault(topic, {})
        if event.kind == "create":
            new_topic = not parts
            channels = parts.setdefault(pid, {})
            if channel is None:
                self._send(
                    [encode_register(topic, None, pid)],
                    [encode_register(topic)] if new_topic else [],
                )
                self._precreate_channels(topic, pid)
            elif channel not in channels:
                new_channel = not any(channel in c for c in parts.values())
                channels[channel] = None
                self._send(
                    [encode_register(topic, channel, pid)],
                    [encode_register(topic, channel)] if new_channel else [],
                )
            return
        if channel is not None:
            parts.get(pid, {}).pop(channel, None)
            gone = not any(channel in c for c in parts.values())
            self._send(
                [encode_unregister(topic, channel, pid)],
                [encode_unregister(topic, channel)] if gone else [],
            )
            return
        # NSQ's order: the topic, then each of its channels (which lets lookupd drop
        # ephemeral channel keys)
        channels = parts.pop(pid, {})
        partitioned = [encode_unregister(topic, None, pid)]
        partitioned += [encode_unregister(topic, ch, pid) for ch in channels]
        vanilla: list[bytes] = []
        if not parts:
            del self._registered[topic]
            vanilla = [encode_unregister(topic)]
            vanilla += [encode_unregister(topic, ch) for ch in channels]
        else:
            vanilla = [
                encode_unregister(topic, ch)
                for ch in channels
                if not any(ch in c for c in parts.values())
            ]
        self._send(partitioned, vanilla)

    # -- a node of several workers: the lead's side ------------------------------------

    def _worker_sync(self, link: Link, item: tuple[Any, ...]) -> None:
        """Another worker (re)connected and sent everything it hosts: register what is
        new, unregister what it no longer has (it restarted without it)."""
        _, index, snap = item
        self._followers[index] = link
        link.on_close.append(self._follower_lost)
        old = self._remote.get(index, {})
        new = {
            name: {pid: dict.fromkeys(chans) for pid, chans in parts.items()}
            for name, parts in snap.items()
        }
        self._remote[index] = new
        if self._started:
            for event in _differences(old, new):
                self._on_topology(event)
        link.send((NODE_STATE, *self.node_state()))
        if self._last_grant is not None:
            link.send((LEASE, *self._last_grant))

    def _worker_event(self, link: Link, item: tuple[Any, ...]) -> None:
        event = item_event(item)
        parts = self._remote.setdefault(item[1], {}).setdefault(event.topic, {})
        if event.kind == "create":
            channels = parts.setdefault(event.partition, {})
            if event.channel is not None:
                channels[event.channel] = None
        elif event.channel is not None:
            parts.get(event.partition, {}).pop(event.channel, None)
        else:
            parts.pop(event.partition, None)
            if not parts:
                del self._remote[item[1]][event.topic]
        if self._started:
            self._on_topology(event)

    def _follower_lost(self, link: Link) -> None:
        # its registrations stay: it is restarted, and its sync says what it still has
        for index, known in list(self._followers.items()):
            if known is link:
                del self._followers[index]

    def node_state(self) -> NodeState:
        """What the other workers need of this node's lookupds."""
        return NodeState(
            self.lookupd_http_addresses(),
            self.node_timeout(),
            self.nsqd.replication.lease.required,
        )

    def state_changed(self) -> None:
        """A lookupd (dis)connected or announced leases: tell the other workers."""
        if not self._followers:
            return
        state = self.node_state()
        for link in self._followers.values():
            link.send((NODE_STATE, *state))

    # -- a node of several workers: the others' side ----------------------------------

    def _lead_state(self, state: NodeState) -> None:
        lease = self.nsqd.replication.lease
        if state.lease_required:
            self._leases_seen = True
            lease.required = True
        elif state.http_addresses and not self._leases_seen:
            # the lead is connected to lookupds that grant no leases (older ones): as
            # in the lead, the coordinator's word is enough (held required until now)
            lease.required = False
        if state.http_addresses and self._precreate_pending:
            pending, self._precreate_pending = self._precreate_pending, []
            for name, pid in pending:
                self._precreate_channels(name, pid)

    def _lead_lease(self, sent: float, duration: float) -> None:
        self.nsqd.replication.lease_granted(sent, duration)

    def _lead_lost(self) -> None:
        self.nsqd.replication.lease_lapsed()

    def _precreate_on_create(self, event: TopologyEvent) -> None:
        if event.kind != "create" or event.channel is not None:
            return
        state = self._lead_link.state if self._lead_link is not None else None
        if state is None and self.nsqd.options.nsqlookupd_tcp_addresses:
            # the lead has not said where the lookupds are yet (both are starting)
            self._precreate_pending.append((event.topic, event.partition))
            return
        self._precreate_channels(event.topic, event.partition)

    # -- pre-creating channels ----------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _precreate_channels(self, name: str, pid: int = 0) -> None:
        """Create the channels lookupd knows for a new topic partition (as NSQ's
        GetTopic does for a new topic).

        NSQ blocks topic creation on this query; here it runs in the background, and the
        channels start at the topic's first message, so they get what was published in
        the meantime (unless a subscriber already consumed it and the log was trimmed).
        """
        topic = self.nsqd.topics.get(name)
        if topic is None or topic.ephemeral or not self.nsqd.options.nsqlookupd_tcp_addresses:
            return
        part = topic.partitions.get(pid)
        if part is None:
            return
        addresses = self.lookupd_http_addresses()
        if not addresses:
            log.error(
                "no available nsqlookupd to query for channels to pre-create for topic %s", name
            )
            return
        self._spawn(self._fetch_and_create(part, part.log.end, addresses))

    async def _fetch_and_create(self, part: Partition, start: int, addresses: list[str]) -> None:
        channels = await self._lookupd_channels(part.name, addresses)
        if part.deleted or part.topic.partitions.get(part.id) is not part:
            return
        for name in channels:
            if is_ephemeral(name):
                continue  # an ephemeral channel without a consumer would be deleted anyway
            part.get_channel(name, start=max(start, part.log.start))

    async def _lookupd_channels(self, topic: str, addresses: list[str]) -> list[str]:
        import aiohttp

        opts = self.nsqd.options
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=opts.http_client_request_timeout,
                    connect=opts.http_client_connect_timeout,
                )
            )
        session: aiohttp.ClientSession = self._http

        async def query(address: str) -> list[str]:
            url = f"http://{address}/channels"
            async with session.get(
                url,
                params={"topic": topic},
                headers={"Accept": "application/vnd.nsq; version=1.0"},
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"{url}: HTTP {resp.status}")
                data = await resp.json(content_type=None)
            channels = data.get("channels") if isinstance(data, dict) else None
            if channels is None and isinstance(data, dict) and "data" in data:
                channels = (data["data"] or {}).get("channels")  # pre-1.0 envelope
            return [c for c in channels or [] if isinstance(c, str)]

        results = await asyncio.gather(*(query(a) for a in addresses), return_exceptions=True)
        found: dict[str, None] = {}
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "failed to query nsqlookupd %s for channels to pre-create for topic %s - %s",
                    address,
                    topic,
                    result,
                )
                continue
            found.update(dict.fromkeys(result))
        return list(found)


def _differences(
    old: dict[str, dict[int, dict[str, None]]], new: dict[str, dict[int, dict[str, None]]]
) -> list[TopologyEvent]:
    """The topology events that turn a worker's ``old`` partitions and channels into
    its ``new`` ones."""
    events: list[TopologyEvent] = []
    for name, parts in old.items():
        for pid, channels in parts.items():
            now = new.get(name, {}).get(pid)
            if now is None:
                events.append(TopologyEvent("delete", name, None, pid))
                continue
            events.extend(
                TopologyEvent("delete", name, ch, pid) for ch in channels if ch not in now
            )
    for name, parts in new.items():
        for pid, channels in parts.items():
            before = old.get(name, {}).get(pid)
            if before is None:
                events.append(TopologyEvent("create", name, None, pid))
                before = {}
            events.extend(
                TopologyEvent("create", name, ch, pid) for ch in channels if ch not in before
            )
    return events
