"""Message storage: a log per topic partition; channels are cursors over it.

No networking here. :class:`MessageLog` is the interface nsqd delivers from;
:class:`MemoryLog` keeps records in memory (``#ephemeral`` topics, and every topic until
the durable log lands).
"""

from nsqx.store.log import MessageLog
from nsqx.store.memlog import MemoryLog

__all__ = ["MemoryLog", "MessageLog"]
