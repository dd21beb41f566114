"""Upgrades keep data: the data directories of a cluster as nsqx's first data format left
them (tests/fixtures/upgrade_v1, made by tests/fixtures/make_upgrade_v1.py: two nsqd and
their nsqlookupd; plain, ext, ordered and replicated topics, deferred messages, channels
part-way) are opened by today's nsqd and nsqlookupd, as real processes, and everything is
delivered with the same ids, offsets and positions; and a directory in a format this
release does not read stops the daemon with one line that says what to run."""

from __future__ import annotations

import json
import shutil
import signal
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqx.spark import rangeclient
from nsqx.store.data_format import (
    CURRENT,
    FORMAT_FILE,
    RELEASE,
    DataFormat,
    DataFormatError,
    check_format,
    open_data_dir,
    read_format,
    write_format,
)
from nsqx.wire import commands as c
from nsqx.wire.range import decode_range

from lookupdproc import LookupdProcess, http_request, start_lookupd, wait_until
from nsqdproc import NsqdProcess, start_nsqd
from rawnsq import Raw, run

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade_v1"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture
def manifest() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURE / "manifest.json").read_text())
    return doc


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LookupdProcess, list[NsqdProcess]]]:
    """The fixture's nsqlookupd (on a copy of its meta store) and both nsqd (on copies of
    their data directories), started in that order; stopped at the end."""
    shutil.copytree(FIXTURE, tmp_path / "data", ignore=shutil.ignore_patterns("manifest.json"))
    lookupd = start_lookupd(f"--data-path={tmp_path / 'data' / 'lookupd'}")
    nodes: list[NsqdProcess] = []
    try:
        yield lookupd, nodes
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)
        lookupd.stop(signal.SIGKILL)


def start_nodes(
    tmp_path: Path, lookupd: LookupdProcess, nodes: list[NsqdProcess], first: int
) -> None:
    """Both nsqd on their directories, node ``first`` first (the replicated partition's
    leader: back before its follower, it keeps leading), as ``nodes[0]`` and ``[1]``."""
    started: dict[int, NsqdProcess] = {}
    for i in (first, 1 - first):
        started[i] = start_nsqd(
            tmp_path / "data" / f"nsqd{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
        )
        nodes.append(started[i])  # (stopped by the fixture whatever happens next)
    nodes[:] = [started[0], started[1]]


def range_read(node: NsqdProcess, topic: str, pid: int, start: int = 0) -> list[dict[str, Any]]:
    """Records from sequence ``start`` as Spark's source reads them, in the manifest's shape."""
    address = f"127.0.0.1:{node.http_port}"
    params = {"topic": topic, "partition": pid, "start": start, "max_messages": 10_000}
    res = decode_range(rangeclient.request(address, "GET", "/range", params))
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


def channel_stats(node: NsqdProcess, topic: str, pid: int, channel: str) -> dict[str, Any]:
    status, _, body = http_request(f"{node.http_url}/stats?format=json&topic={topic}")
    assert status == 200, body
    for t in json.loads(body)["topics"] or []:
        if int(t.get("topic_partition", "0")) == pid:
            for ch in t["channels"]:
                if ch["channel_name"] == channel:
                    return dict(ch)
    raise AssertionError(f"no channel {topic}/{pid}/{channel}")


def wait_whole(node: NsqdProcess, topic: str, pid: int, n: int) -> list[dict[str, Any]]:
    """The partition's records once a range read returns ``n`` or more of them."""
    got: list[dict[str, Any]] = wait_until(
        lambda: (rows := range_read(node, topic, pid)) and len(rows) >= n and rows,
        10,
        f"{n} records in {topic}/{pid}",
    )
    return got


def wait_finished(node: NsqdProcess, topic: str, pid: int, channel: str, held: int) -> None:
    """Until the channel has nothing in flight (the FINs were taken), and nothing left
    but ``held`` deferred messages."""

    def done() -> bool:
        stats = channel_stats(node, topic, pid, channel)
        counts = (stats["in_flight_count"], stats["depth"], stats["deferred_count"])
        return counts == (0, 0, held)

    wait_until(done, 10, f"{topic}/{pid}/{channel} finished")


def post(url: str, body: bytes = b"") -> int:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def lookup_meta(lookupd: LookupdProcess, topic: str) -> dict[str, Any] | None:
    """Youzan's /lookup with the topic's meta, or None."""
    status, _, body = lookupd.get(f"/lookup?topic={topic}&metainfo=true", headers=V1)
    return json.loads(body) if status == 200 else None  # type: ignore[no-any-return]


def placement(doc: dict[str, Any]) -> dict[str, str]:
    """partition -> the node id (distributed_id) that serves it, from /lookup."""
    return {p: info["distributed_id"] for p, info in doc.get("partitions", {}).items()}


def write_leader(lookupd: LookupdProcess, topic: str, pid: int) -> int | None:
    status, _, body = lookupd.get(f"/lookup?topic={topic}&access=w", headers=V1)
    if status != 200:
        return None
    info = json.loads(body).get("partitions", {}).get(str(pid))
    return int(info["tcp_port"]) if info else None


# -- the fixture, opened by this release --------------------------------------------------


def test_nsqlookupds_meta_store_from_before_knows_its_topics(
    cluster: tuple[LookupdProcess, list[NsqdProcess]], manifest: dict[str, Any], tmp_path: Path
) -> None:
    """Before any nsqd is back, nsqlookupd's store still has every partitioned topic's
    partitions, leaders, ISR, replicas and epochs (a failover's history too); it records
    the directory's format (1, the format it had) and no nsqd is needed to answer."""
    lookupd, _ = cluster
    for topic, history in manifest["lookupd_history"].items():
        assert lookupd.json(f"/partition/history?topic={topic}") == history, topic
    repl = manifest["lookupd_history"]["repl"]["partitions"]["0"]
    assert repl["epoch"] == 3 and [h["epoch"] for h in repl["history"]] == [1, 2, 3]
    assert read_format(str(tmp_path / "data" / "lookupd")) == DataFormat(1, RELEASE)


def test_a_cluster_from_before_delivers_everything_with_the_same_ids_and_offsets(
    cluster: tuple[LookupdProcess, list[NsqdProcess]], manifest: dict[str, Any], tmp_path: Path
) -> None:
    """Both nsqd open their old directories: every partition holds the same records
    (sequence, virtual offset, id, trace id, ext, body, timestamp), on the leader and
    the follower of the replicated one; each channel delivers exactly what was left
    (unfinished messages, the ones in flight at the stop with their attempts, none of
    those finished, the out-of-order FINs beyond the confirmed offset included), the
    ordered ones in order; the DPUB due in 200 years stays held; replay by virtual
    offset and by count starts at the same messages; and new ids follow the old ones."""
    lookupd, nodes = cluster
    records: dict[str, list[dict[str, Any]]] = manifest["records"]
    where: dict[str, list[int]] = manifest["where"]
    start_nodes(tmp_path, lookupd, nodes, where["repl/0"][0])
    assert [(n.data_path / "nsqd.node_id").read_text().strip() for n in nodes] == manifest["nodes"]
    # nsqlookupd gives the replicated partition back to its leader, in sync
    repl_leader = nodes[where["repl/0"][0]]
    wait_until(
        lambda: write_leader(lookupd, "repl", 0) == repl_leader.tcp_port, 30, "repl's leader"
    )
    # ... in the epoch it had, or a later one; the topics' settings and placement as they were
    repl = lookupd.json("/partition/history?topic=repl")["partitions"]["0"]
    assert repl["leader"] == manifest["nodes"][where["repl/0"][0]] and repl["epoch"] >= 3
    for topic, flag in (("ext", "extend_support"), ("ordered", "ordered")):
        want = {str(p): manifest["nodes"][where[f"{topic}/{p}"][0]] for p in range(2)}
        doc = wait_until(
            lambda t=topic, w=want: (d := lookup_meta(lookupd, t)) and placement(d) == w and d,
            10,
            f"{topic}'s partitions registered",
        )
        assert doc["meta"][flag] and doc["meta"]["partition_num"] == 2, doc
    for key, idx in where.items():
        topic, pid = key.split("/")
        for i in idx:  # the leader and, for repl, the follower
            # (a replicated partition shows its records once it knows they are committed)
            whole = wait_whole(nodes[i], topic, int(pid), len(records[key]))
            assert whole == records[key], (key, i)
            # a range read from a position in the middle (a Spark query's checkpoint)
            mid = len(records[key]) // 2
            assert range_read(nodes[i], topic, int(pid), mid) == records[key][mid:], key
    for key, answers in manifest["pub_trace_answers"].items():
        for ans in answers:
            row = next(r for r in records[key] if r["id"] == ans[0])
            assert (row["trace_id"], row["offset"]) == (ans[1], ans[2]), key
    for dir_ in ("nsqd0", "nsqd1"):
        assert read_format(str(tmp_path / "data" / dir_)) == DataFormat(1, RELEASE)

    async def consume() -> None:
        # replay by virtual offset and by count from the old positions (first: once the
        # channels are consumed, their segments are reclaimed)
        for key in ("plain/0", "ext/1", "ordered/0", "repl/0"):
            topic, pid = key.split("/")
            node = nodes[where[key][0]]
            row = records[key][3]
            for start in (f"virtual_queue:{row['offset']}", f"msgcount:{row['seq'] + 1}"):
                name = "replay" + start.replace(":", "")
                sub = await Raw.connect(node.tcp_address)
                await sub.identify(desired_tag="", extend_support=topic == "ext")
                if topic == "ordered":
                    # SUB_ORDERED has no start: the channel is moved by /channel/setoffset
                    base = f"{node.http_url}/channel/"
                    q = f"topic={topic}&channel={name}&partition={pid}"
                    assert post(f"{base}create?{q}") == 200
                    assert post(f"{base}setoffset?{q}", start.encode()) == 200
                    sub.send(c.sub_ordered(topic, name, int(pid)))
                else:
                    sub.send(f"SUB_ADVANCED {topic} {name} {pid} {start}\n".encode())
                assert await sub.response() == b"OK"
                sub.send(c.rdy(1))
                m = await sub.yz_message(with_ext=topic == "ext", detail=True)
                assert (m.internal_id, m.offset, m.body.decode()) == (
                    row["id"],
                    row["offset"],
                    row["body"],
                ), (key, start)
                await sub.close()
        for key, want in manifest["deliver"].items():
            topic, pid, channel = key.split("/")
            node = nodes[where[f"{topic}/{pid}"][0]]
            by_seq = {r["seq"]: r for r in records[f"{topic}/{pid}"]}
            expected = [(w["id"], by_seq[w["seq"]]["body"], w["attempts"]) for w in want]
            if key in manifest["ordered_channels"]:
                got = await ordered(node, topic, int(pid), channel, len(want))
                assert got == [
                    (*e, by_seq[w["seq"]]["offset"]) for e, w in zip(expected, want, strict=True)
                ]
            elif topic == "ext":
                got = await youzan_ext(node, topic, int(pid), channel, len(want))
                assert sorted(got) == sorted(
                    (*e, by_seq[w["seq"]]["trace_id"], by_seq[w["seq"]]["ext"])
                    for e, w in zip(expected, want, strict=True)
                ), key
            else:
                sub = await Raw.connect(node.tcp_address)
                await sub.subscribe(topic, channel, rdy=100)
                msgs = await sub.messages(len(want))
                got = [(int(m.id, 16), m.body.decode(), m.attempts) for m in msgs]
                assert sorted(got) == sorted(expected), key
                sub.send(c.fin_many([m.id for m in msgs]))
                if key in manifest["held"]:
                    # the DPUB due in 200 years: held (counted below), not delivered
                    assert await sub.nothing_for(0.2)
                await sub.close()
            wait_finished(node, topic, int(pid), channel, len(manifest["held"].get(key, [])))
        # new messages: the next ids after the old ones, at the log's end
        for key in ("plain/0", "repl/0"):
            topic, pid = key.split("/")
            node = nodes[where[key][0]]
            address = f"127.0.0.1:{node.http_port}"
            end = rangeclient.fetch_range(address, topic, int(pid), 0, max_messages=0)
            assert end.end_offset > records[key][-1]["offset"], key
            pub = await Raw.connect(node.tcp_address)
            pub.send(c.pub_trace(topic, int(pid), 1, b"after the upgrade"))
            resp = await pub.response()
            new_id, _trace, offset, _size = struct.unpack(">QQQI", resp[2:])
            assert new_id == max(r["id"] for r in records[key]) + 1, key
            # a batch's first record follows its header, as the log's first one does
            assert offset == end.end_offset + records[key][0]["offset"], key
            await pub.close()

    run(consume())


async def ordered(
    node: NsqdProcess, topic: str, pid: int, channel: str, n: int
) -> list[tuple[int, str, int, int]]:
    """SUB_ORDERED: one message at a time, each FINed before the next comes."""
    sub = await Raw.connect(node.tcp_address)
    await sub.identify(desired_tag="")
    sub.send(c.sub_ordered(topic, channel, pid))
    assert await sub.response() == b"OK"
    sub.send(c.rdy(10))
    got = []
    for _ in range(n):
        m = await sub.yz_message(detail=True)
        got.append((m.internal_id, m.body.decode(), m.attempts, m.offset))
        sub.send(c.fin(m.id))
    await sub.close()
    return got


async def youzan_ext(
    node: NsqdProcess, topic: str, pid: int, channel: str, n: int
) -> list[tuple[int, str, int, int, str]]:
    """A Youzan consumer with ext support: id, body, attempts, trace id and ext header."""
    sub = await Raw.connect(node.tcp_address)
    await sub.identify(desired_tag="", extend_support=True)
    sub.send(c.sub(topic, channel, pid))
    assert await sub.response() == b"OK"
    sub.send(c.rdy(100))
    msgs = [await sub.yz_message(with_ext=True) for _ in range(n)]
    sub.send(b"".join(c.fin(m.id) for m in msgs))
    await sub.close()
    return [(m.internal_id, m.body.decode(), m.attempts, m.trace_id, m.ext.decode()) for m in msgs]


# -- the format version ------------------------------------------------------------------


def _daemon(command: str, data_path: Path) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "nsqx", command, f"--data-path={data_path}"]
    args += ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    if command == "nsqd":
        args.append("--https-address=")
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("command", ["nsqd", "nsqlookupd"])
def test_a_directory_of_a_newer_format_stops_the_daemon_with_one_line(
    tmp_path: Path, command: str
) -> None:
    """``nsqx nsqd --data-path=X`` (and nsqlookupd) on a directory that a newer release
    wrote exits 1 before it reads anything there, with one line naming the format, the
    release that wrote it, what this release reads and the command to run instead; the
    directory is left as it was."""
    data = tmp_path / "data"
    data.mkdir()
    write_format(str(data), DataFormat(CURRENT + 1, "nsqx 9.0.0"))
    (data / "nsqd.dat").write_text("not JSON: never read")
    (data / "nsqlookupd.meta.json").write_text("not JSON: never read")
    before = sorted(p.name for p in data.iterdir())
    proc = _daemon(command, data)
    assert proc.returncode == 1, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "CRITICAL" in x]
    assert line.endswith(
        f"failed to start: {data} holds data format {CURRENT + 1} (written by nsqx 9.0.0);"
        f" {RELEASE} reads formats up to {CURRENT} and cannot move a directory back:"
        f" start it with `nsqx {command}` of nsqx 9.0.0 or later"
    ), line
    assert sorted(p.name for p in data.iterdir() if p.name != "nsqd.lock") == before
    assert read_format(str(data)) == DataFormat(CURRENT + 1, "nsqx 9.0.0")


def test_a_new_directory_records_its_format(tmp_path: Path) -> None:
    """A new (or unversioned, today's) directory gets the format file on start, written
    whole; opening it again reads it back; a damaged file is an error, not format 1."""
    assert open_data_dir(str(tmp_path / "new"), "nsqx nsqd") == DataFormat(1)
    assert read_format(str(tmp_path / "new")) == DataFormat(1, RELEASE)
    assert [p.name for p in (tmp_path / "new").iterdir()] == [FORMAT_FILE]
    assert open_data_dir(str(tmp_path / "new"), "nsqx nsqd") == DataFormat(1, RELEASE)
    (tmp_path / "new" / FORMAT_FILE).write_text('{"format": "one"}')
    with pytest.raises(DataFormatError, match="is not a data format file"):
        open_data_dir(str(tmp_path / "new"), "nsqx nsqd")


def test_a_format_older_than_this_release_reads_names_the_release_that_migrates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a release stops reading a format, its message names the command (the older
    release's daemon on that directory) that migrates it; a format no release migrates
    says so."""
    from nsqx.store import data_format

    old = DataFormat(1, "nsqx 0.1.0")
    with pytest.raises(DataFormatError) as err:
        check_format("/d", "nsqx nsqd", old, oldest=2, current=3)
    assert str(err.value) == (
        f"/d holds data format 1 (written by nsqx 0.1.0), older than {RELEASE} reads"
        " (formats 2 to 3), and no release migrates it"
    )
    monkeypatch.setitem(data_format.MIGRATED_BY, 1, "0.5.0")
    with pytest.raises(DataFormatError) as err:
        check_format("/d", "nsqx nsqlookupd", old, oldest=2, current=3)
    assert str(err.value) == (
        f"/d holds data format 1 (written by nsqx 0.1.0), older than {RELEASE} reads"
        " (formats 2 to 3): migrate it first with `nsqx nsqlookupd --data-path=/d` of"
        " nsqx 0.5.0, which upgrades it on start, then start this release again"
    )
    check_format("/d", "nsqx nsqd", DataFormat(2), oldest=2, current=3)  # read as is
