"""The options of the "nsq" data source, checked when a query is built.

Spark hands options over lower-cased; every error names the option as users write it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nsqx.wire.names import is_valid_name


class NsqOptionError(ValueError):
    """A data source option is missing or malformed (the message names it)."""


#: user-facing spelling of each option, by its lower-cased key
#: options Spark itself passes to a source or sink along with the user's
#: (``.option("checkpointLocation", ...)`` of a writeStream, ``load(path)``)
SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})

OPTION_NAMES = {
    n.lower(): n
    for n in (
        "topic",
        "nsqdHttpAddresses",
        "nsqdTcpAddresses",
        "lookupdHttpAddresses",
        "startingOffsets",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "channel",
        "mode",
        "maxBatchMessages",
        "topicColumn",
        "bodyColumn",
        "batchSize",
        "readMessages",
        "readBytes",
        "failOnDataLoss",
        "msgTimeout",
        # Kafka's names for what Kafka's source does (docs/spark.md, the parity table)
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "includeHeaders",
    )
}


class ByTimestamp(dict[str, int]):
    """``*OffsetsByTimestamp``: epoch milliseconds by ``host:httpport/partition``."""


#: an offset spec: "earliest", "latest", {partition: sequence}, epoch milliseconds, or
#: epoch milliseconds by partition (ByTimestamp)
OffsetSpec = str | dict[str, int] | int

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration(value: str | None, name: str, default: float) -> float:
    """Seconds from a duration such as ``15m``, ``30s``, ``500ms`` (Kafka's
    maxTriggerDelay); a bare number is milliseconds."""
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    num = v.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = v[len(num) :].strip() or "ms"
    try:
        seconds = float(num) * _DURATION_UNITS[unit]
    except (ValueError, KeyError):
        raise NsqOptionError(
            f"option {name}: expected a duration such as 15m, 30s or 500ms, got {value!r}"
        ) from None
    if seconds < 0:
        raise NsqOptionError(f"option {name}: a duration must be >= 0, got {value!r}")
    return seconds


def _by_timestamp(value: str | None, name: str) -> ByTimestamp | None:
    if value is None or value.strip() == "":
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(t, int) and not isinstance(t, bool) and t >= 0
        for k, t in parsed.items()
    ):
        raise NsqOptionError(
            f'option {name}: JSON must map "host:httpport/partition" to epoch milliseconds, '
            f"got {value!r}"
        )
    return ByTimestamp(parsed)


def _addresses(value: str | None, name: str) -> list[str]:
    if not value:
        return []
    out = []
    for a in value.split(","):
        a = a.strip()
        host, sep, port = a.rpartition(":")
        if not a or not sep or not host or not port.isdigit():
            raise NsqOptionError(f"option {name}: {a!r} is not host:port")
        out.append(a)
    return out


def _offset_spec(value: str | None, name: str, default: str) -> OffsetSpec:
    if value is None or value == "":
        return default
    v = value.strip()
    if v in ("earliest", "latest"):
        return v
    if v.lstrip("-").isdigit():
        ms = int(v)
        if ms < 0:
            raise NsqOptionError(f"option {name}: a timestamp must be >= 0 (epoch ms), got {v}")
        return ms
    try:
        parsed = json.loads(v)
    except ValueError:
        raise NsqOptionError(
            f"option {name}: expected earliest, latest, epoch milliseconds or JSON "
            f'{{"host:httpport/partition": sequence}}, got {v!r}'
        ) from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(s, int) and not isinstance(s, bool) and s >= -2
        for k, s in parsed.items()
    ):
        raise NsqOptionError(
            f'option {name}: JSON must map "host:httpport/partition" to a sequence '
            f"(-2 earliest, -1 latest), got {v!r}"
        )
    return parsed


def _positive_int(value: str | None, name: str, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise NsqOptionError(f"option {name}: expected a positive integer, got {value!r}") from None
    if n <= 0:
        raise NsqOptionError(f"option {name}: expected a positive integer, got {value!r}")
    return n


def _bool(value: str | None, name: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise NsqOptionError(f"option {name}: expected true or false, got {value!r}")


@dataclass
class NsqOptions:
    """Validated options of the "nsq" source and sink."""

    topic: str | None = None
    nsqd_http: list[str] = field(default_factory=list)
    nsqd_tcp: list[str] = field(default_factory=list)
    lookupd_http: list[str] = field(default_factory=list)
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    channel: str | None = None
    mode: str = "range"
    max_batch_messages: int | None = None
    topic_column: str | None = None
    body_column: str = "body"
    batch_size: int = 200
    read_messages: int = 50_000
    read_bytes: int = 16 * 1024 * 1024
    fail_on_data_loss: bool = True
    msg_timeout_ms: int = 30_000
    #: Kafka's minOffsetsPerTrigger / maxTriggerDelay (seconds; 15 minutes by default)
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = 15 * 60.0
    #: add the ``headers`` column (the JSON ext header as key/value pairs)
    include_headers: bool = False

    @classmethod
    def parse(cls, raw: Any, *, for_write: bool = False) -> NsqOptions:
        """Check ``raw`` (Spark's options); raise NsqOptionError naming the bad one."""
        opts = {str(k).lower(): (None if v is None else str(v)) for k, v in dict(raw).items()}
        unknown = [k for k in opts if k not in OPTION_NAMES and k not in SPARK_OPTIONS]
        if unknown:
            raise NsqOptionError(
                f"unknown option(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(OPTION_NAMES.values()))}"
            )
        o = cls()
        o.topic = opts.get("topic") or None
        o.topic_column = opts.get("topiccolumn") or None
        if o.topic is not None and not is_valid_name(o.topic):
            raise NsqOptionError(f"option topic: {o.topic!r} is not a valid NSQ topic name")
        if not for_write and o.topic is None:
            raise NsqOptionError("option topic is required")
        if for_write and o.topic is None and o.topic_column is None:
            raise NsqOptionError("option topic (or topicColumn) is required to write")
        o.nsqd_http = _addresses(opts.get("nsqdhttpaddresses"), "nsqdHttpAddresses")
        o.nsqd_tcp = _addresses(opts.get("nsqdtcpaddresses"), "nsqdTcpAddresses")
        o.lookupd_http = _addresses(opts.get("lookupdhttpaddresses"), "lookupdHttpAddresses")
        o.mode = (opts.get("mode") or "range").lower()
        if o.mode not in ("range", "channel"):
            raise NsqOptionError(f"option mode: expected range or channel, got {o.mode!r}")
        o.channel = opts.get("channel") or None
        if o.channel is not None and not is_valid_name(o.channel):
            raise NsqOptionError(f"option channel: {o.channel!r} is not a valid NSQ channel name")
        # writing and mode=channel speak TCP: to nsqd named by its TCP address, or found
        # through nsqlookupd, or named by its HTTP address (its TCP port is in its /info)
        if for_write:
            if not o.nsqd_tcp and not o.lookupd_http and not o.nsqd_http:
                raise NsqOptionError(
                    "option nsqdTcpAddresses (or lookupdHttpAddresses, or nsqdHttpAddresses) "
                    "is required to write"
                )
        elif o.mode == "channel":
            if o.channel is None:
                raise NsqOptionError("option channel is required with mode=channel")
            if not o.nsqd_tcp and not o.lookupd_http and not o.nsqd_http:
                raise NsqOptionError(
                    "option nsqdTcpAddresses (or lookupdHttpAddresses, or nsqdHttpAddresses) "
                    "is required with mode=channel"
                )
        elif not o.nsqd_http and not o.lookupd_http:
            raise NsqOptionError("option nsqdHttpAddresses (or lookupdHttpAddresses) is required")
        o.starting = _offset_spec(opts.get("startingoffsets"), "startingOffsets", "earliest")
        o.ending = _offset_spec(opts.get("endingoffsets"), "endingOffsets", "latest")
        # Kafka's precedence: by timestamp per partition, then one timestamp, then offsets
        for side in ("starting", "ending"):
            stamp = opts.get(f"{side}timestamp")
            if stamp:
                setattr(o, side, _offset_spec(stamp, f"{side}Timestamp", "latest"))
                if not isinstance(getattr(o, side), int):
                    raise NsqOptionError(
                        f"option {side}Timestamp: expected epoch milliseconds, got {stamp!r}"
                    )
            by_time = _by_timestamp(
                opts.get(f"{side}offsetsbytimestamp"), f"{side}OffsetsByTimestamp"
            )
            if by_time is not None:
                setattr(o, side, by_time)
        o.min_offsets_per_trigger = _positive_int(
            opts.get("minoffsetspertrigger"), "minOffsetsPerTrigger", None
        )
        o.max_trigger_delay = _duration(opts.get("maxtriggerdelay"), "maxTriggerDelay", 15 * 60.0)
        o.include_headers = _bool(opts.get("includeheaders"), "includeHeaders", False)
        o.max_offsets_per_trigger = _positive_int(
            opts.get("maxoffsetspertrigger"), "maxOffsetsPerTrigger", None
        )
        # the older name of maxOffsetsPerTrigger in mode=channel
        o.max_batch_messages = _positive_int(opts.get("maxbatchmessages"), "maxBatchMessages", None)
        o.body_column = opts.get("bodycolumn") or "body"
        o.batch_size = _positive_int(opts.get("batchsize"), "batchSize", 200) or 200
        o.read_messages = _positive_int(opts.get("readmessages"), "readMessages", 50_000) or 50_000
        o.read_bytes = _positive_int(opts.get("readbytes"), "readBytes", 16 << 20) or (16 << 20)
        o.fail_on_data_loss = _bool(opts.get("failondataloss"), "failOnDataLoss", True)
        o.msg_timeout_ms = _positive_int(opts.get("msgtimeout"), "msgTimeout", 30_000) or 30_000
        return o
