"""EtcdClient: the part of etcd's v3 API that nsqlookupd needs, over etcd's JSON gateway.

Why the gateway and not a client library. etcd serves its v3 API as gRPC and, on the
same client port, as JSON over HTTP (the "gRPC gateway": ``POST /v3/kv/range``,
``/v3/kv/txn``, ``/v3/watch``, ``/v3/lease/grant``...; documented by etcd, served by
every etcd since 3.4, and the only path there since 3.5). The Python v3 clients were
weighed against it:

* ``etcd3`` (python-etcd3): blocking, last released in 2020, and its generated
  protobuf modules fail to import under protobuf 4 and later ("Descriptors cannot be
  created directly", kragniz/python-etcd3#1957 and #2709).
* ``aetcd`` (asyncio, maintained): pulls in ``grpcio`` (a native wheel of several MB per
  Python version) and ``protobuf``, with generated code tied to a protobuf range
  (``protobuf>4,<8``): the next protobuf major needs a new aetcd release, and an
  application that pins another protobuf may not install beside it.
* ``etcd-client-py`` (asyncio over Rust's etcd-client, maintained): a 6 MB native
  module per Python version, its own tokio runtime in threads under the event loop.
* ``etcd3gw`` (OpenStack, maintained, the JSON gateway): blocking (requests), so it
  would need a thread per call or per watch.

nsqx already depends on aiohttp, and the few calls needed here are small JSON
documents. So this module speaks the gateway with aiohttp: no new dependency, nothing
generated from .proto files (no protobuf version to follow), native asyncio on any
event loop (uvloop included). What it costs is this module: base64 keys and values,
int64 fields sent as strings, zero values left out of answers, and the watch stream
read as newline-delimited JSON. The gateway has no TLS common-name authentication;
https endpoints work as aiohttp's TLS does.

Several endpoints (members of one etcd cluster) may be given: a call goes to the
endpoint that answered last and moves on to the next one when an endpoint cannot be
reached or says it is unavailable (gRPC code 14, or no leader).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

log = logging.getLogger("nsqx.lookupd")

#: gRPC status codes (what the gateway's error ``code`` holds) that mean "try another
#: member": UNAVAILABLE, DEADLINE_EXCEEDED.
_RETRY_CODES = frozenset({14, 4})

#: A watch answer larger than this is refused (etcd's own request limit is 1.5 MiB).
MAX_WATCH_LINE = 64 << 20


class EtcdError(Exception):
    """etcd refused a request; ``code`` is the gRPC status code of its answer."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered (refused, timed out, or unavailable)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd reports it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int = 0
    lease: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> KeyValue:
        return cls(
            unb64(obj.get("key", "")),
            unb64(obj.get("value", "")),
            int(obj.get("create_revision", 0)),
            int(obj.get("mod_revision", 0)),
            int(obj.get("version", 0)),
            int(obj.get("lease", 0)),
        )


@dataclass(frozen=True)
class WatchEvent:
    """A PUT (``deleted`` False) or DELETE of one key."""

    kv: KeyValue
    deleted: bool


@dataclass(frozen=True)
class WatchResponse:
    """One message of a watch stream."""

    #: The store's revision when the message was sent.
    revision: int
    events: list[WatchEvent] = field(default_factory=list)
    created: bool = False
    canceled: bool = False
    #: Set when the start revision was compacted away: the watch is canceled.
    compact_revision: int = 0


@dataclass(frozen=True)
class TxnResult:
    """What a transaction did: the branch taken, the revision after it, the answers of
    its operations (``response_put``, ``response_range``... as the gateway sends them)."""

    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]

    def range_kvs(self, index: int) -> list[KeyValue]:
        """The keys found by the ``index``-th operation (a range)."""
        rng = self.responses[index].get("response_range", {})
        return [KeyValue.from_json(kv) for kv in rng.get("kvs", [])]


# -- transaction parts ----------------------------------------------------------------


def cmp_create_revision(key: bytes, revision: int) -> dict[str, Any]:
    """Compare: the key's create revision equals ``revision`` (0: the key is absent)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": revision}


def cmp_mod_revision(key: bytes, revision: int) -> dict[str, Any]:
    """Compare: the key was last changed at ``revision`` (0: the key is absent)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision}


def op_put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        req["lease"] = str(lease)
    return {"request_put": req}


def op_delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def op_range(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


class EtcdClient:
    """Calls to an etcd cluster's JSON gateway. Use it from one event loop; the HTTP
    session is made on first use (aiohttp wants a running loop)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        request_timeout: float = 5.0,
        connect_timeout: float = 1.0,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._current = 0
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._current + i) % n for i in range(n)]

    async def call(
        self, path: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to ``/v3<path>`` on the first endpoint that answers; its JSON.

        Raises EtcdUnavailable if none answers, EtcdError if etcd refuses.
        """
        session = self._get_session()
        limit = aiohttp.ClientTimeout(
            total=timeout or self.request_timeout, sock_connect=self.connect_timeout
        )
        problems: list[str] = []
        for index in self._order():
            endpoint = self.endpoints[index]
            try:
                async with session.post(f"{endpoint}/v3{path}", json=body, timeout=limit) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                problems.append(f"{endpoint}: {type(err).__name__} {err}".rstrip())
                continue
            try:
                data = json.loads(raw) if raw else {}
            except ValueError:
                data = {}
            if not isinstance(data, dict):
                data = {}
            if status != 200:
                code = int(data.get("code", 0) or 0)
                message = str(data.get("message") or data.get("error") or raw[:200])
                if code in _RETRY_CODES or status in (502, 503):
                    problems.append(f"{endpoint}: {message}")
                    continue
                raise EtcdError(f"etcd {path}: {message}", code)
            self._current = index
            return data
        raise EtcdUnavailable(f"etcd {path}: no endpoint answered ({'; '.join(problems)})", 14)

    # -- kv -------------------------------------------------------------------------

    async def range(
        self, key: bytes, range_end: bytes | None = None, timeout: float | None = None
    ) -> tuple[int, list[KeyValue]]:
        """(revision, keys) for ``key``, or for [key, range_end)."""
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        data = await self.call("/kv/range", body, timeout)
        revision = int(data.get("header", {}).get("revision", 0))
        return revision, [KeyValue.from_json(kv) for kv in data.get("kvs", [])]

    async def range_prefix(
        self, prefix: bytes, timeout: float | None = None
    ) -> tuple[int, list[KeyValue]]:
        """(revision, keys) of every key that starts with ``prefix``."""
        return await self.range(prefix, prefix_end(prefix), timeout)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Set ``key``; the revision of the write."""
        body = op_put(key, value, lease)["request_put"]
        data = await self.call("/kv/put", body)
        return int(data.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes) -> int:
        """Delete ``key`` (no error if absent); the revision after it."""
        data = await self.call("/kv/deleterange", {"key": b64(key)})
        return int(data.get("header", {}).get("revision", 0))

    async def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> TxnResult:
        """If every ``compare`` holds, do ``success``, otherwise ``failure``, atomically."""
        body = {"compare": compare, "success": success, "failure": failure or []}
        data = await self.call("/kv/txn", body)
        return TxnResult(
            bool(data.get("succeeded", False)),
            int(data.get("header", {}).get("revision", 0)),
            list(data.get("responses", [])),
        )

    # -- leases ---------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, ttl granted)."""
        data = await self.call("/lease/grant", {"TTL": ttl})
        if data.get("error"):
            raise EtcdError(f"etcd lease grant: {data['error']}")
        return int(data["ID"]), int(data.get("TTL", ttl))

    async def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew ``lease``; the TTL it now has, 0 if it is gone (expired or revoked)."""
        data = await self.call("/lease/keepalive", {"ID": str(lease)}, timeout)
        return int(data.get("result", {}).get("TTL", 0))

    async def lease_revoke(self, lease: int, timeout: float | None = None) -> None:
        """Revoke ``lease``, deleting its keys; no error if it is gone already."""
        try:
            await self.call("/lease/revoke", {"ID": str(lease)}, timeout)
        except EtcdError as err:
            if err.code != 5:  # NOT_FOUND: "requested lease not found"
                raise

    # -- watch ----------------------------------------------------------------------

    async def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        """The changes of ``key`` (or [key, range_end)) from ``start_revision`` on
        (0: from now), as etcd sends them, until the stream ends.

        Raises EtcdUnavailable when no endpoint takes the watch or the stream breaks;
        ends when etcd cancels it (a compacted start revision: see
        :attr:`WatchResponse.compact_revision`).
        """
        request: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            request["range_end"] = b64(range_end)
        if start_revision:
            request["start_revision"] = start_revision
        body = {"create_request": request}
        session = self._get_session()
        # no read timeout: a watch is quiet for as long as nothing changes
        limit = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
        problems: list[str] = []
        for index in self._order():
            endpoint = self.endpoints[index]
            try:
                resp = await session.post(f"{endpoint}/v3/watch", json=body, timeout=limit)
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                problems.append(f"{endpoint}: {type(err).__name__} {err}".rstrip())
                continue
            async with resp:
                if resp.status != 200:
                    problems.append(f"{endpoint}: HTTP {resp.status}")
                    continue
                self._current = index
                try:
                    async for msg in _watch_messages(resp):
                        yield msg
                        if msg.canceled:
                            return
                except (aiohttp.ClientError, TimeoutError, OSError) as err:
                    raise EtcdUnavailable(f"etcd watch: stream broke ({err})", 14) from None
                raise EtcdUnavailable("etcd watch: stream ended", 14)
        raise EtcdUnavailable(f"etcd watch: no endpoint answered ({'; '.join(problems)})", 14)


async def _watch_messages(resp: aiohttp.ClientResponse) -> AsyncIterator[WatchResponse]:
    """The newline-delimited JSON messages of a watch stream."""
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            if line.strip():
                yield _watch_message(line)
        if len(buf) > MAX_WATCH_LINE:
            raise EtcdError("etcd watch: message too large")
    if buf.strip():
        yield _watch_message(bytes(buf))


def _watch_message(line: bytes) -> WatchResponse:
    try:
        doc = json.loads(line)
    except ValueError:
        raise EtcdError(f"etcd watch: not JSON: {line[:200]!r}") from None
    if "error" in doc and "result" not in doc:
        err = doc["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise EtcdUnavailable(f"etcd watch: {message}", 14)
    result = doc.get("result", {})
    events = [
        WatchEvent(KeyValue.from_json(ev.get("kv", {})), ev.get("type") == "DELETE")
        for ev in result.get("events", [])
    ]
    return WatchResponse(
        int(result.get("header", {}).get("revision", 0)),
        events,
        bool(result.get("created", False)),
        bool(result.get("canceled", False)),
        int(result.get("compact_revision", 0)),
    )
