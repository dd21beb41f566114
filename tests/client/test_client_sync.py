"""The blocking facade, from plain threads, against a real `nsqx nsqd` process."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nsqx.client import BlockingConsumer, BlockingProducer, MessageRespondedError, PublishError

from nsqdproc import NsqdProcess


def address(nsqd: NsqdProcess) -> str:
    return f"127.0.0.1:{nsqd.tcp_port}"


def test_publish_from_threads_and_consume_blocking(nsqd: NsqdProcess) -> None:
    with BlockingProducer(address(nsqd)) as producer:

        def worker(k: int) -> None:
            for i in range(25):
                producer.publish("t", f"{k}-{i}".encode())

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.multi_publish("t", [b"m1", b"m2"])
        producer.deferred_publish("t", b"d", 0.01)
        with pytest.raises(ValueError):
            producer.publish("t", b"")

    seen: list[bytes] = []
    with BlockingConsumer("t", "c", nsqd_tcp_addresses=address(nsqd), max_in_flight=10) as consumer:
        deadline = time.monotonic() + 20
        while len(seen) < 103 and time.monotonic() < deadline:
            msg = consumer.get(timeout=1)
            if msg is None:
                continue
            seen.append(msg.body)
            # answered from another thread
            threading.Thread(target=msg.finish).start()
        assert consumer.get(timeout=0.05) is None
    assert len(seen) == 103 and len(set(seen)) == 103


def test_messages_not_taken_are_requeued_on_close(
    nsqd: NsqdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nsqx.client")
    with BlockingProducer(address(nsqd)) as producer:
        producer.multi_publish("t", [b"%d" % i for i in range(10)])
    consumer = BlockingConsumer("t", "c", nsqd_tcp_addresses=address(nsqd), max_in_flight=10)
    first = consumer.get(timeout=10)
    assert first is not None
    first.finish()
    with pytest.raises(MessageRespondedError):
        first.requeue()
    # the other messages sit in the inbox, or are still on their way: back to nsqd, and
    # the close does not wait for them (nothing left in flight to time out)
    consumer.close(timeout=5)
    assert not [r for r in caplog.records if "still in flight" in r.getMessage()]
    rest: list[bytes] = []
    with BlockingConsumer("t", "c", nsqd_tcp_addresses=address(nsqd), max_in_flight=10) as again:
        for msg in again.messages(timeout=2):
            rest.append(msg.body)
            msg.finish()
            if len(rest) == 9:
                break
    assert sorted([first.body, *rest]) == sorted(b"%d" % i for i in range(10))


def test_blocking_errors_surface(nsqd_factory: object) -> None:
    small = nsqd_factory("--max-msg-size=10")  # type: ignore[operator]
    with BlockingProducer(address(small)) as producer:
        with pytest.raises(PublishError, match="E_BAD_MESSAGE"):
            producer.publish("t", b"x" * 100)
        producer.publish("t", b"fits")
