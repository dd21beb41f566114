"""NodeLease without clocks or sockets: grants from answered PINGs, and generations."""

from __future__ import annotations

from nsqx.nsqd.replication.lease import NodeLease


def test_no_lease_before_a_grant() -> None:
    lease = NodeLease()
    assert not lease.valid(0.0)
    assert lease.generation == 0
    assert not lease.required


def test_a_grant_runs_from_the_send_time_of_the_ping() -> None:
    lease = NodeLease()
    assert lease.grant(10.0, 0.5)  # the first grant starts generation 1
    assert lease.generation == 1
    assert lease.valid(10.49)
    assert not lease.valid(10.5)
    assert abs(lease.remaining(10.2) - 0.3) < 1e-9


def test_renewals_before_the_end_keep_the_generation() -> None:
    lease = NodeLease()
    lease.grant(10.0, 0.5)
    assert not lease.grant(10.2, 0.5)
    assert not lease.grant(10.6, 0.5)  # sent at 10.6, while the lease ran until 10.7
    assert lease.generation == 1
    assert lease.valid(11.0)


def test_a_ping_sent_after_the_lease_ended_starts_a_new_generation() -> None:
    lease = NodeLease()
    lease.grant(10.0, 0.5)
    assert lease.grant(10.5, 0.5)  # sent exactly when it ended: a gap may have been
    assert lease.generation == 2
    assert lease.grant(20.0, 0.5)
    assert lease.generation == 3


def test_late_answers_neither_shorten_the_lease_nor_start_a_generation() -> None:
    lease = NodeLease()
    lease.grant(10.0, 0.5)
    lease.grant(10.4, 0.5)  # until 10.9
    # an answer to an older PING (another nsqlookupd, slower) arrives last
    assert not lease.grant(10.1, 0.5)
    assert lease.until == 10.9
    assert lease.generation == 1
    # a late answer to a PING sent within the lease: no new generation, even if it
    # arrives after the lease ran out (nsqlookupd promised for the time it was heard)
    assert not lease.grant(10.8, 0.5)
    assert lease.generation == 1
    assert lease.valid(11.2)
