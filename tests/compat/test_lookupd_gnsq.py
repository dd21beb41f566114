"""gnsq 1.0.2's lookupd-based Consumer against two of our nsqd through our nsqlookupd.

The Consumer is given only nsqlookupd's HTTP address (clients/gnsq_lookupd_driver.py):
gnsq's LookupdClient sends ``Accept: application/vnd.nsq version=1.0`` and parses the
body as JSON only if the Content-Type is application/json. Every message of both nsqd
(tagged by nsqd) must arrive once, so the Consumer found both through /lookup.
"""

from __future__ import annotations

CLIENT = "gnsq"


def test_consumer_discovers_both_nsqd(lookupd_cluster, compat):
    s = lookupd_cluster.run(compat, CLIENT)
    compat.fail_unless(s["received"] == s["expected"] == 20, "delivery count", s)
    compat.fail_unless(not s["missing"] and not s["duplicates"], "each message once", s)
    compat.fail_unless(s["attempts"] == [1], f"attempts seen: {s['attempts']}", s)
    compat.fail_unless(s["errors"] == [], f"errors seen by the client: {s['errors']}", s)
