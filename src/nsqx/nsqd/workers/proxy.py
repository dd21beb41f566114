"""Subscriptions to a partition another worker owns: a proxy consumer on the owner.

A SUB that arrives on a worker (the *origin*) for a partition it does not own is sent to
the owner over the link (:mod:`.links`). The owner runs the same checks and the same
subscription as for its own connections (``sub_partition`` and ``sub_channel`` of
nsqx.nsqd.client_v2) with a :class:`ProxyConsumer` in the client's place: to the channel
it is one more :class:`~nsqx.nsqd.channel.Consumer`, with the client's IDENTIFY, RDY,
msg_timeout and sample rate. The owner answers the SUB (OK, or the error to send); the
origin holds the SUB's answer, and all output after it, until then, as it holds a
forwarded publish's (a :class:`~.forwarding.Ticket`).

Deliveries are formatted on the owner as the client must see them (``client_frames``:
it has the log, for Youzan's offsets) and sent to the origin, whose connection writes
them through its TLS or compression and counts them. RDY changes, FIN, REQ and TOUCH go
to the owner; the failures of FIN, REQ and TOUCH come back as error frames. Heartbeats
stay with the connection.

Whoever goes first ends it: the connection closing unsubscribes (the owner removes the
proxy, whose messages in flight go back to the channel, as when a client disconnects);
the channel closing it (deleted, or a fatal :meth:`ProxyConsumer.fail`) makes the
origin write the error and close. A link that breaks takes all of it: the origin closes
every connection subscribed over it (the clients connect again), the owner removes every
proxy of that link.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from nsqx.nsqd import clock
from nsqx.nsqd.client_v2 import client_frames, sub_channel, sub_layout, sub_partition
from nsqx.nsqd.fanin import FanIn, Source, fanin_wanted
from nsqx.nsqd.stats import ClientStats, client_stats
from nsqx.nsqd.workers.forwarding import OK_FRAME, LinkLost, Ticket
from nsqx.wire.errors import (
    E_FIN_FAILED,
    E_REQ_FAILED,
    E_TOPIC_NOT_EXIST,
    E_TOUCH_FAILED,
    ProtocolError,
)
from nsqx.wire.frames import encode_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.client_v2 import ClientV2
    from nsqx.nsqd.workers.forwarding import WorkerSet
    from nsqx.nsqd.workers.links import Link
    from nsqx.wire import commands as cmd
    from nsqx.wire.identify import ClientSettings

log = logging.getLogger("nsqx.nsqd")

# items from the origin to the owner
SUB: Final = "sub"
SUB_RDY: Final = "sub_rdy"
SUB_FIN: Final = "sub_fin"
SUB_REQ: Final = "sub_req"
SUB_TOUCH: Final = "sub_touch"
UNSUB: Final = "unsub"
# items from the owner to the origin
SUB_ANSWER: Final = "sub_ans"
SUB_MSGS: Final = "sub_msgs"
SUB_ERROR: Final = "sub_err"
SUB_CLOSE: Final = "sub_close"
#: a shard of a fan-in (nsqx.nsqd.fanin) has messages and no room for them
SUB_WANT: Final = "sub_want"
#: a shard of a fan-in that asked for RDY has no message left (its ask no longer holds)
SUB_SATED: Final = "sub_sated"
#: a shard of a fan-in whose RDY was lowered has at most ``count`` in flight:
#: (sid, the RDY's number, count); sent at once, as its messages in flight go down,
#: and last when they are within that RDY
SUB_FREED: Final = "sub_freed"
#: the owner drains: a fan-in's shard there sends nothing more, and its worker may
#: exit once its messages in flight are answered (the connection stays)
SUB_DRAINED: Final = "sub_drained"
#: the answer's ``subscribed`` when the topic is sharded: subscribe to every shard
SHARDED: Final = "sharded"
#: how often an owner looks again at a lowered grant still above its messages in flight
#: (those that time out free it without a FIN or REQ; seconds)
FREED_CHECK = 0.05
#: a ProxyConsumer's last count reported, after a RDY: above any, so the next check
#: reports the count at once
_REPORT_NOW: Final = 1 << 62


class RemoteSub(Source):
    """The origin's side: one connection's subscription held by another worker (or,
    in a fan-in, its subscription to one shard there)."""

    def __init__(
        self,
        subs: SubProxies,
        link: Link,
        sid: int,
        client: ClientV2,
        partition: int = -1,
        fanin: FanIn | None = None,
    ) -> None:
        self.subs = subs
        self.link = link
        self.sid = sid
        self.client = client
        self.partition = partition
        self.fanin = fanin
        #: its owner drains (its worker leaving is no reason to close the connection)
        self.drained = False
        #: the SUB's answer, until it came
        self.ticket: Ticket | None = None
        self._ready = 0
        #: how many RDYs were sent: the owner's SUB_FREED names the one it answers
        self._rdy_sent = 0

    def set_grant(self, n: int) -> None:
        """A fan-in's share of the connection's RDY for this shard."""
        if n > self.grant:
            self.wanting = False
            # (a lower grant not yet confirmed still bounds what may be in flight)
            self.committed = max(self.committed, n)
        self.grant = n
        self.ready(n)

    def freed(self, rdy_number: int, count: int) -> None:
        """The owner says it has at most ``count`` messages in flight, under the RDY
        numbered ``rdy_number`` (one sent since may let it deliver more: ignored)."""
        bound = max(count, self.grant)
        if rdy_number == self._rdy_sent and bound < self.committed:
            # (the count, not only the grant once within it: a consumer that holds its
            # messages until RDY's worth arrived would otherwise wait for a timeout
            # while what it holds still counts as the old grant)
            self.committed = bound
            if self.fanin is not None:
                self.fanin.freed()

    def ready(self, n: int) -> None:
        """The client may now have ``n`` messages in flight (0: none, closing)."""
        if n != self._ready:
            self._ready = n
            self._rdy_sent += 1
            self.link.send((SUB_RDY, self.sid, n, self._rdy_sent))

    def fin(self, ids: list[bytes]) -> None:
        self.link.send((SUB_FIN, self.sid, ids))

    def req(self, msg_id: bytes, timeout_ms: int, raw_id: bytes) -> None:
        self.link.send((SUB_REQ, self.sid, msg_id, timeout_ms, raw_id))

    def touch(self, msg_id: bytes, raw_id: bytes) -> None:
        self.link.send((SUB_TOUCH, self.sid, msg_id, raw_id))

    def unsubscribe(self) -> None:
        """The connection closed (or its SUB was refused): forget the subscription."""
        subs = self.subs._remote.get(self.link)
        if subs is not None and subs.get(self.sid) is self:
            del subs[self.sid]
            self.link.send((UNSUB, self.sid))


class ProxyConsumer:
    """The owner's side: a channel's consumer that stands for a connection of another
    worker (see :class:`~nsqx.nsqd.channel.Consumer`)."""

    def __init__(
        self,
        subs: SubProxies,
        link: Link,
        sid: int,
        remote_address: str,
        settings: ClientSettings,
        msg_timeout: float,
        sample_rate: int,
        output_buffer_timeout: float,
    ) -> None:
        self.subs = subs
        self.link = link
        #: the connection's client id on its worker
        self.sid = sid
        self.id = sid
        self.remote_address = remote_address
        self.settings = settings
        self.msg_timeout = msg_timeout
        self.sample_rate = sample_rate
        self.output_buffer_timeout = output_buffer_timeout
        self.channel: Channel | None = None
        self.yz_ids = False
        self.yz_ext = False
        self.yz_detail = False
        self.rdy = 0
        self.closed = False
        #: one shard of a fan-in (nsqx.nsqd.fanin): the channel says when it starves,
        #: and under a lowered RDY it reports its messages in flight as they go down
        self.fanin = False
        self.wants_starved = False
        self._want_sent = False
        #: the number of the last RDY (the origin's), and the in-flight count last
        #: reported under it (-1: nothing to report: the RDY was not lowered, or it is met)
        self._rdy_number = 0
        self._reported = -1
        #: messages sent to the client through it
        self.message_count = 0
        #: what /stats shows of the connection (its worker's word: TLS, AUTH, ...)
        self.info: dict[str, Any] = {}

    @property
    def fans_in(self) -> bool:
        """One shard of a connection that reads them all: /stats counts the connection
        on shard 0 only."""
        return self.fanin

    def client_stats(self) -> ClientStats:
        """The connection's line in its channel's /stats, as a local client's."""
        s = self.settings
        info = self.info
        held = self.channel.held_by(self) if self.channel is not None else None
        return ClientStats(
            client_id=s.client_id,
            hostname=s.hostname,
            version="V2",
            remote_address=self.remote_address,
            state=4 if self.closed else 3,  # (Go's stateClosing, stateSubscribed)
            ready_count=self.rdy,
            in_flight_count=len(held) if held is not None else 0,
            message_count=self.message_count,
            finish_count=held.finish_count if held is not None else 0,
            requeue_count=held.requeue_count if held is not None else 0,
            connect_ts=int(info.get("connect_ts", 0)),
            sample_rate=s.sample_rate,
            deflate=s.deflate,
            snappy=s.snappy,
            user_agent=s.user_agent,
            tls=bool(info.get("tls", False)),
            tls_cipher_suite=str(info.get("tls_cipher_suite", "")),
            tls_version=str(info.get("tls_version", "")),
            tls_negotiated_protocol="",
            tls_negotiated_protocol_is_mutual=False,
            authed=bool(info.get("authed", False)),
            auth_identity=str(info.get("auth_identity", "")),
            auth_identity_url=str(info.get("auth_identity_url", "")),
        )

    def __repr__(self) -> str:
        return f"<client {self.remote_address} {self.settings.client_id!r} via worker {self.link.peer}>"

    def ready(self) -> int:
        """Its RDY as the connection last told it (0 while it cannot take any)."""
        return 0 if self.closed else self.rdy

    def send(self, frames: list[bytes], ids: list[bytes], flush: bool) -> float:
        """Format the messages for the client and send them to its worker."""
        channel = self.channel
        assert channel is not None
        frames = client_frames(channel, frames, ids, self.yz_ids, self.yz_ext, self.yz_detail)
        self.message_count += len(ids)
        self.link.send((SUB_MSGS, self.sid, b"".join(frames), len(ids), flush))
        # the connection buffers them as its own (output_buffer_timeout)
        return 0.0 if flush or self.output_buffer_timeout <= 0 else self.output_buffer_timeout

    def notice(self, frame: bytes) -> None:
        """A frame for the client it did not ask for (its channel's policy), sent now
        as messages are (a frame of no message)."""
        self.link.send((SUB_MSGS, self.sid, frame, 0, True))

    def starved(self) -> None:
        """Its channel has messages and no consumer with room (a fan-in's shard)."""
        if not self._want_sent and not self.closed:
            self._want_sent = True
            self.link.send((SUB_WANT, self.sid))

    def sated(self) -> None:
        """Its channel has no message left: an ask for RDY it sent no longer holds."""
        if self._want_sent and not self.closed:
            self._want_sent = False
            self.link.send((SUB_SATED, self.sid))

    def in_flight(self) -> int:
        held = self.channel.held_by(self) if self.channel is not None else None
        return len(held) if held is not None else 0

    def check_freed(self) -> bool:
        """Report the messages in flight under a lowered RDY each time they went down,
        the last time once within it (True: done or nothing due)."""
        reported = self._reported
        if reported < 0:
            return True
        count = self.in_flight()
        if count < reported:
            self.link.send((SUB_FREED, self.sid, self._rdy_number, count))
            self._reported = count
        if count > self.rdy:
            return False
        self._reported = -1
        return True

    def close(self) -> None:
        """The channel is gone: the connection closes."""
        if self.closed:
            return
        self.closed = True
        self.subs._forget(self)
        self.link.send((SUB_CLOSE, self.sid))

    def fail(self, err: ProtocolError) -> None:
        """Send an error now; a fatal one closes the connection (and unsubscribes)."""
        if self.closed:
            return
        self.link.send((SUB_ERROR, self.sid, encode_error(err), err.fatal))
        if err.fatal:
            self._leave()

    def _leave(self) -> None:
        """Unsubscribe: what it had in flight goes back to the channel."""
        self.closed = True
        self.subs._forget(self)
        if self.channel is not None:
            self.channel.remove_client(self)


class SubProxies:
    """Both sides of the proxied subscriptions of one worker."""

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers
        #: the origin's: subscriptions held by other workers, by link and client id
        self._remote: dict[Link, dict[int, RemoteSub]] = {}
        #: the owner's: proxies of other workers' connections, by link and client id
        self._proxies: dict[Link, dict[int, ProxyConsumer]] = {}
        #: the owner's: fan-in shards whose lowered RDY waits for messages in flight
        self._freeing: set[ProxyConsumer] = set()
        self._freeing_timer: asyncio.TimerHandle | None = None
        handlers: dict[str, Callable[[Link, tuple[Any, ...]], None]] = {
            SUB: self._on_sub,
            SUB_RDY: self._on_rdy,
            SUB_FIN: self._on_fin,
            SUB_REQ: self._on_req,
            SUB_TOUCH: self._on_touch,
            UNSUB: self._on_unsub,
            SUB_ANSWER: self._on_answer,
            SUB_MSGS: self._on_msgs,
            SUB_ERROR: self._on_error,
            SUB_CLOSE: self._on_close,
            SUB_WANT: self._on_want,
            SUB_SATED: self._on_sated,
            SUB_FREED: self._on_freed,
            SUB_DRAINED: self._on_drained,
        }
        workers.handlers.update(handlers)

    # -- the origin's side ------------------------------------------------------------

    def subscribe(
        self,
        owner: int,
        client: ClientV2,
        ev: cmd.Sub,
        slot: int,
        on_answer: Callable[[Ticket, BaseException | None], None],
        shard: int = -1,
        fanin: FanIn | None = None,
    ) -> tuple[RemoteSub, Ticket]:
        """Ask ``owner`` to subscribe ``client``; the ticket gets the SUB's answer.
        ``shard`` (a fan-in's, with ``fanin``): that shard of a sharded topic."""
        link = self.workers.links.link(owner)
        subs = self._remote.get(link)
        if subs is None:
            subs = self._remote[link] = {}
            link.on_close.append(self._owner_lost)
        # a fan-in's subscriptions have ids of their own: one per shard of the connection
        sid = client.id if shard < 0 else -((client.id << 16) | shard) - 1
        remote = RemoteSub(self, link, sid, client, shard, fanin)
        remote.ticket = Ticket(slot, on_answer)
        subs[sid] = remote
        link.send(
            (
                SUB,
                sid,
                ev,
                client.settings,
                client.sample_rate,
                client.msg_timeout,
                client.remote_address,
                client.output_buffer_timeout,
                _connection_info(client),
                shard,
            )
        )
        return remote, remote.ticket

    def _find(self, link: Link, sid: int) -> RemoteSub | None:
        subs = self._remote.get(link)
        return subs.get(sid) if subs is not None else None

    def _on_answer(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, frame, fatal, subscribed = item
        remote = self._find(link, sid)
        if remote is None or remote.ticket is None:
            return
        ticket, remote.ticket = remote.ticket, None
        if subscribed == SHARDED:
            # the topic is sharded (it was made just now): subscribe to every shard
            remote.unsubscribe()
            remote.client.remote_sharded(ticket)
            return
        if not subscribed:
            remote.unsubscribe()
            remote.client.remote_refused()
        ticket.answer = frame
        ticket.fatal = fatal
        ticket.on_answer(ticket, None)

    def _on_msgs(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, data, n, flush = item
        remote = self._find(link, sid)
        if remote is not None:
            if remote.fanin is not None:
                remote.last_delivery = clock.monotonic()
            remote.client.remote_messages(data, n, flush)

    def _on_want(self, link: Link, item: tuple[Any, ...]) -> None:
        remote = self._find(link, item[1])
        if remote is not None and remote.fanin is not None and not remote.wanting:
            remote.fanin.want(remote)

    def _on_sated(self, link: Link, item: tuple[Any, ...]) -> None:
        remote = self._find(link, item[1])
        if remote is not None and remote.fanin is not None and remote.wanting:
            remote.wanting = False
            remote.fanin.freed()  # (the RDY it holds may go to a shard that asks)

    def _on_drained(self, link: Link, item: tuple[Any, ...]) -> None:
        remote = self._find(link, item[1])
        if remote is not None:
            remote.drained = True

    def drain_started(self) -> None:
        """This worker drains: tell each fan-in's connection that its shard here
        stops (so that this worker leaving, once drained, does not close it)."""
        for link, proxies in self._proxies.items():
            for proxy in proxies.values():
                if proxy.fanin and not proxy.closed:
                    link.send((SUB_DRAINED, proxy.sid))

    def _on_freed(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, number, count = item
        remote = self._find(link, sid)
        if remote is not None:
            remote.freed(number, count)

    def _on_error(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, frame, fatal = item
        remote = self._find(link, sid)
        if remote is not None:
            if fatal:
                remote.unsubscribe()  # (the owner removed it already)
            remote.client.remote_error(frame, fatal)

    def _on_close(self, link: Link, item: tuple[Any, ...]) -> None:
        remote = self._find(link, item[1])
        if remote is not None:
            remote.unsubscribe()
            remote.client.close()

    def _owner_lost(self, link: Link) -> None:
        """The owner's worker went away: every connection subscribed there closes (its
        client connects again, and finds the owner once it is back)."""
        subs = self._remote.pop(link, None)
        if not subs:
            return
        log.error(
            "WORKERS: worker %d went away: closing %d connections subscribed there",
            link.peer,
            len(subs),
        )
        err = LinkLost(f"worker {link.peer} went away")
        draining = self.workers.nsqd.draining
        for remote in list(subs.values()):
            if remote.fanin is not None and remote.ticket is None and (draining or remote.drained):
                # the node stops, and that worker drained first: the connection keeps
                # its other shards (this one's messages were answered, or go back)
                remote.fanin.drop(remote)
                continue
            ticket, remote.ticket = remote.ticket, None
            if ticket is not None:
                ticket.on_answer(ticket, err)  # the connection closes unanswered
            else:
                remote.client.close()

    # -- the owner's side -------------------------------------------------------------

    def _on_sub(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, ev, settings, sample_rate, msg_timeout, remote_address, obt, info, shard = item
        nsqd = self.workers.nsqd
        shards = self.workers.shards
        proxy: ProxyConsumer | None = None
        try:
            if shard >= 0:
                # one shard of a fan-in: that partition, with an NSQ 1.3 client's layout
                # (a fan-in's SUB says the topic is sharded: its word to this worker
                # may come later, on another link)
                if shards is None or shards.learned(ev.topic) is None:
                    raise ProtocolError(E_TOPIC_NOT_EXIST, "")
                target = ev._replace(partition=shard)
            else:
                target = ev
                if shards is not None and fanin_wanted(ev, settings):
                    topic = nsqd.topics.get(ev.topic) or nsqd.get_topic(ev.topic)
                    if topic.sharded:
                        # (its worker heard nothing of it yet; now it has)
                        link.send((SUB_ANSWER, sid, OK_FRAME, False, SHARDED))
                        return
            part, settings = sub_partition(nsqd, target, settings, sample_rate)
            if not self.workers.owns(ev.topic, part.id):
                raise ProtocolError(E_TOPIC_NOT_EXIST, "")
            proxy = ProxyConsumer(
                self, link, sid, remote_address, settings, msg_timeout, sample_rate, obt
            )
            proxy.info = info
            proxy.yz_ids, proxy.yz_ext, proxy.yz_detail = sub_layout(ev, settings, part)
            proxy.fanin = proxy.wants_starved = shard >= 0
            channel, late = sub_channel(nsqd, target, part, proxy)
        except ProtocolError as err:
            link.send((SUB_ANSWER, sid, encode_error(err), err.fatal, False))
            return
        except OSError as err:  # a topic's files cannot be made (a full or read-only disk)
            err2 = ProtocolError("E_SUB_FAILED", f"SUB failed {err}")
            link.send((SUB_ANSWER, sid, encode_error(err2), True, False))
            return
        proxy.channel = channel
        proxies = self._proxies.get(link)
        if proxies is None:
            proxies = self._proxies[link] = {}
            link.on_close.append(self._origin_lost)
        proxies[sid] = proxy
        if proxy.fanin:
            channel.notify()  # (messages waiting and no RDY yet: it asks for some)
        if late is not None:
            link.send((SUB_ANSWER, sid, encode_error(late), late.fatal, True))
        else:
            link.send((SUB_ANSWER, sid, OK_FRAME, False, True))

    def _proxy(self, link: Link, sid: int) -> ProxyConsumer | None:
        proxies = self._proxies.get(link)
        return proxies.get(sid) if proxies is not None else None

    def _forget(self, proxy: ProxyConsumer) -> None:
        self._freeing.discard(proxy)
        proxies = self._proxies.get(proxy.link)
        if proxies is not None and proxies.get(proxy.sid) is proxy:
            del proxies[proxy.sid]

    def _on_rdy(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, n, number = item
        proxy = self._proxy(link, sid)
        if proxy is not None and proxy.channel is not None:
            proxy.rdy = n
            proxy.channel.ready_changed(proxy, proxy.ready())
            if proxy.fanin:
                proxy._want_sent = False
                proxy._rdy_number = number
                proxy._reported = _REPORT_NOW
                proxy.channel.notify()  # (with no room and messages, it asks again)
                if not proxy.check_freed():
                    self._freeing.add(proxy)
                    self._arm_freeing()

    def _arm_freeing(self) -> None:
        if self._freeing_timer is None:
            loop = asyncio.get_running_loop()
            self._freeing_timer = loop.call_later(FREED_CHECK, self._check_freeing)

    def _check_freeing(self) -> None:
        self._freeing_timer = None
        for proxy in list(self._freeing):
            if proxy.closed or proxy.check_freed():
                self._freeing.discard(proxy)
        if self._freeing:
            self._arm_freeing()

    def _answered(self, proxy: ProxyConsumer) -> None:
        """A FIN or REQ of a fan-in's shard: a lowered RDY may be met now."""
        if proxy in self._freeing and proxy.check_freed():
            self._freeing.discard(proxy)

    def _on_fin(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, ids = item
        proxy = self._proxy(link, sid)
        if proxy is None or proxy.channel is None:
            return  # gone: its connection closes (or closed)
        for mid, reason in proxy.channel.finish(proxy, ids):
            err = ProtocolError(E_FIN_FAILED, f"FIN {mid.decode('latin-1')} failed {reason}")
            proxy.fail(err)
        if proxy.fanin:
            self._answered(proxy)

    def _on_req(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, mid, timeout_ms, raw_id = item
        proxy = self._proxy(link, sid)
        if proxy is None or proxy.channel is None:
            return
        reason = proxy.channel.requeue(proxy, mid, timeout_ms)
        if reason:
            proxy.fail(
                ProtocolError(E_REQ_FAILED, f"REQ {raw_id.decode('latin-1')} failed {reason}")
            )
        if proxy.fanin:
            self._answered(proxy)

    def _on_touch(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, mid, raw_id = item
        proxy = self._proxy(link, sid)
        if proxy is None or proxy.channel is None:
            return
        reason = proxy.channel.touch(proxy, mid, self.workers.nsqd.options.max_msg_timeout)
        if reason:
            proxy.fail(
                ProtocolError(E_TOUCH_FAILED, f"TOUCH {raw_id.decode('latin-1')} failed {reason}")
            )

    def _on_unsub(self, link: Link, item: tuple[Any, ...]) -> None:
        proxy = self._proxy(link, item[1])
        if proxy is not None:
            proxy._leave()

    def _origin_lost(self, link: Link) -> None:
        """The origin's worker went away: its connections are gone, and so are their
        subscriptions (their messages in flight go back to their channels)."""
        proxies = self._proxies.pop(link, None)
        for proxy in list((proxies or {}).values()):
            proxy._leave()


def _connection_info(client: ClientV2) -> dict[str, Any]:
    """What the owner's /stats shows of a proxied connection that only its own worker
    knows (its TLS session, its AUTH, when it connected)."""
    stats = client_stats(client)
    return {
        "connect_ts": stats.connect_ts,
        "tls": stats.tls,
        "tls_cipher_suite": stats.tls_cipher_suite,
        "tls_version": stats.tls_version,
        "authed": stats.authed,
        "auth_identity": stats.auth_identity,
        "auth_identity_url": stats.auth_identity_url,
    }
