"""``nsqx replicas``: the replicated partitions of a cluster, and moving their leaders.

Without an action it prints one row per replicated partition, as its leader sees it
(each nsqd's ``/stats``): epoch, leader, in-sync replicas, all replicas, the log end,
the commit point and the largest follower lag. ``--drain`` moves every leadership of a
node to in-sync replicas before maintenance (nsqlookupd's ``/cluster/node/drain``);
``--move`` moves one partition's leader (Youzan's ``/topic/partition/move``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import aiohttp

from nsqx.cli.cluster_secret import secret_flags
from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONNECT_TIMEOUT,
    LOOKUPD_HTTP,
    REQUEST_TIMEOUT,
    VERSION,
    Kind,
    Tool,
    ToolError,
    auth_secret,
    bearer_headers,
    check_name,
    flag,
    secret_hint,
)
from nsqx.cluster_secret import load_secret
from nsqx.clusterinfo.info import ClusterInfo, UpstreamError, http_base
from nsqx.wire import members

FLAGS = (
    VERSION,
    LOOKUPD_HTTP,
    flag("topic", Kind.STR, "", "only this topic", "topic"),
    flag("drain", Kind.STR, "", "move every leadership of this node (its id in /nodes) away"),
    flag("move", Kind.STR, "", "move the leader of TOPIC:PARTITION[:TO-NODE]"),
    CONNECT_TIMEOUT,
    REQUEST_TIMEOUT,
    *secret_flags("nsqx replicas"),
    AUTH_SECRET,
    AUTH_SECRET_FILE,
)

EXAMPLES = """
  nsqx replicas --lookupd-http-address=127.0.0.1:4161
  nsqx replicas --lookupd-http-address=127.0.0.1:4161 --topic=orders
  nsqx replicas --lookupd-http-address=127.0.0.1:4161 --drain=127.0.0.1:4150
  nsqx replicas --lookupd-http-address=127.0.0.1:4161 --move=orders:0
"""

HEADER = (
    f"{'topic':<24} {'part':>4} {'epoch':>5} {'leader':<22} {'isr':<46} {'end':>10}"
    f" {'commit':>10} {'lag':>8}"
)


async def partitions(ci: ClusterInfo, topic: str) -> list[dict[str, Any]]:
    """Every replicated partition as its leader reports it (in /stats)."""
    try:
        producers, _ = await ci.producers()
    except UpstreamError as err:
        raise ToolError(secret_hint(f"failed to list nsqd - {err}")) from None
    rows: list[dict[str, Any]] = []
    for p in producers:
        query = urlencode({"format": "json", **({"topic": topic} if topic else {})})
        try:
            stats = await ci.get_json(f"http://{p.http_address}/stats?{query}")
        except UpstreamError:
            continue  # a node that is down leads nothing
        for t in stats.get("topics", []):
            repl = t.get("replication")
            if repl and repl.get("role") == "leader":
                rows.append({"topic": t["topic_name"], "partition": t["topic_partition"], **repl})
    rows.sort(key=lambda r: (r["topic"], int(r["partition"])))
    return rows


def row(r: dict[str, Any]) -> str:
    lag = max((f["lag"] for f in r.get("followers", {}).values()), default=0)
    return (
        f"{r['topic']:<24} {r['partition']:>4} {r['epoch']:>5} {r['leader']:<22}"
        f" {','.join(r['isr']):<46} {r['end']:>10} {r['commit']:>10} {lag:>8}"
    )


async def post_leader(ci: ClusterInfo, path: str, query: dict[str, str]) -> Any:
    """POST to the leading nsqlookupd (the others answer E_FAILED_ON_NOT_LEADER)."""
    errors: list[str] = []
    for addr in ci.lookupd:
        url = f"{http_base(addr)}/{path}?{urlencode(query)}"
        try:
            async with ci.session.post(
                url, headers={"Accept": "application/vnd.nsq; version=1.0"}
            ) as resp:
                body = await resp.read()
                if resp.status == 200:
                    return json.loads(body) if body else None
                errors.append(f"{addr}: {resp.status} {body[:200].decode(errors='replace')}")
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            errors.append(f"{addr}: {err}")
    raise ToolError(secret_hint("; ".join(errors)))


async def main(opts: dict[str, Any]) -> int:
    if not opts["lookupd_http_address"]:
        raise ToolError("--lookupd-http-address is required")
    if opts["topic"]:
        check_name("topic", opts["topic"], "topic")
    if opts["drain"] and opts["move"]:
        raise ToolError("--drain and --move cannot be used together")
    timeout = aiohttp.ClientTimeout(
        total=opts["http_client_request_timeout"], sock_connect=opts["http_client_connect_timeout"]
    )
    try:
        secret = load_secret(opts["cluster_secret"], opts["cluster_secret_file"])
    except ValueError as err:
        raise ToolError(str(err)) from None
    headers = {**members.headers(secret), **bearer_headers(auth_secret(opts))}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        ci = ClusterInfo(session, opts["lookupd_http_address"])
        if opts["drain"]:
            answer = await post_leader(ci, "cluster/node/drain", {"node": opts["drain"]})
            moved = answer.get("moved", []) if isinstance(answer, dict) else []
            print(f"moved {len(moved)} leadership(s) away from {opts['drain']}: {' '.join(moved)}")
            return 0
        if opts["move"]:
            parts = opts["move"].split(":")
            if len(parts) < 2 or not parts[1].isdigit():
                raise ToolError("--move takes TOPIC:PARTITION[:TO-NODE]")
            query = {"topic": parts[0], "partition": parts[1], "move_leader": "true"}
            if len(parts) > 2:
                query["move_to"] = ":".join(parts[2:])
            answer = await post_leader(ci, "topic/partition/move", query)
            print(f"{parts[0]}:{parts[1]} is led by {answer['leader']}")
            return 0
        print(HEADER)
        for r in await partitions(ci, opts["topic"]):
            print(row(r))
    return 0


TOOL = Tool(
    "replicas",
    "nsqx replicas",
    FLAGS,
    "Show replicated partitions (leader, ISR, lag); drain a node or move a leader.",
    EXAMPLES,
    main,
)
