"""Client configuration: go-nsq's options, their defaults, and validation on construction.

Option names are go-nsq's (``max_in_flight``, ``backoff_multiplier``, ...). Durations are
seconds (``float``); :meth:`Config.from_dict` also takes Go duration strings (``"250ms"``,
``"1m30s"``), :class:`datetime.timedelta`, and option names spelt with dashes, as found in
configuration files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal

from nsqx import __version__
from nsqx.client.errors import ConfigError
from nsqx.wire.ext import ExtFilter, ExtFilterSpec, check_tag

BackoffStrategy = Literal["exponential", "full_jitter"]
OrderedCheck = Literal["log", "raise", "off"]

_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_GO_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_TLS_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def parse_duration(value: object, name: str = "duration") -> float:
    """Seconds from a number, a :class:`timedelta` or a Go duration string (``"1m30s"``)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        text = value.strip()
        sign = 1.0
        if text[:1] in "+-" and text:
            sign = -1.0 if text[0] == "-" else 1.0
            text = text[1:]
        if text == "0":
            return 0.0
        pos, total = 0, 0.0
        for m in _GO_DURATION.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _GO_UNITS[m.group(2)]
            pos = m.end()
        if pos == len(text) and text:
            return sign * total
    raise ConfigError(f"{name}: {value!r} is not a duration (seconds, or Go form like '250ms')")


def _default_hostname() -> str:
    return socket.gethostname()


def _default_client_id() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class Config:
    """Every option of a consumer or producer, with go-nsq's names and defaults.

    Durations are in seconds. Invalid values raise :class:`ConfigError` at construction.
    Use :func:`dataclasses.replace` (or :meth:`with_options`) to derive a changed copy.
    """

    # -- network --
    #: Timeout of the TCP connect (and of the whole handshake).
    dial_timeout: float = 1.0
    #: Close a connection that received nothing for this long (heartbeats keep it alive).
    read_timeout: float = 60.0
    #: Close a connection whose writes stay blocked for this long.
    write_timeout: float = 1.0
    #: Local address to bind before connecting: ``"host"`` or ``"host:port"``.
    local_addr: str | None = None

    # -- discovery --
    lookupd_poll_interval: float = 60.0
    #: Random share of the poll interval added to the first wait (thundering herds).
    lookupd_poll_jitter: float = 0.3
    lookupd_poll_timeout: float = 60.0

    # -- reconnection to nsqd given by address (not through lookupd) --
    #: First retry delay; doubles after every failed attempt (8 s, 16 s, 32 s, ...).
    reconnect_delay: float = 8.0
    max_reconnect_delay: float = 120.0

    # -- requeue --
    #: REQ delay when none is given: this times the message's attempts, up to the max.
    default_requeue_delay: float = 90.0
    max_requeue_delay: float = 900.0

    # -- backoff --
    backoff_strategy: BackoffStrategy = "exponential"
    #: The longest backoff; 0 turns backoff off.
    max_backoff_duration: float = 120.0
    backoff_multiplier: float = 1.0

    # -- attempts --
    #: Messages delivered more often than this go to the giving-up hook; 0 = no limit.
    max_attempts: int = 5

    # -- RDY --
    #: A connection that got no message for this long gives its RDY back (when RDY is
    #: scarcer than connections, or in backoff).
    low_rdy_idle_timeout: float = 10.0
    #: A connection that held RDY this long gives it back, so that others get a turn.
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    max_in_flight: int = 1

    # -- identity --
    client_id: str = field(default_factory=_default_client_id)
    hostname: str = field(default_factory=_default_hostname)
    user_agent: str = f"nsqx/{__version__}"

    # -- negotiated with nsqd (IDENTIFY) --
    #: Seconds between nsqd's heartbeats; -1 disables them (nsqd then refuses SUB).
    heartbeat_interval: float = 30.0
    #: Server-side message timeout for this connection; 0 keeps nsqd's default.
    msg_timeout: float = 0.0
    #: Percentage of the channel's messages to receive; 0 = all.
    sample_rate: int = 0
    #: Bytes nsqd buffers before writing to us; -1 disables buffering, 0 = nsqd's default.
    output_buffer_size: int = 16384
    #: Longest time nsqd buffers; -1 disables the timeout, 0 = nsqd's default.
    output_buffer_timeout: float = 0.25

    # -- TLS --
    tls_v1: bool = False
    #: A ready SSL context; when given, the tls_* file options below are not used.
    tls_config: ssl.SSLContext | None = None
    tls_root_ca_file: str | None = None
    tls_insecure_skip_verify: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_min_version: str = "tls1.2"
    #: Name checked against the server's certificate; defaults to the host connected to.
    tls_server_name: str | None = None

    # -- compression (mutually exclusive) --
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False

    # -- auth --
    auth_secret: str | None = None

    # -- Youzan's extensions (partitions, order, tracing, ext headers) --
    #: Consume with SUB_ORDERED: one message at a time per partition, in order.
    enable_ordered: bool = False
    #: Subscribe to partitions with SUB_ADVANCED, so that messages carry their offset
    #: and raw size (also implied by a start position or enable_ordered).
    enable_trace: bool = False
    #: What an ordered consumer does when a partition's offsets or ids go backwards:
    #: "log" an error and go on, "raise" (stop the consumer with OrderError), or "off".
    ordered_check: OrderedCheck = "log"
    #: Ask nsqd for the messages with this dispatch tag (``##client_dispatch_tag``).
    desired_tag: str = ""
    #: Only the messages whose ext header matches (IDENTIFY's ext_filter, e.g.
    #: ``{"type": 1, "filter_ext_key": "k", "filter_data": "v"}``).
    ext_filter: Mapping[str, Any] | None = None
    #: A publish through nsqlookupd is retried this many times after a leader change or
    #: a lost connection, looking the topic up again each time.
    pub_max_retry: int = 3
    #: First wait before such a retry; doubles after each one.
    pub_retry_delay: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type in ("float", float):
                value = getattr(self, f.name)
                object.__setattr__(self, f.name, parse_duration(value, f.name))
        self._validate()

    # -- validation -----------------------------------------------------------------

    def _range(self, name: str, lo: float | None = None, hi: float | None = None) -> None:
        value = getattr(self, name)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if lo is not None and hi is not None:
                want = f"between {lo:g} and {hi:g}"
            elif lo is not None:
                want = f">= {lo:g}"
            else:
                want = f"<= {hi:g}"
            raise ConfigError(f"{name} must be {want} (got {value!r})")

    def _int(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer (got {value!r})")

    def _validate(self) -> None:
        for name in ("max_in_flight", "max_attempts", "sample_rate", "output_buffer_size"):
            self._int(name)
        for name in ("deflate_level",):
            self._int(name)
        self._range("dial_timeout", 0.001, 300)
        self._range("read_timeout", 0.1, 300)
        self._range("write_timeout", 0.1, 300)
        self._range("lookupd_poll_interval", 0.01, 300)
        self._range("lookupd_poll_jitter", 0, 1)
        self._range("lookupd_poll_timeout", 0.001, 300)
        self._range("reconnect_delay", 0.001, 3600)
        self._range("max_reconnect_delay", self.reconnect_delay, 3600)
        self._range("default_requeue_delay", 0, 3600)
        self._range("max_requeue_delay", 0, 3600)
        if self.backoff_strategy not in ("exponential", "full_jitter"):
            raise ConfigError(
                "backoff_strategy must be 'exponential' or 'full_jitter' "
                f"(got {self.backoff_strategy!r})"
            )
        self._range("max_backoff_duration", 0, 3600)
        self._range("backoff_multiplier", 0, 3600)
        self._range("max_attempts", 0, 65535)
        self._range("low_rdy_idle_timeout", 0.001, 300)
        self._range("low_rdy_timeout", 0.001, 300)
        self._range("rdy_redistribute_interval", 0.001, 60)
        self._range("max_in_flight", 0)
        hb = self.heartbeat_interval
        if hb != -1 and hb < 1:
            raise ConfigError(f"heartbeat_interval must be -1 (off) or >= 1 s (got {hb!r})")
        if hb > self.read_timeout:
            raise ConfigError(
                f"heartbeat_interval ({hb:g} s) must be less than read_timeout "
                f"({self.read_timeout:g} s), or idle connections are closed"
            )
        if self.msg_timeout != 0 and self.msg_timeout < 1:
            raise ConfigError(
                f"msg_timeout must be 0 (nsqd's default) or >= 1 s (got {self.msg_timeout!r})"
            )
        self._range("sample_rate", 0, 99)
        obs = self.output_buffer_size
        if obs not in (-1, 0) and obs < 64:
            raise ConfigError(f"output_buffer_size must be -1, 0 or >= 64 (got {obs!r})")
        obt = self.output_buffer_timeout
        if obt not in (-1, 0) and obt < 0.001:
            raise ConfigError(f"output_buffer_timeout must be -1, 0 or >= 1 ms (got {obt!r})")
        if self.deflate and self.snappy:
            raise ConfigError("snappy and deflate are mutually exclusive: choose one")
        self._range("deflate_level", 1, 9)
        if self.tls_min_version not in _TLS_VERSIONS:
            raise ConfigError(
                f"tls_min_version must be one of {', '.join(_TLS_VERSIONS)} "
                f"(got {self.tls_min_version!r})"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: give both or neither")
        for name in ("tls_root_ca_file", "tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"{name}: no such file {path!r}")
        if self.tls_config is not None and not isinstance(self.tls_config, ssl.SSLContext):
            raise ConfigError("tls_config must be an ssl.SSLContext")
        if self.local_addr is not None and not isinstance(self.local_addr, str):
            raise ConfigError("local_addr must be 'host' or 'host:port'")
        self._validate_youzan()

    def _validate_youzan(self) -> None:
        if self.ordered_check not in ("log", "raise", "off"):
            raise ConfigError(
                f"ordered_check must be 'log', 'raise' or 'off' (got {self.ordered_check!r})"
            )
        if self.enable_ordered and self.sample_rate:
            raise ConfigError("enable_ordered and sample_rate exclude each other (nsqd refuses)")
        if not isinstance(self.desired_tag, str):
            raise ConfigError("desired_tag must be a string")
        try:
            check_tag(self.desired_tag)
        except ValueError as err:
            raise ConfigError(f"desired_tag: {err}") from None
        if self.ext_filter is not None:
            try:
                ExtFilter(ExtFilterSpec.from_json(dict(self.ext_filter)))
            except (ValueError, TypeError) as err:
                raise ConfigError(f"ext_filter: {err}") from None
        self._int("pub_max_retry")
        self._range("pub_max_retry", 0, 100)
        self._range("pub_retry_delay", 0, 60)

    # -- derived values ---------------------------------------------------------------

    def with_options(self, **options: Any) -> Config:
        """A copy with some options changed (validated like the original)."""
        return Config.from_dict(options, base=self) if options else self

    @classmethod
    def from_dict(cls, options: Mapping[str, Any], base: Config | None = None) -> Config:
        """Build from a mapping: option names may use dashes; durations may be strings."""
        names = {f.name for f in fields(cls)}
        clean: dict[str, Any] = {}
        for key, value in options.items():
            name = key.replace("-", "_")
            if name not in names:
                raise ConfigError(f"unknown option {key!r}")
            clean[name] = value
        if base is None:
            return cls(**clean)
        return dataclasses.replace(base, **clean)

    def identify_body(self, *, feature_negotiation: bool = True) -> dict[str, Any]:
        """The IDENTIFY JSON (times in milliseconds, as nsqd expects)."""

        def ms(seconds: float) -> int:
            return -1 if seconds < 0 else round(seconds * 1000)

        body: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": feature_negotiation,
            "heartbeat_interval": ms(self.heartbeat_interval),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
            "sample_rate": self.sample_rate,
            "tls_v1": self.tls_v1,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
        }
        if self.msg_timeout:
            body["msg_timeout"] = ms(self.msg_timeout)
        # Youzan's keys only when asked for: any of them makes nsqd send binary ids
        if self.desired_tag:
            body["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            body["ext_filter"] = dict(self.ext_filter)
        return body

    def ssl_context(self) -> ssl.SSLContext:
        """The client SSL context for ``tls_v1`` (``tls_config`` if one was given)."""
        if self.tls_config is not None:
            return self.tls_config
        ctx = ssl.create_default_context(cafile=self.tls_root_ca_file)
        ctx.minimum_version = _TLS_VERSIONS[self.tls_min_version]
        if self.tls_insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.tls_cert and self.tls_key:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def requeue_delay(self, attempts: int) -> float:
        """The REQ delay for a message that failed on its ``attempts``-th delivery."""
        return min(self.default_requeue_delay * attempts, self.max_requeue_delay)
