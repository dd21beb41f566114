"""The side-by-side scenarios against Youzan's own nsqd/nsqlookupd: the answers below are
what the reference gave, so they are the spec nsqx's cluster must give too.

Needs the reference binaries at <repo>/../shared/reference/youzan-nsq-bin (or where
NSQX_YOUZAN_REFERENCE says) and etcd
(Debian: etcd-server); skipped otherwise, or when cluster.sh's fixed ports are busy.
A fresh reference cluster takes 60-120 s before new partitions accept writes, so this
runs only with ``-m slow`` (``make test PYTEST_ARGS='-m slow tests/youzan'``); the answers
it checks are the ones test_side_by_side_nsqx.py holds nsqx's cluster to on every run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from youzan.side_by_side import (
    CHAIN_SEGMENT_BYTES,
    SCENARIOS,
    Restart,
    murmur3_32,
    ordered_keys,
    parse_message,
    partition_for_key,
    run_scenarios,
)

REPO = Path(__file__).resolve().parents[2]
#: NSQX_YOUZAN_REFERENCE names the binaries' folder where the checkout has no ../shared
REFERENCE = Path(
    os.environ.get("NSQX_YOUZAN_REFERENCE")
    or REPO.parent / "shared" / "reference" / "youzan-nsq-bin"
)
# cluster.sh's fixed loopback ports: etcd, nsqlookupd, and the two nsqd
PORTS = (23791, 23801, 14160, 14161, 14260, 14150, 14151, 14250, 14155, 14156, 14255)
LOOKUPD_HTTP = "127.0.0.1:14161"


def _busy(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass
class YouzanCluster:
    lookupd_http: str
    #: stop one nsqd (by its TCP address) and start it again on its data
    restart: Restart
    #: cluster.sh's folder (the nodes' data directories are under it)
    work: Path


@pytest.fixture(scope="module")
def youzan_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[YouzanCluster]:
    """Youzan's etcd + nsqlookupd + 2 nsqd via cluster.sh, with the segment size the chain
    scenario needs; yields lookupd's HTTP address and a restart of one nsqd."""
    script = REFERENCE / "cluster.sh"
    if not script.exists():
        pytest.skip(f"no Youzan reference binaries at {REFERENCE}")
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (apt-get install -y etcd-server)")
    busy = [p for p in PORTS if _busy(p)]
    if busy:
        pytest.skip(f"cluster.sh's fixed ports are busy: {busy}")
    work = tmp_path_factory.mktemp("youzan-ref")
    env = {
        **os.environ,
        "YZ_WORK": str(work),
        "NSQD_EXTRA": f"max_bytes_per_file = {CHAIN_SEGMENT_BYTES}",
    }
    log = work / "cluster-sh.log"

    def cluster_sh(cmd: str) -> int:
        with log.open("a") as out:
            return subprocess.run(
                [str(script), cmd], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120
            ).returncode

    async def restart(tcp: str) -> None:
        # cluster.sh's nsqd1 listens on 14150, nsqd2 on 14155; its start starts again
        # what is not running
        name = {"14150": "nsqd1", "14155": "nsqd2"}[tcp.rsplit(":", 1)[1]]
        pid = int((work / f"{name}.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        while Path(f"/proc/{pid}").exists():
            await asyncio.sleep(0.1)
        if await asyncio.to_thread(cluster_sh, "start") != 0:
            pytest.fail(f"cluster.sh start (restart of {name}) failed:\n{log.read_text()}")

    try:
        if cluster_sh("start") != 0:
            pytest.fail(f"cluster.sh start failed:\n{log.read_text()}")
        yield YouzanCluster(LOOKUPD_HTTP, restart, work)
    finally:
        cluster_sh("stop")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_reference_gives_the_expected_answers(youzan_cluster: YouzanCluster) -> None:
    results = asyncio.run(
        run_scenarios(youzan_cluster.lookupd_http, restart=youzan_cluster.restart)
    )
    # the chain scenario's partition took more than one segment file (max_bytes_per_file)
    files = sorted(
        str(p.relative_to(youzan_cluster.work))
        for p in youzan_cluster.work.rglob("*")
        if p.is_file() and "_chain" in p.as_posix()
    )
    print("\n".join(files))
    queue_files = [f for f in files if ".diskqueue." in f and f.endswith(".dat")]
    assert len(queue_files) > 1, files
    assert list(results) == list(SCENARIOS)
    for name in SCENARIOS:
        assert results[name] == EXPECTED[name], name


def test_murmur3_known_vectors() -> None:
    # reference values of MurmurHash3_x86_32 (seed 0 unless given)
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert murmur3_32(b"\x00\x00\x00\x00") == 0x2362F9DE
    assert murmur3_32(b"abc") == 0xB3DD93FA


def test_ordered_keys_cover_every_partition() -> None:
    keys = ordered_keys(4, 2)
    assert sorted(keys) == [0, 1, 2, 3]
    for p, ks in keys.items():
        assert len(ks) == 2
        assert all(partition_for_key(k, 4) == p for k in ks)


def test_parse_message_layouts() -> None:
    head = (7).to_bytes(8, "big") + (1).to_bytes(2, "big")
    ids = (5).to_bytes(8, "big") + (9).to_bytes(8, "big")
    m = parse_message(head + ids + b"body", ext=False, detail=False)
    assert (m.id, m.trace_id, m.attempts, m.body) == (5, 9, 1, b"body")
    detail = (100).to_bytes(8, "big") + (34).to_bytes(4, "big")
    ext = b"\x04" + (2).to_bytes(2, "big") + b"{}"
    m = parse_message(head + ids + ext + detail + b"body", ext=True, detail=True)
    assert (m.ext_ver, m.ext, m.offset, m.rawsize, m.body) == (4, b"{}", 100, 34, b"body")
    m = parse_message(head + ids + b"\x00" + b"body", ext=True, detail=False)
    assert (m.ext_ver, m.ext, m.body) == (0, None, b"body")


# What the Youzan reference (youzan/nsq b16e68eb) answered, run after run.
EXPECTED: dict[str, object] = {
    "errors": {
        "FIN of an unknown id": "E_FIN_FAILED kept open",
        "MPUB_TRACE well formed (control)": "answer: a 30-byte trace reply",
        "MPUB_TRACE with a message of 8 bytes or less": "E_BAD_MESSAGE closed",
        "PUB to a partition that does not exist": "E_TOPIC_NOT_EXIST closed",
        "PUB without partition on an ordered topic": "E_BAD_PARTITION closed",
        "PUB_EXT whose header length passes the body": "E_BAD_BODY closed",
        "PUB_EXT with a non-numeric ##trace_id": "INVALID_TRACE_ID kept open",
        "PUB_EXT with a numeric ##trace_id": "INVALID_TRACE_ID kept open",
        "PUB_EXT with an empty body after the header": "E_BAD_BODY closed",
        "PUB_EXT with bad JSON": "E_INVALID_JSON_HEADER kept open",
        "PUB_EXT with custom keys on a non-ext topic": "E_EXT_NOT_SUPPORT kept open",
        "PUB_EXT with only ## keys on a non-ext topic": "E_EXT_NOT_SUPPORT kept open",
        "SUB to a partition that does not exist": "E_TOPIC_NOT_EXIST closed",
        "SUB with extend_support on a non-ext topic": "E_SUB_EXTEND_FORBIDDON closed",
        "SUB without extend_support on an ext topic": "E_SUB_EXTEND_NEED closed",
        "SUB_ADVANCED bogus": "E_INVALID closed",
        "SUB_ADVANCED on an orderedmulti topic": "E_SUB_ORDER_IS_MUST closed",
        "SUB_ADVANCED special:0": "E_INVALID closed",
        "SUB_ADVANCED timestamp": "E_INVALID closed",
        "SUB_ADVANCED timestamp:1:2": "E_INVALID closed",
        "SUB_ADVANCED timestamp:9999999999": "E_INVALID closed",
        "SUB_ADVANCED timestamp:abc": "E_INVALID closed",
        "SUB_ADVANCED unknown:1": "E_INVALID closed",
        "SUB_ORDERED with sample_rate": "E_INVALID closed",
        "plain SUB on an orderedmulti topic": "E_SUB_ORDER_IS_MUST closed",
    },
    "ext": {
        "IDENTIFY echoes desired_tag": True,
        "IDENTIFY reply keys with desired_tag": [
            "auth_required",
            "deflate",
            "deflate_level",
            "desired_tag",
            "max_deflate_level",
            "max_msg_timeout",
            "max_rdy_count",
            "msg_timeout",
            "output_buffer_size",
            "output_buffer_timeout",
            "sample_rate",
            "snappy",
            "tls_v1",
            "version",
        ],
        "IDENTIFY without desired_tag has the key": False,
        "bodies for desired_tag tagA": ["e4"],
        "bodies for exact k=v1": ["e1", "e4", "e8"],
        "bodies for glob k=o*": ["e3"],
        "bodies for inverse exact k=v1": ["e2", "e3", "e5", "e6", "e7", "e9", "e10"],
        "bodies for multi all k=v2&k2=x": ["e2"],
        "bodies for multi any k=v2|k2=x": ["e2", "e3", "e10"],
        "bodies for no desired_tag (same channel)": [
            "e1",
            "e2",
            "e3",
            "e5",
            "e6",
            "e7",
            "e8",
            "e9",
            "e10",
        ],
        "bodies for none": ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9", "e10"],
        "bodies for regexp k=^v[0-9]$": ["e1", "e2", "e4", "e8", "e10"],
        "ext_ver read back": {
            "e1": 4,
            "e10": 4,
            "e2": 4,
            "e3": 4,
            "e4": 4,
            "e5": 4,
            "e6": 0,
            "e7": 4,
            "e8": 4,
            "e9": 4,
        },
        "json header bytes read back unchanged": True,
        "publish answers": {
            "e1": "OK",
            "e10": "OK",
            "e2": "OK",
            "e3": "OK",
            "e4": "OK",
            "e5": "OK",
            "e6": "OK",
            "e7": "OK",
            "e8": "trace reply, trace_id=12345",
            "e9": "OK",
        },
        "trace id of e8 read back": 12345,
    },
    "frames": {
        "ext topic SUB json ext": "ts:8 attempts:2 id:8 trace_id:8 ext_ver:1 ext_len:2 ext body",
        "ext topic SUB no ext": "ts:8 attempts:2 id:8 trace_id:8 ext_ver:1 body",
        "ext topic SUB_ADVANCED json ext": "ts:8 attempts:2 id:8 trace_id:8 "
        "ext_ver:1 ext_len:2 ext offset:8 "
        "rawsize:4 body",
        "ext topic SUB_ADVANCED no ext": "ts:8 attempts:2 id:8 trace_id:8 ext_ver:1 "
        "offset:8 rawsize:4 body",
        "ext topic SUB_ORDERED json ext": "ts:8 attempts:2 id:8 trace_id:8 ext_ver:1 "
        "ext_len:2 ext offset:8 rawsize:4 body",
        "ext topic SUB_ORDERED no ext": "ts:8 attempts:2 id:8 trace_id:8 ext_ver:1 "
        "offset:8 rawsize:4 body",
        "plain topic SUB": "ts:8 attempts:2 id:8 trace_id:8 body",
        "plain topic SUB_ADVANCED": "ts:8 attempts:2 id:8 trace_id:8 offset:8 rawsize:4 body",
        "plain topic SUB_ORDERED": "ts:8 attempts:2 id:8 trace_id:8 offset:8 rawsize:4 body",
    },
    "http": {
        "/channel/setoffset": {
            "body foo": "400 invalid consume offset:foo",
            "body unknown:1": "400 invalid consume offset:unknown:1",
            "empty body": "406 MSG_EMPTY",
            "good (msgcount:1)": "200",
            "missing channel": "404 CHANNEL_NOT_FOUND",
            "missing topic": "404 E_TOPIC_NOT_EXIST",
        },
        "/listlookup keys": ["lookupdleader", "lookupdnodes"],
        "/listlookup node keys": ["Epoch", "HttpPort", "ID", "NodeIP", "RpcPort", "TcpPort"],
        "/lookup access=w after a channel": "200 partitions=1",
        "/lookup access=w before any channel": "404 Topic has no channel, should init "
        "at least one for the new topic",
        "/lookup channels (ordered topic)": ["ord", "sbs_probe"],
        "/lookup meta": {
            "ext": {
                "disable_channel_auto_create": False,
                "extend_support": True,
                "multi_part": False,
                "ordered": False,
                "partition_num": 1,
                "replica": 1,
            },
            "ord": {
                "disable_channel_auto_create": False,
                "extend_support": False,
                "multi_part": False,
                "ordered": True,
                "partition_num": 4,
                "replica": 1,
            },
            "replay": {
                "disable_channel_auto_create": False,
                "extend_support": False,
                "multi_part": False,
                "ordered": False,
                "partition_num": 1,
                "replica": 1,
            },
        },
        "/lookup of a missing topic": "200 partitions=0",
        "/lookup partition=1": ["1"],
        "/lookup partitions": ["0", "1", "2", "3"],
        "/lookup peer keys": [
            "broadcast_address",
            "distributed_id",
            "hostname",
            "http_port",
            "id",
            "remote_address",
            "tcp_port",
            "version",
        ],
        "/lookup top keys": ["channels", "meta", "partitions", "producers"],
        "/lookup without Accept: keys": ["data", "status_code", "status_txt"],
        "/lookup without metainfo: keys": ["channels", "partitions", "producers"],
        "/message/trace/enable": {
            "channel": "200",
            "disable": "200",
            "missing topic": "200",
            "topic": "200",
        },
        "/stats ordered topic": {
            "channels": ["ord", "sbs_probe"],
            "depth of channel ord": [0, 0, 0, 0],
            "is_ext": [False],
            "is_leader": [True],
            "is_multi_ordered": [True],
            "message_count total": 100,
            "partitions": ["0", "1", "2", "3"],
            "topic_partition type": ["str"],
        },
        "/topic/create": {
            "bad topic name": "400 INVALID_ARG_TOPIC",
            "no partition_num": "400 MISSING_ARG_TOPIC_PARTITION_NUM",
            "no replicator": "400 MISSING_ARG_TOPIC_REPLICATOR",
            "no topic": "400 MISSING_ARG_TOPIC",
            "other partition_num again": "400 already exist",
            "partition_num=0": "400 INVALID_ARG_TOPIC_PARTITION_NUM",
            "partition_num=256": "400 INVALID_ARG_TOPIC_PARTITION_NUM",
            "replicator=6": "400 INVALID_ARG_TOPIC_REPLICATOR",
            "same settings again": "200",
        },
        "TCP PUB to a topic without channels": "OK",
        "the first channel starts at": ["n1"],
    },
    "ordered": {
        "lost": 0,
        "messages": 96,
        "next_sent_before_fin": 0,
        "offsets_increase": True,
        "order_held": True,
        "out_of_order": 0,
        "partition_in_id_high_bits": True,
        "redelivered_after_fin": 0,
        "redelivery_attempts": {"REQ 0": [2], "REQ 10000": [2], "restart": [1], "timeout": [2]},
        "req_with_delay_redelivered_before_delay": True,
        "timed_out": False,
    },
    "replay": {
        "SUB_ADVANCED msgcount:0": ["sbs-probe"],
        "SUB_ADVANCED msgcount:1": ["sbs-probe", "r0", "r1"],
        "SUB_ADVANCED msgcount:1000000": ["r10"],
        "SUB_ADVANCED msgcount:4": ["r2", "r3", "r4"],
        "SUB_ADVANCED special:-1": ["r10"],
        "SUB_ADVANCED timestamp:<a second before all>": ["sbs-probe", "r0", "r1"],
        "SUB_ADVANCED timestamp:<first second of r5..r9>": ["r5", "r6", "r7"],
        "SUB_ADVANCED virtual_queue:<end + 1000>": ["r10"],
        "SUB_ADVANCED virtual_queue:<offset of r0>": ["r0", "r1", "r2"],
        "SUB_ADVANCED virtual_queue:<offset of r7 + 1>": ["r8"],
        "SUB_ADVANCED virtual_queue:<offset of r7>": ["r7", "r8", "r9"],
        "SUB_ADVANCED without a start (new channel)": ["r10"],
        "setoffset msgcount:0": ["sbs-probe"],
        "setoffset msgcount:1": ["sbs-probe", "r0", "r1"],
        "setoffset msgcount:1000000": ["r10"],
        "setoffset msgcount:4": ["r2", "r3", "r4"],
        "setoffset special:-1": ["r10"],
        "setoffset timestamp:<a second before all>": ["sbs-probe", "r0", "r1"],
        "setoffset timestamp:<first second of r5..r9>": ["r5", "r6", "r7"],
        "setoffset virtual_queue:<end + 1000>": ["r10"],
        "setoffset virtual_queue:<offset of r0>": ["r0", "r1", "r2"],
        "setoffset virtual_queue:<offset of r7 + 1>": ["r8"],
        "setoffset virtual_queue:<offset of r7>": ["r7", "r8", "r9"],
    },
    "trace": {
        "MPUB_TRACE reply id == first message id": True,
        "MPUB_TRACE reply offset == first message offset": True,
        "MPUB_TRACE reply rawsize == sum of the batch's rawsizes": True,
        "MPUB_TRACE reply trace_id": 0,
        "PUB_TRACE reply id/trace_id/offset/rawsize == read back": [
            [True, True, True, True],
            [True, True, True, True],
            [True, True, True, True],
        ],
        "bodies read back": [
            "t-single",
            "tt-single",
            "ttt-single",
            "m-batch",
            "mm-batch",
            "mmm-batch",
            "plain",
        ],
        "ids consecutive": True,
        "no id is 0": True,
        "message/get": {
            "attempts": 0,
            "by_count_queue_cnt_index_same_message": True,
            "by_id_same_message": True,
            "by_virtual_offset_matches_reply": True,
            "keys": [
                "attempts",
                "body",
                "ext",
                "id",
                "offset",
                "queue_cnt_index",
                "timestamp",
                "trace_id",
            ],
        },
        "offset + rawsize == next offset": True,
        "plain PUB answer": "OK",
        "rawsize - len(body)": [30],
        "trace ids read back": [1001, 1002, 1003, 2001, 2002, 2003, 0],
    },
    "chain": {
        "bodies read back": [
            "sbs-probe",
            "c-single-1",
            "c-single-2",
            "c-turn-1",
            "c-turn-2",
            "c-turn-3",
            "c-mpub-1",
            "c-mpub-2",
            "c-mpub-3",
            "c-trace-1",
            "c-trace-2",
            "c-tm-1",
            "c-tm-2",
            "c-tm-3",
            "c-after-batch",
            *(f"c-big-{i:02d}" for i in range(20)),
        ],
        "offset + rawsize == next offset": True,
        "PUB_TRACE answer offset, rawsize == read back": [True],
        "MPUB_TRACE answer offset + rawsize == the next message's offset": True,
        "bytes past a segment": True,
        "after a PUB in one write: virtual_queue:<offset + rawsize>, /message/get": [
            "c-turn-2",
            "c-turn-2",
        ],
        "after an MPUB: virtual_queue:<offset + rawsize>, /message/get": [
            "c-trace-1",
            "c-trace-1",
        ],
        "after a restart": {
            "offsets and raw sizes before it unchanged": True,
            "its first message at the last one's offset + rawsize": True,
            "offset + rawsize == next offset": True,
            "PUB_TRACE answer == read back": True,
        },
    },
}
