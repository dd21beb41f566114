"""Stream codecs for snappy and deflate: the place where compression plugs into a connection.

A connection that negotiated compression passes every read through ``decompress`` and
every write through ``compress`` (which must flush: each write is a unit nsqd can
decode at once). The codecs themselves belong in ``nsqx.wire.compression`` (sans-IO,
shared with nsqd); this module only finds them. :func:`register_codec` installs another
implementation under a name (tests use it to exercise the plumbing).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from nsqx.client.errors import CodecUnavailableError


class StreamCodec(Protocol):
    """A compressed stream in both directions (one object per connection)."""

    def compress(self, data: bytes) -> bytes:
        """Compress and flush ``data``: the result can be decoded without what follows."""
        ...

    def decompress(self, data: bytes) -> bytes:
        """Decompress a chunk of the incoming stream (partial input is kept)."""
        ...


#: ``factory(level)`` -> a new codec; level is only meaningful for deflate.
CodecFactory = Callable[[int], StreamCodec]

_registered: dict[str, CodecFactory] = {}


def register_codec(name: str, factory: CodecFactory | None) -> None:
    """Use ``factory`` for ``name`` ("snappy" or "deflate"); ``None`` removes it."""
    if factory is None:
        _registered.pop(name, None)
    else:
        _registered[name] = factory


class _Pair:
    """A compressor and a decompressor (nsqx.wire.compression's shape) as one codec."""

    def __init__(self, compressor: Any, decompressor: Any) -> None:
        self.compress: Callable[[bytes], bytes] = compressor.compress
        self.decompress: Callable[[bytes], bytes] = decompressor.decompress


def _wire_factory(name: str) -> CodecFactory | None:
    """The codec from ``nsqx.wire.compression`` (``codec_pair(snappy, deflate,
    level)`` returns ``(compressor, decompressor)``), shared with nsqd."""
    try:
        mod: Any = importlib.import_module("nsqx.wire.compression")
    except ImportError:
        return None
    pair = getattr(mod, "codec_pair", None)
    if pair is None:
        return None

    def make(level: int) -> StreamCodec:
        compressor, decompressor = pair(name == "snappy", name == "deflate", level)
        return _Pair(compressor, decompressor)

    return make


def codec_factory(name: str) -> CodecFactory:
    """The factory for ``name``, or :class:`CodecUnavailableError` saying what is missing."""
    factory = _registered.get(name) or _wire_factory(name)
    if factory is None:
        raise CodecUnavailableError(
            f"{name} compression needs a stream codec (nsqx.wire.compression), which this "
            f"build does not have yet; turn {name} off or register a codec"
        )
    return factory


def available(name: str) -> bool:
    """True when a codec for ``name`` can be made."""
    try:
        codec_factory(name)
    except CodecUnavailableError:
        return False
    return True
