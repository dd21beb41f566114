"""The HTTP plumbing shared by nsqlookupd's handlers: NSQ's V1 responses, Youzan's
wrapped ones, and query strings read as Go reads them.

A V1 response (NSQ's ``RespondV1``) is the data itself, with ``X-NSQ-Content-Type: nsq;
version=1.0``, and ``{"message": "CODE"}`` for an error. A wrapped response (Youzan's
``Respond``, for clients that do not send ``Accept: application/vnd.nsq;
version=1.0``) is ``{"status_code","status_txt","data"}`` with no such header; a
wrapped error always has status 500, as Youzan keeps "for backwards compatibility".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from nsqx.wire.names import is_valid_name

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
_V1_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}
#: The Accept values that ask for V1 answers: the header Youzan's clients and pynsq
#: send, and gnsq's spelling (without ';').
V1_ACCEPT = frozenset({"application/vnd.nsq; version=1.0", "application/vnd.nsq version=1.0"})


def accepts_v1(request: web.Request) -> bool:
    """True if the request asks for V1 answers (its Accept header)."""
    return request.headers.get("Accept", "") in V1_ACCEPT


class HTTPError(Exception):
    """An API error: HTTP status and NSQ's message code. ``negotiate`` marks an error
    of a request whose answer is negotiated (V1 or wrapped)."""

    def __init__(self, status: int, message: str, *, negotiate: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.negotiate = negotiate


@dataclass(frozen=True)
class Negotiated:
    """A handler's answer to send V1 or wrapped, as the request's Accept header asks."""

    data: Any


def go_json(obj: Any) -> bytes:
    """JSON as Go's encoding/json writes it: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text.encode()


def respond_wrapped(status: int, text: str, data: Any) -> web.Response:
    """Youzan's Respond: ``{"status_code","status_txt","data"}``, no V1 header."""
    body = go_json({"status_code": status, "status_txt": text, "data": data})
    return web.Response(status=status, body=body, headers={"Content-Type": JSON_CONTENT_TYPE})


def respond_v1(status: int, data: Any) -> web.Response:
    """NSQ's RespondV1: text as is, None as an empty body, anything else as JSON."""
    headers = dict(_V1_HEADERS)
    if status != 200:
        headers["Content-Type"] = JSON_CONTENT_TYPE
        return web.Response(status=status, body=go_json({"message": str(data)}), headers=headers)
    if data is None:
        return web.Response(status=200, body=b"", headers=headers)
    if isinstance(data, str):
        return web.Response(status=200, body=data.encode(), headers=headers)
    headers["Content-Type"] = JSON_CONTENT_TYPE
    return web.Response(status=200, body=go_json(data), headers=headers)


# --- query strings, as Go's url.ParseQuery reads them ----------------------------------

_HEX = "0123456789abcdefABCDEF"


def _unescape(s: str) -> str:
    """Go's url.QueryUnescape: '+' is a space, '%XX' a byte; a bad escape is an error."""
    if "%" not in s and "+" not in s:
        return s
    out = bytearray()
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "%":
            if i + 2 >= n:
                raise ValueError("invalid URL escape")
            hi, lo = s[i + 1], s[i + 2]
            if hi not in _HEX or lo not in _HEX:
                raise ValueError("invalid URL escape")
            out.append(int(hi + lo, 16))
            i += 3
        elif ch == "+":
            out.append(0x20)
            i += 1
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", errors="replace")


def parse_query(raw: str) -> dict[str, list[str]]:
    """Parse a raw query string like Go's url.ParseQuery; ValueError where Go errs.

    Pairs are split on '&' only; a ';' or a bad escape is an error (Go keeps parsing
    the other pairs but reports the error, which NSQ turns into INVALID_REQUEST).
    """
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = error or "invalid semicolon separator in query"
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            k, v = _unescape(key), _unescape(value)
        except ValueError as e:
            error = error or str(e)
            continue
        values.setdefault(k, []).append(v)
    if error is not None:
        raise ValueError(error)
    return values


class Params:
    """A request's query parameters; ``get`` gives the first value, as NSQ's ReqParams."""

    def __init__(self, request: web.Request) -> None:
        try:
            self.values = parse_query(request.rel_url.raw_query_string)
        except ValueError:
            raise HTTPError(400, "INVALID_REQUEST") from None

    def get(self, key: str) -> str | None:
        v = self.values.get(key)
        return v[0] if v else None

    def topic(self) -> str:
        """The ``topic`` parameter (any value, even empty); MISSING_ARG_TOPIC if absent."""
        topic = self.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return topic

    def topic_channel(self) -> tuple[str, str]:
        """Valid ``topic`` and ``channel``, checked in NSQ's order."""
        topic = self.topic()
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = self.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel


_ATOI_RE = re.compile(r"[+-]?[0-9]+")


def go_atoi(text: str) -> int | None:
    """Go's strconv.Atoi (an optional sign, ASCII digits), None where it fails."""
    if _ATOI_RE.fullmatch(text) is None:
        return None
    return int(text)
