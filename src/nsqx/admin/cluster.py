"""ClusterInfo: what nsqadmin and the tools learn about a cluster, over HTTP only.

The cluster is reached the way NSQ's nsqadmin reaches it: through nsqlookupd
(``/nodes``, ``/topics``, ``/lookup``) or, without lookupd, through a fixed list of
nsqd (``/info``, ``/stats``); every number comes from nsqd's ``/stats?format=json``.
Nothing here imports nsqd's code: any NSQ 1.3 nsqd and nsqlookupd will do.

Calls fan out concurrently. As in NSQ, a call that some servers answered returns what
they said plus the errors of the others (:class:`Partial`); a call that no server
answered raises :class:`UpstreamError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp

from nsqx.admin import aggregate

__all__ = [
    "ClusterInfo",
    "Partial",
    "Producer",
    "UpstreamError",
    "http_base",
]

T = TypeVar("T")


class UpstreamError(Exception):
    """No server answered (or the one asked refused): the message says which and why."""


@dataclass
class Partial:
    """The errors of the servers that did not answer a call others answered."""

    errors: list[str] = field(default_factory=list)

    def extend(self, other: Partial | list[str]) -> None:
        self.errors.extend(other.errors if isinstance(other, Partial) else other)

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
    the nsqd list is not used for discovery, as in nsqadmin.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        lookupd_http_addresses: Iterable[str] = (),
        nsqd_http_addresses: Iterable[str] = (),
    ) -> None:
        self.session = session
        self.lookupd = list(lookupd_http_addresses)
        self.nsqd = list(nsqd_http_addresses)

    # -- HTTP ---------------------------------------------------------------------------

    async def get_json(self, url: str) -> Any:
        """GET ``url`` and decode its JSON; UpstreamError on any failure."""
        try:
            async with self.session.get(url) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(f"GET {url}: {resp.status} {_error_text(body)}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise UpstreamError(f"GET {url}: {_describe(err)}") from None
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
            raise UpstreamError(f"GET {url}: {_describe(err)}") from None

    async def post(self, url: str, data: bytes | None = None) -> None:
        """POST to ``url``; UpstreamError unless it answers 200."""
        try:
            async with self.session.post(url, data=data) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(f"POST {url}: {resp.status} {_error_text(body)}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise UpstreamError(f"POST {url}: {_describe(err)}") from None

    @staticmethod
    async def _fan_out(
        items: Iterable[T],
        call: Callable[[T], Awaitable[Any]],
        what: str,
    ) -> tuple[list[Any], Partial]:
        """Run ``call`` on every item at once: (answers, errors); all failed: raise."""
        items = list(items)
        results = await asyncio.gather(*(call(i) for i in items), return_exceptions=True)
        answers: list[Any] = []
        partial = Partial()
        for result in results:
            if isinstance(result, UpstreamError):
                partial.errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        if items and not answers:
            raise UpstreamError(f"failed to query any {what}: " + "; ".join(partial.errors))
        return answers, partial

    # -- discovery ----------------------------------------------------------------------

    async def lookupd_topics(self) -> tuple[list[str], Partial]:
        """The union of every lookupd's ``/topics``, sorted."""
        answers, partial = await self._fan_out(
            self.lookupd, lambda a: self.get_json(f"{http_base(a)}/topics"), "nsqlookupd"
        )
        topics: set[str] = set()
        for answer in answers:
            topics.update(str(t) for t in (_dict(answer).get("topics") or []))
        return sorted(topics), partial

    async def lookupd_topic_channels(self, topic: str) -> tuple[list[str], Partial]:
        """The union of every lookupd's ``/channels?topic=``, sorted."""
        qs = urlencode({"topic": topic})
        answers, partial = await self._fan_out(
            self.lookupd, lambda a: self.get_json(f"{http_base(a)}/channels?{qs}"), "nsqlookupd"
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

        answers, partial = await self._fan_out(self.lookupd, nodes, "nsqlookupd")
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

        answers, partial = await self._fan_out(addresses, one, "nsqd")
        producers = [p for p in answers if p is not None]
        return sorted(producers, key=lambda p: (p.hostname, p.http_address)), partial

    async def topic_producers(self, topic: str) -> tuple[list[Producer], Partial]:
        """The nsqd that have ``topic`` (lookupd's ``/lookup``, or asking each nsqd)."""
        if not self.lookupd:
            return await self._nsqd_producers(self.nsqd, topic)
        qs = urlencode({"topic": topic})

        async def lookup(addr: str) -> Any:
            try:
                return await self.get_json(f"{http_base(addr)}/lookup?{qs}")
            except UpstreamError as err:
                # an unknown topic is no producer, not a failure of the lookupd
                if " 404 " in str(err):
                    return {}
                raise

        answers, partial = await self._fan_out(self.lookupd, lookup, "nsqlookupd")
        seen: dict[str, Producer] = {}
        for answer in answers:
            for raw in _dict(answer).get("producers") or []:
                p = _producer_from_lookupd(_dict(raw))
                seen.setdefault(p.http_address, p)
        return list(seen.values()), partial

    # -- stats --------------------------------------------------------------------------

    async def node_stats(
        self,
        producers: Iterable[Producer],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
    ) -> tuple[list[dict[str, Any]], Partial]:
        """Each nsqd's topics from ``/stats``, tagged with the node (see aggregate)."""
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
            return aggregate.node_topics(stats, p.http_address, p.hostname, topic)

        answers, partial = await self._fan_out(producers, one, "nsqd")
        entries = [t for answer in answers for t in answer]
        entries.sort(key=lambda t: (t["hostname"], t["node"]))
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
        qs = urlencode(query, quote_via=quote)
        nodes = list(nodes)
        results = await asyncio.gather(
            *(self.post(f"http://{n}/{path}?{qs}", data) for n in nodes), return_exceptions=True
        )
        partial = Partial()
        for result in results:
            if isinstance(result, UpstreamError):
                partial.errors.append(str(result))
            elif isinstance(result, BaseException):
                raise result
        return partial

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
