"""`make compiled`: build the wheel as ``pip install .`` does and test the compiled modules.

The wheel (mypyc, see setup.py) goes into .venv-compiled, a venv that borrows every
other package from .venv through a path entry read after its own site-packages (no
download; .venv's editable nsqx is a .pth file, which a plain path entry does not run).
Then pytest runs the given tests there with NSQX_EXPECT_COMPILED=1, so that
tests/conftest.py refuses to run them on anything but the compiled modules.

Without a C compiler (or Python's headers) setup.py builds pure Python: this prints one
line and exits 0. Any other fallback (mypyc or the C build failed) is a failure.
The wheel is rebuilt only when setup.py, pyproject.toml or a source file changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-compiled"
WHEEL_DIR = ROOT / "build" / "compiled-wheel"
STAMP = VENV / ".source-hash"
# reasons setup.py gives when this machine cannot compile at all (then: skip, not fail)
NO_TOOLCHAIN = ("no C compiler", "no Python headers")


def source_hash() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "setup.py", ROOT / "pyproject.toml", *sorted((ROOT / "src").rglob("*.py"))]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_wheel() -> tuple[Path, dict[str, object]]:
    for old in WHEEL_DIR.glob("*.whl"):
        old.unlink()
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(WHEEL_DIR), "."]
    subprocess.run(cmd, cwd=ROOT, check=True)
    (wheel,) = WHEEL_DIR.glob("nsqx-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        info: dict[str, object] = json.loads(zf.read("nsqx/build-info.json"))
    print(f"compiled: built {wheel.name} in {time.monotonic() - started:.0f} s")
    return wheel, info


def install(wheel: Path) -> None:
    """A fresh venv without pip (this pip installs into it), plus .venv's packages."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", str(VENV)], check=True
    )
    python = VENV / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "nsqx-dev-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def main(tests: list[str]) -> int:
    if os.environ.get("NSQX_COMPILE", "").strip() == "0":
        print("compiled: skipped (NSQX_COMPILE=0)")
        return 0
    digest = source_hash()
    if not (STAMP.is_file() and STAMP.read_text() == digest):
        wheel, info = build_wheel()
        if not info.get("compiled"):
            reason = str(info.get("reason"))
            if reason.startswith(NO_TOOLCHAIN):
                print(f"compiled: skipped, this machine cannot compile ({reason})")
                return 0
            print(f"compiled: the build fell back to pure Python: {reason}", file=sys.stderr)
            return 1
        install(wheel)
        STAMP.write_text(digest)
    env = dict(os.environ, NSQX_EXPECT_COMPILED="1")
    cmd = [str(VENV / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tests/wire", "tests/store", "tests/nsqd"]))
