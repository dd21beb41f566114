"""The "nsq" data source's options: bad ones are refused with a message naming them."""

from __future__ import annotations

import pytest

from nsqx.spark.options import NsqOptionError, NsqOptions


def parse(**opts: str) -> NsqOptions:
    return NsqOptions.parse({k.lower(): v for k, v in opts.items()})


def test_defaults() -> None:
    o = parse(topic="t", nsqdHttpAddresses="127.0.0.1:4151")
    assert (o.starting, o.ending, o.mode, o.max_offsets_per_trigger) == (
        "earliest",
        "latest",
        "range",
        None,
    )


def test_offsets_forms() -> None:
    o = parse(
        topic="t",
        nsqdHttpAddresses="a:1,b:2",
        startingOffsets='{"a:1/0": 5}',
        endingOffsets="1700000000000",
    )
    assert o.nsqd_http == ["a:1", "b:2"]
    assert o.starting == {"a:1/0": 5}
    assert o.ending == 1700000000000


@pytest.mark.parametrize(
    ("opts", "names"),
    [
        ({}, "topic"),
        ({"topic": "bad topic!", "nsqdHttpAddresses": "a:1"}, "topic"),
        ({"topic": "t"}, "nsqdHttpAddresses"),
        ({"topic": "t", "nsqdHttpAddresses": "nohost"}, "nsqdHttpAddresses"),
        ({"topic": "t", "nsqdHttpAddresses": "a:1", "startingOffsets": "soon"}, "startingOffsets"),
        (
            {"topic": "t", "nsqdHttpAddresses": "a:1", "endingOffsets": '{"k": "x"}'},
            "endingOffsets",
        ),
        (
            {"topic": "t", "nsqdHttpAddresses": "a:1", "maxOffsetsPerTrigger": "0"},
            "maxOffsetsPerTrigger",
        ),
        ({"topic": "t", "nsqdHttpAddresses": "a:1", "mode": "magic"}, "mode"),
        ({"topic": "t", "nsqdTcpAddresses": "a:1", "mode": "channel"}, "channel"),
        ({"topic": "t", "nsqdHttpAddresses": "a:1", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"topic": "t", "nsqdHttpAddresses": "a:1", "colour": "red"}, "colour"),
    ],
)
def test_bad_options_are_named(opts: dict[str, str], names: str) -> None:
    with pytest.raises(NsqOptionError, match=names.lower() if names == "colour" else names):
        parse(**opts)


def test_write_needs_a_destination() -> None:
    with pytest.raises(NsqOptionError, match="nsqdTcpAddresses"):
        NsqOptions.parse({"topic": "t"}, for_write=True)
    o = NsqOptions.parse({"topiccolumn": "t", "nsqdtcpaddresses": "a:1"}, for_write=True)
    assert o.topic is None and o.topic_column == "t"


def test_kafka_named_options() -> None:
    o = parse(
        topic="t",
        nsqdHttpAddresses="a:1",
        startingTimestamp="1700000000000",
        endingOffsetsByTimestamp='{"a:1/0": 1700000000001}',
        minOffsetsPerTrigger="100",
        maxTriggerDelay="2m",
        includeHeaders="true",
    )
    assert o.starting == 1700000000000
    assert o.ending == {"a:1/0": 1700000000001} and type(o.ending).__name__ == "ByTimestamp"
    assert (o.min_offsets_per_trigger, o.max_trigger_delay, o.include_headers) == (100, 120, True)
    assert parse(topic="t", nsqdHttpAddresses="a:1").max_trigger_delay == 15 * 60
    assert (
        parse(topic="t", nsqdHttpAddresses="a:1", maxTriggerDelay="500ms").max_trigger_delay == 0.5
    )
    for bad in ({"maxTriggerDelay": "soon"}, {"startingTimestamp": "latest"}):
        with pytest.raises(NsqOptionError, match=next(iter(bad))):
            parse(topic="t", nsqdHttpAddresses="a:1", **bad)
    with pytest.raises(NsqOptionError, match="startingOffsetsByTimestamp"):
        parse(topic="t", nsqdHttpAddresses="a:1", startingOffsetsByTimestamp='{"a:1/0": "x"}')


def test_the_options_spark_passes_itself_are_accepted() -> None:
    """A writeStream's checkpointLocation (and a load path) reach the source with the
    user's options: they are Spark's, not unknown ones."""
    o = NsqOptions.parse(
        {"topic": "t", "nsqdtcpaddresses": "a:1", "checkpointLocation": "/tmp/c", "path": "x"},
        for_write=True,
    )
    assert o.topic == "t"
