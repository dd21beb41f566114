"""nsqx.clusterinfo: what the web admin and the command-line tools learn about a cluster.

NSQ's ``internal/clusterinfo``, shared by nsqadmin and the tools: :mod:`.info` asks
nsqlookupd and nsqd over their HTTP APIs only (so any NSQ 1.3 server will do), and
:mod:`.aggregate` adds each node's ``/stats`` up into cluster-wide topics and channels
(pure functions). It sits beside :mod:`nsqx.admin` and :mod:`nsqx.cli`, which both use
it; neither imports the other.
"""

from nsqx.clusterinfo.info import (
    ClusterInfo,
    NodeHealth,
    Partial,
    Producer,
    UpstreamError,
    http_base,
)

__all__ = ["ClusterInfo", "NodeHealth", "Partial", "Producer", "UpstreamError", "http_base"]
