from __future__ import annotations

import pytest

from nsqx.wire import is_ephemeral, is_valid_name


@pytest.mark.parametrize(
    "name",
    ["a", "test", "a.b-c_d", "x" * 64, "t#ephemeral", "x" * 54 + "#ephemeral", "0.1"],
)
def test_valid(name: str) -> None:
    assert is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 65,
        "a b",
        "a/b",
        "#ephemeral",
        "a#ephemeralx",
        "a#b",
        "é",
        "a\n",
        "x" * 55 + "#ephemeral",
    ],
)
def test_invalid(name: str) -> None:
    assert not is_valid_name(name)


def test_ephemeral() -> None:
    assert is_ephemeral("a#ephemeral")
    assert not is_ephemeral("a")
