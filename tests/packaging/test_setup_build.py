"""setup.py's choice between the compiled and the pure-Python build (docs/install.md).

The compiled build itself is tested by `make compiled` (tests/compiled_build.py); here,
what a machine without a C compiler gets. Each case builds a wheel as pip does, from a
copy of the sources (the repo's build/ directory is left to `make compiled`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("nsqx-source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    return copy


def build(source: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(source)]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**_env(), **env}, timeout=300, check=False
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("NSQX_COMPILE", "CC")}


def test_without_a_c_compiler_the_wheel_is_pure_python_and_says_why(
    source: Path, tmp_path: Path
) -> None:
    done = build(source, tmp_path, CC="/nonexistent/cc")
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("nsqx-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = json.loads(zf.read("nsqx/build-info.json"))
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert "nsqx/wire/frames.py" in names
    assert info == {"compiled": False, "reason": "no C compiler (/nonexistent/cc not found)"}
    # one warning line (pip shows it with -v)
    output = (done.stdout + done.stderr).splitlines()
    warnings = [line for line in output if "WARNING: nsqx:" in line]
    assert len(warnings) == 1 and "not compiled: no C compiler" in warnings[0]


def test_nsqx_compile_1_fails_the_build_when_it_cannot_compile(
    source: Path, tmp_path: Path
) -> None:
    done = build(source, tmp_path, CC="/nonexistent/cc", NSQX_COMPILE="1")
    assert done.returncode != 0
    assert "NSQX_COMPILE=1 but nsqx cannot be compiled: no C compiler" in done.stdout + done.stderr
    assert not list(tmp_path.glob("*.whl"))
