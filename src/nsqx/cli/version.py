"""The line ``--version`` prints, for ``nsqx`` and each of its commands.

Go's daemons print ``nsqd v1.3.0 (built w/go1.19.8)`` and its tools ``nsq_tail v1.3.0``;
every nsqx command prints the Go program's name (nsqx's own name for the commands
without a Go counterpart), NSQ's version as nsqd reports it, and what runs it: the
Python version and whether the hot path is compiled (nsqx.compiled).
"""

from __future__ import annotations

import sys

from nsqx import NSQ_VERSION, __version__
from nsqx.compiled import build_description

__all__ = ["nsqx_version_line", "version_line"]


def version_line(app: str) -> str:
    """``<app> v1.3.0-nsqx (built w/python3.11.7; pure Python)``, in Go's shape."""
    return f"{app} v{NSQ_VERSION} ({_built()})"


def nsqx_version_line() -> str:
    """What ``nsqx --version`` prints: nsqx's release, NSQ's version, what runs it."""
    return f"nsqx {__version__} (NSQ v{NSQ_VERSION}; {_built()})"


def _built() -> str:
    v = sys.version_info
    return f"built w/python{v.major}.{v.minor}.{v.micro}; {build_description()}"
