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
# the commands of pip's metadata steps (each its own process): they need no decision
METADATA_COMMANDS = {"egg_info", "dist_info", "sdist"}
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


class _Decision:
    """What this build does, decided once: setuptools finalizes build_ext more than once."""

    extensions: list[Extension] | None = None
    reason = ""  # why not compiled ("" when compiled, or an editable install)

    @classmethod
    def fall_back(cls, reason: str) -> None:
        if _mode() == "1":
            raise SystemExit(f"NSQX_COMPILE=1 but nsqx cannot be compiled: {reason}")
        _warn(reason)
        cls.extensions, cls.reason = [], reason


class BuildExt(build_ext):
    """Compiles the hot path with mypyc, or leaves the pure-Python package as it is."""

    def finalize_options(self) -> None:
        if self.editable_mode or self.inplace:
            if _mode() == "1":
                raise SystemExit("NSQX_COMPILE=1: an editable install is never compiled")
            self.distribution.ext_modules = []
        elif set(self.distribution.commands) <= METADATA_COMMANDS:
            self.distribution.ext_modules = []  # egg_info lists sources: no need to compile
        else:
            if _Decision.extensions is None:
                self._decide()
            self.distribution.ext_modules = list(_Decision.extensions or [])
        super().finalize_options()

    def _decide(self) -> None:
        if _mode() == "0":
            _Decision.extensions, _Decision.reason = [], "NSQX_COMPILE=0"
            return
        missing = _missing_toolchain()
        if missing is None:
            try:
                _Decision.extensions = self._mypycify()
                return
            except Exception as err:  # mypyc's type check or code generation
                missing = f"mypyc failed: {type(err).__name__}: {err}".strip().rstrip(":")
        _Decision.fall_back(missing)

    def _mypycify(self) -> list[Extension]:
        from mypyc.build import mypycify

        paths = [str(Path("src", *name.split(".")).with_suffix(".py")) for name in _module_list()]
        # No config file: the project's strict settings are for `make typecheck` with every
        # dependency installed; the build environment has none of them (their types are Any
        # here) and only needs the types to generate code.
        options = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]
        extensions: list[Extension] = mypycify(
            # the shared library beside the package: inside it, mypyc gets the __file__
            # of some modules wrong (site-packages/nsqx/nsqx/...)
            [*options, *paths],
            opt_level="3",
            group_name="nsqx",
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
                name = type(err).__name__
                _Decision.fall_back(f"the C build failed ({name}; pip -v shows the compiler)")
                compiled = False
                self.extensions = self.distribution.ext_modules = []
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
        build_lib = Path(self.build_lib)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            found = [*build_lib.glob(f"nsqx__mypyc{suffix}"), *build_lib.glob(f"nsqx/**/*{suffix}")]
            for path in found:
                if path.resolve() not in keep:
                    path.unlink()

    def _write_build_info(self, compiled: bool) -> None:
        target = Path(self.build_lib, "nsqx", "build-info.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"compiled": compiled, "reason": _Decision.reason}) + "\n")


# A placeholder so that setuptools runs build_ext (and tags the wheel per platform);
# BuildExt.finalize_options replaces it with mypyc's extensions, or with none.
setup(
    ext_modules=[Extension("nsqx__mypyc", sources=[])],
    cmdclass={"build_ext": BuildExt},
)
