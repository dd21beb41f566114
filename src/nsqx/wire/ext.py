"""Youzan's message extensions, sans-IO: JSON ext headers, dispatch tags, ext filters.

A message on an *ext* topic may carry a JSON object as its ext header (PUB_EXT). Keys
starting with ``##`` are reserved: ``##client_dispatch_tag`` routes the message to
consumers that IDENTIFY with that ``desired_tag``, ``##trace_id`` (a decimal u64 as a
string) makes it traced. A consumer's ``ext_filter`` (IDENTIFY) keeps only messages
whose header matches; the others are finished for it without being sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: ext versions (the byte before the ext data in message frames)
NO_EXT_VER = 0
TAG_EXT_VER = 2
JSON_HEADER_EXT_VER = 4

CLIENT_DISPATCH_TAG_KEY = "##client_dispatch_tag"
TRACE_ID_KEY = "##trace_id"
#: the longest ext header (its length is a u16 on the wire)
MAX_EXT_LEN = 65535
MAX_TAG_LEN = 100

FILTER_EXACT = 1
FILTER_REGEXP = 2
FILTER_GLOB = 3
FILTER_MULTI = 4


class ExtError(ValueError):
    """An ext header or filter that cannot be used; ``code`` is the protocol error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_header(raw: bytes) -> dict[str, Any]:
    """A JSON ext header as an object; ExtError(E_INVALID_JSON_HEADER) otherwise."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ExtError("E_INVALID_JSON_HEADER", f"fail to parse json header:{err}") from None
    if not isinstance(obj, dict):
        raise ExtError("E_INVALID_JSON_HEADER", "fail to parse json header:not a json object")
    return obj


def header_trace_id(header: dict[str, Any]) -> int | None:
    """The ``##trace_id`` of a header (None if absent). It must be a string holding a
    decimal u64, as Youzan's nsqd requires (ExtError(INVALID_TRACE_ID) otherwise)."""
    if TRACE_ID_KEY not in header:
        return None
    value = header[TRACE_ID_KEY]
    if not isinstance(value, str):
        raise ExtError("INVALID_TRACE_ID", "passin trace id should be string")
    if not value.isascii() or not value.isdigit() or int(value) >= 1 << 64:
        raise ExtError("INVALID_TRACE_ID", "invalid trace id")
    return int(value)


def only_reserved_keys(header: dict[str, Any]) -> bool:
    """True if every key is a reserved ``##`` one (such a header can be dropped for a
    topic without ext support, with --allow-ext-compatible)."""
    return all(k.startswith("##") or k == "zan_test" for k in header)


def header_tag(ext_ver: int, ext: bytes) -> str:
    """The dispatch tag of a message's ext data ("" if none)."""
    if ext_ver == TAG_EXT_VER:
        return ext.decode("utf-8", "replace")
    if ext_ver == JSON_HEADER_EXT_VER and ext:
        try:
            value = json.loads(ext).get(CLIENT_DISPATCH_TAG_KEY)
        except (ValueError, AttributeError, UnicodeDecodeError):
            return ""
        return value if isinstance(value, str) else ""
    return ""


def check_tag(tag: str) -> None:
    """A desired_tag longer than Youzan's limit is refused (ValueError)."""
    if len(tag) > MAX_TAG_LEN:
        raise ValueError(f"invalid tag len {len(tag)}, exceed limit {MAX_TAG_LEN}")


# --- filters ------------------------------------------------------------------------


def _lookup(obj: Any, path: str) -> Any:
    """A value by a dotted path (gjson's basic syntax, as Youzan's filters use)."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """A glob as gobwas/glob reads it without separators: ``*`` any run, ``?`` one
    character, ``[abc]`` / ``[!abc]`` / ``[a-z]`` a class, ``{a,b}`` alternatives,
    ``\\`` escapes. Anchored at both ends. ValueError on a malformed pattern."""
    out: list[str] = []
    i, n, depth = 0, len(pattern), 0
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "*":
            while i < n and pattern[i] == "*":
                i += 1
            out.append(".*")
            continue
        if c == "?":
            out.append(".")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j < 0:
                raise ValueError(f"unexpected end of input in {pattern!r}")
            body = pattern[i + 1 : j]
            neg = body[:1] == "!"
            if neg:
                body = body[1:]
            # gobwas reads ``lo-hi`` as a range and anything else as a list of characters
            # (each one literal: a class never becomes regex syntax; found by fuzzing)
            if len(body) == 3 and body[1] == "-":
                if body[0] > body[2]:
                    raise ValueError(f"bad range {body!r} in {pattern!r}")
                chars = re.escape(body[0]) + "-" + re.escape(body[2])
            else:
                chars = "".join(map(re.escape, body))
            if not chars:
                raise ValueError(f"empty class in {pattern!r}")
            out.append("[" + ("^" if neg else "") + chars + "]")
            i = j + 1
            continue
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise ValueError(f"unexpected end of input in {pattern!r}")
    try:
        return re.compile("(?s)" + "".join(out) + r"\Z")
    except re.error as err:  # not expected: every piece above is escaped
        raise ValueError(f"bad glob {pattern!r}: {err}") from None


@dataclass(frozen=True)
class ExtFilterSpec:
    """IDENTIFY's ``ext_filter``, as sent."""

    type: int = 0
    inverse: bool = False
    filter_ext_key: str = ""
    filter_data: str = ""
    filter_data_list: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> ExtFilterSpec:
        """From the decoded JSON; ValueError if a field has the wrong type."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("ext_filter is not an object")
        t = data.get("type") or 0
        inverse = data.get("inverse") or False
        key = data.get("filter_ext_key") or ""
        fdata = data.get("filter_data") or ""
        flist = data.get("filter_data_list") or []
        if (
            isinstance(t, bool)
            or not isinstance(t, int)
            or not isinstance(inverse, bool)
            or not isinstance(key, str)
            or not isinstance(fdata, str)
            or not isinstance(flist, list)
        ):
            raise ValueError("ext_filter has a field of the wrong type")
        pairs: list[tuple[str, str]] = []
        for item in flist:
            if not isinstance(item, dict):
                raise ValueError("ext_filter list entry is not an object")
            k = item.get("filter_ext_key") or ""
            d = item.get("filter_data") or ""
            if not isinstance(k, str) or not isinstance(d, str):
                raise ValueError("ext_filter list entry has a field of the wrong type")
            pairs.append((k, d))
        return cls(t, inverse, key, fdata, tuple(pairs))


class ExtFilter:
    """A compiled ext filter: :meth:`match` a message's ext data (version and bytes).

    Semantics are Youzan's: exact (the key's string value equals the data; an empty
    rule matches anything), regexp (a search, not a full match), glob, and multi (a
    list of exact rules joined by ``any`` or ``all``, given as ``filter_ext_key``).
    Only JSON headers are matched; ``inverse`` flips the answer.
    """

    def __init__(self, spec: ExtFilterSpec) -> None:
        if spec.type not in (FILTER_EXACT, FILTER_REGEXP, FILTER_GLOB, FILTER_MULTI):
            raise ValueError("the filter type not supported")
        if not spec.filter_ext_key or (not spec.filter_data and spec.type != FILTER_MULTI):
            raise ValueError("invalid filter rule")
        self.spec = spec
        self._regex: re.Pattern[str] | None = None
        if spec.type == FILTER_REGEXP:
            try:
                self._regex = re.compile(spec.filter_data)
            except re.error as err:
                raise ValueError(f"invalid regexp {spec.filter_data!r}: {err}") from None
        elif spec.type == FILTER_GLOB:
            self._regex = glob_to_regex(spec.filter_data)
        elif spec.type == FILTER_MULTI:
            if spec.filter_ext_key not in ("any", "all") or not spec.filter_data_list:
                raise ValueError("invalid filter rule")
            if any(not k or not d for k, d in spec.filter_data_list):
                raise ValueError("invalid filter rule")

    def match(self, ext_ver: int, ext: bytes) -> bool:
        """Whether a message with this ext data passes the filter."""
        spec = self.spec
        matched = False
        if ext_ver == JSON_HEADER_EXT_VER:
            try:
                header = json.loads(ext) if ext else {}
            except (ValueError, UnicodeDecodeError):
                header = {}
            matched = self._match_header(header if isinstance(header, dict) else {})
        return not matched if spec.inverse else matched

    def _match_header(self, header: dict[str, Any]) -> bool:
        spec = self.spec
        if spec.type == FILTER_MULTI:
            results = (_exact(header, k, d) for k, d in spec.filter_data_list)
            return any(results) if spec.filter_ext_key == "any" else all(results)
        if spec.type == FILTER_EXACT:
            return _exact(header, spec.filter_ext_key, spec.filter_data)
        value = _lookup(header, spec.filter_ext_key)
        text = value if isinstance(value, str) else ""
        assert self._regex is not None
        if spec.type == FILTER_REGEXP:
            return self._regex.search(text) is not None
        return self._regex.match(text) is not None


def _exact(header: dict[str, Any], key: str, data: str) -> bool:
    if not data:
        return True
    value = _lookup(header, key)
    return isinstance(value, str) and value == data
