"""The checker's storage verdicts on made-up records (no cluster): reused ids, deferred
messages delivered early, positions moved back, a loss window, a damaged batch, writes
that never resumed."""

from __future__ import annotations

from chaos.checker import EARLY_SLACK, POSITION_WINDOW, judge
from chaos.workload import Attempt, Delivery, Records, Sent

FAULT = 1000.0


def sent(rec: Records, body: bytes, at: float, defer_ms: int = 0, topic: str = "plain") -> Sent:
    s = Sent(body, topic, 0, defer_ms=defer_ms)
    s.attempts.append(Attempt(at, at + 0.01, "n1", "ack"))
    rec.sent[body] = s
    return s


def deliver(
    rec: Records, body: bytes, at: float, mid: bytes, node: str = "n1", fin: bool = True
) -> None:
    rec.delivered.append(Delivery(at, "plain", 0, node, body, 1, mid, fin))


def verdict(rec: Records, **kw: object):  # type: ignore[no-untyped-def]
    return judge("t", rec, {}, {}, FAULT, set(), stopped_at=FAULT + 20, **kw)  # type: ignore[arg-type]


def test_a_clean_run_is_ok() -> None:
    rec = Records()
    for i in range(3):
        sent(rec, b"b%d" % i, FAULT + i)
        deliver(rec, b"b%d" % i, FAULT + i + 0.1, b"id%d" % i)
    sent(rec, b"late", FAULT + 19)
    deliver(rec, b"late", FAULT + 19.5, b"idL")
    v = verdict(rec, strict=("schedule", "positions", "resumed"))
    assert v.ok and v.reused_ids == v.early == v.moved_back == v.lost == 0


def test_an_id_given_to_two_bodies() -> None:
    rec = Records()
    sent(rec, b"a", FAULT - 5)
    sent(rec, b"b", FAULT + 5)
    deliver(rec, b"a", FAULT - 4, b"id1")
    deliver(rec, b"b", FAULT + 6, b"id1")
    deliver(rec, b"b", FAULT + 7, b"id1")
    v = verdict(rec)
    assert v.reused_ids == 1 and not v.ok


def test_a_deferred_message_delivered_early() -> None:
    rec = Records()
    sent(rec, b"d1", FAULT, defer_ms=5000)
    deliver(rec, b"d1", FAULT + 5 - EARLY_SLACK / 2, b"i1")  # within the slack
    sent(rec, b"d2", FAULT, defer_ms=5000)
    deliver(rec, b"d2", FAULT + 1, b"i2")  # 4 s early
    assert verdict(rec).early == 1
    assert verdict(rec).ok  # counted, not judged, unless the run checks schedules
    assert not verdict(rec, strict=("schedule",)).ok


def test_a_requeued_message_delivered_early() -> None:
    rec = Records()
    sent(rec, b"r", FAULT - 10)
    deliver(rec, b"r", FAULT - 5, b"i1", fin=False)  # REQ 3 s, and a fault meanwhile
    rec.requeued[("plain", b"i1", b"r")] = (FAULT - 5, 3.0)
    deliver(rec, b"r", FAULT - 4, b"i1", node="n2")  # 2 s early
    v = verdict(rec, strict=("schedule", "positions"))
    assert v.early == 1 and v.moved_back == 0 and v.lost == 0 and not v.ok


def test_a_second_copy_of_a_requeued_body_is_not_early() -> None:
    """A body published twice (a retried publish whose first attempt was stored) is two
    messages: the second copy may come while the first waits out its REQ."""
    rec = Records()
    sent(rec, b"r", FAULT - 10)
    deliver(rec, b"r", FAULT - 5, b"i1", fin=False)
    rec.requeued[("plain", b"i1", b"r")] = (FAULT - 5, 3.0)
    deliver(rec, b"r", FAULT - 4.9, b"i2")
    deliver(rec, b"r", FAULT - 2, b"i1")
    assert verdict(rec, strict=("schedule",)).ok


def test_a_requeued_message_that_never_comes_back_is_lost() -> None:
    rec = Records()
    sent(rec, b"r", FAULT - 10)
    deliver(rec, b"r", FAULT - 5, b"i1", fin=False)
    rec.requeued[("plain", b"i1", b"r")] = (FAULT - 5, 3.0)
    assert verdict(rec).lost == 1


def test_a_position_moved_back() -> None:
    rec = Records()
    sent(rec, b"old", FAULT - 10)
    deliver(rec, b"old", FAULT - POSITION_WINDOW - 1, b"i1")
    deliver(rec, b"old", FAULT + 2, b"i1", node="n2")  # finished long before: back
    sent(rec, b"recent", FAULT - 1)
    deliver(rec, b"recent", FAULT - 0.5, b"i2")
    deliver(rec, b"recent", FAULT + 2, b"i2", node="n2")  # within the window: allowed
    v = verdict(rec, strict=("positions",))
    assert v.moved_back == 1 and not v.ok
    assert any("plain:0 from n1 then n2" in d for d in v.details)


def test_a_loss_window_and_a_damaged_batch() -> None:
    rec = Records()
    sent(rec, b"in-window", FAULT - 1)
    assert verdict(rec, loss_window=2.5).ok
    sent(rec, b"before-window", FAULT - 10)
    v = verdict(rec, loss_window=2.5)
    assert v.lost == 2 and v.lost_outside_window == 1 and not v.ok
    assert verdict(rec, max_lost=2).ok
    assert not verdict(rec, max_lost=1).ok


def test_writes_that_never_resumed() -> None:
    rec = Records()
    sent(rec, b"a", FAULT + 1)
    deliver(rec, b"a", FAULT + 2, b"i")
    v = verdict(rec, strict=("resumed",))
    assert not v.writes_resumed and not v.ok
    assert verdict(rec).ok  # only judged where the run checks it
