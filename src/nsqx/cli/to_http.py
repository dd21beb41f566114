"""``nsqx to-http``: send a topic's messages to HTTP endpoints, as NSQ's ``nsq_to_http``.

Each message is POSTed as the body to a ``--post`` URL, or sent as a GET to a ``--get``
URL whose one ``%s`` is replaced by the URL-escaped body. ``--mode`` picks the URL:
hostpool (the default), round-robin, epsilon-greedy, or all (every message to every
URL: fan-out). A 2xx answer (200 for GET) finishes the message; anything else
requeues it, with the consumer's backoff. ``--n`` requests run at once; ``--sample``
sends only that share of messages (the rest are finished unsent).
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any
from urllib.parse import quote_plus

import aiohttp

from nsqx.cli.hostpool import MODES, HostPool
from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONNECT_TIMEOUT,
    CONSUMER_OPT,
    LOOKUPD_HTTP,
    MAX_IN_FLIGHT,
    NSQD_TCP,
    PROGRESS,
    VERSION,
    Kind,
    Progress,
    StatusEvery,
    Tool,
    ToolError,
    auth_secret,
    check_lookupds,
    check_name,
    check_nsqds,
    check_one_source,
    client_config,
    flag,
    user_agent,
)
from nsqx.client import Consumer, Message

_DEFAULT_CONTENT_TYPE = "application/octet-stream"

FLAGS = (
    VERSION,
    flag("topic", Kind.STR, "", "nsq topic", "topic"),
    flag("channel", Kind.STR, "nsq_to_http", "nsq channel", "channel"),
    MAX_IN_FLIGHT,
    flag("n", Kind.INT, 100, "number of concurrent publishers"),
    flag("mode", Kind.STR, "hostpool", f"how to pick a URL: {', '.join(MODES)}"),
    flag("sample", Kind.FLOAT, 1.0, "share of messages to send (0.0 to 1.0)"),
    CONNECT_TIMEOUT,
    flag("http-client-request-timeout", Kind.DURATION, 20.0, "timeout for HTTP request"),
    flag(
        "status-every",
        Kind.INT,
        250,
        "the # of requests between status lines (their latencies, as Go's), 0 disables",
    ),
    flag("content-type", Kind.STR, _DEFAULT_CONTENT_TYPE, "the Content-Type of POST requests"),
    flag("post", Kind.STR_LIST, [], "URL to POST each message to (the body)", "url"),
    flag("get", Kind.STR_LIST, [], "URL to GET; its %s is replaced by the escaped body", "url"),
    flag("header", Kind.STR_LIST, [], "custom header for HTTP requests, as 'Name: value'", "hdr"),
    NSQD_TCP,
    LOOKUPD_HTTP,
    CONSUMER_OPT,
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
)

EXAMPLES = """
  nsqx to-http --topic=events --lookupd-http-address=127.0.0.1:4161 --post=http://127.0.0.1:8080/ingest
  nsqx to-http --topic=events --nsqd-tcp-address=127.0.0.1:4150 --get='http://127.0.0.1:8080/e?data=%s'
  nsqx to-http --topic=events --nsqd-tcp-address=127.0.0.1:4150 --mode=round-robin \\
               --post=http://a:8080/ingest --post=http://b:8080/ingest --header='X-Source: nsq'
  nsqx to-http --topic=events --nsqd-tcp-address=127.0.0.1:4150 --mode=all \\
               --post=http://a:8080/ingest --post=http://b:8080/ingest    # fan-out
"""


def parse_headers(specs: list[str]) -> dict[str, str]:
    """``Name: value`` pairs (NSQ's --header); ToolError for a malformed one."""
    headers: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ToolError(f"--header {spec!r}: the format is 'Name: value'")
        headers[name] = value
    return headers


async def main(opts: dict[str, Any]) -> int:
    topic, channel = opts["topic"], opts["channel"]
    if not topic or not channel:
        raise ToolError("--topic and --channel are required")
    check_name("topic", topic, "topic")
    check_name("channel", channel, "channel")
    headers = parse_headers(opts["header"])
    posts, gets = opts["post"], opts["get"]
    if opts["content_type"] != _DEFAULT_CONTENT_TYPE:
        if not posts:
            raise ToolError("--content-type only used with --post")
        if not opts["content_type"]:
            raise ToolError("--content-type requires a value when used")
    check_one_source(opts)
    if not gets and not posts:
        raise ToolError("--get or --post required")
    if gets and posts:
        raise ToolError("use --get or --post not both")
    for url in gets:
        if url.count("%s") != 1:
            raise ToolError(f"--get {url!r}: the URL must contain %s exactly once")
    for url in posts + gets:
        if not url.startswith(("http://", "https://")):
            raise ToolError(f"{url!r} is not an http:// or https:// URL")
    if not 0.0 <= opts["sample"] <= 1.0:
        raise ToolError("--sample must be between 0.0 and 1.0")
    if opts["n"] < 1:
        raise ToolError("--n must be >= 1")
    urls = posts or gets
    try:
        pool = HostPool(urls, opts["mode"])
    except ValueError as err:
        raise ToolError(str(err)) from None
    # (the secret goes to nsqd and nsqlookupd only, never to the --post/--get URLs)
    secret = auth_secret(opts)
    config = client_config(
        opts["consumer_opt"],
        "consumer-opt",
        secret,
        user_agent=user_agent("nsq_to_http"),
        max_in_flight=opts["max_in_flight"],
    )
    if opts["nsqd_tcp_address"]:
        await check_nsqds(opts["nsqd_tcp_address"], config=config)
    else:
        found = await check_lookupds(opts["lookupd_http_address"], secret=secret, topics=[topic])
        await check_nsqds(found, config=config, secret_only=True)
    headers.setdefault("User-Agent", user_agent("nsq_to_http"))
    progress = Progress("nsqx to-http", "requests", opts["progress_interval"])
    if opts["status_every"] < 0:
        raise ToolError("--status-every must be >= 0")
    # Go's status lines: the latencies of every --status-every requests, in all and
    # (with several URLs) per URL
    aggregate = StatusEvery("nsqx to-http", "[aggregate]", opts["status_every"])
    per_url = {
        u: StatusEvery("nsqx to-http", f"[{u}]", opts["status_every"] if len(urls) > 1 else 0)
        for u in urls
    }
    timeout = aiohttp.ClientTimeout(
        total=opts["http_client_request_timeout"], sock_connect=opts["http_client_connect_timeout"]
    )
    sample: float = opts["sample"]

    async with aiohttp.ClientSession(
        timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(limit=opts["n"])
    ) as session:

        async def send(url: str, body: bytes) -> None:
            if posts:
                ctx = session.post(url, data=body, headers={"Content-Type": opts["content_type"]})
            else:
                ctx = session.get(url.replace("%s", quote_plus(body), 1))
            async with ctx as resp:
                await resp.read()
                ok = 200 <= resp.status < 300 if posts else resp.status == 200
                if not ok:
                    raise ToolError(f"{url}: got status code {resp.status}")

        async def handle(msg: Message) -> None:
            if sample < 1.0 and random.random() > sample:
                return
            began = time.monotonic()
            for url in pool.pick(began):
                started = time.monotonic()
                try:
                    await send(url, msg.body)
                except (ToolError, aiohttp.ClientError, OSError, TimeoutError):
                    # requeued; the consumer says why, in one line at most every few s
                    pool.mark(url, False, time.monotonic())
                    raise
                now = time.monotonic()
                pool.mark(url, True, now, now - started)
                per_url[url].record(now - started)
                progress.add()
            aggregate.record(time.monotonic() - began)

        consumer = Consumer(
            topic,
            channel,
            handle,
            nsqd_tcp_addresses=opts["nsqd_tcp_address"],
            lookupd_http_addresses=opts["lookupd_http_address"],
            config=config,
            concurrency=opts["n"],
        )
        progress.start()
        try:
            await consumer.start()
            await consumer.wait_closed()
        finally:
            with contextlib.suppress(Exception):
                await consumer.close(timeout=10)
            await progress.stop("nsqx to-http: {count} requests in {seconds:.1f}s")
    return 0


TOOL = Tool(
    "to-http",
    "nsq_to_http",
    FLAGS,
    "Send a topic's messages to HTTP endpoints, by GET or POST (NSQ's nsq_to_http).",
    EXAMPLES,
    main,
)
