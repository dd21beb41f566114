"""``nsqx to-nsq``: relay topics to other nsqd, as NSQ's ``nsq_to_nsq``.

It consumes each ``--topic`` on ``--channel`` and publishes every message to
``--destination-topic`` (by default the same topic) on one of the
``--destination-nsqd-tcp-address`` (``--mode``: hostpool, round-robin,
epsilon-greedy, or all of them). A message is finished once the destination
acknowledged it and requeued if it refused or could not be reached. For JSON messages,
``--require-json-field`` / ``--require-json-value`` pass only matching ones and
``--whitelist-json-field`` keeps only the listed fields, as NSQ's tool does.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from nsqx.cli.hostpool import MODES, HostPool
from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONSUMER_OPT,
    LOOKUPD_HTTP,
    MAX_IN_FLIGHT,
    NSQD_TCP,
    PRODUCER_OPT,
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
from nsqx.client import Consumer, Message, Producer

FLAGS = (
    VERSION,
    flag("topic", Kind.STR_LIST, [], "nsq topic", "topic"),
    flag("channel", Kind.STR, "nsq_to_nsq", "nsq channel", "channel"),
    flag(
        "destination-topic",
        Kind.STR,
        "",
        "use this destination topic for all consumed topics (default: the consumed topic)",
        "topic",
    ),
    MAX_IN_FLIGHT,
    flag(
        "status-every",
        Kind.INT,
        250,
        "the # of requests between status lines (their latencies, as Go's), 0 disables",
    ),
    flag("mode", Kind.STR, "hostpool", f"how to pick a destination: {', '.join(MODES)}"),
    NSQD_TCP,
    flag("destination-nsqd-tcp-address", Kind.STR_LIST, [], "destination nsqd TCP address", "addr"),
    LOOKUPD_HTTP,
    flag(
        "require-json-field",
        Kind.STR,
        "",
        "for JSON messages: only pass messages that contain this field",
    ),
    flag(
        "require-json-value",
        Kind.STR,
        "",
        "for JSON messages: only pass messages in which the required field has this value",
    ),
    flag("whitelist-json-field", Kind.STR_LIST, [], "for JSON messages: pass this field", "field"),
    CONSUMER_OPT,
    PRODUCER_OPT,
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
)

EXAMPLES = """
  nsqx to-nsq --topic=events --lookupd-http-address=127.0.0.1:4161 \\
              --destination-nsqd-tcp-address=10.0.0.9:4150
  nsqx to-nsq --topic=events --nsqd-tcp-address=127.0.0.1:4150 \\
              --destination-nsqd-tcp-address=127.0.0.1:5150 --destination-topic=events-copy
  nsqx to-nsq --topic=orders --nsqd-tcp-address=127.0.0.1:4150 \\
              --destination-nsqd-tcp-address=127.0.0.1:5150 \\
              --require-json-field=country --require-json-value=NL --whitelist-json-field=id
"""


class JsonFilter:
    """nsq_to_nsq's JSON rules: which messages pass, and which of their fields."""

    def __init__(self, field: str, value: str, whitelist: list[str]) -> None:
        self.field = field
        self.value = value
        self.whitelist = whitelist
        self.number: float | None = None
        if value:
            with contextlib.suppress(ValueError):
                self.number = float(value)

    @property
    def active(self) -> bool:
        return bool(self.field or self.whitelist)

    def apply(self, body: bytes) -> bytes | None:
        """The body to send, None to drop it; ValueError("backoff") to requeue it."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            print(f"ERROR: Unable to decode json: {body[:200]!r}", file=sys.stderr)
            return None
        if not isinstance(doc, dict):
            return None
        if self.field:
            if self.field not in doc:
                if self.value:
                    print("ERROR: missing field to check required value", file=sys.stderr)
                    raise ValueError("backoff")
                return None
            if self.value:
                got = doc[self.field]
                if isinstance(got, str):
                    if got != self.value:
                        return None
                elif self.number is None or isinstance(got, bool) or got != self.number:
                    return None
        if not self.whitelist:
            return body
        kept = {k: doc[k] for k in self.whitelist if k in doc}
        return json.dumps(kept, separators=(",", ":")).encode()


async def main(opts: dict[str, Any]) -> int:
    topics: list[str] = opts["topic"]
    if not topics or not opts["channel"]:
        raise ToolError("--topic and --channel are required")
    for topic in topics:
        check_name("topic", topic, "topic")
    if opts["destination_topic"]:
        check_name("topic", opts["destination_topic"], "destination-topic")
    check_name("channel", opts["channel"], "channel")
    check_one_source(opts)
    destinations: list[str] = opts["destination_nsqd_tcp_address"]
    if not destinations:
        raise ToolError("--destination-nsqd-tcp-address required")
    try:
        pool = HostPool(destinations, opts["mode"])
    except ValueError as err:
        raise ToolError(str(err)) from None
    agent = user_agent("nsq_to_nsq")
    secret = auth_secret(opts)
    cconfig = client_config(
        opts["consumer_opt"],
        "consumer-opt",
        secret,
        user_agent=agent,
        max_in_flight=opts["max_in_flight"],
    )
    pconfig = client_config(opts["producer_opt"], "producer-opt", secret, user_agent=agent)
    await check_nsqds(destinations, config=pconfig)
    if opts["nsqd_tcp_address"]:
        await check_nsqds(opts["nsqd_tcp_address"], config=cconfig)
    else:
        # (the source's secret: --consumer-opt=auth_secret,... when it differs)
        lookupd_secret = cconfig.auth_secret or ""
        found = await check_lookupds(
            opts["lookupd_http_address"], secret=lookupd_secret, topics=topics
        )
        await check_nsqds(found, config=cconfig, secret_only=True)
    producers = {d: Producer(d, config=pconfig) for d in destinations}
    jf = JsonFilter(
        opts["require_json_field"], opts["require_json_value"], opts["whitelist_json_field"]
    )
    progress = Progress("nsqx to-nsq", "relayed", opts["progress_interval"])
    if opts["status_every"] < 0:
        raise ToolError("--status-every must be >= 0")
    # Go's status lines: the latencies of every --status-every publishes, in all and
    # (with several destinations) per destination
    aggregate = StatusEvery("nsqx to-nsq", "[aggregate]", opts["status_every"])
    per_address = {
        d: StatusEvery(
            "nsqx to-nsq", f"[{d}]", opts["status_every"] if len(destinations) > 1 else 0
        )
        for d in destinations
    }

    def handler_for(topic: str) -> Any:
        dest = opts["destination_topic"] or topic

        async def handle(msg: Message) -> None:
            body = msg.body
            if jf.active:
                filtered = jf.apply(msg.body)  # ValueError requeues with backoff
                if filtered is None:
                    return
                body = filtered
            began = time.monotonic()
            for addr in pool.pick(began):
                started = time.monotonic()
                try:
                    await producers[addr].publish(dest, body)
                except Exception:
                    pool.mark(addr, False, time.monotonic())
                    raise
                now = time.monotonic()
                pool.mark(addr, True, now, now - started)
                per_address[addr].record(now - started)
            progress.add()
            aggregate.record(time.monotonic() - began)

        return handle

    consumers = [
        Consumer(
            topic,
            opts["channel"],
            handler_for(topic),
            nsqd_tcp_addresses=opts["nsqd_tcp_address"],
            lookupd_http_addresses=opts["lookupd_http_address"],
            config=cconfig,
            concurrency=max(1, opts["max_in_flight"]),
        )
        for topic in topics
    ]
    progress.start()
    try:
        for consumer in consumers:
            await consumer.start()
        for consumer in consumers:
            await consumer.wait_closed()
    finally:
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.close(timeout=10)
        for producer in producers.values():
            with contextlib.suppress(Exception):
                await producer.close()
        await progress.stop("nsqx to-nsq: relayed {count} messages in {seconds:.1f}s")
    return 0


TOOL = Tool(
    "to-nsq",
    "nsq_to_nsq",
    FLAGS,
    "Relay topics to other nsqd (NSQ's nsq_to_nsq).",
    EXAMPLES,
    main,
)
