"""Message ids: never 0 (Youzan's clients read an answered id 0 as "no id"), unique per
partition, and the same after a restart and after an upgrade: a data directory written
while ids were partition << 50 | sequence (tests/fixtures/legacy_ids, made by
tests/fixtures/make_legacy_ids.py) keeps its ids, offsets and positions."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from nsqx.nsqd.guid import LEGACY_ID_BASE, PARTITION_SHIFT, make_ids, seq_of
from nsqx.nsqd.nsqd import NSQD
from nsqx.nsqd.partition import Partition
from nsqx.store.disklog import DiskLog
from nsqx.wire import commands as c
from nsqx.wire.frames import ID_AT, ID_END, encode_message_batch, record_parts

from rawnsq import Raw, run, start_nsqd, wait_for

FIXTURE = Path(__file__).parent.parent / "fixtures" / "legacy_ids"
TS = 1_700_000_000_000_000_000


@asynccontextmanager
async def served(data: Path) -> AsyncIterator[tuple[NSQD, aiohttp.ClientSession, str]]:
    nsqd = await start_nsqd(data_path=str(data), http_address="127.0.0.1:0")
    assert nsqd.http_address is not None
    try:
        async with aiohttp.ClientSession() as session:
            yield nsqd, session, f"http://127.0.0.1:{nsqd.http_address[1]}"
    finally:
        await nsqd.close()


async def post(s: aiohttp.ClientSession, url: str, data: bytes = b"") -> tuple[int, bytes]:
    async with s.post(url, data=data) as resp:
        return resp.status, await resp.read()


async def get(s: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with s.get(url) as resp:
        return resp.status, json.loads(await resp.read() or b"null")


async def traced_pub(raw: Raw, topic: str, pid: int, trace: int, body: bytes) -> tuple[int, ...]:
    """PUB_TRACE; its answer: (id, trace id, offset, raw size). youzan/go-nsq takes an
    id of 0 there for "no id" (PublishWithTrace, PublishOrdered)."""
    raw.send(c.pub_trace(topic, pid, trace, body))
    resp = await raw.response()
    assert len(resp) == 30 and resp[:2] == b"OK", resp
    return struct.unpack(">QQQI", resp[2:])


async def youzan_sub(nsqd: NSQD, topic: str, channel: str, partition: int, start: str = "") -> Raw:
    """A SUB_ADVANCED consumer (Youzan mode: binary ids, offsets) with RDY 10."""
    sub = await Raw.connect(nsqd)
    await sub.identify(desired_tag="")
    line = f"SUB_ADVANCED {topic} {channel} {partition}" + (f" {start}" if start else "")
    sub.send(line.encode() + b"\n")
    assert await sub.response() == b"OK", line
    sub.send(c.rdy(10))
    return sub


def stored(part: Partition) -> list[tuple[int, str, int | None, str]]:
    """(sequence, id, virtual offset, body) of every record of a partition's log."""
    log = part.log
    out = []
    for seq in range(log.start, log.end):
        frame = log.get(seq)
        assert frame is not None
        body_at = record_parts(frame)[3]
        out.append(
            (seq, frame[ID_AT:ID_END].decode(), log.offset_of(seq), frame[body_at:].decode())
        )
    return out


# -- new logs ---------------------------------------------------------------------------


def test_the_first_message_of_every_partition_has_an_id_that_is_not_0(tmp_path: Path) -> None:
    """What youzan/go-nsq checks (its PublishWithTrace / PublishOrdered take an answered
    id 0 for "no id"; go-nsq itself cannot be run here): the PUB_TRACE and MPUB_TRACE
    answers of a partition's first messages, and the ids consumers get, are not 0, on a
    fresh NSQ 1.3 topic, on every partition of a partitioned one and on a memory-only
    topic."""

    async def body() -> None:
        async with served(tmp_path) as (nsqd, s, base):
            pub = await Raw.connect(nsqd)
            for name in ("traced", "batch", "mem#ephemeral"):
                nsqd.get_topic(name)  # (PUB_TRACE makes no topic, as Youzan's)
            # NSQ 1.3 topics: a plain PUB first, then traced ones
            await pub.publish("plain", b"first")
            one = await traced_pub(pub, "traced", 0, 7, b"first")
            assert one[0] == 1 and one[1] == 7
            pub.send(c.mpub_trace("batch", 0, [1, 2], [b"a", b"b"]))
            resp = await pub.response()
            assert struct.unpack(">Q", resp[2:10])[0] == 1
            eph = await traced_pub(pub, "mem#ephemeral", 0, 1, b"first")
            assert eph[0] == 1
            # a partitioned topic: each partition's first id is partition << 50 | 1
            for p in range(4):
                url = f"{base}/topic/create?topic=pp&partition={p}&partition_num=4"
                assert await post(s, url) == (200, b"")
            for p in range(4):
                got = await traced_pub(pub, "pp", p, 100 + p, b"pp%d" % p)
                assert got[0] != 0 and got[0] >> PARTITION_SHIFT == p
                assert got[0] == (p << PARTITION_SHIFT) | 1
            # a vanilla consumer gets hex ids, a Youzan one binary ids: none is 0
            sub = await Raw.connect(nsqd)
            await sub.subscribe("plain", "ch", rdy=10)
            (m,) = await sub.messages(1)
            assert m.body == b"first" and m.id == b"0000000000000001"
            yz = await youzan_sub(nsqd, "pp", "ch", 0)
            ym = await yz.yz_message(detail=True)
            assert ym.body == b"pp0" and ym.internal_id == 1 and ym.offset >= 0
            # REQ, TOUCH and FIN of that id lead to its record
            sub.send(c.touch(m.id) + c.req(m.id, 0))
            (again,) = await sub.messages(1)
            assert (again.id, again.body, again.attempts) == (m.id, b"first", 2)
            sub.send(c.fin(again.id))
            yz.send(c.fin(ym.id))
            ch = nsqd.topics["plain"].partitions[0].channels["ch"]
            await wait_for(lambda: ch.in_flight_count == 0 and ch.depth == 0)
            assert nsqd.topics["plain"].partitions[0].id_base == 0
        # after a restart: the same ids, and the next ones follow
        async with served(tmp_path) as (nsqd, s, base):
            part = nsqd.topics["traced"].partitions[0]
            assert part.id_base == 0 and stored(part)[0][:2] == (0, "0000000000000001")
            pub = await Raw.connect(nsqd)
            assert (await traced_pub(pub, "traced", 0, 8, b"second"))[0] == 2
            assert (await traced_pub(pub, "pp", 3, 8, b"second"))[0] == 3 << PARTITION_SHIFT | 2

    run(body())


def test_replay_positions_keep_their_meaning(tmp_path: Path) -> None:
    """SUB_ADVANCED and /channel/setoffset by count and by virtual offset start where the
    PUB_TRACE answers say, and /message/get by id finds what the answer named."""

    async def body() -> None:
        async with served(tmp_path) as (nsqd, s, base):
            nsqd.get_topic("r")
            pub = await Raw.connect(nsqd)
            answers = [await traced_pub(pub, "r", 0, 0, b"m%d" % i) for i in range(5)]
            assert [a[0] for a in answers] == [1, 2, 3, 4, 5]
            for start, want in (
                ("msgcount:1", 0),  # the first message, counted from 1 as Youzan counts
                ("msgcount:3", 2),
                (f"virtual_queue:{answers[0][2]}", 0),
                (f"virtual_queue:{answers[3][2]}", 3),
            ):
                sub = await youzan_sub(nsqd, "r", "x" + start.replace(":", ""), 0, start)
                m = await sub.yz_message(detail=True)
                assert (m.body, m.internal_id, m.offset) == (
                    b"m%d" % want,
                    answers[want][0],
                    answers[want][2],
                ), start
                await sub.close()
            sub = await youzan_sub(nsqd, "r", "all", 0, "msgcount:1")
            got = [await sub.yz_message(detail=True) for _ in range(5)]
            sub.send(b"".join(c.fin(m.id) for m in got))
            ch = nsqd.topics["r"].partitions[0].channels["all"]
            await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0)
            url = f"{base}/channel/setoffset?topic=r&channel=all&partition=0"
            assert await post(s, url, b"msgcount:2") == (200, b"")
            got = [await sub.yz_message(detail=True) for _ in range(4)]
            assert [(m.body, m.internal_id) for m in got] == [
                (b"m%d" % i, answers[i][0]) for i in range(1, 5)
            ]
            sub.send(b"".join(c.fin(m.id) for m in got))
            await wait_for(lambda: ch.depth == 0 and ch.in_flight_count == 0)
            assert await post(s, url, f"virtual_queue:{answers[4][2]}".encode()) == (200, b"")
            m = await sub.yz_message(detail=True)
            assert (m.body, m.internal_id) == (b"m4", answers[4][0])
            for i in (0, 4):
                status, msg = await get(
                    s, f"{base}/message/get?topic=r&search_mode=id&search_pos={answers[i][0]}"
                )
                assert status == 200 and msg["body"] == f"m{i}" and msg["id"] == answers[i][0]
                assert msg["queue_cnt_index"] == i + 1 and msg["offset"] == answers[i][2]
            # no message has id 0 (nor an id past the last)
            for pos in (0, answers[4][0] + 1):
                url = f"{base}/message/get?topic=r&search_mode=id&search_pos={pos}"
                assert (await get(s, url))[0] == 404

    run(body())


# -- a data directory written while ids were partition << 50 | sequence ------------------


def test_a_data_directory_from_before_keeps_its_ids(tmp_path: Path) -> None:
    """Every stored message keeps its id, offset and body; a message in flight at the
    stop comes back with its id, and REQ / FIN of the old ids work; replay positions
    start at the same messages; new publishes get ids that are not 0 and are none of
    the old ones; and all of that again after another restart."""
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    records: dict[str, list[dict[str, Any]]] = manifest["records"]
    old_ids = {r["id"] for rows in records.values() for r in rows}
    assert "0000000000000000" in old_ids  # made by the rule before: partition 0's first
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)

    def parts(nsqd: NSQD) -> dict[str, Partition]:
        return {
            "legacy": nsqd.topics["legacy"].partitions[0],
            **{f"parts.{p}": nsqd.topics["parts"].partitions[p] for p in range(3)},
        }

    def as_stored(rows: list[dict[str, Any]]) -> list[tuple[int, str, int | None, str]]:
        return [(r["seq"], r["id"], r["offset"], r["body"]) for r in rows]

    new_ids: dict[str, list[int]] = {}

    async def body() -> None:
        async with served(data) as (nsqd, s, base):
            for name, part in parts(nsqd).items():
                assert part.id_base == LEGACY_ID_BASE, name
                assert stored(part) == as_stored(records[name]), name
            legacy = records["legacy"]
            # c1: m0 and m1 were finished; m2 and m3 were in flight, and come back first
            c1 = await Raw.connect(nsqd)
            await c1.subscribe("legacy", "c1", rdy=10)
            got = await c1.messages(7)
            want = {(r["id"].encode(), r["body"].encode()) for r in legacy[2:]}
            assert {(m.id, m.body) for m in got} == want
            in_flight = [m for m in got if m.id.decode() in manifest["c1_in_flight"]]
            assert [m.body for m in in_flight] == [b"m2", b"m3"]
            # REQ of an old id brings back that message, with that id
            c1.send(c.req(in_flight[0].id, 0))
            (again,) = await c1.messages(1)
            assert (again.id, again.body) == (in_flight[0].id, b"m2")
            c1.send(c.fin_many([m.id for m in got if m.id != again.id] + [again.id]))
            ch1 = nsqd.topics["legacy"].partitions[0].channels["c1"]
            await wait_for(lambda: ch1.in_flight_count == 0 and ch1.depth == 0)
            # c2: everything, id 0 included, FINed by its old ids
            c2 = await Raw.connect(nsqd)
            await c2.subscribe("legacy", "c2", rdy=20)
            got = await c2.messages(len(legacy))
            assert sorted((m.id.decode(), m.body.decode()) for m in got) == sorted(
                (r["id"], r["body"]) for r in legacy
            )
            c2.send(c.fin_many([m.id for m in got]))
            ch2 = nsqd.topics["legacy"].partitions[0].channels["c2"]
            await wait_for(lambda: ch2.in_flight_count == 0 and ch2.depth == 0)
            # /message/get by the old ids (0 too), by count and by offset
            for mode, pos, want_row in (
                ("id", 0, legacy[0]),
                ("id", int(legacy[5]["id"], 16), legacy[5]),
                ("count", 1, legacy[0]),
                ("virtual_offset", legacy[5]["offset"], legacy[5]),
            ):
                status, msg = await get(
                    s,
                    f"{base}/message/get?topic=legacy&partition=0&search_mode={mode}"
                    f"&search_pos={pos}",
                )
                assert status == 200, (mode, pos)
                assert (msg["id"], msg["body"], msg["offset"]) == (
                    int(want_row["id"], 16),
                    want_row["body"],
                    want_row["offset"],
                ), (mode, pos)
                assert msg["trace_id"] == want_row["trace_id"]
            # replay by count and by offset starts at the same messages as before
            p0, p1 = records["parts.0"], records["parts.1"]
            for partition, start, row in (
                (0, "msgcount:1", p0[0]),
                (0, "msgcount:2", p0[1]),
                (0, f"virtual_queue:{p0[0]['offset']}", p0[0]),
                (1, f"virtual_queue:{p1[1]['offset']}", p1[1]),
            ):
                channel = f"r{partition}{start.replace(':', '')}"
                sub = await youzan_sub(nsqd, "parts", channel, partition, start)
                m = await sub.yz_message(detail=True)
                assert (m.internal_id, m.offset, m.body.decode()) == (
                    int(row["id"], 16),
                    row["offset"],
                    row["body"],
                ), (partition, start)
                await sub.close()
            # the answers PUB_TRACE gave then are what is stored
            for name, answers in manifest["pub_trace_answers"].items():
                for ans in answers:
                    row = next(r for r in records[name] if int(r["id"], 16) == ans[0])
                    assert (row["trace_id"], row["offset"]) == (ans[1], ans[2])
            # new publishes: ids that are not 0 and none of the old ones, still growing
            pub = await Raw.connect(nsqd)
            for name, part in parts(nsqd).items():
                ans = await traced_pub(pub, part.name, part.id, 9, b"new " + name.encode())
                assert ans[0] != 0 and b"%016x" % ans[0] not in old_ids
                assert ans[0] > max(int(r["id"], 16) for r in records[name])
                assert ans[0] >> PARTITION_SHIFT == part.id
                new_ids[name] = [ans[0]]
            got = await c2.messages(1)
            assert (int(got[0].id, 16), got[0].body) == (new_ids["legacy"][0], b"new legacy")
            c2.send(c.fin(got[0].id))
            await wait_for(lambda: ch2.in_flight_count == 0 and ch2.depth == 0)
        # again after a restart: old and new ids as they were, and the next ones follow
        async with served(data) as (nsqd, s, base):
            pub = await Raw.connect(nsqd)
            for name, part in parts(nsqd).items():
                rows = stored(part)
                assert rows[: len(records[name])] == as_stored(records[name]), name
                assert [int(r[1], 16) for r in rows[len(records[name]) :]] == new_ids[name]
                ans = await traced_pub(pub, part.name, part.id, 9, b"newer")
                assert ans[0] == new_ids[name][0] + 1
                assert part.seq_of(b"%016x" % ans[0]) == part.log.end - 1

    run(body())


def test_an_old_log_with_no_record_left_gives_ids_past_its_end(tmp_path: Path) -> None:
    """A log from before with nothing left of it (consumed, emptied) starts the rule
    of ids from sequence + 1 at its end: no id it gave is given again, none is 0."""

    async def body() -> None:
        async with served(tmp_path) as (nsqd, _s, _base):
            nsqd.get_topic("e")
        log = DiskLog(str(tmp_path / "e.topic" / "p0"))
        for _ in range(3):
            _leader_put(log, 1, LEGACY_ID_BASE)  # ids 0, 1, 2, as nsqx gave them before
        log.drop_before(log.end)
        log.close()
        (tmp_path / "e.topic" / "topic.json").unlink(missing_ok=True)  # (state from before)
        async with served(tmp_path) as (nsqd, _s, _base):
            part = nsqd.topics["e"].partitions[0]
            assert (part.log.start, part.log.end, part.id_base) == (3, 3, 3)
            pub = await Raw.connect(nsqd)
            assert (await traced_pub(pub, "e", 0, 1, b"new"))[0] == 4
        async with served(tmp_path) as (nsqd, _s, _base):
            part = nsqd.topics["e"].partitions[0]
            assert part.id_base == 3 and [r[:2] for r in stored(part)] == [(3, "0000000000000004")]
            pub = await Raw.connect(nsqd)
            assert (await traced_pub(pub, "e", 0, 1, b"newer"))[0] == 5

    run(body())


# -- replication: a follower keeps its leader's ids and rule -----------------------------


def _leader_put(log: DiskLog, n: int, id_base: int) -> None:
    ids = make_ids(log.end, n, 0, id_base)
    chunk, stride = encode_message_batch(TS, ids, [b"b%d" % (log.end + k) for k in range(n)])
    log.append(chunk, ids, 0, stride)


def test_a_follower_takes_its_leaders_id_rule(tmp_path: Path) -> None:
    """A follower stores its leader's records byte for byte and never makes ids: its id
    base (how an id leads back to a sequence, and the ids it makes once it leads) follows
    the leader's records, also where a leader that kept an old log starts ids at
    sequence + 1 (it had none of the old records left at a restart), and across a
    restart of the follower."""
    leader = DiskLog(str(tmp_path / "leader"))
    for _ in range(3):
        _leader_put(leader, 2, LEGACY_ID_BASE)  # written with the rule before: ids 0..5

    def follower_ids(part: Partition) -> list[bytes]:
        return part.log.read(part.log.start, 100)[1]

    async def body() -> None:
        data = tmp_path / "follower"
        async with served(data) as (nsqd, _s, _base):
            part = nsqd.get_topic("f").partitions[0]
            assert part.id_base == 0  # a new log: ids from sequence + 1
            part.append_replicated(leader.read_batches(0, 1 << 20))
            assert part.id_base == LEGACY_ID_BASE
            assert follower_ids(part) == leader.read(0, 100)[1] == make_ids(0, 6, 0, LEGACY_ID_BASE)
            assert [part.seq_of(i) for i in follower_ids(part)] == list(range(6))
            # the leader restarted with nothing of its old log left: ids from sequence + 1
            _leader_put(leader, 2, 6)
            part.append_replicated(leader.read_batches(6, 1 << 20))
            assert part.id_base == 6
            ids = follower_ids(part)
            assert ids == leader.read(0, 100)[1] and int(ids[-2], 16) == 7
            assert [part.seq_of(i) for i in ids] == list(range(8))
        async with served(data) as (nsqd, _s, _base):
            part = nsqd.topics["f"].partitions[0]
            assert part.id_base == 6  # (in the partition's state: its records are mixed)
            assert [part.seq_of(i) for i in follower_ids(part)] == list(range(8))
            # if it leads now, its ids follow the leader's
            pub = await Raw.connect(nsqd)
            assert (await traced_pub(pub, "f", 0, 1, b"led"))[0] == 9
            # cut back to before the base: the next leader says the rule again
            part.truncate(5)
            assert part.log.end == 4 and part.id_base == LEGACY_ID_BASE  # (batches of 2)
            part.reset(20, 1000)
            assert part.id_base == 20 and part.log.end == 20
            assert seq_of(b"%016x" % 21, part.id_base) == 20
        leader.close()

    run(body())
