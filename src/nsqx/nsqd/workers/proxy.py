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

import logging
from typing import TYPE_CHECKING, Any, Final

from nsqx.nsqd.client_v2 import client_frames, sub_channel, sub_layout, sub_partition
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


class RemoteSub:
    """The origin's side: one connection's subscription held by another worker."""

    __slots__ = ("_ready", "client", "link", "sid", "subs", "ticket")

    def __init__(self, subs: SubProxies, link: Link, sid: int, client: ClientV2) -> None:
        self.subs = subs
        self.link = link
        self.sid = sid
        self.client = client
        #: the SUB's answer, until it came
        self.ticket: Ticket | None = None
        self._ready = 0

    def ready(self, n: int) -> None:
        """The client may now have ``n`` messages in flight (0: none, closing)."""
        if n != self._ready:
            self._ready = n
            self.link.send((SUB_RDY, self.sid, n))

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
        #: messages sent to the client through it
        self.message_count = 0
        #: what /stats shows of the connection (its worker's word: TLS, AUTH, ...)
        self.info: dict[str, Any] = {}

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
    ) -> tuple[RemoteSub, Ticket]:
        """Ask ``owner`` to subscribe ``client``; the ticket gets the SUB's answer."""
        link = self.workers.links.link(owner)
        subs = self._remote.get(link)
        if subs is None:
            subs = self._remote[link] = {}
            link.on_close.append(self._owner_lost)
        remote = RemoteSub(self, link, client.id, client)
        remote.ticket = Ticket(slot, on_answer)
        subs[client.id] = remote
        link.send(
            (
                SUB,
                client.id,
                ev,
                client.settings,
                client.sample_rate,
                client.msg_timeout,
                client.remote_address,
                client.output_buffer_timeout,
                _connection_info(client),
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
            remote.client.remote_messages(data, n, flush)

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
        for remote in list(subs.values()):
            ticket, remote.ticket = remote.ticket, None
            if ticket is not None:
                ticket.on_answer(ticket, err)  # the connection closes unanswered
            else:
                remote.client.close()

    # -- the owner's side -------------------------------------------------------------

    def _on_sub(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, ev, settings, sample_rate, msg_timeout, remote_address, obt, info = item
        nsqd = self.workers.nsqd
        proxy: ProxyConsumer | None = None
        try:
            part, settings = sub_partition(nsqd, ev, settings, sample_rate)
            if not self.workers.owns(ev.topic, part.id):
                raise ProtocolError(E_TOPIC_NOT_EXIST, "")
            proxy = ProxyConsumer(
                self, link, sid, remote_address, settings, msg_timeout, sample_rate, obt
            )
            proxy.info = info
            proxy.yz_ids, proxy.yz_ext, proxy.yz_detail = sub_layout(ev, settings, part)
            channel, late = sub_channel(nsqd, ev, part, proxy)
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
        if late is not None:
            link.send((SUB_ANSWER, sid, encode_error(late), late.fatal, True))
        else:
            link.send((SUB_ANSWER, sid, OK_FRAME, False, True))

    def _proxy(self, link: Link, sid: int) -> ProxyConsumer | None:
        proxies = self._proxies.get(link)
        return proxies.get(sid) if proxies is not None else None

    def _forget(self, proxy: ProxyConsumer) -> None:
        proxies = self._proxies.get(proxy.link)
        if proxies is not None and proxies.get(proxy.sid) is proxy:
            del proxies[proxy.sid]

    def _on_rdy(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, n = item
        proxy = self._proxy(link, sid)
        if proxy is not None and proxy.channel is not None:
            proxy.rdy = n
            proxy.channel.ready_changed(proxy, proxy.ready())

    def _on_fin(self, link: Link, item: tuple[Any, ...]) -> None:
        _, sid, ids = item
        proxy = self._proxy(link, sid)
        if proxy is None or proxy.channel is None:
            return  # gone: its connection closes (or closed)
        for mid, reason in proxy.channel.finish(proxy, ids):
            err = ProtocolError(E_FIN_FAILED, f"FIN {mid.decode('latin-1')} failed {reason}")
            proxy.fail(err)

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
