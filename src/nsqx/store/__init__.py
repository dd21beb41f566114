"""Message storage: a log per topic partition; channels are cursors over it.

No networking here. :class:`MessageLog` is the one interface nsqd delivers from and
writes to; :func:`open_log` gives a partition its log: a :class:`MemoryLog`
(``#ephemeral`` topics) or a DiskLog (segment files, everything else).
"""

from nsqx.store.disklog import DiskLog
from nsqx.store.log import MessageLog, SetAside
from nsqx.store.memlog import MemoryLog

__all__ = ["MemoryLog", "MessageLog", "SetAside", "open_log"]


def open_log(
    directory: str | None,
    *,
    max_bytes_per_file: int = 100 * 1024 * 1024,
    cache_size: int = 10000,
    skip_lost: bool = True,
) -> MessageLog:
    """A partition's log: in ``directory`` (opened, recovered, or made), or in memory
    if it is None. ``cache_size`` bounds a DiskLog's records kept in memory.
    ``skip_lost``: a single node's log skips the sequences that damage set aside at
    its end may have held (no id is ever given twice); a replica's log (False) ends at
    its last whole record instead, for its leader to ship what follows (see
    :class:`~nsqx.store.disklog.DiskLog`)."""
    if directory is None:
        return MemoryLog()
    return DiskLog(
        directory,
        max_bytes_per_file=max_bytes_per_file,
        cache_size=cache_size,
        skip_lost=skip_lost,
    )
