"""ClusterInfo: what nsqadmin and the tools learn about a cluster, over HTTP only.

The cluster is reached the way NSQ's nsqadmin reaches it: through nsqlookupd
(``/nodes``, ``/topics``, ``/lookup``) or, without lookupd, through a fixed list of
nsqd (``/info``, ``/stats``); every number comes from nsqd's ``/stats?format=json``.
Nothing here imports nsqd's code: any NSQ 1.3 nsqd and nsqlookupd will do.

Calls fan out concurrently. As in NSQ, a call that some servers answered returns what
they said plus the errors of the others (:class:`Partial`); a call that no server
answered raises :class:`UpstreamError`.

With a ``node_timeout`` (nsqadmin's pages), a read waits that long for each server and
no longer: one that did not answer in time, or could not be reached, is remembered as
not answering (:class:`NodeHealth`). A background probe of its ``/ping`` asks it again
(after 1 s, then 2, 4, ... up to :data:`MAX_BACKOFF`), and a page that needs it asks it
itself once the last try is :data:`REPROBE_AFTER` old (within ``node_timeout`` again),
so that a node that starts after the admin, or comes back, shows at the next page;
meanwhile the pages skip it. Without one (the command-line tools), every call waits for
the session's own timeouts, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp

from nsqx.clusterinfo import aggregate

log = logging.getLogger("nsqx.clusterinfo")

__all__ = [
    "MAX_BACKOFF",
    "REPROBE_AFTER",
    "ClusterInfo",
    "Down",
    "NodeHealth",
    "Partial",
    "Producer",
    "UpstreamError",
    "http_base",
]

T = TypeVar("T")


#: the longest a server that does not answer waits for its next probe, in seconds
MAX_BACKOFF = 15.0
#: the first wait before a probe, in seconds (doubled after each failed probe)
FIRST_BACKOFF = 1.0
#: a page asks a server that is not answering itself once its last try is this old
REPROBE_AFTER = 1.0


class UpstreamError(Exception):
    """No server answered (or the one asked refused): the message says which and why.

    ``unreachable``: the server did not answer at all (cannot connect, timed out, or
    skipped because it was not answering), as opposed to answering with an error.
    """

    def __init__(self, message: str, unreachable: bool = False, skipped: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable or skipped
        #: not asked at all: known not to answer (see NodeHealth)
        self.skipped = skipped
        #: for a call that no server answered: each one's error
        self.partial: Partial | None = None


@dataclass
class Down:
    """A server that did not answer: why, since when, and when it is probed next."""

    address: str
    error: str
    #: Unix time of the first failure in a row
    since: float
    failures: int = 1
    #: loop time (monotonic) of the next probe
    retry_at: float = 0.0
    #: loop time (monotonic) of the last try, by a page or a probe
    tried_at: float = 0.0
    #: how many page reads skipped it since it went down
    skipped: int = 0

    def to_json(self, node: str = "", hostname: str = "", skipped: bool = False) -> dict[str, Any]:
        return {
            "node": node or self.address,
            "hostname": hostname,
            "error": self.error,
            "since": self.since,
            "failures": self.failures,
            "skipped": skipped,
        }


class NodeHealth:
    """Which servers are not answering, with a doubling delay between probes.

    No I/O: :class:`ClusterInfo` reports what happened and probes; the clocks are
    arguments so that tests can drive it.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        first_backoff: float = FIRST_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        reprobe_after: float = REPROBE_AFTER,
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.reprobe_after = reprobe_after
        self._down: dict[str, Down] = {}

    def get(self, address: str) -> Down | None:
        return self._down.get(address)

    def down(self) -> dict[str, Down]:
        return dict(self._down)

    def failed(self, address: str, error: str) -> tuple[Down, bool]:
        """Record a failure: (the record, whether the server was answering until now)."""
        known = self._down.get(address)
        now = self.clock()
        if known is None:
            down = self._down[address] = Down(address, error, self.wall())
            down.retry_at = now + self.first_backoff
            down.tried_at = now
            return down, True
        known.failures += 1
        known.error = error
        delay = min(self.max_backoff, self.first_backoff * 2 ** (known.failures - 1))
        known.retry_at = now + delay
        known.tried_at = max(known.tried_at, now)
        return known, False

    def answered(self, address: str) -> bool:
        """Record an answer: True if the server was down until now."""
        return self._down.pop(address, None) is not None

    def skip(self, address: str) -> Down | None:
        """The record of a server that pages should not ask now (counted), else None:
        None too for a server not answering whose last try is ``reprobe_after`` old,
        which the caller then asks (the try is recorded now: the pages that want it
        meanwhile skip it rather than each waiting for it)."""
        down = self._down.get(address)
        if down is None:
            return None
        now = self.clock()
        if now - down.tried_at >= self.reprobe_after:
            down.tried_at = now
            return None
        down.skipped += 1
        return down


@dataclass
class Partial:
    """The errors of the servers that did not answer a call others answered.

    ``down``: those that did not answer at all, as :meth:`Down.to_json` (``node``,
    ``hostname``, ``error``, ``since``, ``skipped``: not asked, known not to answer).
    """

    errors: list[str] = field(default_factory=list)
    down: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Partial | list[str]) -> None:
        if isinstance(other, Partial):
            self.errors.extend(other.errors)
            known = {d["node"] for d in self.down}
            self.down.extend(d for d in other.down if d["node"] not in known)
        else:
            self.errors.extend(other)

    def message(self) -> str:
        """nsqadmin's ``message`` field: empty, or ``WARNING: ...``."""
        return "WARNING: " + "; ".join(self.errors) if self.errors else ""


@dataclass
class Producer:
    """One nsqd as nsqlookupd (or its own ``/info``) describes it."""

    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    remote_address: str = ""
    #: "lookupd address/remote address" for each lookupd that lists this nsqd
    remote_addresses: list[str] = field(default_factory=list)
    #: (topic, tombstoned) pairs
    topics: list[tuple[str, bool]] = field(default_factory=list)
    #: Youzan's partition map from a partition-aware lookupd: topic -> partitions
    partitions: dict[str, list[str]] = field(default_factory=dict)
    out_of_date: bool = False

    @property
    def http_address(self) -> str:
        """``host:port`` of its HTTP API (what nsqadmin calls a node)."""
        return _join(self.broadcast_address, self.http_port)

    @property
    def tcp_address(self) -> str:
        return _join(self.broadcast_address, self.tcp_port)

    def to_json(self) -> dict[str, Any]:
        """nsqadmin's JSON for a producer (plus ``partitions``)."""
        return {
            "remote_addresses": self.remote_addresses,
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topics": [{"topic": t, "tombstoned": ts} for t, ts in self.topics],
            "partitions": self.partitions,
            "out_of_date": self.out_of_date,
        }


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_base(address: str) -> str:
    """``http://host:port`` from ``host:port`` or a URL (a trailing ``/`` dropped)."""
    address = address.strip()
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    return "http://" + address.rstrip("/")


_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _version_key(version: str) -> tuple[int, int, int]:
    m = _VERSION_RE.match(version)
    return (int(m[1]), int(m[2]), int(m[3])) if m else (0, 0, 0)


def supports_setoffset(version: str) -> bool:
    """Whether an nsqd of this version has Youzan's ``/channel/setoffset``.

    nsqx's nsqd says ``-nsqx``; Youzan's versions carry ``HA``. NSQ 1.3 has no such
    endpoint (it answers 404).
    """
    return "nsqx" in version or "HA" in version


class ClusterInfo:
    """Reads and acts on a cluster through nsqlookupd or a list of nsqd.

    ``lookupd`` and ``nsqd`` are ``host:port`` (or URL) lists; with lookupd addresses
    the nsqd list is not used for discovery, as in nsqadmin. ``node_timeout``: how long
    a read waits for one server before it counts as not answering (None: the session's
    timeouts, and no memory of servers that did not answer).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        lookupd_http_addresses: Iterable[str] = (),
        nsqd_http_addresses: Iterable[str] = (),
        node_timeout: float | None = None,
        health: NodeHealth | None = None,
    ) -> None:
        self.session = session
        self.lookupd = list(lookupd_http_addresses)
        self.nsqd = list(nsqd_http_addresses)
        self.node_timeout = node_timeout
        self.health = health or NodeHealth()
        self._probes: dict[str, asyncio.Task[None]] = {}
        #: topic -> partition -> (node, hostname): where each partition was last seen
        #: in a node's /stats (only partitioned topics are there)
        self.placements: dict[str, dict[int, tuple[str, str]]] = {}
        #: the same from nsqlookupd (/nodes, Youzan's /lookup): a hint for where a
        #: partition was, but it lists NSQ 1.3 topics as partition 0 too
        self.lookupd_placements: dict[str, dict[int, tuple[str, str]]] = {}

    async def close(self) -> None:
        """Stop the background probes."""
        probes = list(self._probes.values())
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probes.clear()

    # -- HTTP ---------------------------------------------------------------------------

    async def get_json(self, url: str, headers: dict[str, str] | None = None) -> Any:
        """GET ``url`` and decode its JSON; UpstreamError on any failure."""
        try:
            async with self.session.get(url, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(f"GET {url}: {resp.status} {_error_text(body)}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise UpstreamError(f"GET {url}: {_describe(err)}", _unreachable(err)) from None
        try:
            return json.loads(body)
        except ValueError:
            raise UpstreamError(f"GET {url}: the answer is not JSON") from None

    async def get_text(self, url: str) -> tuple[int, str]:
        """GET ``url``: (status, body text); UpstreamError if it cannot be reached."""
        try:
            async with self.session.get(url) as resp:
                return resp.status, (await resp.read()).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise UpstreamError(f"GET {url}: {_describe(err)}", _unreachable(err)) from None

    async def post(self, url: str, data: bytes | None = None) -> Any:
        """POST to ``url``; UpstreamError unless it answers 200. Its answer's JSON (None
        when it is empty or not JSON: NSQ's actions answer plain ``OK`` too)."""
        try:
            async with self.session.post(url, data=data) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(f"POST {url}: {resp.status} {_error_text(body)}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise UpstreamError(f"POST {url}: {_describe(err)}", _unreachable(err)) from None
        try:
            return json.loads(body) if body else None
        except ValueError:
            return None

    # -- servers that do not answer ------------------------------------------------------

    async def ask(self, address: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one read of the server at ``address`` within ``node_timeout``.

        A server known not to answer is not asked (UpstreamError with ``skipped``), but
        once a second (:data:`REPROBE_AFTER`) a read asks it anyway; one that does not
        answer in time, or cannot be reached, is remembered as such and probed in the
        background until it answers again.
        """
        if self.node_timeout is None:
            return await call()
        key = http_base(address)
        down = self.health.skip(key)
        if down is not None:
            raise UpstreamError(
                f"{address}: not answering ({down.error}); asked again once a second",
                skipped=True,
            )
        task = asyncio.ensure_future(call())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.node_timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            error = f"{address}: no answer within {self.node_timeout:g} s"
            self._failed(key, error)
            raise UpstreamError(error, unreachable=True)
        try:
            result = task.result()
        except UpstreamError as err:
            if err.unreachable:
                self._failed(key, str(err))
            else:
                self._answered(key)  # it answered (with an error of its own)
            raise
        self._answered(key)
        return result

    def _failed(self, key: str, error: str) -> None:
        _, new = self.health.failed(key, error)
        if new:
            log.warning("%s does not answer (%s): asking it again in the background", key, error)
        if key not in self._probes:
            self._probes[key] = asyncio.ensure_future(self._probe(key))

    def _answered(self, key: str) -> None:
        if self.health.answered(key):
            log.info("%s answers again", key)

    async def _probe(self, key: str) -> None:
        """GET ``/ping`` of a server that does not answer, backing off, until it does."""
        try:
            while (down := self.health.get(key)) is not None:
                await asyncio.sleep(max(0.0, down.retry_at - self.health.clock()))
                current = self.health.get(key)
                if current is None:
                    return
                current.tried_at = self.health.clock()
                try:
                    async with self.session.get(f"{key}/ping") as resp:
                        await resp.read()
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                    self.health.failed(key, f"GET {key}/ping: {_describe(err)}")
                    continue
                self._answered(key)
        finally:
            if self._probes.get(key) is asyncio.current_task():
                del self._probes[key]

    def down_entry(self, err: UpstreamError, address: str, hostname: str = "") -> dict[str, Any]:
        """The ``not_answering`` entry of a server that ``err`` says did not answer."""
        down = self.health.get(http_base(address))
        if down is None:
            down = Down(address, str(err), time.time())
        return down.to_json(_node_of(address), hostname, skipped=err.skipped)

    async def _fan_out(
        self,
        items: Iterable[T],
        call: Callable[[T], Awaitable[Any]],
        what: str,
        name: Callable[[T], tuple[str, str]] | None = None,
    ) -> tuple[list[Any], Partial]:
        """Run ``call`` on every item at once: (answers, errors); all failed: raise.

        ``name(item)``: the server's (address, hostname); with it each call is a read
        within ``node_timeout`` (:meth:`ask`), and the servers that did not answer are
        listed in the Partial's ``down``.
        """
        items = list(items)

        async def one(item: T) -> Any:
            if name is None:
                return await call(item)
            return await self.ask(name(item)[0], lambda: call(item))

        results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
        answers: list[Any] = []
        partial = Partial()
        for item, result in zip(items, results, strict=True):
            if isinstance(result, UpstreamError):
                partial.errors.append(str(result))
                if result.unreachable and name is not None:
                    partial.down.append(self.down_entry(result, *name(item)))
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        if items and not answers:
            err = UpstreamError(f"failed to query any {what}: " + "; ".join(partial.errors))
            err.partial = partial
            raise err
        return answers, partial

    async def _lookupds(self, call: Callable[[str], Awaitable[Any]]) -> tuple[list[Any], Partial]:
        return await self._fan_out(self.lookupd, call, "nsqlookupd", name=lambda a: (a, ""))

    # -- discovery ----------------------------------------------------------------------

    async def lookupd_topics(self) -> tuple[list[str], Partial]:
        """The union of every lookupd's ``/topics``, sorted."""
        answers, partial = await self._lookupds(lambda a: self.get_json(f"{http_base(a)}/topics"))
        topics: set[str] = set()
        for answer in answers:
            topics.update(str(t) for t in (_dict(answer).get("topics") or []))
        return sorted(topics), partial

    async def lookupd_topic_channels(self, topic: str) -> tuple[list[str], Partial]:
        """The union of every lookupd's ``/channels?topic=``, sorted."""
        qs = urlencode({"topic": topic})
        answers, partial = await self._lookupds(
            lambda a: self.get_json(f"{http_base(a)}/channels?{qs}")
        )
        channels: set[str] = set()
        for answer in answers:
            channels.update(str(c) for c in (_dict(answer).get("channels") or []))
        return sorted(channels), partial

    async def topics(self) -> tuple[list[str], Partial]:
        """Every topic: from lookupd, or from the nsqd list's ``/stats``."""
        if self.lookupd:
            return await self.lookupd_topics()
        answers, partial = await self._fan_out(
            self.nsqd,
            lambda a: self.get_json(f"{http_base(a)}/stats?format=json&include_clients=false"),
            "nsqd",
            name=lambda a: (a, ""),
        )
        topics: set[str] = set()
        for answer in answers:
            for t in _dict(answer).get("topics") or []:
                topics.add(str(_dict(t).get("topic_name", "")))
        topics.discard("")
        return sorted(topics), partial

    async def producers(self) -> tuple[list[Producer], Partial]:
        """Every nsqd of the cluster (lookupd's ``/nodes``, or each nsqd's ``/info``)."""
        if self.lookupd:
            return await self._lookupd_producers()
        return await self._nsqd_producers(self.nsqd)

    async def _lookupd_producers(self) -> tuple[list[Producer], Partial]:
        async def nodes(addr: str) -> tuple[str, Any]:
            return addr, await self.get_json(f"{http_base(addr)}/nodes")

        answers, partial = await self._lookupds(nodes)
        by_addr: dict[str, Producer] = {}
        for addr, answer in answers:
            for raw in _dict(answer).get("producers") or []:
                p = _producer_from_lookupd(_dict(raw))
                known = by_addr.setdefault(p.tcp_address, p)
                known.remote_addresses.append(f"{addr}/{p.remote_address or 'N/A'}")
        producers = sorted(by_addr.values(), key=lambda p: (p.hostname, p.http_address))
        newest = max((_version_key(p.version) for p in producers), default=(0, 0, 0))
        for p in producers:
            p.out_of_date = _version_key(p.version) < newest
            for topic, pids in p.partitions.items():
                for pid in pids:
                    if pid.isdigit():
                        self._hint(topic, int(pid), p.http_address, p.hostname)
        return producers, partial

    async def _nsqd_producers(
        self, addresses: Iterable[str], topic: str | None = None
    ) -> tuple[list[Producer], Partial]:
        async def one(addr: str) -> Producer | None:
            base = http_base(addr)
            query = {"format": "json", "include_clients": "false"}
            if topic is not None:
                query["topic"] = topic
            stats = _dict(await self.get_json(f"{base}/stats?{urlencode(query)}"))
            names = sorted({str(_dict(t).get("topic_name", "")) for t in stats.get("topics") or []})
            if topic is not None and topic not in names:
                return None
            info = _dict(await self.get_json(f"{base}/info"))
            host, _, port = base.split("://", 1)[1].rpartition(":")
            broadcast = str(info.get("broadcast_address") or host.strip("[]"))
            http_port = _int(info.get("http_port")) or _int(port)
            return Producer(
                hostname=str(info.get("hostname") or host),
                broadcast_address=broadcast,
                tcp_port=_int(info.get("tcp_port")),
                http_port=http_port,
                version=str(info.get("version") or ""),
                topics=[(n, False) for n in names if n],
            )

        answers, partial = await self._fan_out(addresses, one, "nsqd", name=lambda a: (a, ""))
        producers = [p for p in answers if p is not None]
        return sorted(producers, key=lambda p: (p.hostname, p.http_address)), partial

    async def lookup_topic(self, topic: str) -> tuple[list[Producer], Partial, bool]:
        """(producers, errors, known): the nsqd that have ``topic``, and whether any
        server knows the topic at all (a lookupd's answer other than 404, or an nsqd
        that has it)."""
        if not self.lookupd:
            producers, partial = await self._nsqd_producers(self.nsqd, topic)
            return producers, partial, bool(producers)
        qs = urlencode({"topic": topic})

        async def lookup(addr: str) -> Any:
            try:
                return await self.get_json(f"{http_base(addr)}/lookup?{qs}")
            except UpstreamError as err:
                # an unknown topic is no producer, not a failure of the lookupd
                if " 404 " in str(err):
                    return None
                raise

        answers, partial = await self._lookupds(lookup)
        seen: dict[str, Producer] = {}
        for answer in answers:
            for raw in _dict(answer).get("producers") or []:
                p = _producer_from_lookupd(_dict(raw))
                seen.setdefault(p.http_address, p)
        known = any(a is not None for a in answers)
        return list(seen.values()), partial, known

    async def topic_producers(self, topic: str) -> tuple[list[Producer], Partial]:
        """The nsqd that have ``topic`` (lookupd's ``/lookup``, or asking each nsqd)."""
        producers, partial, _ = await self.lookup_topic(topic)
        return producers, partial

    async def topic_partition_num(self, topic: str) -> int:
        """How many partitions the lookupds say ``topic`` has (0: unknown, or no
        partition-aware lookupd); also learns where the partitions are served."""
        if not self.lookupd:
            return 0
        qs = urlencode({"topic": topic, "metainfo": "true"})

        async def lookup(addr: str) -> Any:
            # Youzan's form of /lookup; NSQ 1.3's lookupd ignores the parameter
            return await self.get_json(
                f"{http_base(addr)}/lookup?{qs}", headers={"Accept": _V1_ACCEPT}
            )

        try:
            answers, _ = await self._lookupds(lookup)
        except UpstreamError:
            return 0
        num = 0
        for answer in answers:
            answer = _dict(answer)
            answer = _dict(answer.get("data")) if "data" in answer else answer
            num = max(num, _int(_dict(answer.get("meta")).get("partition_num")))
            for pid, raw in _dict(answer.get("partitions")).items():
                if str(pid).isdigit():
                    peer = _producer_from_lookupd(_dict(raw))
                    self._hint(topic, int(pid), peer.http_address, peer.hostname)
        return num

    # -- where partitions are ------------------------------------------------------------

    def _place(self, topic: str, pid: int, node: str, hostname: str) -> None:
        self.placements.setdefault(topic, {})[pid] = (node, hostname)

    def _hint(self, topic: str, pid: int, node: str, hostname: str) -> None:
        self.lookupd_placements.setdefault(topic, {})[pid] = (node, hostname)

    def forget_topic(self, topic: str) -> None:
        """Forget where a deleted topic's partitions were."""
        self.placements.pop(topic, None)
        self.lookupd_placements.pop(topic, None)

    def last_seen(self, topic: str, pid: int) -> tuple[str, str]:
        """(node, hostname) where the partition was last seen (in a node's /stats, else
        in nsqlookupd's answers); ("", "") if never."""
        seen = self.placements.get(topic, {}).get(pid)
        if seen is None:
            seen = self.lookupd_placements.get(topic, {}).get(pid)
        return seen or ("", "")

    # -- stats --------------------------------------------------------------------------

    async def node_stats(
        self,
        producers: Iterable[Producer],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
        none_is_error: bool = True,
    ) -> tuple[list[dict[str, Any]], Partial]:
        """Each nsqd's topics from ``/stats``, tagged with the node (see aggregate).

        Each row also has ``ts``: when its node answered (Unix seconds), for rates.
        When no node answered: UpstreamError, unless ``none_is_error`` is false and
        they all just did not answer (then no row, and every node in ``down``).
        """
        try:
            return await self._node_stats(producers, topic, channel, include_clients)
        except UpstreamError as err:
            if none_is_error or err.partial is None or not err.partial.down:
                raise
            return [], err.partial

    async def _node_stats(
        self, producers: Iterable[Producer], topic: str, channel: str, include_clients: bool
    ) -> tuple[list[dict[str, Any]], Partial]:
        query = {"format": "json"}
        if topic:
            query["topic"] = topic
            if channel:
                query["channel"] = channel
        if not include_clients:
            query["include_clients"] = "false"
        qs = urlencode(query)

        async def one(p: Producer) -> list[dict[str, Any]]:
            stats = _dict(await self.get_json(f"http://{p.http_address}/stats?{qs}"))
            now = time.time()
            rows = aggregate.node_topics(stats, p.http_address, p.hostname, topic, now=now)
            for row in rows:
                row["ts"] = now
            return rows

        answers, partial = await self._fan_out(
            producers, one, "nsqd", name=lambda p: (p.http_address, p.hostname)
        )
        entries = [t for answer in answers for t in answer]
        entries.sort(key=lambda t: (t["hostname"], t["node"]))
        for row in entries:
            for part in row.get("partitions") or []:
                if part.get("is_leader", True) or part["partition"] not in self.placements.get(
                    row["topic_name"], {}
                ):
                    self._place(row["topic_name"], part["partition"], row["node"], row["hostname"])
        return entries, partial

    # -- actions ------------------------------------------------------------------------

    async def post_lookupds(self, path: str, query: dict[str, str]) -> Partial:
        """POST ``path?query`` to every lookupd; the errors of those that failed."""
        qs = urlencode(query, quote_via=quote)
        partial = Partial()
        for addr in self.lookupd:
            try:
                await self.post(f"{http_base(addr)}/{path}?{qs}")
            except UpstreamError as err:
                partial.errors.append(str(err))
        return partial

    async def post_nodes(
        self,
        nodes: Iterable[str],
        path: str,
        query: dict[str, str],
        data: bytes | None = None,
    ) -> Partial:
        """POST ``path?query`` to each nsqd (``host:port``) concurrently."""
        _, partial = await self.post_nodes_answers(nodes, path, query, data)
        return partial

    async def post_nodes_answers(
        self,
        nodes: Iterable[str],
        path: str,
        query: dict[str, str],
        data: bytes | None = None,
    ) -> tuple[dict[str, Any], Partial]:
        """POST ``path?query`` to each nsqd concurrently: (node -> its answer's JSON, for
        those that answered 200; the errors of the others)."""
        qs = urlencode(query, quote_via=quote)
        nodes = list(nodes)
        results = await asyncio.gather(
            *(self.post(f"http://{n}/{path}?{qs}", data) for n in nodes), return_exceptions=True
        )
        answers: dict[str, Any] = {}
        partial = Partial()
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, UpstreamError):
                partial.errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                answers[node] = result
        return answers, partial

    async def topic_action(self, topic: str, path: str, query: dict[str, str]) -> Partial:
        """POST an action to every nsqd that has ``topic`` (nsqadmin's actionHelper)."""
        producers, partial = await self.topic_producers(topic)
        partial.extend(await self.post_nodes([p.http_address for p in producers], path, query))
        return partial


def _producer_from_lookupd(raw: dict[str, Any]) -> Producer:
    topics = [str(t) for t in raw.get("topics") or []]
    tombstones = list(raw.get("tombstones") or [])
    tombstones += [False] * (len(topics) - len(tombstones))
    parts = raw.get("partitions")
    partitions: dict[str, list[str]] = {}
    if isinstance(parts, dict):
        partitions = {str(k): [str(x) for x in v or []] for k, v in parts.items()}
    return Producer(
        hostname=str(raw.get("hostname") or ""),
        broadcast_address=str(raw.get("broadcast_address") or ""),
        tcp_port=_int(raw.get("tcp_port")),
        http_port=_int(raw.get("http_port")),
        version=str(raw.get("version") or ""),
        remote_address=str(raw.get("remote_address") or ""),
        topics=sorted(zip(topics, (bool(t) for t in tombstones), strict=False)),
        partitions=partitions,
    )


_V1_ACCEPT = "application/vnd.nsq; version=1.0"


def _node_of(address: str) -> str:
    """``host:port`` of an address given as ``host:port`` or a URL."""
    return http_base(address).split("://", 1)[1]


def _unreachable(err: BaseException) -> bool:
    """Whether a client error means the server did not answer at all."""
    return isinstance(
        err, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError, OSError)
    )


def _dict(value: Any) -> dict[str, Any]:
    """A JSON object, or {} for anything else (servers may answer garbage)."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(decoded, dict) and "message" in decoded:
        return str(decoded["message"])
    return text[:200]


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, aiohttp.ClientConnectorError):
        os_error = err.os_error
        reason = os.strerror(os_error.errno) if os_error.errno else str(os_error)
        return f"cannot connect ({reason})"
    return str(err) or type(err).__name__
