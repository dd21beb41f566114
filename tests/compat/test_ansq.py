"""ansq 0.3.0 (asyncio) against our nsqd: PUB/MPUB/DPUB, consume + FIN, REQ, TOUCH.

The driver (clients/ansq_driver.py) uses create_writer and create_reader in a subprocess
(ansq's reader stays at RDY 1 unless told otherwise: the driver sets RDY 8 itself).
"""

from __future__ import annotations

CLIENT = "ansq"


def test_publish_and_consume(nsqd, compat):
    """Writer.pub/mpub/dpub are each answered OK; a Reader at RDY 8 receives every body
    exactly once, byte for byte, and FINs it."""
    compat.check_pubsub(compat.run(CLIENT, nsqd, "pubsub"))


def test_requeue(nsqd, compat):
    """NSQMessage.req(timeout=0 and 100 ms): redelivered with attempts 2, then FINed."""
    compat.check_requeue(compat.run(CLIENT, nsqd, "requeue"))


def test_touch_keeps_message(nsqd, compat):
    """ConnectionFeatures(msg_timeout=1000) is accepted in IDENTIFY; NSQMessage.touch()
    keeps a message held 2.5 s from being redelivered while an untouched one times out."""
    compat.check_touch(compat.run(CLIENT, nsqd, "touch"), negotiated=True)
