"""Discovery: ask nsqlookupd which nsqd have a topic (HTTP GET /lookup?topic=).

Every configured nsqlookupd is queried each round; their producers are united by
``broadcast_address:tcp_port`` (lookupds do not share their data).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

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


def parse_lookup(body: Any) -> set[str]:
    """The nsqd addresses of a /lookup response (NSQ >= 1.0, or the older envelope)."""
    if isinstance(body, dict) and "producers" not in body and isinstance(body.get("data"), dict):
        body = body["data"]
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
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


class LookupdPoller:
    """Queries a set of nsqlookupd for one topic."""

    def __init__(self, addresses: Iterable[str], topic: str, *, timeout: float = 60.0) -> None:
        self.urls = [lookup_url(a) for a in addresses]
        self.topic = topic
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def _query(self, session: aiohttp.ClientSession, url: str) -> set[str]:
        async with session.get(url, params={"topic": self.topic}, headers=_HEADERS) as resp:
            text = await resp.text()
            if resp.status == 404:
                # TOPIC_NOT_FOUND: no nsqd has the topic yet; a valid, empty answer
                return set()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {text[:200]}")
            return parse_lookup(json.loads(text))

    async def poll(self) -> set[str] | None:
        """The union of every lookupd's producers; None when no lookupd answered."""
        if self._session is None:
            import aiohttp  # only consumers that use lookupd pay for importing it

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        session = self._session
        results = await asyncio.gather(
            *(self._query(session, url) for url in self.urls), return_exceptions=True
        )
        found: set[str] = set()
        answered = False
        for url, result in zip(self.urls, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.warning("lookupd %s: query for %r failed: %s", url, self.topic, result)
                continue
            answered = True
            found |= result
        return found if answered else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
