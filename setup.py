"""Build nsqx with its hot path compiled by mypyc when it can be (docs/install.md).

NSQX_COMPILE chooses the build:

- unset or ``auto``: compile the modules listed in src/nsqx/compiled.py with mypyc when mypy
  (a build requirement), a C compiler and Python's headers are at hand; otherwise, or when
  the compile fails, print one warning line and build the pure-Python package;
- ``0``: the pure-Python package, no compiler used;
- ``1``: compile, or fail the build.

The compiled modules are the same .py sources (the wheel carries both; Python loads the
extension first). Editable installs (``pip install -e``) are always pure Python: a
compiled module in src/ would shadow the .py being edited. Everything else (metadata,
dependencies) is in pyproject.toml.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE / "src" / "nsqx"


def _module_list() -> tuple[str, ...]:
    # read from the package itself (one list), without importing nsqx (its dependencies
    # are not in the build environment)
    spec = importlib.util.spec_from_file_location("_nsqx_compiled", PACKAGE_DIR / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.COMPILED_MODULES)


def _mode() -> str:
    value = os.environ.get("NSQX_COMPILE", "auto").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("0", "false", "no", "off"):
        return "0"
    if value in ("1", "true", "yes", "on"):
        return "1"
    raise SystemExit(f"NSQX_COMPILE={value!r}: expected 0 (pure Python), 1 (compile) or auto")


def _missing_toolchain() -> str | None:
    """Why mypyc cannot build here, found before spending a minute on it (None: it can)."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc (part of mypy) is not in the build environment"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC")
    if cc:  # on Windows there is no CC: setuptools finds MSVC, or the compile fails below
        exe = shlex.split(cc)[0]
        if shutil.which(exe) is None:
            return f"no C compiler ({exe} not found)"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"no Python headers ({include}/Python.h: install python3-dev or similar)"
    return None


def _warn(reason: str) -> None:
    # pip shows a build's output with -v only; `nsqx nsqd --version` tells what runs
    print(f"WARNING: nsqx: building pure Python, not compiled: {reason}", file=sys.stderr)


class BuildExt(build_ext):
    """Compiles the hot path with mypyc, or leaves the pure-Python package as it is."""

    def finalize_options(self) -> None:
        self.nsqx_reason = ""
        self.distribution.ext_modules = self._mypyc_extensions()
        super().finalize_options()

    def _mypyc_extensions(self) -> list[Extension]:
        mode = _mode()
        if self.editable_mode or self.inplace:
            if mode == "1":
                raise SystemExit("NSQX_COMPILE=1: an editable install is never compiled")
            return []
        if mode == "0":
            self.nsqx_reason = "NSQX_COMPILE=0"
            return []
        missing = _missing_toolchain()
        if missing is None:
            try:
                return self._mypycify()
            except Exception as err:  # mypyc's type check or code generation
                missing = f"mypyc failed: {type(err).__name__}: {err}".strip().rstrip(":")
        if mode == "1":
            raise SystemExit(f"NSQX_COMPILE=1 but nsqx cannot be compiled: {missing}")
        _warn(missing)
        self.nsqx_reason = missing
        return []

    def _mypycify(self) -> list[Extension]:
        from mypyc.build import mypycify

        paths = [str(Path("src", *name.split(".")).with_suffix(".py")) for name in _module_list()]
        # No config file: the project's strict settings are for `make typecheck` with every
        # dependency installed; the build environment has none of them (their types are Any
        # here) and only needs the types to generate code.
        options = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
        extensions: list[Extension] = mypycify(
            [*options, *paths], opt_level="3", group_name="nsqx.hotpath"
        )
        return extensions

    def run(self) -> None:
        # build/ is reused between builds: never ship a module an earlier build compiled
        self._remove_stale_extensions()
        compiled = bool(self.extensions)
        if compiled:
            try:
                super().run()
            except Exception as err:  # no working compiler or linker after all
                if _mode() == "1":
                    raise
                reason = f"the C build failed: {type(err).__name__}: {err}"
                _warn(reason)
                self.nsqx_reason = reason
                compiled = False
                self.extensions = []
                self._remove_stale_extensions()
        if not (self.editable_mode or self.inplace):
            self._write_build_info(compiled)
        # a wheel with nothing compiled is pure Python: tag it py3-none-any
        wheel: Any = self.distribution.command_obj.get("bdist_wheel")
        if wheel is not None:
            wheel.root_is_pure = not compiled

    def _remove_stale_extensions(self) -> None:
        if self.editable_mode or self.inplace:
            return
        keep = {Path(self.get_ext_fullpath(ext.name)).resolve() for ext in self.extensions}
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            for path in Path(self.build_lib, "nsqx").rglob(f"*{suffix}"):
                if path.resolve() not in keep:
                    path.unlink()

    def _write_build_info(self, compiled: bool) -> None:
        target = Path(self.build_lib, "nsqx", "build-info.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"compiled": compiled, "reason": self.nsqx_reason}) + "\n")


# A placeholder so that setuptools runs build_ext (and tags the wheel per platform);
# BuildExt.finalize_options replaces it with mypyc's extensions, or with none.
setup(
    ext_modules=[Extension("nsqx.hotpath__mypyc", sources=[])],
    cmdclass={"build_ext": BuildExt},
)
