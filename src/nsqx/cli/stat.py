"""``nsqx stat``: a channel's numbers every ``--interval``, as NSQ's ``nsq_stat``.

Every interval it reads ``/stats`` from each nsqd that has the topic (found through
nsqlookupd or in the ``--nsqd-http-address`` list), adds the channel up over them and
prints one row of NSQ's table: ingress and egress rates, depth (total, memory, disk),
in-flight, deferred, requeued, timed-out, messages and clients, with the header again
every 25 rows. ``--count`` stops after that many rows.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONNECT_TIMEOUT,
    LOOKUPD_HTTP,
    NSQD_HTTP,
    REQUEST_TIMEOUT,
    VERSION,
    Kind,
    Tool,
    ToolError,
    auth_secret,
    bearer_headers,
    check_name,
    check_one_source,
    flag,
    secret_hint,
)
from nsqx.clusterinfo import aggregate
from nsqx.clusterinfo.info import ClusterInfo, UpstreamError

FLAGS = (
    VERSION,
    flag("topic", Kind.STR, "", "NSQ topic", "topic"),
    flag("channel", Kind.STR, "", "NSQ channel", "channel"),
    flag("interval", Kind.DURATION, 2.0, "duration of time between polling/printing output"),
    CONNECT_TIMEOUT,
    REQUEST_TIMEOUT,
    NSQD_HTTP,
    LOOKUPD_HTTP,
    flag("count", Kind.INT, 0, "number of reports (0: until stopped)"),
    AUTH_SECRET,
    AUTH_SECRET_FILE,
)

EXAMPLES = """
  nsqx stat --topic=events --channel=archive --lookupd-http-address=127.0.0.1:4161
  nsqx stat --topic=events --channel=archive --nsqd-http-address=127.0.0.1:4151 --interval=5s
  nsqx stat --topic=events --channel=archive --nsqd-http-address=127.0.0.1:4151 --count=3
"""

HEADER = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} {'def':>5}"
    f" | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}"
)


def row(new: dict[str, Any], old: dict[str, Any], interval: float, delivered: bool) -> str:
    """One line of nsq_stat's table from two readings ``interval`` seconds apart.

    Go's nsqd counts a channel's ``message_count`` as messages entering the channel;
    nsqx's counts them as they are delivered (``delivered``). Either way ingress is what
    entered and egress what left the queue.
    """
    counted = new["message_count"] - old["message_count"]
    grown = new["depth"] - old["depth"]
    if delivered:
        ingress, egress = counted + grown, counted
    else:
        ingress, egress = counted, counted - grown
    ingress, egress = int(ingress / interval), int(egress / interval)
    return (
        f"{ingress:7d} {egress:7d} | {new['depth']:7d} {new['memory_depth']:7d}"
        f" {new['backend_depth']:7d} {new['in_flight_count']:5d} {new['deferred_count']:5d}"
        f" | {new['requeue_count']:7d} {new['timeout_count']:7d} {new['message_count']:12d}"
        f" {new['client_count']:7d}"
    )


async def read_channel(ci: ClusterInfo, topic: str, channel: str) -> dict[str, Any]:
    """The channel summed over the nsqd that have the topic; ToolError if none has it.

    ``delivered`` is set when every nsqd counts deliveries (nsqx) rather than entries.
    """
    try:
        producers, _ = await ci.topic_producers(topic)
        rows, _ = await ci.node_stats(producers, topic, channel, include_clients=False)
    except UpstreamError as err:
        raise ToolError(secret_hint(f"failed to get nsqd stats - {err}")) from None
    found = aggregate.aggregate_channels(rows).get(channel)
    if found is None:
        raise ToolError(f"failed to find channel({channel}) in stats metadata for topic({topic})")
    found["delivered"] = all("nsqx" in p.version for p in producers)
    return found


async def main(opts: dict[str, Any]) -> int:
    topic, channel = opts["topic"], opts["channel"]
    if not topic or not channel:
        raise ToolError("--topic and --channel are required")
    check_name("topic", topic, "topic")
    check_name("channel", channel, "channel")
    for name in ("interval", "http_client_connect_timeout", "http_client_request_timeout"):
        if opts[name] <= 0:
            raise ToolError(f"--{name.replace('_', '-')} should be positive")
    if opts["count"] < 0:
        raise ToolError("--count should be positive")
    check_one_source(opts, http=True)
    for address in opts["nsqd_http_address"] + opts["lookupd_http_address"]:
        if address.startswith("http"):
            raise ToolError(f"{address}: address should not contain scheme")
    timeout = aiohttp.ClientTimeout(
        total=opts["http_client_request_timeout"], sock_connect=opts["http_client_connect_timeout"]
    )
    interval: float = opts["interval"]
    headers = bearer_headers(auth_secret(opts))
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        ci = ClusterInfo(session, opts["lookupd_http_address"], opts["nsqd_http_address"])
        loop = asyncio.get_running_loop()
        old = await read_channel(ci, topic, channel)
        old_at = loop.time()
        printed = 0
        next_at = loop.time()
        while not opts["count"] or printed < opts["count"]:
            if printed % 25 == 0:
                print(HEADER, flush=True)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            new = await read_channel(ci, topic, channel)
            # the rates over the time between the two readings (a slow /stats or a late
            # wake-up makes it longer than --interval)
            new_at = loop.time()
            print(row(new, old, max(new_at - old_at, 1e-3), new["delivered"]), flush=True)
            old, old_at = new, new_at
            printed += 1
    return 0


TOOL = Tool(
    "stat",
    "nsq_stat",
    FLAGS,
    "Print a channel's rates, depth and counts every interval (NSQ's nsq_stat).",
    EXAMPLES,
    main,
)
