"""Discovery: ask nsqlookupd which nsqd have a topic (HTTP GET /lookup?topic=).

Every configured nsqlookupd is queried each round; their producers are united by
``broadcast_address:tcp_port`` (lookupds do not share their data).

Youzan's nsqlookupd (and nsqx's) also answers ``meta`` (partition_num, ordered,
extend_support, ...) and ``partitions`` (the nsqd serving each partition) when asked
with ``access=r|w&metainfo=true``; NSQ 1.3's ignores those parameters and answers
``producers`` only, which reads as a topic without partitions (:class:`LookupResult`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from nsqx.wire.topic_meta import TopicMeta

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("nsqx.client")

_HEADERS = {"Accept": "application/vnd.nsq; version=1.0"}


def lookup_url(address: str) -> str:
    """The /lookup URL of an nsqlookupd given as ``host:port`` or as a URL."""
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def producer_key(producer: dict[str, Any]) -> str | None:
    """``broadcast_address:tcp_port`` of one producer of a /lookup response."""
    host = producer.get("broadcast_address") or producer.get("address")
    port = producer.get("tcp_port")
    if not isinstance(host, str) or not host or not isinstance(port, int):
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _unwrap(body: Any) -> dict[str, Any]:
    """The answer inside the pre-1.0 (and Youzan's) ``{status_code, data}`` envelope."""
    if isinstance(body, dict) and "producers" not in body and isinstance(body.get("data"), dict):
        body = body["data"]
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def parse_lookup(body: Any) -> set[str]:
    """The nsqd addresses of a /lookup response (NSQ >= 1.0, or the older envelope)."""
    body = _unwrap(body)
    producers = body.get("producers") or []
    if not isinstance(producers, list):
        raise ValueError("producers is not a list")
    out: set[str] = set()
    for p in producers:
        if isinstance(p, dict):
            key = producer_key(p)
            if key is not None:
                out.add(key)
    return out


@dataclass(frozen=True)
class LookupResult:
    """What nsqlookupd said of a topic.

    ``producers``: every nsqd that has it (``host:port``); ``partitions``: the nsqd
    serving each partition (empty from NSQ 1.3's lookupd); ``meta``: the topic's
    settings (None unless the lookupd knows partitions and was asked for them).
    """

    producers: frozenset[str] = frozenset()
    partitions: Mapping[int, str] = field(default_factory=dict)
    meta: TopicMeta | None = None
    channels: tuple[str, ...] = ()

    @property
    def partitioned(self) -> bool:
        """True when the topic needs partition-aware clients: several partitions, or
        ordered, or with ext headers (a lone partition of a plain topic does not)."""
        meta = self.meta
        if meta is None or not self.partitions:
            return False
        return meta.partition_num > 1 or meta.ordered or meta.ext

    @property
    def partition_num(self) -> int:
        """The topic's partition count (from meta, else from the partitions map, else 1)."""
        if self.meta is not None and self.meta.partition_num > 0:
            return self.meta.partition_num
        return max(self.partitions, default=-1) + 1 or 1

    def merge(self, other: LookupResult) -> LookupResult:
        """Both answers (several lookupds): producers united; for a partition or the
        meta, this one's answer first."""
        partitions = dict(other.partitions)
        partitions.update(self.partitions)
        channels = tuple(dict.fromkeys((*self.channels, *other.channels)))
        return LookupResult(
            self.producers | other.producers,
            partitions,
            self.meta if self.meta is not None else other.meta,
            channels,
        )


def parse_lookup_result(body: Any) -> LookupResult:
    """A /lookup response, with Youzan's ``meta`` and ``partitions`` when present."""
    body = _unwrap(body)
    producers = frozenset(parse_lookup(body))
    partitions: dict[int, str] = {}
    raw_parts = body.get("partitions") or {}
    if not isinstance(raw_parts, dict):
        raise ValueError("partitions is not an object")
    for pid_text, peer in raw_parts.items():
        try:
            pid = int(pid_text)
        except (TypeError, ValueError):
            log.warning("lookupd: ignoring partition %r (not a number)", pid_text)
            continue
        key = producer_key(peer) if isinstance(peer, dict) else None
        if pid < 0 or key is None:
            log.warning("lookupd: ignoring partition %r: %r", pid_text, peer)
            continue
        partitions[pid] = key
    raw_meta = body.get("meta")
    meta = TopicMeta.from_lookup_json(raw_meta) if isinstance(raw_meta, dict) else None
    raw_channels = body.get("channels") or []
    channels = (
        tuple(c for c in raw_channels if isinstance(c, str))
        if isinstance(raw_channels, list)
        else ()
    )
    return LookupResult(producers, partitions, meta, channels)


class LookupdPoller:
    """Queries a set of nsqlookupd for one topic.

    ``access`` is Youzan's: ``"r"`` for consumers (every partition's node), ``"w"`` for
    producers (writable ones only); with it the lookupd is also asked for the meta.

    ``auth_secret`` (the client's AUTH secret): sent as ``Authorization: Bearer`` to a
    lookupd that answers 401 (nsqx's ``--http-auth``, docs/http-auth.md), and from then
    on to that one; a lookupd that does not ask never sees it.
    """

    def __init__(
        self,
        addresses: Iterable[str],
        topic: str,
        *,
        timeout: float = 60.0,
        access: Literal["r", "w"] = "r",
        session: aiohttp.ClientSession | None = None,
        auth_secret: str | None = None,
    ) -> None:
        self.urls = [lookup_url(a) for a in addresses]
        self.topic = topic
        self.timeout = timeout
        # NSQ 1.3's lookupd ignores parameters it does not know
        self.params = {"topic": topic, "access": access, "metainfo": "true"}
        #: a session given by the owner (shared by several pollers) is not closed here
        self._session = session
        self._own_session = session is None
        self._auth_headers = (
            {**_HEADERS, "Authorization": f"Bearer {auth_secret}"} if auth_secret else None
        )
        #: the lookupds that asked for the secret
        self._asked: set[str] = set()

    async def _query(self, session: aiohttp.ClientSession, url: str) -> LookupResult:
        auth = self._auth_headers
        headers = auth if auth is not None and url in self._asked else _HEADERS
        async with session.get(url, params=self.params, headers=headers) as resp:
            text = await resp.text()
            if resp.status == 401 and auth is not None and url not in self._asked:
                self._asked.add(url)
                return await self._query(session, url)
            if resp.status == 404:
                # TOPIC_NOT_FOUND: no nsqd has the topic yet; a valid, empty answer
                return LookupResult()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {text[:200]}")
            return parse_lookup_result(json.loads(text))

    async def poll(self) -> set[str] | None:
        """The union of every lookupd's producers; None when no lookupd answered."""
        result = await self.lookup()
        return None if result is None else set(result.producers)

    async def lookup(self) -> LookupResult | None:
        """Every lookupd's answer, merged; None when no lookupd answered."""
        if self._session is None:
            import aiohttp  # only consumers that use lookupd pay for importing it

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        session = self._session
        results = await asyncio.gather(
            *(self._query(session, url) for url in self.urls), return_exceptions=True
        )
        found: LookupResult | None = None
        for url, result in zip(self.urls, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.warning("lookupd %s: query for %r failed: %s", url, self.topic, result)
                continue
            found = result if found is None else found.merge(result)
        return found

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None
