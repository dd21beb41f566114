"""The sink by key, partition and headers (the columns of Kafka's sink), and mode=channel
over every partition of a topic: publishing and subscribing against real nsqd (and
nsqlookupd) without Spark, then a round trip in Spark."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_partitions import create, http, post, publish, publish_tcp

from nsqx.client.sharding import partition_for_key
from nsqx.spark.channel_mode import NsqChannelStreamReader
from nsqx.spark.options import NsqOptionError, NsqOptions
from nsqx.spark.publisher import PublishError
from nsqx.spark.rangeclient import NsqUnreachable
from nsqx.spark.routing import NsqColumnError, SinkColumns, header_json, sink_columns
from nsqx.spark.source import NsqBatchReader, publish_rows, read_range
from nsqx.wire import commands as cmd

from nsqdproc import NsqdProcess, start_nsqd

PARTITION_SHIFT = 50


def start(tmp_path: Path, name: str, *args: str) -> NsqdProcess:
    return start_nsqd(tmp_path / name, "--http-address=127.0.0.1:0", *args)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NsqdProcess]:
    n = start(tmp_path, "n")
    yield n
    n.stop(signal.SIGKILL)


def write_opts(**opts: str) -> NsqOptions:
    return NsqOptions.parse(opts, for_write=True)


def read_all(topic: str, *nodes: NsqdProcess) -> list[dict[str, Any]]:
    """Every message of ``topic`` on ``nodes``, by range reads, in offset order per
    partition."""
    opts = NsqOptions.parse({"topic": topic, "nsqdHttpAddresses": ",".join(map(http, nodes))})
    return [
        r
        for part in NsqBatchReader(opts).partitions()
        for b in read_range(opts, part)
        for r in b.to_pylist()
    ]


def wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def partitions(lookupd: Any, topic: str) -> dict[str, Any]:
    """The partitions map of nsqlookupd's /lookup (Youzan's form, in NSQ's envelope)."""
    answer = lookupd.json(f"/lookup?topic={topic}&access=w")
    return dict(answer.get("data", answer).get("partitions") or {})


ROUTED = SinkColumns(key="key", partition="partition", headers="headers", headers_kind="array")


def rows_for(n: int, tag: str) -> list[dict[str, Any]]:
    """Rows with a key (7 of them), every fifth with a partition named instead, every
    third with headers (Kafka's array of key/value pairs)."""
    return [
        {
            "body": f"{tag}-{i}".encode(),
            "key": f"user-{i % 7}",
            "partition": 2 if i % 5 == 0 else None,
            "headers": [{"key": "i", "value": b"%d" % i}, {"key": "tag", "value": tag.encode()}]
            if i % 3 == 0
            else None,
        }
        for i in range(n)
    ]


def check_routed(
    rows: list[dict[str, Any]], got: list[dict[str, Any]], num: int, *, in_order: bool = True
) -> None:
    """Each row in its partition (the one named, else its key's), with its headers as
    the ext header, and (``in_order``: published by one task) the rows of one key in
    their order."""
    by_body = {r["body"]: r for r in got}
    assert sorted(by_body) == sorted(r["body"] for r in rows)
    for row in rows:
        found = by_body[row["body"]]
        want = row["partition"]
        if want is None:
            want = partition_for_key(row["key"], num)
        assert found["partition"] == want, row
        if row["headers"] is None:
            assert found["ext"] is None
        else:
            header = {h["key"]: h["value"].decode() for h in row["headers"]}
            assert json.loads(found["ext"]) == header
    for key in {r["key"] for r in rows} if in_order else ():
        mine = [r["body"] for r in rows if r["key"] == key and r["partition"] is None]
        offsets = [by_body[b]["offset"] for b in mine]
        assert offsets == sorted(offsets), key  # one partition, in the rows' order


# -- publishing, without Spark -------------------------------------------------------------


def test_rows_go_to_their_key_or_named_partition_with_headers(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """Three partitions of an ext topic on two nsqd: the leaders are found through
    nsqlookupd (as PartitionProducer finds them) or by asking each nsqd (its /stats),
    and every row lands where nsqx.client would put it, with its headers, batches of 4
    (so a key's rows go in several MPUBs, in order)."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    nodes = [
        start(
            tmp_path,
            f"n{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
        )
        for i in range(2)
    ]
    try:
        wait_for(lambda: len(lookupd.json("/nodes")["producers"]) == 2, "two nsqd registered")
        status, _, body = lookupd.post(
            "/topic/create?topic=routed&partition_num=3&replicator=1&multipart=true&extend=true"
        )
        assert status == 200, body
        wait_for(lambda: len(partitions(lookupd, "routed")) == 3, "three partitions with leaders")
        homes = {p: n for n in nodes for p in range(3) if _hosts(n, "routed", p)}
        assert set(homes) == {0, 1, 2}
        through_lookupd = rows_for(40, "l")
        sent = publish_rows(
            write_opts(topic="routed", lookupdHttpAddresses=lookupd.http_address, batchSize="4"),
            iter(through_lookupd),
            ROUTED,
        )
        assert sent.messages == 40
        check_routed(through_lookupd, read_all("routed", *nodes), 3)
        # the same rows, the leaders found by asking the nsqd themselves
        asking_nsqd = rows_for(40, "h")
        publish_rows(
            write_opts(topic="routed", nsqdHttpAddresses=",".join(map(http, nodes))),
            iter(asking_nsqd),
            ROUTED,
        )
        got = [r for r in read_all("routed", *nodes) if r["body"].startswith(b"h-")]
        check_routed(asking_nsqd, got, 3)
        assert {r["nsqd"] for r in got if r["partition"] == 1} == {http(homes[1])}
        # an ext topic made on an nsqd directly, not through nsqlookupd (whose meta for
        # it is derived from the registrations, without "extend"): headers go through
        for p in (0, 1):
            create(nodes[0], "made", p, 2, "&extend=true")
        wait_for(lambda: len(partitions(lookupd, "made")) == 2, "nsqlookupd knows 'made'")
        made = rows_for(10, "m")
        publish_rows(
            write_opts(topic="made", lookupdHttpAddresses=lookupd.http_address),
            iter(made),
            SinkColumns(key="key", headers="headers", headers_kind="array"),
        )
        got = read_all("made", nodes[0])
        assert sorted(r["body"] for r in got) == sorted(r["body"] for r in made)
        assert sum(r["ext"] is not None for r in got) == 4
    finally:
        for n in nodes:
            n.stop(signal.SIGKILL)


def _hosts(node: NsqdProcess, topic: str, partition: int) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"{node.http_url}/stats?format=json&topic={topic}") as resp:
        stats = json.load(resp)
    return any(t.get("topic_partition") == str(partition) for t in stats["topics"] or ())


def test_bad_rows_are_refused_clearly_and_publish_nothing(node: NsqdProcess) -> None:
    """A partition out of range, headers on a topic that is not ext (known from the
    nsqd's /stats, or said by nsqd itself when only its TCP address is known), a row
    without key or partition on an ordered topic: each fails the write with a message
    naming the value; nothing of it was published and the nsqd goes on working."""
    create(node, "two", 0, 2)
    create(node, "two", 1, 2)
    create(node, "ord", 0, 2, "&orderedmulti=true")
    create(node, "ord", 1, 2, "&orderedmulti=true")
    by_http = write_opts(topic="two", nsqdHttpAddresses=http(node))
    partition_only = SinkColumns(partition="partition")
    for bad in (2, -1):
        row = {"body": b"x", "partition": bad}
        with pytest.raises(NsqColumnError, match=rf"partition {bad} .*'two' has 2 partitions"):
            publish_rows(by_http, iter([row]), partition_only)
    headed = {"body": b"x", "headers": {"a": "b"}}
    map_headers = SinkColumns(headers="headers", headers_kind="map")
    with pytest.raises(NsqColumnError, match="'two' is not an ext topic"):
        publish_rows(by_http, iter([headed]), map_headers)
    by_tcp = write_opts(topic="plain", nsqdTcpAddresses=f"127.0.0.1:{node.tcp_port}")
    with pytest.raises(PublishError, match=r"E_EXT_NOT_SUPPORT.*'plain'.*need an ext topic"):
        publish_rows(by_tcp, iter([headed]), map_headers)
    ordered = write_opts(topic="ord", nsqdHttpAddresses=http(node))
    keyed = SinkColumns(key="key")
    with pytest.raises(NsqColumnError, match="'ord' is ordered: each row needs a key"):
        publish_rows(ordered, iter([{"body": b"x", "key": None}]), keyed)
    with pytest.raises(NsqColumnError, match="header 'a' appears twice"):
        publish_rows(
            by_http,
            iter([{"body": b"x", "headers": [{"key": "a", "value": b"1"}] * 2}]),
            SinkColumns(headers="headers", headers_kind="array"),
        )
    nowhere = write_opts(topic="two", lookupdHttpAddresses="127.0.0.1:1")  # (nothing there)
    with pytest.raises(NsqUnreachable, match=r"127\.0\.0\.1:1/lookup"):
        publish_rows(nowhere, iter([{"body": b"x", "key": "k"}]), keyed)
    assert read_all("two", node) == [] and read_all("ord", node) == []
    # the nsqd goes on: good rows of the same writes are published (a plain one, with
    # no routing column, to the nsqd's default partition)
    publish_rows(by_http, iter([{"body": b"fine", "partition": 1}]), partition_only)
    publish_rows(by_http, iter([{"body": b"plain"}]))
    publish_rows(ordered, iter([{"body": b"in order", "key": "k"}]), keyed)
    assert sorted((r["partition"], r["body"]) for r in read_all("two", node)) == [
        (0, b"plain"),
        (1, b"fine"),
    ]
    assert [(r["partition"], r["body"]) for r in read_all("ord", node)] == [
        (partition_for_key("k", 2), b"in order")
    ]


NOT_EXT = (
    r"nsq: topic '{}' is not an ext topic: a row's headers need a topic created with extend=true"
)


def test_headers_to_a_topic_without_ext_are_refused_by_the_sink_on_every_path(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    """Headers to a topic that is not an ext topic, found through nsqlookupd (created
    there without extend, made on the nsqd directly with partitions, or as NSQ 1.3 makes
    it) or through nsqd's HTTP address: the sink's own error names the topic, before a
    row with headers is sent; with nsqd's TCP address alone, nsqd's refusal with the
    same hint. No row with headers is ever published, and the rows before it in the
    task at most."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    node = start(
        tmp_path,
        "n",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
    )
    try:
        wait_for(lambda: lookupd.json("/nodes")["producers"], "nsqd registered")
        status, _, body = lookupd.post(
            "/topic/create?topic=bylookupd&partition_num=2&replicator=1&multipart=true"
        )
        assert status == 200, body
        create(node, "onnode", 0, 2)
        create(node, "onnode", 1, 2)
        post(node, "/topic/create?topic=asnsq")  # (one partition, as NSQ 1.3's)
        topics = ("bylookupd", "onnode", "asnsq")
        for topic in topics:
            wait_for(lambda t=topic: partitions(lookupd, t), f"nsqlookupd knows {topic}")
        headed = {"body": b"headed", "headers": {"a": "b"}}
        plain = [{"body": b"plain-%d" % i, "headers": None} for i in range(3)]
        map_headers = SinkColumns(headers="headers", headers_kind="map")
        for topic in topics:
            for where in (
                {"lookupdHttpAddresses": lookupd.http_address},
                {"nsqdHttpAddresses": http(node)},
            ):
                opts = write_opts(topic=topic, batchSize="2", **where)
                # a row with headers first: nothing at all is published
                with pytest.raises(NsqColumnError, match=NOT_EXT.format(topic)):
                    publish_rows(opts, iter([headed, *plain]), map_headers)
                # after rows without headers: those may be, the one with headers is not
                with pytest.raises(NsqColumnError, match=NOT_EXT.format(topic)):
                    publish_rows(opts, iter([*plain, headed]), map_headers)
        by_tcp = write_opts(topic="asnsq", nsqdTcpAddresses=f"127.0.0.1:{node.tcp_port}")
        with pytest.raises(PublishError, match=r"E_EXT_NOT_SUPPORT.*'asnsq'.*need an ext topic"):
            publish_rows(by_tcp, iter([headed]), map_headers)
        for topic in topics:
            got = read_all(topic, node)
            assert all(r["body"].startswith(b"plain-") and r["ext"] is None for r in got), got
        # the same columns with null headers are plain MPUBs, welcome on these topics
        opts = write_opts(topic="bylookupd", lookupdHttpAddresses=lookupd.http_address)
        assert publish_rows(opts, iter(plain), map_headers).messages == 3
    finally:
        node.stop(signal.SIGKILL)


def test_the_columns_types_and_headers_are_checked() -> None:
    """The routing columns' types are checked when the write is built (naming the
    column), and a key or partition column needs a way to find partitions; headers
    become a compact JSON object, null and empty ones none."""
    from pyspark.sql import types as T

    opts = write_opts(topic="t", nsqdHttpAddresses="127.0.0.1:1")
    pair = T.StructType(
        [T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]
    )
    kinds = {
        "STRING": T.StringType(),
        "BINARY": T.BinaryType(),
        "INT": T.IntegerType(),
        "BIGINT": T.LongType(),
        "MAP<STRING,STRING>": T.MapType(T.StringType(), T.StringType()),
        "MAP<INT,STRING>": T.MapType(T.IntegerType(), T.StringType()),
        "ARRAY<STRUCT<key:STRING,value:BINARY>>": T.ArrayType(pair),
        "ARRAY<STRUCT<k:STRING,value:BINARY>>": T.ArrayType(
            T.StructType([T.StructField("k", T.StringType()), pair.fields[1]])
        ),
    }

    def cols(ddl: str, o: NsqOptions = opts) -> SinkColumns:
        fields = [c.split(" ", 1) for c in ddl.split(", ") if c]
        schema = T.StructType([T.StructField(name, kinds[kind]) for name, kind in fields])
        return sink_columns(schema, o)

    assert cols("body BINARY") == SinkColumns()
    assert not cols("body BINARY").any
    assert cols("body STRING, Key BINARY, partition BIGINT, headers MAP<STRING,STRING>") == (
        SinkColumns("Key", "partition", "headers", "map")
    )
    assert cols("body STRING, headers ARRAY<STRUCT<key:STRING,value:BINARY>>").headers_kind == (
        "array"
    )
    for ddl, name in (
        ("body STRING, key INT", "key"),
        ("body STRING, partition STRING", "partition"),
        ("body STRING, headers STRING", "headers"),
        ("body STRING, headers MAP<INT,STRING>", "headers"),
        ("body STRING, headers BIGINT", "headers"),
        ("body STRING, headers ARRAY<STRUCT<k:STRING,value:BINARY>>", "headers"),
    ):
        with pytest.raises(NsqColumnError, match=f"column {name} "):
            cols(ddl)
    tcp_only = write_opts(topic="t", nsqdTcpAddresses="127.0.0.1:1")
    with pytest.raises(NsqOptionError, match="lookupdHttpAddresses or nsqdHttpAddresses"):
        cols("body STRING, key STRING", tcp_only)
    assert cols("body STRING, headers MAP<STRING,STRING>", tcp_only).headers == "headers"

    assert header_json(None, "map") is None
    assert header_json({}, "map") is None and header_json([], "array") is None
    assert header_json({"b": "2", "a": None}, "map") == b'{"a":null,"b":"2"}'
    # and read back (includeHeaders) as they were: null as null, text as its bytes
    import pyarrow as pa

    from nsqx.spark.source import headers_column

    assert headers_column(pa.array(['{"a":null,"b":"2","n":3}', None])).to_pylist() == [
        [{"key": "a", "value": None}, {"key": "b", "value": b"2"}, {"key": "n", "value": b"3"}],
        None,
    ]
    pairs = [{"key": "k", "value": bytearray(b"v\xc3\xa9")}, {"key": "##trace_id", "value": b"7"}]
    assert json.loads(header_json(pairs, "array") or b"") == {"k": "vé", "##trace_id": "7"}
    for bad, why in (
        ([{"key": "k", "value": b"\xff"}], "not UTF-8"),
        ([{"key": None, "value": b"v"}], "key is null"),
        ({"##mine": "x"}, "reserved"),
        ({"##trace_id": "x"}, "##trace_id"),
        ({"k": "v" * 70_000}, "too long"),
    ):
        with pytest.raises(NsqColumnError, match=why):
            header_json(bad, "array" if isinstance(bad, list) else "map")


# -- mode=channel over every partition, without Spark ---------------------------------------


def channel_rows(opts: NsqOptions, want: int) -> list[dict[str, Any]]:
    """Micro-batches as Spark takes them (read, then commit) until ``want`` rows came."""
    previous = signal.getsignal(signal.SIGTERM)
    reader = NsqChannelStreamReader(opts)
    rows: list[dict[str, Any]] = []
    start = reader.initialOffset()
    deadline = time.monotonic() + 30
    try:
        while len(rows) < want:
            assert time.monotonic() < deadline, f"{len(rows)} of {want} rows came"
            batches, end = reader.read(start)
            rows += [r for b in batches for r in b.to_pylist()]
            reader.commit(end)
            start = end
    finally:
        reader.stop()
        signal.signal(signal.SIGTERM, previous)  # (the reader hooks SIGTERM, as in Spark)
    return rows


def test_channel_mode_reads_every_partition(lookupd_factory: Any, tmp_path: Path) -> None:
    """mode=channel subscribes to each partition, found through nsqlookupd or by asking
    the nsqd named by its HTTP address; rows carry their partition, their id (as the
    range reader shows it), trace id and ext header. An nsqd named by its TCP address
    alone is subscribed to as NSQ 1.3 does: its default partition only."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    node = start(
        tmp_path,
        "n",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
    )
    try:
        for p in range(3):
            create(node, "cm", p, 3, "&extend=true")
            for channel in ("via-lookupd", "via-http", "via-tcp"):
                # (a channel made after the messages would start at the end)
                post(node, f"/channel/create?topic=cm&channel={channel}&partition={p}")
        expected = []
        commands = []
        for i in range(30):
            p, body = i % 3, b"m%d" % i
            seq = i // 3
            if i % 2:
                header = b'{"n":"%d"}' % i
                commands.append(cmd.pub_ext("cm", p, header, body))
                expected.append((p, seq, 0, header.decode(), body))
            else:
                commands.append(cmd.pub_trace("cm", p, 1000 + i, body))
                expected.append((p, seq, 1000 + i, None, body))
        publish_tcp(node, commands)
        wait_for(lambda: len(partitions(lookupd, "cm")) == 3, "nsqlookupd knows 3 partitions")
        for channel, where in (
            ("via-lookupd", {"lookupdHttpAddresses": lookupd.http_address}),
            ("via-http", {"nsqdHttpAddresses": http(node)}),
        ):
            opts = NsqOptions.parse(
                {
                    "topic": "cm",
                    "mode": "channel",
                    "channel": channel,
                    "includeHeaders": "true",
                    "maxOffsetsPerTrigger": "100",  # one connection per partition
                    **where,
                }
            )
            rows = channel_rows(opts, 30)
            got = sorted(
                (
                    r["partition"],
                    int(r["id"], 16) & ((1 << PARTITION_SHIFT) - 1),
                    r["trace_id"],
                    r["ext"],
                    r["body"],
                )
                for r in rows
            )
            assert got == sorted((p, s + 1, t, e, b) for p, s, t, e, b in expected), channel
            assert all(int(r["id"], 16) >> PARTITION_SHIFT == r["partition"] for r in rows)
            assert all(
                r["headers"] == [{"key": "n", "value": r["ext"][6:-2].encode()}]
                for r in rows
                if r["ext"]
            )
        tcp = NsqOptions.parse(
            {
                "topic": "cm",
                "mode": "channel",
                "channel": "via-tcp",
                "nsqdTcpAddresses": f"127.0.0.1:{node.tcp_port}",
                "maxOffsetsPerTrigger": "100",
            }
        )
        assert {r["partition"] for r in channel_rows(tcp, 10)} == {0}
    finally:
        node.stop(signal.SIGKILL)


# -- Spark -------------------------------------------------------------------------------------


@pytest.mark.spark
def test_round_trip_by_key_partition_and_headers_in_spark(spark: Any, node: NsqdProcess) -> None:
    """df.write with ``key``, ``partition`` and ``headers`` columns, read back with
    includeHeaders: each row in its partition with its headers; the rows read (their
    partition and headers columns as they are) written to another topic land the same
    way, as with Kafka's source and sink."""
    for topic in ("rt", "rt2"):
        for p in range(3):
            create(node, topic, p, 3, "&extend=true")
    schema = (
        "body BINARY, key STRING, partition INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
    )
    rows = rows_for(30, "s")
    # two tasks (the session's parallelism), each publishing its rows
    df = spark.createDataFrame(
        [(r["body"], r["key"], r["partition"], r["headers"]) for r in rows], schema
    )

    def write(frame: Any, topic: str) -> None:
        (
            frame.write.format("nsq")
            .option("topic", topic)
            .option("nsqdHttpAddresses", http(node))
            .mode("append")
            .save()
        )

    def read(topic: str) -> tuple[list[dict[str, Any]], Any]:
        got = (
            spark.read.format("nsq")
            .option("topic", topic)
            .option("nsqdHttpAddresses", http(node))
            .option("includeHeaders", "true")
            .load()
        )
        return [r.asDict(recursive=True) for r in got.collect()], got

    write(df, "rt")
    first, got = read("rt")
    check_routed(rows, first, 3, in_order=False)  # (tasks run side by side)
    headed = [r for r in first if r["headers"] is not None]
    assert len(headed) == 10
    for r in headed:
        pairs = {h["key"]: bytes(h["value"]).decode() for h in r["headers"]}
        assert pairs == json.loads(r["ext"]) == {"i": r["body"][2:].decode(), "tag": "s"}
    write(got.select("body", "partition", "headers"), "rt2")
    second, _ = read("rt2")
    assert sorted((r["partition"], r["body"], r["ext"]) for r in second) == sorted(
        (r["partition"], r["body"], r["ext"]) for r in first
    )
    with pytest.raises(Exception, match=r"column key .* string or binary"):
        write(spark.createDataFrame([(b"x", 1)], "body BINARY, key INT"), "rt")


@pytest.mark.timeout(300)  # (Spark tries each failing task 4 times, in two jobs)
def test_a_spark_write_of_headers_to_a_topic_without_ext_says_so(
    spark: Any, lookupd_factory: Any, tmp_path: Path
) -> None:
    """In Spark, batch and streaming, through nsqlookupd: the write fails with the sink's
    own words, and nothing with headers reached the topic."""
    lookupd = lookupd_factory(f"--data-path={tmp_path / 'lookupd'}")
    node = start(
        tmp_path,
        "n",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
    )
    try:
        wait_for(lambda: lookupd.json("/nodes")["producers"], "nsqd registered")
        status, _, body = lookupd.post(
            "/topic/create?topic=noext&partition_num=2&replicator=1&multipart=true"
        )
        assert status == 200, body
        wait_for(lambda: len(partitions(lookupd, "noext")) == 2, "its partitions placed")
        df = spark.createDataFrame(
            [(b"b-%d" % i, {"i": str(i)}) for i in range(6)],
            "body BINARY, headers MAP<STRING, STRING>",
        )
        with pytest.raises(Exception, match="nsq: topic 'noext' is not an ext topic"):
            (
                df.write.format("nsq")
                .option("topic", "noext")
                .option("lookupdHttpAddresses", lookupd.http_address)
                .mode("append")
                .save()
            )
        create(node, "source", 0, 1)
        publish(node, "source", 0, [b"s-%d" % i for i in range(5)])
        q = (
            spark.readStream.format("nsq")
            .option("topic", "source")
            .option("nsqdHttpAddresses", http(node))
            .load()
            .selectExpr("body", "map('from', 'stream') AS headers")
            .writeStream.format("nsq")
            .option("topic", "noext")
            .option("lookupdHttpAddresses", lookupd.http_address)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="nsq: topic 'noext' is not an ext topic"):
            q.awaitTermination(120)
        assert read_all("noext", node) == []
    finally:
        node.stop(signal.SIGKILL)
