"""pynsq 0.9.1 (Tornado) against our nsqd: PUB/MPUB/DPUB, consume + FIN, REQ, TOUCH.

The driver (clients/pynsq_driver.py) uses nsq.Writer and nsq.Reader in a subprocess.
"""

from __future__ import annotations

CLIENT = "pynsq"


def test_publish_and_consume(nsqd, compat):
    """Writer.pub/mpub/dpub are each answered OK; a Reader (max_in_flight 8) receives every
    body exactly once, byte for byte, and FINs it."""
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub"))


def test_requeue(nsqd, compat):
    """Message.requeue(backoff=False) with 0 ms and 100 ms: redelivered with attempts 2."""
    compat.check_requeue(compat.run(CLIENT, nsqd, "requeue"))


def test_touch_keeps_message(nsqd, compat):
    """Reader(msg_timeout=1.0) negotiates 1000 ms in IDENTIFY; Message.touch() keeps a
    message held 2.5 s from being redelivered while an untouched one times out."""
    compat.check_touch(compat.run(CLIENT, nsqd, "touch"), negotiated=True)


def test_tls_snappy(nsqd_factory, certs, compat):
    """Writer and Reader negotiate TLS then snappy (TLS handshake, encrypted OK, then the
    snappy OK); every body arrives exactly once."""
    nsqd = nsqd_factory(*certs.nsqd_flags())
    opts = ("--tls-ca", certs.ca_file, "--compression", "snappy")
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub", opts))
    compat.check_upgraded(nsqd, "TLS", "snappy")


def test_tls_deflate(nsqd_factory, certs, compat):
    """The same over TLS then deflate."""
    nsqd = nsqd_factory(*certs.nsqd_flags())
    opts = ("--tls-ca", certs.ca_file, "--compression", "deflate")
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub", opts))
    compat.check_upgraded(nsqd, "TLS", "deflate")
