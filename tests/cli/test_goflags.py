"""The Go-``flag``-compatible parser and the TOML config layering in nsqx.cli.goflags."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest

from nsqx.cli.goflags import (
    FlagError,
    FlagSet,
    FlagSpec,
    HelpRequested,
    Kind,
    format_go_duration,
    load_toml_config,
    parse_go_bool,
    parse_go_duration,
    parse_go_float,
    parse_go_int,
)


def _mode(text: str) -> str:
    if text not in ("fast", "slow"):
        raise ValueError("must be fast or slow")
    return text


SPECS = (
    FlagSpec("config", Kind.STR, "", "", "config file"),
    FlagSpec("version", Kind.BOOL, "", False, "print version"),
    FlagSpec("name", Kind.STR, "name", "anon", "a string"),
    FlagSpec("count", Kind.INT, "count", 3, "an int"),
    FlagSpec("ratio", Kind.FLOAT, "ratio", 0.5, "a float"),
    FlagSpec("snappy", Kind.BOOL, "snappy", True, "a bool"),
    FlagSpec("timeout", Kind.DURATION, "timeout", 60.0, "a duration"),
    FlagSpec("lookupd-tcp-address", Kind.STR_LIST, "nsqlookupd_tcp_addresses", [], "a list"),
    FlagSpec("percentile", Kind.FLOAT_LIST, "percentiles", [], "floats"),
    FlagSpec(
        "node-id", Kind.INT, "node_id", None, "id", config_key="id", config_aliases=("node_id",)
    ),
    FlagSpec("mode", Kind.STR, "mode", "fast", "a choice", convert=_mode),
    FlagSpec("tls", Kind.STR, "tls", "false", "bool-ish", bool_style=True),
)


@pytest.fixture
def fs() -> FlagSet:
    return FlagSet("prog", SPECS, summary="A test program.")


# -- syntax forms -------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-name=x"],
        ["--name=x"],
        ["-name", "x"],
        ["--name", "x"],
    ],
)
def test_every_value_syntax(fs: FlagSet, argv: list[str]) -> None:
    parsed = fs.parse(argv)
    assert parsed.get("name") == "x"
    assert parsed.is_set("name")
    assert parsed.order == ["name"]


def test_value_may_contain_equals_and_be_empty(fs: FlagSet) -> None:
    assert fs.parse(["--name=a=b"]).get("name") == "a=b"
    assert fs.parse(["--name="]).get("name") == ""
    assert fs.parse(["--name", ""]).get("name") == ""


def test_separate_value_is_taken_even_if_it_looks_like_a_flag(fs: FlagSet) -> None:
    # Go's flag package does this too
    parsed = fs.parse(["--name", "--snappy"])
    assert parsed.get("name") == "--snappy"
    assert not parsed.is_set("snappy")


def test_nothing_given_means_nothing_set(fs: FlagSet) -> None:
    parsed = fs.parse([])
    assert parsed.values == {}
    assert not parsed.is_set("name")
    assert parsed.get("name", "dflt") == "dflt"


def test_repeated_scalar_keeps_last(fs: FlagSet) -> None:
    assert fs.parse(["--count=1", "-count", "2"]).get("count") == 2


def test_repeated_string_list_appends(fs: FlagSet) -> None:
    parsed = fs.parse(
        [
            "--lookupd-tcp-address=127.0.0.1:4160",
            "-lookupd-tcp-address",
            "127.0.0.1:5160",
            "-lookupd-tcp-address=a,b",  # strings are not split on commas
        ]
    )
    assert parsed.get("lookupd-tcp-address") == ["127.0.0.1:4160", "127.0.0.1:5160", "a,b"]
    assert parsed.order == ["lookupd-tcp-address"] * 3


def test_float_list_accepts_commas_and_repeats(fs: FlagSet) -> None:
    parsed = fs.parse(["--percentile=1.0,0.99", "--percentile", "0.5", "-percentile=0.95, 0.9"])
    assert parsed.get("percentile") == [1.0, 0.99, 0.5, 0.95, 0.9]


def test_float_list_bad_element(fs: FlagSet) -> None:
    with pytest.raises(FlagError, match=r'invalid value "0.9,x" for flag -percentile: parse error'):
        fs.parse(["--percentile=0.9,x"])
    with pytest.raises(FlagError, match="parse error"):
        fs.parse(["--percentile=0.9,"])


def test_double_dash_ends_flags(fs: FlagSet) -> None:
    assert fs.parse(["--count=5", "--"]).get("count") == 5
    with pytest.raises(FlagError, match=r'unexpected argument "x": prog takes only flags'):
        fs.parse(["--count=5", "--", "x"])
    with pytest.raises(FlagError, match="unexpected argument"):
        fs.parse(["--", "--count=5"])


@pytest.mark.parametrize("arg", ["foo", "-", "1"])
def test_positional_arguments_are_refused(fs: FlagSet, arg: str) -> None:
    with pytest.raises(FlagError, match=f'unexpected argument "{arg}"'):
        fs.parse(["--count=1", arg])


def test_bool_followed_by_value_hints_at_equals(fs: FlagSet) -> None:
    with pytest.raises(FlagError, match=r"as in --snappy=false"):
        fs.parse(["--snappy", "false"])


@pytest.mark.parametrize("arg", ["---name=x", "-=x", "--=x", "---"])
def test_bad_flag_syntax(fs: FlagSet, arg: str) -> None:
    with pytest.raises(FlagError, match=f"^bad flag syntax: {arg}$"):
        fs.parse([arg])


@pytest.mark.parametrize("arg", ["-foo", "--foo", "--foo=1", "-foo=bar"])
def test_unknown_flag_uses_gos_wording(fs: FlagSet, arg: str) -> None:
    with pytest.raises(FlagError, match=r"^flag provided but not defined: -foo$"):
        fs.parse([arg])


def test_flag_names_are_case_sensitive(fs: FlagSet) -> None:
    with pytest.raises(FlagError, match="not defined: -Name"):
        fs.parse(["--Name=x"])


@pytest.mark.parametrize("argv", [["--name"], ["-count"], ["--snappy", "-timeout"]])
def test_missing_value(fs: FlagSet, argv: list[str]) -> None:
    name = argv[-1].lstrip("-")
    with pytest.raises(FlagError, match=f"^flag needs an argument: -{name}$"):
        fs.parse(argv)


# -- booleans -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--snappy"], True),
        (["-snappy"], True),
        (["--snappy=true"], True),
        (["--snappy=false"], False),
        (["-snappy=false"], False),
        (["--snappy=1"], True),
        (["--snappy=0"], False),
        (["--snappy=t"], True),
        (["--snappy=f"], False),
        (["--snappy=T"], True),
        (["--snappy=F"], False),
        (["--snappy=TRUE"], True),
        (["--snappy=FALSE"], False),
        (["--snappy=True"], True),
        (["--snappy=False"], False),
        (["--snappy=false", "--snappy"], True),
    ],
)
def test_bool_forms(fs: FlagSet, argv: list[str], expected: bool) -> None:
    assert fs.parse(argv).get("snappy") is expected


@pytest.mark.parametrize("value", ["yes", "no", "tRUE", "", "2", "on"])
def test_bad_bool(fs: FlagSet, value: str) -> None:
    with pytest.raises(
        FlagError, match=f'^invalid boolean value "{value}" for -snappy: parse error$'
    ):
        fs.parse([f"--snappy={value}"])


def test_bool_style_string_flag(fs: FlagSet) -> None:
    assert fs.parse(["--tls"]).get("tls") == "true"
    assert fs.parse(["--tls=tcp-https"]).get("tls") == "tcp-https"
    with pytest.raises(FlagError, match="unexpected argument"):
        fs.parse(["--tls", "tcp-https"])


def test_parse_go_bool() -> None:
    assert parse_go_bool("1") is True
    assert parse_go_bool("False") is False
    with pytest.raises(ValueError):
        parse_go_bool("yes")


# -- integers and floats --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("-7", -7),
        ("+7", 7),
        ("0x10", 16),
        ("0X1f", 31),
        ("010", 8),  # Go's base-0 parsing: a leading 0 is octal
        ("0o17", 15),
        ("0b101", 5),
        ("1_000", 1000),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
    ],
)
def test_parse_go_int(text: str, expected: int) -> None:
    assert parse_go_int(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.5", " 1", "1 ", "08", "0x", "1__0", "_1", "1e3"])
def test_parse_go_int_errors(text: str) -> None:
    with pytest.raises(ValueError, match="parse error"):
        parse_go_int(text)


def test_parse_go_int_range() -> None:
    with pytest.raises(ValueError, match="value out of range"):
        parse_go_int("9223372036854775808")


def test_int_flag_errors_name_the_flag(fs: FlagSet) -> None:
    with pytest.raises(FlagError, match=r'^invalid value "abc" for flag -count: parse error$'):
        fs.parse(["--count=abc"])
    with pytest.raises(FlagError, match="value out of range"):
        fs.parse(["--count", "99999999999999999999"])
    assert fs.parse(["--count=-1"]).get("count") == -1
    assert fs.parse(["--count", "-1"]).get("count") == -1


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1.0), ("0.5", 0.5), (".5", 0.5), ("1.", 1.0), ("1e3", 1000.0), ("-2.5E-1", -0.25)],
)
def test_parse_go_float(text: str, expected: float) -> None:
    assert parse_go_float(text) == expected


def test_parse_go_float_specials() -> None:
    assert parse_go_float("0x1p-2") == 0.25
    assert parse_go_float("inf") == math.inf
    assert parse_go_float("-Infinity") == -math.inf
    assert math.isnan(parse_go_float("NaN"))
    for bad in ("", "abc", " 1", "1_0", "0x1", "1e", "+nan"):
        with pytest.raises(ValueError, match="parse error"):
            parse_go_float(bad)
    with pytest.raises(ValueError, match="value out of range"):
        parse_go_float("1e400")


def test_float_flag(fs: FlagSet) -> None:
    assert fs.parse(["--ratio=0.25"]).get("ratio") == 0.25
    with pytest.raises(FlagError, match=r'invalid value "x" for flag -ratio: parse error'):
        fs.parse(["--ratio", "x"])


# -- durations ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("-0", 0.0),
        ("0s", 0.0),
        ("1s", 1.0),
        ("250ms", 0.25),
        ("25ms", 0.025),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("15m", 900.0),
        ("10m0s", 600.0),
        ("1h0m0s", 3600.0),
        ("300us", 0.0003),
        ("300\u00b5s", 0.0003),
        ("300\u03bcs", 0.0003),
        ("1500ns", 0.0000015),
        ("-1.5s", -1.5),
        ("+2s", 2.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("1h1m1s1ms1us1ns", 3661.001001001),
    ],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration"),
        ("-", "invalid duration"),
        ("1", "missing unit"),
        ("60", "missing unit"),
        ("1.5", "missing unit"),
        ("1x", "unknown unit"),
        ("1S", "unknown unit"),
        ("1 s", "unknown unit"),
        (".s", "invalid duration"),
        ("s", "invalid duration"),
        ("1s2", "missing unit"),
        ("3000000h", "invalid duration"),  # beyond int64 nanoseconds
    ],
)
def test_parse_go_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_go_duration(text)


def test_duration_flag(fs: FlagSet) -> None:
    assert fs.parse(["--timeout=250ms"]).get("timeout") == 0.25
    assert fs.parse(["-timeout", "1m30s"]).get("timeout") == 90.0
    assert fs.parse(["--timeout=0"]).get("timeout") == 0.0
    with pytest.raises(FlagError, match=r'^invalid value "60" for flag -timeout: parse error$'):
        fs.parse(["--timeout=60"])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (1, "1s"),
        (2.5, "2.5s"),
        (60, "1m0s"),
        (90, "1m30s"),
        (900, "15m0s"),
        (3600, "1h0m0s"),
        (5400, "1h30m0s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (0.0015, "1.5ms"),
        (0.0003, "300\u00b5s"),
        (1e-9, "1ns"),
        (-1.5, "-1.5s"),
    ],
)
def test_format_go_duration(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text
    assert parse_go_duration(text) == pytest.approx(seconds)


# -- string conversion -----------------------------------------------------------


def test_convert_validates_strings(fs: FlagSet) -> None:
    assert fs.parse(["--mode=slow"]).get("mode") == "slow"
    with pytest.raises(
        FlagError, match=r'^invalid value "medium" for flag -mode: must be fast or slow$'
    ):
        fs.parse(["--mode", "medium"])


# -- help and usage ----------------------------------------------------------------


@pytest.mark.parametrize("arg", ["-h", "--h", "-help", "--help", "--help=false"])
def test_help(fs: FlagSet, arg: str) -> None:
    with pytest.raises(HelpRequested) as info:
        fs.parse(["--count=1", arg, "--bogus"])
    assert info.value.usage == fs.usage()
    assert fs.wants_help([arg])


def test_wants_help_follows_go_order(fs: FlagSet) -> None:
    assert fs.wants_help(["--help", "--bogus"])
    assert not fs.wants_help(["--bogus", "--help"])
    assert not fs.wants_help(["--count=1"])


def test_usage_lists_every_flag_with_default_and_help(fs: FlagSet) -> None:
    text = fs.usage()
    assert text.startswith("Usage: prog [flags]\n")
    assert "A test program." in text
    for spec in SPECS:
        assert f"--{spec.name}" in text
        assert spec.help in text
    assert 'a string (default: "anon")' in text
    assert "an int (default: 3)" in text
    assert "a bool (default: true)" in text
    assert "a duration (default: 1m0s)" in text
    assert "a list (repeatable) (default: none)" in text
    assert "floats (repeatable or comma-separated) (default: none)" in text
    assert "--snappy[=true|false]" in text
    assert "--count=<int>" in text


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        FlagSpec("-x", Kind.STR, "x")
    with pytest.raises(ValueError):
        FlagSpec("x", Kind.INT, "x", bool_style=True)
    with pytest.raises(ValueError):
        FlagSpec("x", Kind.INT, "x", convert=str)
    assert FlagSpec("x", Kind.BOOL, "x").bool_style
    with pytest.raises(ValueError, match="defined twice"):
        FlagSet("p", [FlagSpec("x", Kind.STR, "x"), FlagSpec("x", Kind.STR, "y")])
    with pytest.raises(ValueError, match="config key"):
        FlagSet("p", [FlagSpec("x", Kind.STR, "x"), FlagSpec("y", Kind.STR, "x")], config_flag=None)
    with pytest.raises(ValueError, match="config flag"):
        FlagSet("p", [FlagSpec("x", Kind.STR, "x")])


# -- config files -------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "prog.cfg"
    path.write_text(text)
    return str(path)


def test_config_values_coercion(fs: FlagSet) -> None:
    cfg: dict[str, Any] = {
        "name": "from-cfg",
        "count": 7,
        "ratio": 1,
        "snappy": False,
        "timeout": "1m30s",
        "nsqlookupd_tcp_addresses": ["a:1", "b:2"],
        "percentiles": [1, 0.99],
        "id": 12,
        "mode": "slow",
        "tls": True,
    }
    assert fs.config_values(cfg) == {
        "name": "from-cfg",
        "count": 7,
        "ratio": 1.0,
        "snappy": False,
        "timeout": 90.0,
        "nsqlookupd_tcp_addresses": ["a:1", "b:2"],
        "percentiles": [1.0, 0.99],
        "node_id": 12,
        "mode": "slow",
        "tls": "true",
    }


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("timeout", 1500, 1.5),  # NSQ reads integer durations as milliseconds
        ("timeout", "0", 0.0),
        ("count", "12", 12),
        ("snappy", "false", False),
        ("snappy", "T", True),
        ("snappy", 0, False),
        ("snappy", 1, True),
        ("nsqlookupd_tcp_addresses", "a:1,b:2", ["a:1", "b:2"]),
        ("percentiles", "0.99, 0.5", [0.99, 0.5]),
        ("percentiles", ["0.9"], [0.9]),
        ("name", 5, "5"),
        ("node_id", 3, 3),
    ],
)
def test_config_value_forms(fs: FlagSet, key: str, value: Any, expected: Any) -> None:
    values = fs.config_values({key: value})
    assert list(values.values()) == [expected]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timeout", "60"),
        ("timeout", 1.5),
        ("timeout", True),
        ("count", 1.5),
        ("count", "abc"),
        ("count", True),
        ("count", 2**64),
        ("snappy", "yes"),
        ("snappy", 1.0),
        ("nsqlookupd_tcp_addresses", [1, 2]),
        ("percentiles", [True]),
        ("percentiles", "x"),
        ("mode", "medium"),
        ("name", ["a"]),
        ("name", {"a": 1}),
    ],
)
def test_config_value_errors_name_the_key(fs: FlagSet, key: str, value: Any) -> None:
    with pytest.raises(FlagError, match=f"for config key '{key}' in cfg.toml"):
        fs.config_values({key: value}, source="cfg.toml")


def test_unknown_config_keys_are_ignored_with_a_warning(
    fs: FlagSet, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nsqx.cli"):
        values = fs.config_values({"count": 1, "bogus": 2, "version": True}, source="x.toml")
    assert values == {"count": 1}
    assert "x.toml: ignoring unknown config key 'bogus'" in caplog.text
    assert "'version'" in caplog.text  # control flags are not config keys


def test_canonical_config_key_beats_alias(fs: FlagSet, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="nsqx.cli"):
        assert fs.config_values({"node_id": 1, "id": 2}) == {"node_id": 2}
        assert fs.config_values({"id": 2, "node_id": 1}) == {"node_id": 2}
    assert "'node_id' ignored" in caplog.text


def test_precedence_flags_over_config_over_defaults(fs: FlagSet, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'name = "cfg"\ncount = 7\ntimeout = "2s"\nnsqlookupd_tcp_addresses = ["c:1", "c:2"]\n',
    )
    res = fs.parse_and_resolve(
        [f"--config={path}", "--count=9", "--lookupd-tcp-address=f:1", "--snappy=false"]
    )
    assert res.config_path == path
    assert res.config["name"] == "cfg"
    assert res.values == {
        "name": "cfg",  # config
        "count": 9,  # flag beats config
        "timeout": 2.0,  # config
        "nsqlookupd_tcp_addresses": ["f:1"],  # a flag replaces the config list
        "snappy": False,  # flag
    }
    # defaults are left to the options object
    assert "ratio" not in res.values
    assert fs.defaults()["ratio"] == 0.5


def test_resolve_without_config(fs: FlagSet) -> None:
    res = fs.parse_and_resolve(["--version", "--name", "n"])
    assert res.values == {"name": "n"}  # control flags have no destination
    assert res.parsed.get("version") is True
    assert res.config == {}


def test_resolved_lists_are_copies(fs: FlagSet) -> None:
    parsed = fs.parse(["--lookupd-tcp-address=a"])
    values = fs.resolve(parsed)
    values["nsqlookupd_tcp_addresses"].append("b")
    assert parsed.get("lookupd-tcp-address") == ["a"]


def test_config_file_errors(fs: FlagSet, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(FlagError, match=r"failed to load config file .*nope.toml"):
        fs.parse_and_resolve([f"--config={missing}"])
    bad = _write(tmp_path, "count = = 1\n")
    with pytest.raises(FlagError, match="failed to load config file"):
        load_toml_config(bad)
    wrong = _write(tmp_path, 'count = "many"\n')
    with pytest.raises(FlagError, match=r"for config key 'count' in .*prog.cfg"):
        fs.parse_and_resolve(["--config", wrong])
