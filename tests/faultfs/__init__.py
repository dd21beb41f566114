"""faultfs: a FUSE filesystem that forgets what was not made durable, for tests.

It mounts over a real backing directory and passes everything through, keeping what a
power cut may take back (docs/reliability.md, "A filesystem that forgets"). The model
and the operations are in ``fs.py``, the daemon in ``daemon.py``, the test's handle
(:class:`FaultFS`, :func:`unavailable`) in ``mount.py``.
"""

from faultfs.mount import FaultFS, FaultFSError, flip_bit_at_rest, unavailable

__all__ = ["FaultFS", "FaultFSError", "flip_bit_at_rest", "unavailable"]
