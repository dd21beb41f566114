"""The auth rules, sans-IO (nsqx.wire.auth): what a grant permits over TCP and HTTP, the
``--http-auth`` values, Bearer headers and the answer cache. No event loop, no socket."""

from __future__ import annotations

import json
import re

import pytest

from nsqx.wire.auth import (
    ADMIN,
    PUBLISH,
    READ,
    AuthCache,
    AuthError,
    AuthState,
    Need,
    bearer_secret,
    cache_key,
    parse_auth_response,
    parse_http_auth,
)


def state(*grants: dict[str, object], ttl: int = 60, now: float = 0.0) -> AuthState:
    return parse_auth_response(json.dumps({"ttl": ttl, "authorizations": list(grants)}), now)


ORDERS_ADMIN = {"topic": "^orders$", "channels": [".*"], "permissions": ["admin"]}
AUDIT_READER = {"topic": "^orders$", "channels": ["^audit$"], "permissions": ["subscribe"]}
ORDERS_PUBLISHER = {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}
EVERYTHING = {"topic": ".*", "channels": [".*"], "permissions": ["admin"]}


def test_admin_is_a_permission_that_grants_nothing_over_tcp() -> None:
    st = state(ORDERS_ADMIN)
    assert not st.allows("orders", "")  # PUB
    assert not st.allows("orders", "audit")  # SUB
    assert st.permits("admin", "orders", "audit")
    with pytest.raises(AuthError, match="unknown permission manage"):
        state({"topic": ".*", "channels": [".*"], "permissions": ["manage"]})


@pytest.mark.parametrize(
    ("need", "publisher", "audit_reader", "orders_admin", "everything"),
    [
        (Need(PUBLISH, "orders"), True, False, False, False),
        (Need(PUBLISH, "payments"), False, False, False, False),
        # a read needs subscribe or admin on what it reads
        (Need(READ, "orders", "audit"), False, True, True, True),
        # a whole topic: its channel patterns must match "" (^audit$ does not)
        (Need(READ, "orders"), False, False, True, True),
        # the whole node: the topic pattern must match "" too
        (Need(READ), False, False, False, True),
        (Need(ADMIN, "orders", "audit"), False, False, True, True),
        (Need(ADMIN, "orders"), False, False, True, True),
        (Need(ADMIN, "payments"), False, False, False, True),
        (Need(ADMIN), False, False, False, True),
    ],
)
def test_what_each_need_asks_for(
    need: Need, publisher: bool, audit_reader: bool, orders_admin: bool, everything: bool
) -> None:
    got = [
        need.granted_by(state(g))
        for g in (ORDERS_PUBLISHER, AUDIT_READER, ORDERS_ADMIN, EVERYTHING)
    ]
    assert got == [publisher, audit_reader, orders_admin, everything]
    assert not need.granted_by(state())  # no authorizations: nothing


def test_publish_does_not_come_with_admin() -> None:
    # permissions are independent, as NSQ's subscribe and publish are
    assert not Need(PUBLISH, "orders").granted_by(state(EVERYTHING))


@pytest.mark.parametrize(
    ("value", "classes"),
    [
        ("off", set()),
        ("", set()),
        ("all", {PUBLISH, READ, ADMIN}),
        ("ALL", {PUBLISH, READ, ADMIN}),
        ("publish", {PUBLISH}),
        ("publish, admin", {PUBLISH, ADMIN}),
        ("read,admin", {READ, ADMIN}),
    ],
)
def test_http_auth_values(value: str, classes: set[str]) -> None:
    assert parse_http_auth(value) == classes


@pytest.mark.parametrize("value", ["on", "true", "publish,", "publish;admin", "write", "all,read"])
def test_bad_http_auth_values_name_the_flag(value: str) -> None:
    with pytest.raises(ValueError, match="--http-auth"):
        parse_http_auth(value)


def test_a_daemon_may_allow_fewer_classes() -> None:
    assert parse_http_auth("all", (READ, ADMIN)) == {READ, ADMIN}
    with pytest.raises(ValueError, match=re.escape("'publish' is not one of off|all|read|admin")):
        parse_http_auth("publish", (READ, ADMIN))


@pytest.mark.parametrize(
    ("header", "secret"),
    [
        ("Bearer s3cret", b"s3cret"),
        ("bearer s3cret", b"s3cret"),
        ("Bearer   s3cret  ", b"s3cret"),
        ("Bearer a.b-c_d~e+f/g==", b"a.b-c_d~e+f/g=="),
        ("Basic dXNlcjpwYXNz", None),
        ("Token s3cret", None),
    ],
)
def test_bearer_headers(header: str, secret: bytes | None) -> None:
    assert bearer_secret(header) == secret


@pytest.mark.parametrize(
    "header", ["Bearer", "Bearer ", "Bearer a b", "Bearer caf\xe9", "Bearer a\x00"]
)
def test_bad_bearer_headers(header: str) -> None:
    with pytest.raises(ValueError):
        bearer_secret(header)


def test_cache_keeps_an_answer_for_its_ttl_only() -> None:
    cache = AuthCache()
    key = cache_key(b"s3cret", "10.0.0.1", False, "")
    cache.put(key, state(EVERYTHING, ttl=30), 100.0)
    assert cache.get(key, 129.9) is not None
    assert cache.get(key, 130.0) is None
    assert len(cache) == 0  # the expired answer is dropped
    # what else the auth server was told is part of the key
    cache.put(key, state(EVERYTHING, ttl=30), 100.0)
    assert cache.get(cache_key(b"s3cret", "10.0.0.2", False, ""), 101) is None
    assert cache.get(cache_key(b"s3cret", "10.0.0.1", True, ""), 101) is None
    assert cache.get(cache_key(b"other", "10.0.0.1", False, ""), 101) is None
    assert b"s3cret" not in repr(key).encode()


def test_cache_is_bounded_least_recently_used_first() -> None:
    cache = AuthCache(max_entries=3)
    keys = [cache_key(str(i).encode(), "ip", False, "") for i in range(4)]
    for k in keys[:3]:
        cache.put(k, state(EVERYTHING), 0)
    assert cache.get(keys[0], 1) is not None  # 0 is now the most recent
    cache.put(keys[3], state(EVERYTHING), 0)
    assert len(cache) == 3
    assert cache.get(keys[1], 1) is None
    assert all(cache.get(k, 1) is not None for k in (keys[0], keys[2], keys[3]))
