"""LookupProtocolV1: one nsqd's TCP connection to nsqlookupd.

A thin asyncio shell over :class:`nsqx.wire.lookupd.LookupParser`: the parser checks the
protocol and yields valid commands; this class applies them to the RegistrationDB and
writes the replies. When the connection closes, the peer's producers are removed from
every registration, as in NSQ.

A partition-aware peer (see :class:`~nsqx.wire.lookupd.PeerInfo`) registers partitions
(``REGISTER t p [c]``) and is told ``"partitions": true`` in the IDENTIFY reply; an NSQ
1.3 nsqd's registrations are partition 0, and its IDENTIFY reply is NSQ's, byte for
byte. The coordinator hears of identifications, registrations and disconnections, to
ask nodes for partitions they were placed on and have not registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import TYPE_CHECKING, cast

from nsqx import NSQ_VERSION
from nsqx.lookupd.registration_db import (
    CHANNEL,
    CLIENT_KEY,
    TOPIC,
    Peer,
    Producer,
    Registration,
)
from nsqx.wire.lookupd import (
    NO_LEASE,
    OK,
    Identify,
    LookupParser,
    Ping,
    ProtocolError,
    Register,
    Unregister,
    encode_error_reply,
    encode_reply,
)
from nsqx.wire.names import is_ephemeral

if TYPE_CHECKING:
    from nsqx.lookupd.nsqlookupd import NSQLookupd

log = logging.getLogger("nsqx.lookupd")


def format_address(sockname: tuple[object, ...] | str | None) -> str:
    """A socket address as Go prints it: ``1.2.3.4:5`` or ``[::1]:5``."""
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return str(sockname or "")
    host, port = str(sockname[0]), sockname[1]
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class LookupProtocolV1(asyncio.Protocol):
    """Serves the V1 protocol to one client: IDENTIFY, REGISTER, UNREGISTER, PING."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.parser = LookupParser()
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.peer: Peer | None = None
        self._loop = asyncio.get_running_loop()

    def __str__(self) -> str:
        return self.remote

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one
        self.transport = cast(asyncio.Transport, transport)
        self.remote = format_address(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lookupd.clients.add(self)
        log.info("TCP: new client(%s)", self.remote)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.last_heard = self._loop.time()
        out: list[bytes] = []
        for event in self.parser.feed(data):
            if isinstance(event, ProtocolError):
                log.error("[%s] - %s", self, event)
                out.append(encode_error_reply(event))
                self._write(out)
                self.close()
                return
            if isinstance(event, Ping):
                out.append(encode_reply(self._ping()))
            elif isinstance(event, Identify):
                out.append(encode_reply(self._identify(event)))
            elif isinstance(event, Register):
                out.append(encode_reply(self._register(event)))
            else:
                out.append(encode_reply(self._unregister(event)))
        self._write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lookupd.clients.discard(self)
        log.info("CLIENT(%s): closing", self)
        if self.peer is not None:
            self.lookupd.coordinator.peer_gone(self.peer)
            for key in self.db.remove_peer(self.peer.id):
                log.info(
                    "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                    self,
                    key.category,
                    key.key,
                    key.subkey,
                )
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def time_out(self, silent_for: float) -> None:
        """The node has been silent for the node timeout (stopped, hung, cut off): it
        no longer counts as alive, and the connection is dropped without waiting for
        its buffers to drain (they may never)."""
        peer = self.peer
        if peer is None or peer.lost:
            return
        log.warning(
            "CLIENT(%s): node %s silent for %.2fs: connection closed, node lost",
            self,
            peer.node_id,
            silent_for,
        )
        peer.lost = True
        if self.transport is not None:
            self.transport.abort()

    def _write(self, out: list[bytes]) -> None:
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    # -- commands ---------------------------------------------------------------------

    def _ping(self) -> bytes:
        peer = self.peer
        if peer is not None:
            # a PING may come before IDENTIFY; only an identified peer has a clock to refresh
            now = time.time_ns()
            log.debug(
                "CLIENT(%s): pinged (last ping %.3fs)",
                peer.id,
                (now - peer.last_update) / 1e9,
            )
            peer.last_update = now
            if peer.speaks_partitions and not self.lookupd.coordinator.can_grant_lease(
                peer.node_id
            ):
                # the PING still counts for liveness; only the lease is refused
                return NO_LEASE
        return OK

    def _identify(self, event: Identify) -> bytes:
        info = event.info
        self.peer = Peer(self.remote, info, time.time_ns(), self._loop.time())
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s%s",
            self,
            info.broadcast_address,
            info.tcp_port,
            info.http_port,
            info.version,
            f" DistributedID:{info.distributed_id}" if info.distributed_id else "",
        )
        if self.db.add_producer(CLIENT_KEY, Producer(self.peer)):
            log.info("DB: client(%s) REGISTER category:client key: subkey:", self)
        lookupd = self.lookupd
        lookupd.coordinator.peer_identified(self.peer)
        # keys sorted, as Go marshals a map
        reply: dict[str, object] = {
            "broadcast_address": lookupd.options.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": lookupd.http_port,
            "tcp_port": lookupd.tcp_port,
            "version": NSQ_VERSION,
        }
        if info.speaks_partitions:
            # only a peer that announced itself partition-aware hears of partitions: a
            # Go nsqd gets NSQ's reply exactly
            reply["partitions"] = True
            # how often to PING, the lease an answered PING grants, the node timeout
            reply.update(lookupd.coordinator.timing.identify_fields())
            reply = dict(sorted(reply.items()))
        return json.dumps(reply, separators=(",", ":")).encode()

    def _register(self, event: Register) -> bytes:
        assert self.peer is not None  # the parser refuses REGISTER before IDENTIFY
        topic, channel = event.topic, event.channel
        # NSQ's form (no partition) is partition 0
        partition = event.partition or 0
        if channel is not None:
            self._add(Registration(CHANNEL, topic, channel), partition)
        self._add(Registration(TOPIC, topic, ""), partition)
        self.lookupd.coordinator.peer_registered(self.peer, topic, partition, channel)
        return OK

    def _add(self, key: Registration, partition: int) -> None:
        assert self.peer is not None
        if self.db.add_producer(key, Producer(self.peer, partition)):
            log.info(
                "DB: client(%s) REGISTER category:%s key:%s subkey:%s%s",
                self,
                key.category,
                key.key,
                key.subkey,
                self._partition_text(partition),
            )

    def _partition_text(self, partition: int) -> str:
        assert self.peer is not None
        return f" partition:{partition}" if self.peer.speaks_partitions else ""

    def _unregister(self, event: Unregister) -> bytes:
        assert self.peer is not None
        peer_id = self.peer.id
        db = self.db
        topic, channel = event.topic, event.channel
        partition = event.partition or 0
        ptext = self._partition_text(partition)
        if channel is not None:
            key = Registration(CHANNEL, topic, channel)
            removed, left = db.remove_producer(key, peer_id, partition)
            if removed:
                log.info(
                    "DB: client(%s) UNREGISTER category:channel key:%s subkey:%s%s",
                    self,
                    topic,
                    channel,
                    ptext,
                )
            # an ephemeral channel goes away with its last producer
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(key)
            return OK
        # a topic unregistration takes this peer off the topic's channels too; nsqd
        # normally unregisters those first, hence NSQ's warning when something goes
        for ch in db.find_registrations(CHANNEL, topic, "*"):
            removed, _ = db.remove_producer(ch, peer_id, partition)
            if removed:
                log.warning(
                    "client(%s) unexpected UNREGISTER category:channel key:%s subkey:%s%s",
                    self,
                    topic,
                    ch.subkey,
                    ptext,
                )
        key = Registration(TOPIC, topic, "")
        removed, left = db.remove_producer(key, peer_id, partition)
        if removed:
            log.info(
                "DB: client(%s) UNREGISTER category:topic key:%s subkey:%s", self, topic, ptext
            )
        if left == 0 and is_ephemeral(topic):
            db.remove_registration(key)
        return OK
