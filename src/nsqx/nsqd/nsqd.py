"""NSQD: the daemon: topics, client connections, listeners and the scan loop."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from nsqx.nsqd.client_v2 import ClientV2
from nsqx.nsqd.options import NsqdOptions
from nsqx.nsqd.topic import Topic
from nsqx.wire.names import is_valid_name

log = logging.getLogger("nsqx.nsqd")

#: Bytes read from all clients in one event-loop iteration before busy readers yield,
#: so that channel pumps (which run once per iteration) keep pace with publishers.
#: Measured (bench/server_bench.py, both phase): 64 KiB keeps consumers level with a
#: flooding publisher (513k in / 511k out); 256 KiB let ingest win (619k in / 320k out).
READ_BUDGET_PER_ITERATION = 64 * 1024


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); an empty host means all."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class NSQD:
    """The nsqd daemon: owns topics and clients, runs the TCP listener and one scan
    loop that checks every channel's timers (in-flight timeouts, deferred messages) and
    every client's heartbeat in batches, every --queue-scan-interval (100ms)."""

    def __init__(self, options: NsqdOptions) -> None:
        self.options = options
        self.parser_limits = options.parser_limits()
        self.server_limits = options.server_limits()
        self.topics: dict[str, Topic] = {}
        self.clients: set[ClientV2] = set()
        self.start_time = int(time.time())
        self.tcp_address: tuple[str, int] | None = None
        self._client_seq = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._scan_task: asyncio.Task[None] | None = None
        self._exiting = False
        self._read_this_turn = 0
        self._budget_reset_scheduled = False

    def spend_read_budget(self, nbytes: int) -> bool:
        """Count bytes read in this loop iteration; True once over the budget."""
        if not self._budget_reset_scheduled:
            self._budget_reset_scheduled = True
            asyncio.get_running_loop().call_soon(self._reset_read_budget)
        self._read_this_turn += nbytes
        return self._read_this_turn >= READ_BUDGET_PER_ITERATION

    def _reset_read_budget(self) -> None:
        self._read_this_turn = 0
        self._budget_reset_scheduled = False

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    # -- topics -----------------------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic named ``name``, created on first use."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            topic = self.topics[name] = Topic(self, name)
            log.info("TOPIC(%s): created", name)
        return topic

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is not None:
            topic.close()
            log.info("TOPIC(%s): deleted", name)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the listeners and start the scan loop."""
        loop = asyncio.get_running_loop()
        addr = self.options.tcp_address
        if addr:
            if "/" in addr:
                server = await loop.create_unix_server(lambda: ClientV2(self), addr)
                log.info("TCP: listening on %s", addr)
            else:
                host, port = split_address(addr)
                server = await loop.create_server(
                    lambda: ClientV2(self), host, port, reuse_address=True, backlog=1024
                )
                sockname = server.sockets[0].getsockname()
                self.tcp_address = (sockname[0], sockname[1])
                log.info("TCP: listening on %s:%d", sockname[0], sockname[1])
            self._servers.append(server)
        if self.options.http_address:
            log.warning(
                "HTTP: the HTTP API is not available yet; --http-address=%s is not served",
                self.options.http_address,
            )
        self._scan_task = asyncio.create_task(self._scan_loop())

    async def _scan_loop(self) -> None:
        interval = self.options.queue_scan_interval
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            now_ns = time.time_ns()
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    channel.scan(now, now_ns)
                topic.trim()
            for client in list(self.clients):
                client.tick(now)

    async def close(self) -> None:
        """Stop listening, close every client, stop the timers."""
        if self._exiting:
            return
        self._exiting = True
        for server in self._servers:
            server.close()
        for client in list(self.clients):
            client.close()
        if self._scan_task is not None:
            self._scan_task.cancel()
        for server in self._servers:
            await server.wait_closed()
        if self.options.tcp_address and "/" in self.options.tcp_address:
            try:
                os.unlink(self.options.tcp_address)
            except OSError:
                pass
