"""IDENTIFY negotiation: validate a client's IDENTIFY body against the server's limits.

The result is the client's settings plus the response nsqd sends: ``OK``, or, with
``feature_negotiation``, the JSON of NSQ 1.3 (times in milliseconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from nsqx.wire.errors import E_BAD_BODY, E_IDENTIFY_FAILED, ProtocolError
from nsqx.wire.ext import ExtFilter, ExtFilterSpec, check_tag
from nsqx.wire.frames import OK


@dataclass(frozen=True)
class ServerLimits:
    """What nsqd allows and offers; defaults are NSQ 1.3's."""

    version: str = "1.3.0"
    max_rdy_count: int = 2500
    max_msg_timeout_ms: int = 15 * 60 * 1000
    max_heartbeat_interval_ms: int = 60_000
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout_ms: int = 30_000
    min_output_buffer_timeout_ms: int = 25
    max_deflate_level: int = 6
    tls_available: bool = False
    snappy_available: bool = False
    deflate_available: bool = False
    auth_required: bool = False
    # defaults a client gets when it does not ask
    msg_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 30_000
    output_buffer_size: int = 16384
    output_buffer_timeout_ms: int = 250


@dataclass(frozen=True)
class ClientSettings:
    """A connection's negotiated settings. 0 for an interval or timeout means disabled."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval_ms: int = 30_000
    #: 1 means unbuffered (the client sent -1)
    output_buffer_size: int = 16384
    output_buffer_timeout_ms: int = 250
    sample_rate: int = 0
    msg_timeout_ms: int = 60_000
    feature_negotiation: bool = False
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    #: Youzan's fields: the client IDENTIFYed as a Youzan client (it sent one of them),
    #: and then gets binary message ids (8-byte id + 8-byte trace id)
    youzan: bool = False
    extend_support: bool = False
    desired_tag: str = ""
    ext_filter: ExtFilter | None = None
    #: nsqx: the client asked to be told its channel's max_attempts (a policy notice,
    #: nsqx.wire.frames.CHANNEL_POLICY), to leave giving up to the channel
    channel_policy: bool = False

    @classmethod
    def defaults(cls, limits: ServerLimits) -> ClientSettings:
        return cls(
            heartbeat_interval_ms=limits.heartbeat_interval_ms,
            output_buffer_size=limits.output_buffer_size,
            output_buffer_timeout_ms=limits.output_buffer_timeout_ms,
            msg_timeout_ms=limits.msg_timeout_ms,
        )


_STR_FIELDS = ("client_id", "hostname", "user_agent", "short_id", "long_id", "desired_tag")
_INT_FIELDS = (
    "heartbeat_interval",
    "output_buffer_size",
    "output_buffer_timeout",
    "sample_rate",
    "msg_timeout",
    "deflate_level",
)
_BOOL_FIELDS = (
    "feature_negotiation",
    "tls_v1",
    "snappy",
    "deflate",
    "extend_support",
    "channel_policy",
)
#: keys only Youzan's clients send (go-nsq always sends desired_tag, the Java SDK
#: always extend_support)
_YOUZAN_FIELDS = ("extend_support", "desired_tag", "ext_filter")


def _decode(body: bytes) -> dict[str, Any]:
    """Decode like Go's json.Unmarshal into NSQ's identify struct: wrong types fail."""
    bad = ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict):
        raise bad
    for key in _STR_FIELDS:
        v = data.get(key)
        if v is not None and not isinstance(v, str):
            raise bad
    for key in _INT_FIELDS:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad
        if v is not None and not -(2**31) <= v < 2**31:
            raise bad
    for key in _BOOL_FIELDS:
        v = data.get(key)
        if v is not None and not isinstance(v, bool):
            raise bad
    return data


def negotiate(
    body: bytes, limits: ServerLimits, current: ClientSettings | None = None
) -> tuple[ClientSettings, bytes]:
    """Apply an IDENTIFY body. Returns the new settings and the response payload.

    Raises :class:`ProtocolError` (fatal, E_BAD_BODY or E_IDENTIFY_FAILED) as nsqd does.
    """
    data = _decode(body)
    s = current or ClientSettings.defaults(limits)
    client_id = data.get("client_id") or ""
    hostname = data.get("hostname") or ""
    # pre-1.0 clients send short_id/long_id
    if data.get("short_id"):
        client_id = data["short_id"]
    if data.get("long_id"):
        hostname = data["long_id"]
    s = replace(s, client_id=client_id, hostname=hostname, user_agent=data.get("user_agent") or "")
    if any(k in data for k in _YOUZAN_FIELDS):
        s = _youzan_fields(s, data)

    hb = data.get("heartbeat_interval") or 0
    if hb == -1:
        s = replace(s, heartbeat_interval_ms=0)
    elif hb != 0:
        if not 1000 <= hb <= limits.max_heartbeat_interval_ms:
            raise ProtocolError(E_BAD_BODY, f"IDENTIFY heartbeat interval ({hb}) is invalid")
        s = replace(s, heartbeat_interval_ms=hb)

    obt = data.get("output_buffer_timeout") or 0
    obs = data.get("output_buffer_size") or 0
    if obt == -1:
        s = replace(s, output_buffer_timeout_ms=0)
    elif obt != 0:
        if not limits.min_output_buffer_timeout_ms <= obt <= limits.max_output_buffer_timeout_ms:
            raise ProtocolError(E_BAD_BODY, f"IDENTIFY output buffer timeout ({obt}) is invalid")
        s = replace(s, output_buffer_timeout_ms=obt)
    if obs == -1:
        s = replace(s, output_buffer_size=1, output_buffer_timeout_ms=0)
    elif obs != 0:
        if not 64 <= obs <= limits.max_output_buffer_size:
            raise ProtocolError(E_BAD_BODY, f"IDENTIFY output buffer size ({obs}) is invalid")
        s = replace(s, output_buffer_size=obs)

    rate = data.get("sample_rate") or 0
    if not 0 <= rate <= 99:
        raise ProtocolError(E_BAD_BODY, f"IDENTIFY sample rate ({rate}) is invalid")
    s = replace(s, sample_rate=rate)

    mt = data.get("msg_timeout") or 0
    if mt != 0:
        if not 1000 <= mt <= limits.max_msg_timeout_ms:
            raise ProtocolError(E_BAD_BODY, f"IDENTIFY msg timeout ({mt}) is invalid")
        s = replace(s, msg_timeout_ms=mt)

    if not data.get("feature_negotiation"):
        return replace(s, feature_negotiation=False), OK

    tls_v1 = limits.tls_available and bool(data.get("tls_v1"))
    deflate = limits.deflate_available and bool(data.get("deflate"))
    # NSQ 1.3 answers its default level (6, capped by --max-deflate-level) also when
    # deflate is not negotiated; the connection then compresses nothing
    answered_level = 6
    if deflate:
        requested = data.get("deflate_level") or 0
        if requested > 0:
            answered_level = requested
    answered_level = min(answered_level, limits.max_deflate_level)
    deflate_level = answered_level if deflate else 0
    snappy = limits.snappy_available and bool(data.get("snappy"))
    if deflate and snappy:
        raise ProtocolError(E_IDENTIFY_FAILED, "cannot enable both deflate and snappy compression")
    s = replace(
        s,
        feature_negotiation=True,
        tls_v1=tls_v1,
        snappy=snappy,
        deflate=deflate,
        deflate_level=deflate_level,
    )
    response = {
        "max_rdy_count": limits.max_rdy_count,
        "version": limits.version,
        "max_msg_timeout": limits.max_msg_timeout_ms,
        "msg_timeout": s.msg_timeout_ms,
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": answered_level,
        "max_deflate_level": limits.max_deflate_level,
        "snappy": snappy,
        "sample_rate": s.sample_rate,
        "auth_required": limits.auth_required,
        "output_buffer_size": s.output_buffer_size,
        "output_buffer_timeout": s.output_buffer_timeout_ms,
    }
    if s.desired_tag:  # omitted when empty, as Youzan's nsqd does
        response["desired_tag"] = s.desired_tag
    if data.get("channel_policy"):
        # (answered only to a client that asked: NSQ 1.3's answer is unchanged)
        s = replace(s, channel_policy=True)
        response["channel_policy"] = True
    return s, json.dumps(response, separators=(",", ":")).encode()


def _youzan_fields(s: ClientSettings, data: dict[str, Any]) -> ClientSettings:
    tag = data.get("desired_tag") or ""
    try:
        check_tag(tag)
    except ValueError as err:
        raise ProtocolError(E_BAD_BODY, f"IDENTIFY {err}") from None
    try:
        spec = ExtFilterSpec.from_json(data.get("ext_filter"))
    except ValueError:
        raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body") from None
    ext_filter = None
    if spec.type:
        # Youzan's nsqd logs a bad filter and delivers everything; nsqx says so instead
        try:
            ext_filter = ExtFilter(spec)
        except ValueError as err:
            raise ProtocolError(E_BAD_BODY, f"IDENTIFY invalid ext_filter: {err}") from None
    return replace(
        s,
        youzan=True,
        extend_support=bool(data.get("extend_support")),
        desired_tag=tag,
        ext_filter=ext_filter,
    )
