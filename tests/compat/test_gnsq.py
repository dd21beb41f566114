"""gnsq 1.0.2 (gevent) against our nsqd: PUB/MPUB/DPUB, consume + FIN, REQ, TOUCH.

The driver (clients/gnsq_driver.py) uses gnsq.Producer and gnsq.Consumer in a subprocess.
"""

from __future__ import annotations

CLIENT = "gnsq"


def test_publish_and_consume(nsqd, compat):
    """Producer.publish/multipublish/publish(defer=) are each answered OK; a Consumer
    (max_in_flight 8) receives every body exactly once, byte for byte, and FINs it."""
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub"))


def test_requeue(nsqd, compat):
    """Message.requeue(time_ms, backoff=False) with 0 and 100 ms: back with attempts 2."""
    compat.check_requeue(compat.run(CLIENT, nsqd, "requeue"))


def test_touch_keeps_message(nsqd_factory, compat):
    """Message.touch() keeps a message held 2.5 s from being redelivered while an
    untouched one times out. gnsq cannot send msg_timeout in IDENTIFY, so the server's
    own --msg-timeout is set to 1 s."""
    nsqd = nsqd_factory("--msg-timeout=1s")
    compat.check_touch(compat.run(CLIENT, nsqd, "touch"), negotiated=False)


def test_tls(nsqd_factory, certs, compat):
    """Producer and Consumer over TLS (gnsq pins TLS 1.2), the certificate verified."""
    nsqd = nsqd_factory(*certs.nsqd_flags())
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub", ("--tls-ca", certs.ca_file)))
    compat.check_upgraded(nsqd, "TLS")


def test_deflate(nsqd, compat):
    """Producer and Consumer with deflate compression."""
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub", ("--compression", "deflate")))
    compat.check_upgraded(nsqd, "deflate")
