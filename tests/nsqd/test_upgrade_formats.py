"""Every data format main ever wrote is read by today's nsqd as if it had written it: for
each fixture tests/fixtures/upgrade_<format>/ (made by that format's last commit with
tests/fixtures/make_upgrade.py; docs/nsqd.md, Upgrades, lists them), today's nsqd opens a
copy of each node's directory and

- holds every record it held, with the same sequence, virtual offset, id, trace id, ext
  header, body and publish time, and offsets chain by raw size over them (a raw size
  is worked out, never stored: old data gets it too), an old offset still finding its
  message and the next publish following the last old record;
- delivers on each channel exactly what was left: the messages in flight at the stop
  again with their attempts counted, the unfinished ones beside, none that was
  finished, an ordered channel in order, an ext channel with its trace ids and headers;
- keeps what was deferred (DPUB, /pub?defer, REQ with a delay) deferred, counted in
  /stats, until its due time and not later: the test runs nsqd on a clock set back to
  just before the due times the fixture holds, then moves it past them;
- keeps paused topics and channels paused, channel policies and dead letters;

and, for the formats written by a cluster, nsqlookupd and both nsqd come back as
processes with the replicated partition's records on both replicas, its leader and its
epochs."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fakeclock import JumpingClock
from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import commands as c
from nsqx.wire.range import decode_range

from lookupdproc import LookupdProcess, http_request, start_lookupd, wait_until
from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run
from rawnsq import start_nsqd as start_inprocess

FIXTURES = Path(__file__).parent.parent / "fixtures"
FORMATS = sorted(
    p.name.removeprefix("upgrade_")
    for p in FIXTURES.glob("upgrade_*")
    if (p / "manifest.json").exists() and "format" in json.loads((p / "manifest.json").read_text())
)
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def manifest_of(fmt: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"upgrade_{fmt}" / "manifest.json").read_text())
    return doc


def test_every_format_has_a_fixture() -> None:
    """The fixtures are the formats make_upgrade.py knows (one per format main wrote)."""
    from fixtures.make_upgrade import FORMATS as MADE

    assert sorted(MADE) == FORMATS


# -- one node's directory, opened in process on a clock set back to the fixture's time --


class Node:
    """Today's nsqd (in process) on a copy of one node's directory, and HTTP to it."""

    def __init__(self, nsqd: NSQD, session: aiohttp.ClientSession) -> None:
        self.nsqd = nsqd
        self.s = session
        assert nsqd.http_address is not None
        self.base = f"http://127.0.0.1:{nsqd.http_address[1]}"

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.s.get(self.base + path) as r:
            return r.status, await r.read()

    async def post(self, path: str, body: bytes = b"") -> tuple[int, bytes]:
        async with self.s.post(self.base + path, data=body) as r:
            return r.status, await r.read()

    async def records(self, key: str, start: int = 0) -> list[dict[str, Any]]:
        topic, pid = key.split("/")
        q = f"/range?topic={topic}&partition={pid}&start={start}&max_messages=10000"
        status, body = await self.get(q)
        assert status == 200, (key, body)
        return [
            {
                "seq": r.sequence,
                "offset": r.offset,
                "id": int(r.id, 16),
                "trace_id": r.trace_id,
                "ext_ver": r.ext_ver,
                "ext": r.ext.decode(),
                "body": r.body.decode(),
                "timestamp": r.timestamp,
            }
            for r in decode_range(body).records
        ]

    async def channel(self, key: str) -> dict[str, Any]:
        topic, pid, channel = key.split("/")
        status, body = await self.get(f"/stats?format=json&topic={topic}")
        assert status == 200
        for t in json.loads(body)["topics"] or []:
            if t["topic_name"] == topic and int(t.get("topic_partition", "0")) == int(pid):
                for ch in t["channels"]:
                    if ch["channel_name"] == channel:
                        return dict(ch)
        raise AssertionError(f"no channel {key}")

    async def topic_paused(self, topic: str) -> bool:
        _status, body = await self.get(f"/stats?format=json&topic={topic}")
        return bool(json.loads(body)["topics"][0]["paused"])


class Consumer:
    """A subscription to one channel that collects what it is sent as (id, body,
    attempts), in Youzan's layout on a partitioned topic (binary ids, offsets and raw
    sizes on an ordered channel, ext headers on an ext one)."""

    def __init__(self, raw: Raw, key: str, youzan: bool, ext: bool, ordered: bool) -> None:
        self.raw = raw
        self.key = key
        self.youzan = youzan
        self.ext = ext
        self.ordered = ordered
        #: (id, body, attempts), and (offset, raw size) on an ordered channel
        self.got: list[tuple[int, str, int]] = []
        self.positions: list[tuple[int, int]] = []
        self.traces: list[tuple[str, int, str]] = []

    @classmethod
    async def start(cls, nsqd: NSQD, key: str, manifest: dict[str, Any]) -> Consumer:
        topic, pid, channel = key.split("/")
        partitioned = topic in ("multi", "ext", "ordered", "repl")
        ext = key in manifest["ext_channels"]
        ordered = key in manifest["ordered_channels"]
        raw = await Raw.connect(nsqd)
        if partitioned:
            await raw.identify(desired_tag="", extend_support=ext)
            line = (
                c.sub_ordered(topic, channel, int(pid))
                if ordered
                else c.sub(topic, channel, int(pid))
            )
        else:
            line = c.sub(topic, channel)
        raw.send(line)
        assert await raw.response() == b"OK", key
        raw.send(c.rdy(1 if ordered else 100))
        return cls(raw, key, partitioned, ext, ordered)

    async def take(self, n: int) -> None:
        """``n`` more messages, each FINed (an ordered channel sends the next after it)."""
        for _ in range(n):
            if self.youzan:
                m = await self.raw.yz_message(with_ext=self.ext, detail=self.ordered)
                self.got.append((m.internal_id, m.body.decode(), m.attempts))
                if self.ordered:
                    self.positions.append((m.offset, m.raw_size))
                if self.ext:
                    self.traces.append((m.body.decode(), m.trace_id, m.ext.decode()))
                self.raw.send(c.fin(m.id))
            else:
                v = await self.raw.message()
                self.got.append((int(v.id, 16), v.body.decode(), v.attempts))
                self.raw.send(c.fin(v.id))

    async def nothing_more(self) -> bool:
        return await self.raw.nothing_for(0.2)


def expected(rows: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    return [(r["id"], r["body"], r["attempts"]) for r in rows]


def node_keys(manifest: dict[str, Any], node: int) -> tuple[list[str], list[str]]:
    """The partitions (``topic/pid``) this node leads, and their channels
    (``topic/pid/channel``) with something to deliver; the replicated partition is
    left to the cluster test (its leader needs nsqlookupd)."""
    parts = [k for k, idx in manifest["where"].items() if idx[0] == node and k != "repl/0"]
    keys = {*manifest["deliver"], *manifest["deliver_later"]}
    chans = sorted(k for k in keys if k.rsplit("/", 1)[0] in parts)
    return sorted(parts), chans


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_node_of_a_format_delivers_everything_at_its_time(fmt: str, tmp_path: Path) -> None:
    manifest = manifest_of(fmt)
    dirs = sorted((FIXTURES / f"upgrade_{fmt}").glob("nsqd*"))
    assert dirs, fmt
    for src in dirs:
        i = int(src.name.removeprefix("nsqd"))
        if i in manifest.get("sharded_nodes", []):
            continue  # (a node of workers: test_a_sharded_node_of_a_format)
        data = tmp_path / src.name
        shutil.copytree(src, data)
        if "durable" not in manifest["features"]:
            run(memory_node(data, manifest))
            continue
        parts, chans = node_keys(manifest, i)
        later = [r for k in chans for r in manifest["deliver_later"].get(k, [])]
        with JumpingClock() as clk:
            if later:
                # back to a minute before the first due time the fixture holds
                first_due = min(r["due_min"] for r in later)
                clk.jump_wall((first_due - 60 * 10**9 - time.time_ns()) / 1e9)
            run(durable_node(data, manifest, parts, chans, clk), timeout=120)


async def memory_node(data: Path, manifest: dict[str, Any]) -> None:
    """A directory from before the log: nsqd.dat's topics and channels come back (their
    messages lived in memory only, as NSQ 1.3's did below its mem-queue-size)."""
    nsqd = await start_inprocess(data_path=str(data), http_address="127.0.0.1:0")
    try:
        found = {
            name: sorted(ch.name for p in t.partitions.values() for ch in p.channels.values())
            for name, t in nsqd.topics.items()
        }
        assert found == manifest["topics"]
    finally:
        await nsqd.close()


async def durable_node(
    data: Path, manifest: dict[str, Any], parts: list[str], chans: list[str], clk: JumpingClock
) -> None:
    nsqd = await start_inprocess(data_path=str(data), http_address="127.0.0.1:0")
    try:
        async with aiohttp.ClientSession() as s:
            node = Node(nsqd, s)
            await check_records(node, manifest, parts)
            ends = await check_offsets(node, manifest, parts)
            consumers = await deliver_now(node, manifest, chans)
            await deliver_later(node, manifest, consumers, clk)
            for con in consumers.values():
                await con.raw.close()
            await publish_after(node, manifest, ends)
            if "policies" in manifest["features"] and "poison/0" in parts:
                status, body = await node.get("/channel/config?topic=poison&channel=dl")
                assert status == 200 and json.loads(body)["max_attempts"] == 2, body
    finally:
        await nsqd.close()


async def check_records(node: Node, manifest: dict[str, Any], parts: list[str]) -> None:
    for key in parts:
        want = manifest["records"][key]
        assert await node.records(key) == want, key
        mid = len(want) // 2
        assert await node.records(key, want[mid]["seq"]) == want[mid:], key


async def deliver_now(
    node: Node, manifest: dict[str, Any], chans: list[str]
) -> dict[str, Consumer]:
    """Each channel delivers what was left (deferred ones held), counted as deferred."""
    consumers = {}
    for key in chans:
        now = manifest["deliver"].get(key, [])
        later = manifest["deliver_later"].get(key, [])
        stats = await node.channel(key)
        assert stats["deferred_count"] == len(later), (key, stats)
        topic = key.split("/")[0]
        paused_topic = topic in manifest["paused_topics"]
        paused = key in manifest["paused_channels"]
        if paused_topic:
            assert await node.topic_paused(topic), key
        if paused:
            assert stats["paused"], key
        con = await Consumer.start(node.nsqd, key, manifest)
        consumers[key] = con
        if paused_topic or paused:
            before = [r for r in now if r["body"] != "held while paused"] if paused_topic else []
            await con.take(len(before))
            assert sorted(con.got) == sorted(expected(before)), key
            assert await con.nothing_more(), key  # held by the pause
            which = "topic" if paused_topic else "channel"
            q = f"topic={topic}" + ("" if paused_topic else f"&channel={key.split('/')[2]}")
            assert (await node.post(f"/{which}/unpause?{q}"))[0] == 200
            await con.take(len(now) - len(before))
        else:
            await con.take(len(now))
        if con.ordered:
            assert con.got == expected(now), key
            assert all(
                a[0] + a[1] == b[0] for a, b in zip(con.positions, con.positions[1:], strict=False)
            )
        else:
            assert sorted(con.got) == sorted(expected(now)), key
        if con.ext:
            records = {r["body"]: r for r in manifest["records"][key.rsplit("/", 1)[0]]}
            for body, trace_id, ext in con.traces:
                assert (trace_id, ext) == (records[body]["trace_id"], records[body]["ext"]), body
        assert await con.nothing_more(), key  # the deferred ones are not due yet
        con.got.clear()
    return consumers


async def deliver_later(
    node: Node, manifest: dict[str, Any], consumers: dict[str, Consumer], clk: JumpingClock
) -> None:
    """Past the last due time, every deferred message comes, with its attempts."""
    later = {k: manifest["deliver_later"][k] for k in consumers if k in manifest["deliver_later"]}
    if not later:
        return
    for con in consumers.values():
        # (a jump of the clocks would time their heartbeats out: subscribed again after)
        await con.raw.close()
    last_due = max(r["due_max"] for rows in later.values() for r in rows)
    clk.advance((last_due + 10**9 - time.time_ns() - clk.wall_offset_ns) / 1e9)
    for key, rows in later.items():
        con = consumers[key] = await Consumer.start(node.nsqd, key, manifest)
        await con.take(len(rows))
        assert sorted(con.got) == sorted(expected(rows)), key
        assert await con.nothing_more(), key
    for key in later:
        stats = await node.channel(key)
        assert stats["deferred_count"] == 0, (key, stats)


async def check_offsets(node: Node, manifest: dict[str, Any], parts: list[str]) -> dict[str, int]:
    """Before any channel is consumed (their segments are then reclaimed): offsets chain
    by raw size over the old records, in SUB_ADVANCED frames (the deferred ones are held
    back), and an old offset finds its message. Returns, per partition, where its next
    message must land (its last record's offset plus raw size)."""
    ends = {}
    for key in parts:
        topic, pid = key.split("/")
        deferred = {
            r["id"]
            for k, rows in manifest["deliver_later"].items()
            if k.rsplit("/", 1)[0] == key
            for r in rows
            if r["attempts"] == 1  # (a DPUB's: a REQ'd message was read already)
        }
        if topic == "ordered" or topic in manifest["paused_topics"]:
            # (SUB_ADVANCED is refused on an orderedmulti topic: see deliver_now; a
            # paused topic delivers nothing)
            continue
        records = [r for r in manifest["records"][key] if r["id"] not in deferred]
        ext = topic == "ext"
        mid = len(records) // 2
        msgs = []
        for start, name in ((0, "chain_all"), (records[mid]["offset"], "chain_mid")):
            sub = await Raw.connect(node.nsqd)
            await sub.identify(desired_tag="", extend_support=ext)
            pos = c.ConsumeStart("virtual_queue", start) if start else c.ConsumeStart("msgcount", 0)
            sub.send(c.sub_advanced(topic, name, int(pid), pos))
            assert await sub.response() == b"OK", key
            sub.send(c.rdy(len(records) + 1))
            n = len(records) - (mid if start else 0)
            msgs.append([await sub.yz_message(with_ext=ext, detail=True) for _ in range(n)])
            assert await sub.nothing_for(0.1), (key, name)
            await sub.close()
        everything, from_mid = msgs
        assert [(m.internal_id, m.offset) for m in everything] == [
            (r["id"], r["offset"]) for r in records
        ], key
        by_seq = {r["id"]: r["seq"] for r in records}
        for a, b in itertools.pairwise(everything):
            if by_seq[b.internal_id] == by_seq[a.internal_id] + 1:
                assert a.offset + a.raw_size == b.offset, (key, a.body, b.body)
        assert [m.internal_id for m in from_mid] == [r["id"] for r in records[mid:]], key
        last = everything[-1]
        if last.internal_id == manifest["records"][key][-1]["id"]:
            ends[key] = last.offset + last.raw_size
    return ends


async def publish_after(node: Node, manifest: dict[str, Any], ends: dict[str, int]) -> None:
    """A publish after the upgrade gets the next id and follows the last old record."""
    for key, offset in ends.items():
        topic, pid = key.split("/")
        if topic not in ("plain", "multi"):
            continue
        pub = await Raw.connect(node.nsqd)
        pub.send(c.pub_trace(topic, int(pid), 1, b"after the upgrade"))
        resp = await pub.response()
        new_id, _trace, got, _size = struct.unpack(">QQQI", resp[2:])
        await pub.close()
        assert got == offset, key
        assert new_id == max(r["id"] for r in manifest["records"][key]) + 1, key


# -- the cluster formats: nsqlookupd and both nsqd as processes -----------------------

CLUSTER_FORMATS = [f for f in FORMATS if "cluster" in manifest_of(f)["features"]]


def lookup_placement(lookupd: LookupdProcess, topic: str) -> dict[str, Any] | None:
    """/lookup with the topic's meta: ({partition: the node id serving it}, meta)."""
    status, _, body = lookupd.get(f"/lookup?topic={topic}&metainfo=true", headers=V1)
    if status != 200:
        return None
    doc = json.loads(body)
    parts = {p: info["distributed_id"] for p, info in doc.get("partitions", {}).items()}
    return {"partitions": parts, "meta": doc.get("meta")}


@pytest.mark.parametrize("fmt", CLUSTER_FORMATS)
def test_a_cluster_of_a_format_keeps_its_placement_replicas_leaders_and_epochs(
    fmt: str, tmp_path: Path
) -> None:
    """nsqlookupd's meta store keeps every partition's leader (and, where the format had
    them, its ISR and epochs) before any nsqd is back; both nsqd come back and every
    topic is served where it was, with its settings; the replicated partition holds the
    same records on both replicas, is led by its leader again, and its channel delivers
    what was left."""
    manifest = manifest_of(fmt)
    shutil.copytree(
        FIXTURES / f"upgrade_{fmt}",
        tmp_path / "data",
        ignore=shutil.ignore_patterns("manifest.json"),
    )
    lookupd = start_lookupd(f"--data-path={tmp_path / 'data' / 'lookupd'}")
    nodes: list[NsqdProcess] = []
    try:
        old = {
            t: {
                "partitions": {p: i["distributed_id"] for p, i in doc["partitions"].items()},
                "meta": doc["meta"],
            }
            for t, doc in manifest["lookupd_lookup"].items()
        }
        for topic, want in old.items():
            got = lookupd.json(f"/partition/history?topic={topic}")["partitions"]
            assert {p: got[p]["leader"] for p in want["partitions"]} == want["partitions"]
            for pid, before in (
                manifest["lookupd_history"].get(topic, {}).get("partitions", {}).items()
            ):
                assert [got[pid][k] for k in ("leader", "isr", "epoch")] == [
                    before[k] for k in ("leader", "isr", "epoch")
                ], (topic, pid)
        where = manifest["where"]
        first = where["repl/0"][0] if "repl/0" in where else 0
        started: dict[int, NsqdProcess] = {}
        for i in (first, 1 - first):
            started[i] = start_nsqd(
                tmp_path / "data" / f"nsqd{i}",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                "--http-address=127.0.0.1:0",
                "--broadcast-address=127.0.0.1",
            )
            nodes.append(started[i])
        nodes[:] = [started[0], started[1]]
        assert [(n.data_path / "nsqd.node_id").read_text().strip() for n in nodes] == manifest[
            "nodes"
        ]
        for topic, want in old.items():
            wait_until(
                lambda t=topic, w=want: lookup_placement(lookupd, t) == w,
                30,
                f"{topic} served where it was, with its settings",
            )
        if "repl/0" not in where:
            return
        wait_until(lambda: write_leader(lookupd) == nodes[first].tcp_port, 30, "repl's leader")
        for i in (first, 1 - first):
            wait_until(
                lambda i=i: range_read(nodes[i], "repl") == manifest["records"]["repl/0"],
                30,
                f"repl's records on node {i}",
            )
        want_r = manifest["deliver"]["repl/0/r"]
        records = manifest["records"]["repl/0"]

        async def consume() -> None:
            # offsets, written before and after the failover, chain by raw size
            chain = await Raw.connect(nodes[first].tcp_address)
            await chain.identify(desired_tag="")
            chain.send(c.sub_advanced("repl", "chain", 0, c.ConsumeStart("msgcount", 0)))
            assert await chain.response() == b"OK"
            chain.send(c.rdy(len(records)))
            read = [await chain.yz_message(detail=True) for _ in range(len(records))]
            assert [(m.internal_id, m.offset) for m in read] == [
                (r["id"], r["offset"]) for r in records
            ]
            assert all(a.offset + a.raw_size == b.offset for a, b in itertools.pairwise(read))
            await chain.close()
            sub = await Raw.connect(nodes[first].tcp_address)
            await sub.subscribe("repl", "r", rdy=100)
            msgs = await sub.messages(len(want_r))
            got = [(int(m.id, 16), m.body.decode(), m.attempts) for m in msgs]
            assert sorted(got) == sorted(expected(want_r))
            sub.send(c.fin_many([m.id for m in msgs]))
            assert await sub.nothing_for(0.2)
            await sub.close()

        run(consume())
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)
        lookupd.stop(signal.SIGKILL)


SHARDED_FORMATS = [f for f in FORMATS if manifest_of(f).get("sharded_nodes")]


@pytest.mark.parametrize("fmt", SHARDED_FORMATS)
def test_a_sharded_node_of_a_format_delivers_from_every_shard(fmt: str, tmp_path: Path) -> None:
    """A node that ran as two workers with --worker-shards comes back so: each shard
    holds its records, a consumer fed from every shard gets what was left (the two in
    flight at the stop again, with their attempts), the DPUB held and counted."""
    manifest = manifest_of(fmt)
    (i,) = manifest["sharded_nodes"]
    data = tmp_path / f"nsqd{i}"
    shutil.copytree(FIXTURES / f"upgrade_{fmt}" / f"nsqd{i}", data)
    later = manifest["deliver_later"]["sharded/*/c"]
    # back to a minute before the first due time the fixture holds (its workers too)
    shift = min(r["due_min"] for r in later) - 60 * 10**9 - time.time_ns()
    node = start_nsqd(
        data, "--http-address=127.0.0.1:0", "--workers=2", "--worker-shards", wall_shift_ns=shift
    )
    try:
        for pid in (0, 1):
            assert range_read(node, "sharded", pid) == manifest["records"][f"sharded/{pid}"]
        now = manifest["deliver"]["sharded/*/c"]

        async def consume() -> None:
            sub = await Raw.connect(node.tcp_address)
            await sub.subscribe("sharded", "c", rdy=100)
            msgs = await sub.messages(len(now))
            got = [(int(m.id, 16), m.body.decode(), m.attempts) for m in msgs]
            assert sorted(got) == sorted(expected(now))
            sub.send(c.fin_many([m.id for m in msgs]))
            assert await sub.nothing_for(0.2)  # the DPUB is not due
            await sub.close()

        run(consume())
        status, _, body = http_request(f"{node.http_url}/stats?format=json&topic=sharded")
        assert status == 200
        (topic,) = json.loads(body)["topics"]
        assert [ch["deferred_count"] for ch in topic["channels"]] == [len(later)]
    finally:
        node.stop(signal.SIGKILL)


def write_leader(lookupd: LookupdProcess) -> int | None:
    status, _, body = lookupd.get("/lookup?topic=repl&access=w", headers=V1)
    if status != 200:
        return None
    info = json.loads(body).get("partitions", {}).get("0")
    return int(info["tcp_port"]) if info else None


def range_read(node: NsqdProcess, topic: str, pid: int = 0) -> list[dict[str, Any]]:
    from nsqx.spark import rangeclient

    params = {"topic": topic, "partition": pid, "start": 0, "max_messages": 10_000}
    res = decode_range(rangeclient.request(f"127.0.0.1:{node.http_port}", "GET", "/range", params))
    return [
        {
            "seq": r.sequence,
            "offset": r.offset,
            "id": int(r.id, 16),
            "trace_id": r.trace_id,
            "ext_ver": r.ext_ver,
            "ext": r.ext.decode(),
            "body": r.body.decode(),
            "timestamp": r.timestamp,
        }
        for r in res.records
    ]
