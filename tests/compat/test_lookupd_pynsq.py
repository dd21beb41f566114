"""pynsq 0.9.1's lookupd-based Reader against two of our nsqd through our nsqlookupd.

The Reader is given only nsqlookupd's HTTP address (clients/pynsq_lookupd_driver.py): it
must read /lookup (sending Accept: application/vnd.nsq; version=1.0), connect to both
nsqd at their broadcast address and TCP port, and consume every message once.
"""

from __future__ import annotations

CLIENT = "pynsq"


def test_reader_discovers_both_nsqd(lookupd_cluster, compat):
    s = lookupd_cluster.run(compat, CLIENT)
    compat.fail_unless(s["received"] == s["expected"] == 20, "delivery count", s)
    compat.fail_unless(not s["missing"] and not s["duplicates"], "each message once", s)
    compat.fail_unless(s["attempts"] == [1], f"attempts seen: {s['attempts']}", s)
    want = sorted(f"127.0.0.1:{n.tcp_port}" for n in lookupd_cluster.nsqds)
    compat.fail_unless(s["nsqd_connections"] == want, "connected to both nsqd", s)
    compat.fail_unless(s["errors"] == [], f"errors seen by the client: {s['errors']}", s)
