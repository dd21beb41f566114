"""IDENTIFY negotiation against the server's limits."""

from __future__ import annotations

import json

import pytest

from nsqx.wire import ClientSettings, ProtocolError, ServerLimits, negotiate

LIMITS = ServerLimits(max_output_buffer_size=512 * 1024, max_output_buffer_timeout_ms=1000)


def ident(**fields: object) -> tuple[ClientSettings, bytes]:
    return negotiate(json.dumps(fields).encode(), LIMITS)


def test_without_feature_negotiation_answers_ok() -> None:
    settings, resp = ident(client_id="c", hostname="h", user_agent="ua/1")
    assert resp == b"OK"
    assert (settings.client_id, settings.hostname, settings.user_agent) == ("c", "h", "ua/1")


def test_feature_negotiation_response_shape() -> None:
    _, resp = ident(feature_negotiation=True, tls_v1=True, snappy=True, deflate=True)
    data = json.loads(resp)
    assert list(data) == [
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
    ]
    # not available on this server: answered truthfully
    assert data["tls_v1"] is False and data["snappy"] is False and data["deflate"] is False
    assert data["max_rdy_count"] == 2500
    assert data["msg_timeout"] == 60000 and data["max_msg_timeout"] == 900000


def test_values_applied() -> None:
    s, resp = ident(
        feature_negotiation=True,
        heartbeat_interval=1000,
        output_buffer_size=512 * 1024,
        output_buffer_timeout=1000,
        sample_rate=50,
        msg_timeout=5000,
    )
    assert (s.heartbeat_interval_ms, s.output_buffer_size, s.output_buffer_timeout_ms) == (
        1000,
        512 * 1024,
        1000,
    )
    assert (s.sample_rate, s.msg_timeout_ms) == (50, 5000)
    data = json.loads(resp)
    assert data["sample_rate"] == 50 and data["output_buffer_size"] == 512 * 1024


def test_minus_one_disables() -> None:
    s, _ = ident(heartbeat_interval=-1, output_buffer_size=-1, output_buffer_timeout=-1)
    assert s.heartbeat_interval_ms == 0
    assert s.output_buffer_size == 1
    assert s.output_buffer_timeout_ms == 0


def test_zero_keeps_defaults() -> None:
    s, _ = ident(heartbeat_interval=0, output_buffer_size=0, output_buffer_timeout=0, msg_timeout=0)
    assert s == ClientSettings.defaults(LIMITS)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
        (
            {"heartbeat_interval": 60001},
            "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid",
        ),
        (
            {"output_buffer_size": 512 * 1024 + 1},
            f"E_BAD_BODY IDENTIFY output buffer size ({512 * 1024 + 1}) is invalid",
        ),
        ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
        (
            {"output_buffer_timeout": 1001},
            "E_BAD_BODY IDENTIFY output buffer timeout (1001) is invalid",
        ),
        ({"output_buffer_timeout": 5}, "E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid"),
        ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
        ({"msg_timeout": 999}, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
        ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
        ({"heartbeat_interval": "1000"}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        ({"feature_negotiation": 1}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ],
)
def test_invalid_values(fields: dict[str, object], expected: str) -> None:
    with pytest.raises(ProtocolError) as info:
        ident(**fields)
    assert str(info.value) == expected
    assert info.value.fatal


@pytest.mark.parametrize("body", [b"not json", b"[1,2]", b"\xff\xfe", b'"x"'])
def test_bad_json(body: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        negotiate(body, LIMITS)
    assert str(info.value) == "E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_compression_negotiated_when_available() -> None:
    limits = ServerLimits(snappy_available=True, deflate_available=True, max_deflate_level=4)
    s, resp = negotiate(b'{"feature_negotiation":true,"deflate":true,"deflate_level":9}', limits)
    assert s.deflate and s.deflate_level == 4
    assert json.loads(resp)["deflate_level"] == 4
    with pytest.raises(ProtocolError) as info:
        negotiate(b'{"feature_negotiation":true,"deflate":true,"snappy":true}', limits)
    assert info.value.code == "E_IDENTIFY_FAILED"


def test_short_and_long_id_compat() -> None:
    s, _ = ident(short_id="s", long_id="l")
    assert (s.client_id, s.hostname) == ("s", "l")


def test_channel_policy_is_answered_only_to_a_client_that_asks() -> None:
    """nsqx's consumers ask to be told their channel's max_attempts; NSQ 1.3's answer is
    unchanged for everyone else."""
    plain, resp = ident(feature_negotiation=True)
    assert "channel_policy" not in json.loads(resp) and not plain.channel_policy
    asked, resp = ident(feature_negotiation=True, channel_policy=True)
    assert json.loads(resp)["channel_policy"] is True and asked.channel_policy
    with pytest.raises(ProtocolError):
        ident(feature_negotiation=True, channel_policy="yes")
