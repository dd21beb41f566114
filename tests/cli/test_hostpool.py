"""Destination choice of to-http and to-nsq (--mode), with the clock as an argument."""

from __future__ import annotations

import random

import pytest

from nsqx.cli.hostpool import HostPool
from nsqx.cli.stat import row
from nsqx.cli.toolbase import ToolError, client_config


def test_round_robin_and_all() -> None:
    rr = HostPool(["a", "b", "c"], "round-robin")
    assert [rr.pick(0)[0] for _ in range(4)] == ["a", "b", "c", "a"]
    assert HostPool(["a", "b"], "all").pick(0) == ["a", "b"]


def test_hostpool_skips_a_failed_host_until_its_retry_time() -> None:
    pool = HostPool(["a", "b"], "hostpool")
    pool.mark("a", False, now=100.0)
    assert {pool.pick(101.0)[0] for _ in range(4)} == {"b"}
    assert "a" in {pool.pick(131.0)[0] for _ in range(4)}  # 30 s later it is tried again
    pool.mark("a", False, now=131.0)
    assert {pool.pick(180.0)[0] for _ in range(4)} == {"b"}  # then 60 s
    pool.mark("b", False, now=180.0)
    assert {pool.pick(181.0)[0] for _ in range(4)} == {"a", "b"}  # all down: all again


def test_epsilon_greedy_prefers_the_fastest() -> None:
    pool = HostPool(["slow", "fast"], "epsilon-greedy", rng=random.Random(1))
    pool.mark("slow", True, 0, seconds=0.5)
    pool.mark("fast", True, 0, seconds=0.01)
    picks = [pool.pick(0)[0] for _ in range(200)]
    assert picks.count("fast") > 150


def test_bad_mode() -> None:
    with pytest.raises(ValueError, match="--mode must be one of"):
        HostPool(["a"], "fastest")


def test_consumer_opts_are_go_nsq_name_value_pairs() -> None:
    cfg = client_config(
        ["max_attempts,10", "snappy", "heartbeat_interval,10s", "user-agent,x/1"], "consumer-opt"
    )
    assert (cfg.max_attempts, cfg.snappy, cfg.heartbeat_interval, cfg.user_agent) == (
        10, True, 10.0, "x/1",
    )  # fmt: skip
    with pytest.raises(ToolError, match="unknown option 'nope'"):
        client_config(["nope,1"], "consumer-opt")
    with pytest.raises(ToolError, match="max_attempts"):
        client_config(["max_attempts,-3"], "consumer-opt")


def test_stat_rates_for_both_counting_rules() -> None:
    base = {"depth": 0, "memory_depth": 0, "backend_depth": 0, "in_flight_count": 0,
            "deferred_count": 0, "requeue_count": 0, "timeout_count": 0, "message_count": 0,
            "client_count": 1}  # fmt: skip
    new = dict(base, depth=10, memory_depth=10, message_count=30)
    # NSQ counts messages entering the channel: 30 in, 20 out (depth grew by 10)
    assert row(new, base, 2.0, delivered=False).split()[:2] == ["15", "10"]
    # nsqx counts deliveries: 30 out, and 40 came in
    assert row(new, base, 2.0, delivered=True).split()[:2] == ["20", "15"]
