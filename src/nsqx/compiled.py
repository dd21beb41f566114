"""Which of nsqx's modules run compiled (mypyc) in this installation.

A wheel built by ``pip install .`` compiles :data:`COMPILED_MODULES` with mypyc when it can
(see setup.py and docs/install.md); the same ``.py`` sources are the pure-Python fallback,
and an editable install is always pure Python. This module reports what was actually
loaded, for ``nsqx nsqd --version``, nsqd's start-up log line and ``/info``.

It imports nothing of nsqx's: setup.py reads the module list from this file.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from importlib import resources

__all__ = ["COMPILED_MODULES", "build_description", "build_reason", "compiled_modules"]

#: The single-message hot path: decoding commands and building frames, the log, and the
#: broker's per-message code. Compiled, it cut Python's CPU per single PUB from 10.2 to
#: 6.8 µs (1 connection) and 5.0 to 3.1 µs (16); see docs/benchmarks.md.
#: The store's modules are the disk log's parts (one module, split by job) and MemoryLog,
#: which is compiled because it subclasses the compiled MessageLog.
#: Left out: nsqx.wire.errors, as ProtocolError is subclassed outside it (CompressionError,
#: the client's NSQServerError), which a compiled class forbids; it costs nothing per message.
COMPILED_MODULES: tuple[str, ...] = (
    "nsqx.wire.commands",
    "nsqx.wire.frames",
    "nsqx.nsqd.guid",
    "nsqx.store.disklog",
    "nsqx.store.record",
    "nsqx.store.segment",
    "nsqx.store.walk",
    "nsqx.store.staging",
    "nsqx.store.recovery",
    "nsqx.store.fsutil",
    "nsqx.store.batchcache",
    "nsqx.store.log",
    "nsqx.store.memlog",
    "nsqx.nsqd.partition",
    "nsqx.nsqd.protocol_v2",
    "nsqx.nsqd.client_v2",
    "nsqx.nsqd.channel",
    "nsqx.nsqd.inflight",
    "nsqx.nsqd.topic",
    "nsqx.nsqd.loopturn",
)

#: Written by setup.py next to this file in a built wheel: whether it compiled, and why not.
BUILD_INFO_FILE = "build-info.json"


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED_MODULES` that load from a compiled extension here."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for name in COMPILED_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            found.append(name)
    return found


def build_reason() -> str | None:
    """Why the installed wheel is pure Python, as its build recorded it (None if unknown)."""
    try:
        text = resources.files("nsqx").joinpath(BUILD_INFO_FILE).read_text("utf-8")
        reason = json.loads(text).get("reason")
    except (OSError, ValueError, AttributeError):
        return None  # a source tree or an editable install: no build ran
    return reason if isinstance(reason, str) and reason else None


def build_description() -> str:
    """One phrase: "compiled with mypyc, 18 of 18 hot-path modules", or "pure Python" and why."""
    n = len(compiled_modules())
    if n:
        return f"compiled with mypyc, {n} of {len(COMPILED_MODULES)} hot-path modules"
    reason = build_reason()
    return f"pure Python, not compiled: {reason}" if reason else "pure Python"
