"""nsqx.admin: the web admin (``nsqx nsqadmin``), NSQ's nsqadmin for nsqx and NSQ 1.3.

A page of the cluster (nodes, topics, channels, clients, partitions, latency, live
rates and recent history) and its JSON API under ``/api``, served by aiohttp. It is a
client of the cluster: everything comes from nsqlookupd's and nsqd's HTTP APIs.

    from nsqx.admin import AdminOptions, NSQAdmin

    admin = NSQAdmin(AdminOptions(nsqlookupd_http_addresses=["127.0.0.1:4161"]))
    await admin.start()
    ...
    await admin.close()

See docs/admin.md.
"""

from nsqx.admin.nsqadmin import NSQAdmin
from nsqx.admin.options import AdminOptions
from nsqx.clusterinfo.info import ClusterInfo, Partial, Producer, UpstreamError

__all__ = ["AdminOptions", "ClusterInfo", "NSQAdmin", "Partial", "Producer", "UpstreamError"]
