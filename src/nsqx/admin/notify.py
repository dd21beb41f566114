"""Admin-action notifications: nsqadmin's ``--notification-http-endpoint``.

Each action (pause, empty, delete, tombstone, create, reset) is POSTed as one JSON
object, NSQ 1.3's ``AdminAction``: ``action``, ``topic``, ``channel`` and ``node`` when
they apply, ``timestamp`` (Unix seconds), ``user`` (from HTTP basic auth, else the ACL
header), ``remote_ip``, ``user_agent``, ``url`` and ``via`` (this host's name). Sending
happens in the background, in order, so an action never waits for the endpoint; a
failure is logged and dropped, as in NSQ.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import socket
import time
from typing import Any

import aiohttp

__all__ = ["Notifier", "admin_action", "basic_auth_user"]

log = logging.getLogger("nsqx.admin")

#: notifications waiting to be sent; beyond this, new ones are dropped (and logged)
_QUEUE_SIZE = 1000


def basic_auth_user(authorization: str) -> str:
    """The user name of a ``Basic`` Authorization header, or ``""``."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


def admin_action(
    action: str,
    topic: str,
    channel: str = "",
    node: str = "",
    *,
    user: str = "",
    remote_ip: str = "",
    user_agent: str = "",
    url: str = "",
) -> dict[str, Any]:
    """One notification body (keys as NSQ's, empty optional ones left out)."""
    body: dict[str, Any] = {"action": action, "topic": topic}
    if channel:
        body["channel"] = channel
    if node:
        body["node"] = node
    body["timestamp"] = int(time.time())
    if user:
        body["user"] = user
    body.update(
        {
            "remote_ip": remote_ip,
            "user_agent": user_agent,
            "url": url,
            "via": socket.gethostname(),
        }
    )
    return body


class Notifier:
    """Sends queued notifications to one endpoint with a session of its own."""

    def __init__(self, endpoint: str, session: aiohttp.ClientSession) -> None:
        self.endpoint = endpoint
        self.session = session
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_QUEUE_SIZE)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def send(self, action: dict[str, Any]) -> None:
        """Queue one notification (never blocks)."""
        try:
            self._queue.put_nowait(action)
        except asyncio.QueueFull:
            log.error("notification queue full: dropped %s", action.get("action"))

    async def _run(self) -> None:
        while True:
            action = await self._queue.get()
            try:
                async with self.session.post(
                    self.endpoint,
                    data=json.dumps(action),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
                    if resp.status >= 300:
                        log.error("notification to %s: HTTP %d", self.endpoint, resp.status)
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                log.error("notification to %s failed: %s", self.endpoint, err or type(err))
            finally:
                self._queue.task_done()

    async def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (for up to ``timeout`` seconds), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
