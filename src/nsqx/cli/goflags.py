"""A small parser for Go's ``flag`` package syntax, plus NSQ's TOML config layering.

NSQ's daemons are Go programs, and the harnesses that start them (pynsq's, go-nsq's,
gnsq's) pass Go-style command lines: ``-flag``, ``--flag``, ``-flag=value``,
``--flag value``, booleans as ``--snappy`` or ``--snappy=false``, durations such as
``250ms`` or ``1m30s``, and repeatable flags. :mod:`argparse` rejects several of these
(single-dash long names, ``--snappy=false``), so this module reimplements the rules.

The model is a table of :class:`FlagSpec` rows collected in a :class:`FlagSet`:

* :meth:`FlagSet.parse` turns ``argv`` into :class:`ParsedFlags` (Go's rules, Go's
  error wording);
* :meth:`FlagSet.config_values` coerces a decoded TOML mapping the way NSQ's option
  resolver does (durations as strings or integer milliseconds, lists as arrays or
  comma-separated strings);
* :meth:`FlagSet.resolve` layers them: command-line flags beat the config file, which
  beats the defaults;
* :meth:`FlagSet.parse_and_resolve` does all of it, reading ``--config`` with
  :mod:`tomllib`.

Durations are returned as float seconds. Every problem raises :class:`FlagError`, whose
message names the offending flag or config key.
"""

from __future__ import annotations

import enum
import logging
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FlagError",
    "FlagSet",
    "FlagSpec",
    "HelpRequested",
    "Kind",
    "ParsedFlags",
    "Resolution",
    "format_go_duration",
    "load_toml_config",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_float",
    "parse_go_int",
]

log = logging.getLogger("nsqx.cli")


class FlagError(Exception):
    """A command line or config file that the program refuses; the message says why."""


class HelpRequested(FlagError):
    """``-h``, ``-help`` or ``--help`` was given; :attr:`usage` holds the text to print.

    Go's ``flag`` package treats these as requests, not errors (the program prints the
    usage and exits 0). It subclasses :class:`FlagError` only so that "parsing raises
    FlagError" stays true; callers should test for it first.
    """

    def __init__(self, usage: str) -> None:
        super().__init__("help requested")
        self.usage = usage


class Kind(enum.Enum):
    """How a flag's text becomes a value."""

    STR = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    #: Go duration text (``1m30s``); the value is float seconds.
    DURATION = "duration"
    #: Repeatable; each occurrence appends one string.
    STR_LIST = "string list"
    #: Repeatable; each occurrence appends one or more comma-separated floats.
    FLOAT_LIST = "float list"


_LIST_KINDS = (Kind.STR_LIST, Kind.FLOAT_LIST)


@dataclass(frozen=True)
class FlagSpec:
    """One flag: its name, type, destination, default and help.

    ``dest`` is both the attribute of the options object and the config-file key (NSQ's
    convention: ``lookupd-tcp-address`` is stored as ``nsqlookupd_tcp_addresses``). An
    empty ``dest`` marks a control flag (``--version``, ``--config``) that the caller
    reads from :class:`ParsedFlags` and that never reaches the options object.
    """

    name: str
    kind: Kind
    dest: str
    default: object = None
    help: str = ""
    #: The config-file key when it differs from ``dest`` (nsqd's node-id is ``id``).
    config_key: str | None = None
    #: Further config keys accepted for the same option.
    config_aliases: tuple[str, ...] = ()
    #: Like Go's ``IsBoolFlag``: a bare ``-flag`` means ``true`` and the flag never takes
    #: the next argument as its value. Always true for :attr:`Kind.BOOL`.
    bool_style: bool = False
    #: For :attr:`Kind.STR`: normalises or validates the text (raise ValueError to refuse).
    convert: Callable[[str], str] | None = None
    #: Shown in the usage instead of ``default`` (for defaults computed at run time).
    default_text: str | None = None
    #: Placeholder for the value in the usage text.
    metavar: str = ""

    def __post_init__(self) -> None:
        if not self.name or self.name.startswith("-") or "=" in self.name:
            raise ValueError(f"bad flag name {self.name!r}")
        if self.kind is Kind.BOOL and not self.bool_style:
            object.__setattr__(self, "bool_style", True)
        if self.bool_style and self.kind not in (Kind.BOOL, Kind.STR):
            raise ValueError(f"-{self.name}: only bool and string flags can be bool-style")
        if self.convert is not None and self.kind is not Kind.STR:
            raise ValueError(f"-{self.name}: convert is only for string flags")

    @property
    def config_keys(self) -> tuple[str, ...]:
        """Every config-file key that sets this flag's option, canonical first."""
        if not self.dest:
            return ()
        return (self.config_key or self.dest, *self.config_aliases)


@dataclass
class ParsedFlags:
    """What the command line said: values by flag name, for the flags that were given."""

    values: dict[str, Any] = field(default_factory=dict)
    #: Flag names in command-line order, repeats included.
    order: list[str] = field(default_factory=list)

    def is_set(self, name: str) -> bool:
        """Whether ``-name`` appeared on the command line."""
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        """The value given for ``-name`` (accumulated for lists), else ``default``."""
        return self.values.get(name, default)


@dataclass
class Resolution:
    """The outcome of :meth:`FlagSet.parse_and_resolve`."""

    parsed: ParsedFlags
    #: dest -> value for every option set by a flag or the config file (flags win).
    #: Options set by neither are absent, so the options object keeps its own defaults.
    values: dict[str, Any]
    #: The decoded config file (empty without ``--config``).
    config: dict[str, Any]
    config_path: str = ""


# ---------------------------------------------------------------------------
# Go value syntax


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: 1/t/T/TRUE/true/True and 0/f/F/FALSE/false/False."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("parse error")


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# Go integer literals as accepted by strconv.ParseInt(s, 0, 64): the prefix picks the
# base and a leading 0 alone means octal. Underscores are checked by int() below.
_GO_INT_RE = re.compile(
    r"(?P<sign>[+-]?)(?:"
    r"0[xX](?P<hex>[0-9a-fA-F_]+)|0[oO](?P<oct>[0-7_]+)|0[bB](?P<bin>[01_]+)"
    r"|0(?P<legacy>[0-7_]*)|(?P<dec>[1-9][0-9_]*))\Z"
)


def parse_go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 0, 64)``, which is what integer flags use.

    Accepts ``0x``/``0o``/``0b`` prefixes, Go's legacy ``0``-prefixed octal, and
    underscores between digits. Raises ValueError("parse error" or "value out of range").
    """
    m = _GO_INT_RE.match(text)
    if m is None:
        raise ValueError("parse error")
    try:
        if m["hex"] is not None:
            value = int(m["hex"], 16)
        elif m["oct"] is not None:
            value = int(m["oct"], 8)
        elif m["bin"] is not None:
            value = int(m["bin"], 2)
        elif m["legacy"] is not None:
            # "0_7" is valid Go; Python's int() wants the underscore between digits.
            digits = m["legacy"].removeprefix("_")
            value = int(digits, 8) if digits else 0
        else:
            value = int(m["dec"], 10)
    except ValueError:
        raise ValueError("parse error") from None
    if m["sign"] == "-":
        value = -value
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


_DEC_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_HEX_FLOAT_RE = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F_]+\.?[0-9a-fA-F_]*|\.[0-9a-fA-F_]+)[pP][+-]?[0-9_]+\Z"
)
_SPECIAL_FLOAT_RE = re.compile(r"(?i)(?:[+-]?(?:inf|infinity)|nan)")


def parse_go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat(text, 64)``: decimal, hex (``0x1p-2``), inf and nan.

    Unlike Python's ``float()`` it refuses surrounding spaces and decimal underscores.
    """
    if _SPECIAL_FLOAT_RE.fullmatch(text):
        return float(text)
    if _DEC_FLOAT_RE.match(text):
        value = float(text)
    elif _HEX_FLOAT_RE.match(text):
        try:
            value = float.fromhex(text.replace("_", ""))
        except (ValueError, OverflowError):
            raise ValueError("value out of range") from None
    else:
        raise ValueError("parse error")
    if math.isinf(value):
        raise ValueError("value out of range")
    return value


_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_DIGITS = "0123456789"


def _parse_go_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration`` in integer nanoseconds (ValueError on bad text)."""
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":  # the only unitless duration Go accepts
        return 0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while rest:
        # a number: digits, optionally "." and more digits, at least one digit overall
        i = 0
        while i < len(rest) and rest[i] in _DIGITS:
            i += 1
        whole = rest[:i]
        frac = ""
        if i < len(rest) and rest[i] == ".":
            j = i + 1
            while j < len(rest) and rest[j] in _DIGITS:
                j += 1
            frac = rest[i + 1 : j]
            i = j
        if not whole and not frac:
            raise ValueError(f"invalid duration {text!r}")
        # the unit: everything up to the next digit or "."
        k = i
        while k < len(rest) and rest[k] != "." and rest[k] not in _DIGITS:
            k += 1
        unit = rest[i:k]
        if not unit:
            raise ValueError(f"missing unit in duration {text!r}")
        scale = _NS_PER_UNIT.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        value = int(whole or "0") * scale
        if frac:
            # Go truncates fractions of a nanosecond
            value += int(frac) * scale // 10 ** len(frac)
        total += value
        if total > _INT64_MAX + (1 if negative else 0):
            raise ValueError(f"invalid duration {text!r}")
        rest = rest[k:]
    return -total if negative else total


def parse_go_duration(text: str) -> float:
    """Parse Go duration text (``250ms``, ``1m30s``, ``1.5h``, ``300us``, ``0``) to seconds.

    Follows Go's ``time.ParseDuration``: a sign, then one or more number+unit pairs with
    units ns, us (or µs), ms, s, m, h; a bare number is refused except ``0``.
    Raises ValueError.
    """
    return _parse_go_duration_ns(text) / 1e9


def _format_fraction(whole: int, frac: int, width: int) -> str:
    if not frac:
        return str(whole)
    return f"{whole}.{frac:0{width}d}".rstrip("0")


def format_go_duration(seconds: float) -> str:
    """Render seconds the way Go's ``Duration.String`` does (``1h0m0s``, ``250ms``)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size, width in (("ms", 1_000_000, 6), ("\u00b5s", 1_000, 3), ("ns", 1, 0)):
            if ns >= size:
                whole, frac = divmod(ns, size)
                return f"{sign}{_format_fraction(whole, frac, width)}{unit}"
    hours, ns = divmod(ns, 3600 * 1_000_000_000)
    minutes, ns = divmod(ns, 60 * 1_000_000_000)
    secs, frac = divmod(ns, 1_000_000_000)
    out = _format_fraction(secs, frac, 9) + "s"
    if hours or minutes:
        out = f"{minutes}m{out}"
    if hours:
        out = f"{hours}h{out}"
    return sign + out


# ---------------------------------------------------------------------------
# config files


def load_toml_config(path: str) -> dict[str, Any]:
    """Read a TOML config file; FlagError if it is missing or malformed."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as e:
        raise FlagError(f"failed to load config file {path} - {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise FlagError(f"failed to load config file {path} - {e}") from e


def _go_text(value: object) -> str:
    """A TOML scalar as Go's ``%v`` would print it (true, 5, 0.5)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce_config_value(spec: FlagSpec, value: object) -> Any:
    """Coerce one decoded TOML value like NSQ's option resolver; ValueError if refused."""
    kind = spec.kind
    if isinstance(value, dict):
        raise ValueError("expected a value, got a table")
    if kind is Kind.STR:
        if isinstance(value, str):
            text = value
        elif isinstance(value, bool | int | float):
            text = _go_text(value)
        else:
            raise ValueError("expected a string")
        return spec.convert(text) if spec.convert is not None else text
    if kind is Kind.INT:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("expected an integer")
        if isinstance(value, str):
            # the resolver parses config strings as plain base-10 integers
            if not re.fullmatch(r"[+-]?[0-9]+", value):
                raise ValueError("parse error")
            value = int(value)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError("value out of range")
        return value
    if kind is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("expected a number")
        return parse_go_float(value) if isinstance(value, str) else float(value)
    if kind is Kind.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_go_bool(value)
        if isinstance(value, int):
            # NSQ's resolver accepts integers here but maps 0 to true (a bug); we do
            # the obvious thing instead.
            return value != 0
        raise ValueError("expected true or false")
    if kind is Kind.DURATION:
        if isinstance(value, bool):
            raise ValueError("expected a duration")
        if isinstance(value, str):
            return parse_go_duration(value)
        if isinstance(value, int):
            # NSQ's resolver reads bare integers as milliseconds
            return value / 1000.0
        raise ValueError('expected a duration string such as "1s" or integer milliseconds')
    if kind is Kind.STR_LIST:
        if isinstance(value, str):
            return value.split(",")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ValueError("expected an array of strings or a comma-separated string")
    # Kind.FLOAT_LIST
    if isinstance(value, str):
        return [parse_go_float(part.strip()) for part in value.split(",")]
    if isinstance(value, list):
        out: list[float] = []
        for item in value:
            if isinstance(item, bool):
                raise ValueError("expected numbers")
            if isinstance(item, int | float):
                out.append(float(item))
            elif isinstance(item, str):
                out.append(parse_go_float(item.strip()))
            else:
                raise ValueError("expected numbers")
        return out
    raise ValueError("expected an array of numbers or a comma-separated string")


# ---------------------------------------------------------------------------
# the flag set


class FlagSet:
    """A program's flags; parses Go-style command lines and layers a config file."""

    def __init__(
        self,
        program: str,
        specs: Iterable[FlagSpec],
        *,
        summary: str = "",
        config_flag: str | None = "config",
    ) -> None:
        """``config_flag`` names the flag holding the config path (None: no config)."""
        self.program = program
        self.summary = summary
        self.config_flag = config_flag
        self._specs: tuple[FlagSpec, ...] = tuple(specs)
        self._by_name: dict[str, FlagSpec] = {}
        self._by_config_key: dict[str, FlagSpec] = {}
        for spec in self._specs:
            if spec.name in self._by_name:
                raise ValueError(f"flag -{spec.name} defined twice")
            self._by_name[spec.name] = spec
            for key in spec.config_keys:
                if key in self._by_config_key:
                    raise ValueError(f"config key {key!r} used twice")
                self._by_config_key[key] = spec
        if config_flag is not None and config_flag not in self._by_name:
            raise ValueError(f"config flag -{config_flag} is not defined")

    @property
    def specs(self) -> tuple[FlagSpec, ...]:
        """The flags, in table order."""
        return self._specs

    def lookup(self, name: str) -> FlagSpec | None:
        """The spec for ``name`` (without dashes), or None."""
        return self._by_name.get(name)

    # -- command line --------------------------------------------------------

    def _convert(self, spec: FlagSpec, raw: str) -> Any:
        try:
            if spec.kind is Kind.BOOL:
                return parse_go_bool(raw)
            if spec.kind is Kind.STR:
                return spec.convert(raw) if spec.convert is not None else raw
            if spec.kind is Kind.INT:
                return parse_go_int(raw)
            if spec.kind is Kind.FLOAT:
                return parse_go_float(raw)
            if spec.kind is Kind.DURATION:
                try:
                    return parse_go_duration(raw)
                except ValueError:
                    # Go's flag package reports every bad duration as a parse error
                    raise ValueError("parse error") from None
            if spec.kind is Kind.STR_LIST:
                return [raw]
            return [parse_go_float(part.strip()) for part in raw.split(",")]
        except ValueError as e:
            if spec.bool_style:
                raise FlagError(
                    f"invalid boolean value {_quote(raw)} for -{spec.name}: {e}"
                ) from None
            raise FlagError(f"invalid value {_quote(raw)} for flag -{spec.name}: {e}") from None

    def parse(self, argv: Sequence[str]) -> ParsedFlags:
        """Parse ``argv`` (without the program name) with Go's ``flag`` rules.

        ``-name`` and ``--name`` are the same; a value follows ``=`` or is the next
        argument, except for bool-style flags, which only take ``=value``. Repeating a
        list flag appends; repeating any other flag keeps the last value. ``--`` ends the
        flags. Positional arguments are refused. Raises FlagError (HelpRequested for
        ``-h``/``-help``).
        """
        parsed = ParsedFlags()
        args = list(argv)
        i = 0
        bare_bool = ""  # the previous bool-style flag given without "=", for a hint
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                if i < len(args):
                    raise FlagError(self._positional_error(args[i], ""))
                break
            if len(arg) < 2 or arg[0] != "-":
                raise FlagError(self._positional_error(arg, bare_bool))
            body = arg[2:] if arg.startswith("--") else arg[1:]
            if not body or body[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            name, eq, value = body.partition("=")
            spec = self._by_name.get(name)
            if spec is None:
                if name in ("h", "help"):
                    raise HelpRequested(self.usage())
                raise FlagError(f"flag provided but not defined: -{name}")
            bare_bool = ""
            if spec.bool_style:
                raw = value if eq else "true"
                if not eq:
                    bare_bool = name
            elif eq:
                raw = value
            elif i < len(args):
                # like Go, the next argument is the value even if it starts with "-"
                raw = args[i]
                i += 1
            else:
                raise FlagError(f"flag needs an argument: -{name}")
            converted = self._convert(spec, raw)
            if spec.kind in _LIST_KINDS:
                parsed.values.setdefault(name, []).extend(converted)
            else:
                parsed.values[name] = converted
            parsed.order.append(name)
        return parsed

    def _positional_error(self, arg: str, bare_bool: str) -> str:
        msg = f"unexpected argument {_quote(arg)}: {self.program} takes only flags"
        if bare_bool:
            msg += f" (boolean flags take their value after '=', as in --{bare_bool}={arg})"
        return msg

    def wants_help(self, argv: Sequence[str]) -> bool:
        """True if parsing ``argv`` reaches ``-h``/``-help`` before any error, as in Go."""
        try:
            self.parse(argv)
        except HelpRequested:
            return True
        except FlagError:
            return False
        return False

    # -- config file and layering ----------------------------------------------

    def config_values(self, config: Mapping[str, Any], *, source: str = "config") -> dict[str, Any]:
        """Coerce a decoded config file to dest -> value.

        Unknown keys are ignored, as NSQ does, but logged as warnings. ``source`` names
        the file in messages. Raises FlagError for a value of the wrong shape.
        """
        out: dict[str, Any] = {}
        for key, value in config.items():
            spec = self._by_config_key.get(key)
            if spec is None:
                log.warning("%s: ignoring unknown config key %r", source, key)
                continue
            # with several keys for one option present, the canonical one wins
            chosen = next(k for k in spec.config_keys if k in config)
            if key != chosen:
                log.warning("%s: config key %r ignored; %r is also set", source, key, chosen)
                continue
            try:
                out[spec.dest] = _coerce_config_value(spec, value)
            except ValueError as e:
                raise FlagError(
                    f"invalid value {value!r} for config key {key!r} in {source}: {e}"
                ) from None
        return out

    def resolve(
        self,
        parsed: ParsedFlags,
        config: Mapping[str, Any] | None = None,
        *,
        source: str = "config",
    ) -> dict[str, Any]:
        """Layer flags over config values: dest -> value for options set by either.

        A flag given on the command line replaces the config value outright (lists are
        not merged), as in NSQ. Options set by neither are left out.
        """
        values = self.config_values(config or {}, source=source)
        for name, value in parsed.values.items():
            spec = self._by_name[name]
            if spec.dest:
                values[spec.dest] = list(value) if isinstance(value, list) else value
        return values

    def parse_and_resolve(self, argv: Sequence[str]) -> Resolution:
        """Parse ``argv``, load the config file it names, and layer the two."""
        parsed = self.parse(argv)
        config: dict[str, Any] = {}
        path = ""
        if self.config_flag is not None:
            path = str(parsed.get(self.config_flag, "") or "")
        if path:
            config = load_toml_config(path)
        values = self.resolve(parsed, config, source=path or "config")
        return Resolution(parsed=parsed, values=values, config=config, config_path=path)

    # -- usage ---------------------------------------------------------------

    def defaults(self) -> dict[str, Any]:
        """dest -> table default, for flags that have a destination."""
        return {s.dest: s.default for s in self._specs if s.dest}

    def usage(self) -> str:
        """The ``--help`` text: every flag with its value type, help and default."""
        lines = [f"Usage: {self.program} [flags]"]
        if self.summary:
            lines += ["", self.summary]
        lines += [
            "",
            "Flags take Go's syntax: -name or --name, then =value or a separate value;",
            "booleans take =true/=false only. Durations look like 250ms, 1m30s, 1h.",
            "",
        ]
        for spec in self._specs:
            lines.append(f"  --{spec.name}{_usage_value(spec)}")
            text = spec.help.strip()
            if spec.kind is Kind.STR_LIST:
                text += " (repeatable)"
            elif spec.kind is Kind.FLOAT_LIST:
                text += " (repeatable or comma-separated)"
            text += f" (default: {_usage_default(spec)})"
            lines.append(f"        {text.strip()}")
        return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    """Double-quoted like Go's %q for the plain strings that appear on command lines."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _usage_value(spec: FlagSpec) -> str:
    if spec.kind is Kind.BOOL:
        return "[=true|false]"
    if spec.bool_style:
        return f"[={spec.metavar or 'value'}]"
    return f"=<{spec.metavar or spec.kind.value}>"


def _usage_default(spec: FlagSpec) -> str:
    if spec.default_text is not None:
        return spec.default_text
    default = spec.default
    if default is None or (isinstance(default, list | tuple) and not default):
        return "none"
    if spec.kind is Kind.BOOL:
        return "true" if default else "false"
    if spec.kind is Kind.DURATION and isinstance(default, int | float):
        return format_go_duration(float(default))
    if isinstance(default, str):
        return _quote(default)
    if isinstance(default, list | tuple):
        return ",".join(str(v) for v in default)
    return str(default)
