"""Config: go-nsq's option names and defaults; bad values refused at construction."""

from __future__ import annotations

import ssl
from datetime import timedelta

import pytest

from nsqx.client import Config, ConfigError, Consumer, Producer, codec, parse_duration


def test_defaults_are_go_nsqs():
    c = Config()
    assert c.max_in_flight == 1
    assert c.max_attempts == 5
    assert c.dial_timeout == 1.0 and c.read_timeout == 60.0 and c.write_timeout == 1.0
    assert c.lookupd_poll_interval == 60.0 and c.lookupd_poll_jitter == 0.3
    assert c.default_requeue_delay == 90.0 and c.max_requeue_delay == 900.0
    assert c.backoff_strategy == "exponential"
    assert c.max_backoff_duration == 120.0 and c.backoff_multiplier == 1.0
    assert c.low_rdy_idle_timeout == 10.0 and c.rdy_redistribute_interval == 5.0
    assert c.heartbeat_interval == 30.0
    assert c.output_buffer_size == 16384 and c.output_buffer_timeout == 0.25
    assert c.deflate_level == 6 and not c.snappy and not c.deflate and not c.tls_v1
    assert c.user_agent.startswith("nsqx/")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_in_flight": -1}, "max_in_flight must be >= 0"),
        ({"max_in_flight": 2.5}, "max_in_flight must be an integer"),
        ({"max_attempts": 70000}, "max_attempts must be between 0 and 65535"),
        ({"backoff_strategy": "linear"}, "backoff_strategy must be"),
        ({"sample_rate": 100}, "sample_rate must be between 0 and 99"),
        ({"heartbeat_interval": 0.5}, "heartbeat_interval must be -1"),
        ({"msg_timeout": 0.2}, "msg_timeout must be 0"),
        ({"output_buffer_size": 10}, "output_buffer_size must be -1, 0 or >= 64"),
        ({"deflate_level": 10}, "deflate_level must be between 1 and 9"),
        ({"snappy": True, "deflate": True}, "mutually exclusive"),
        ({"lookupd_poll_jitter": 1.5}, "lookupd_poll_jitter must be between 0 and 1"),
        ({"tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, "no such file"),
        ({"tls_cert": "/x.pem"}, "tls_cert and tls_key go together"),
        ({"tls_min_version": "ssl3.0"}, "tls_min_version must be one of"),
        ({"read_timeout": "soon"}, "is not a duration"),
        ({"max_reconnect_delay": 1.0, "reconnect_delay": 8.0}, "max_reconnect_delay"),
        ({"heartbeat_interval": 90}, "must be less than read_timeout"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(options, message):
    with pytest.raises(ConfigError, match=message):
        Config(**options)


def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="unknown option 'max_inflight'"):
        Config.from_dict({"max_inflight": 3})
    with pytest.raises(ConfigError, match="unknown option"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_inflight=3)


def test_from_dict_takes_dashes_and_go_durations():
    c = Config.from_dict(
        {
            "max-in-flight": 200,
            "lookupd-poll-interval": "15s",
            "backoff_multiplier": "250ms",
            "max_backoff_duration": "1m30s",
            "read_timeout": timedelta(seconds=45),
        }
    )
    assert c.max_in_flight == 200
    assert c.lookupd_poll_interval == 15.0
    assert c.backoff_multiplier == 0.25
    assert c.max_backoff_duration == 90.0
    assert c.read_timeout == 45.0
    assert c.with_options(max_in_flight=5).max_in_flight == 5
    with pytest.raises(ConfigError):
        c.with_options(max_in_flight=-5)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("1s", 1.0), ("250ms", 0.25), ("1m30s", 90.0), ("1h", 3600.0), ("1.5s", 1.5)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_identify_body_in_milliseconds():
    body = Config(heartbeat_interval=-1, msg_timeout=5, output_buffer_timeout=-1).identify_body()
    assert body["feature_negotiation"] is True
    assert body["heartbeat_interval"] == -1
    assert body["msg_timeout"] == 5000
    assert body["output_buffer_timeout"] == -1
    assert "msg_timeout" not in Config().identify_body()


def test_requeue_delay_grows_with_attempts_up_to_the_max():
    c = Config(default_requeue_delay=90, max_requeue_delay=300)
    assert [c.requeue_delay(a) for a in (1, 2, 3, 4)] == [90, 180, 270, 300]


def test_ssl_context_from_options():
    ctx = Config(tls_v1=True, tls_insecure_skip_verify=True).ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    mine = ssl.create_default_context()
    assert Config(tls_v1=True, tls_config=mine).ssl_context() is mine


def test_consumer_and_producer_refuse_bad_input_when_built():
    with pytest.raises(ConfigError, match="invalid topic name"):
        Consumer("bad topic!", "c", nsqd_tcp_addresses=["127.0.0.1:1"])
    with pytest.raises(ConfigError, match="invalid channel name"):
        Consumer("t", "", nsqd_tcp_addresses=["127.0.0.1:1"])
    with pytest.raises(ConfigError, match="max_in_flight"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:1"], max_in_flight=-1)
    with pytest.raises(ConfigError, match="concurrency"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:1"], concurrency=0)
    if not codec.available("snappy"):  # until nsqx.wire.compression is merged
        with pytest.raises(ConfigError, match="compression needs a stream codec"):
            Producer("127.0.0.1:1", snappy=True)
    with pytest.raises(ValueError, match="port is not a number"):
        Producer("127.0.0.1:http")
