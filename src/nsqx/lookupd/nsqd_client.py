"""NsqdClient: the calls nsqlookupd makes to an nsqd's HTTP API to create and delete
topic partitions and channels on it.

Youzan's lookupd does this over its own RPC port; nsqx's nsqd has no RPC, so lookupd
uses the nsqd's HTTP API, at the ``broadcast_address`` and ``http_port`` the nsqd
announced in IDENTIFY (as nsqadmin reaches nsqd). Every call is idempotent on the nsqd
side, so the coordinator may repeat one after a timeout without harm.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from yarl import URL

from nsqx.wire import members
from nsqx.wire.lookupd import PeerInfo
from nsqx.wire.topic_meta import TopicMeta

log = logging.getLogger("nsqx.lookupd")


class NsqdCallError(Exception):
    """An nsqd call that failed: unreachable, timed out, or a non-200 answer."""


def _flag(value: bool) -> str:
    return "true" if value else "false"


def topic_create_params(topic: str, partition: int, meta: TopicMeta) -> dict[str, str]:
    """The query of nsqd's ``POST /topic/create`` for one partition with ``meta``'s
    settings (contract.md). Booleans are always sent, ``true`` or ``false``, so that a
    repeated call after ``/topic/meta/update`` also turns a setting off."""
    return {
        "topic": topic,
        "partition": str(partition),
        "partition_num": str(meta.partition_num),
        "orderedmulti": _flag(meta.ordered),
        "extend": _flag(meta.ext),
        "multipart": _flag(meta.multipart),
        "disable_channel_auto_create": _flag(meta.disable_channel_auto_create),
        "retention": str(meta.retention_days),
        "syncdisk": str(meta.sync_every),
        "replicator": str(meta.replica),
        **({"replication_ack": meta.replication_ack} if meta.replication_ack else {}),
    }


class NsqdClient:
    """An aiohttp session for nsqd calls, with connect and total timeouts."""

    def __init__(
        self, connect_timeout: float, request_timeout: float, cluster_secret: str = ""
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, connect=connect_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._headers = members.headers(cluster_secret)

    def use_secret(self, cluster_secret: str) -> None:
        """Send this cluster secret from now on (before the first call)."""
        self._headers = members.headers(cluster_secret)

    def _get_session(self) -> aiohttp.ClientSession:
        # created on first use, inside the running loop, as aiohttp requires; roles and
        # fences are members-only calls
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, node: PeerInfo, path: str, params: Mapping[str, str], body: bytes | None = None
    ) -> None:
        """``POST http://broadcast_address:http_port/path?params``; raises
        :class:`NsqdCallError` unless nsqd answers 200."""
        url = URL.build(
            scheme="http", host=node.broadcast_address, port=node.http_port, path=path
        ).with_query(dict(params))
        try:
            async with self._get_session().post(url, data=body) as resp:
                body = await resp.read()
                if resp.status != 200:
                    text = body[:200].decode("utf-8", errors="replace")
                    raise NsqdCallError(f"POST {url}: {resp.status} {text}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise NsqdCallError(f"POST {url}: {type(err).__name__}: {err}") from None
        log.debug("NSQD: POST %s OK", url)

    async def send_role(
        self, node: PeerInfo, topic: str, partition: int, role: Mapping[str, Any]
    ) -> None:
        """Tell the node its role for a replicated partition (leader, ISR, epoch)."""
        await self.post(
            node,
            "/partition/role",
            {"topic": topic, "partition": str(partition)},
            json.dumps(role).encode(),
        )

    async def fence(self, node: PeerInfo, topic: str, partition: int, epoch: int) -> None:
        """Tell the node's leadership of ``epoch`` to stop acknowledging (a move)."""
        await self.post(
            node,
            "/partition/fence",
            {"topic": topic, "partition": str(partition), "epoch": str(epoch)},
        )

    async def partition_state(self, node: PeerInfo, topic: str, partition: int) -> dict[str, Any]:
        """The node's ``GET /partition/state``: its log end and replica role."""
        url = URL.build(
            scheme="http",
            host=node.broadcast_address,
            port=node.http_port,
            path="/partition/state",
        ).with_query({"topic": topic, "partition": str(partition)})
        try:
            async with self._get_session().get(url) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise NsqdCallError(f"GET {url}: {resp.status} {body[:200]!r}")
                doc = json.loads(body)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise NsqdCallError(f"GET {url}: {type(err).__name__}: {err}") from None
        if not isinstance(doc, dict):
            raise NsqdCallError(f"GET {url}: not a JSON object")
        return doc

    async def create_partition(
        self, node: PeerInfo, topic: str, partition: int, meta: TopicMeta
    ) -> None:
        """Create (or update the settings of) one topic partition on the node."""
        await self.post(node, "/topic/create", topic_create_params(topic, partition, meta))

    async def delete_partition(self, node: PeerInfo, topic: str, partition: int) -> None:
        """Delete one topic partition on the node."""
        await self.post(node, "/topic/delete", {"topic": topic, "partition": str(partition)})

    async def create_channel(
        self, node: PeerInfo, topic: str, channel: str, partition: int
    ) -> None:
        """Create a channel on one topic partition of the node."""
        params = {"topic": topic, "channel": channel, "partition": str(partition)}
        await self.post(node, "/channel/create", params)

    async def delete_channel(
        self, node: PeerInfo, topic: str, channel: str, partition: int
    ) -> None:
        """Delete a channel from one topic partition of the node."""
        params = {"topic": topic, "channel": channel, "partition": str(partition)}
        await self.post(node, "/channel/delete", params)
