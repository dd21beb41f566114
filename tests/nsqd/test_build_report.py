"""nsqd says whether its hot path runs compiled (mypyc) or as pure Python.

In `make test` this runs on the editable install (pure Python) and again in `make
compiled` on the wheel, where NSQX_EXPECT_COMPILED=1 (tests/compiled_build.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from nsqx.compiled import COMPILED_MODULES, build_description, compiled_modules

from nsqdproc import NsqdProcess

EXPECT_COMPILED = os.environ.get("NSQX_EXPECT_COMPILED") == "1"


def test_this_interpreter_runs_the_build_the_suite_expects() -> None:
    if EXPECT_COMPILED:
        assert compiled_modules() == list(COMPILED_MODULES)
        assert build_description() == (
            f"compiled with mypyc, {len(COMPILED_MODULES)} of {len(COMPILED_MODULES)} "
            "hot-path modules"
        )
        import nsqx.wire.frames

        assert not nsqx.wire.frames.__file__.endswith(".py")
    else:
        assert compiled_modules() == []
        assert build_description().startswith("pure Python")


def test_version_first_log_line_and_info_name_the_build(nsqd_factory: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nsqx", "nsqd", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    v = sys.version_info
    assert done.stdout.strip() == (
        f"nsqd v1.3.0-nsqx (built w/python{v.major}.{v.minor}.{v.micro}; {build_description()})"
    )
    nsqd: NsqdProcess = nsqd_factory("--http-address=127.0.0.1:0")  # type: ignore[operator]
    assert done.stdout.strip() in nsqd.log[0]
    url = f"http://127.0.0.1:{nsqd.http_port}/info"
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert json.loads(resp.read())["build"] == build_description()
