"""Members only: with --cluster-secret, the endpoints that change roles or ship a log
refuse strangers (no secret, or a wrong one), while the cluster's members, which send
it, replicate as before, here with TLS on for clients (tests/tlsnsq.py's certificates)."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

from cluster import leader_port, partition_state, start_node, until

from nsqx.wire.members import HEADER
from tlsnsq import make_certs

from lookupdproc import http_request

SECRET = "members-s3cret"


def request(
    method: str, url: str, body: bytes = b"", secret: str | None = None
) -> tuple[int, bytes]:
    headers = {HEADER: secret} if secret is not None else {}
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_strangers_are_refused_and_members_replicate_with_tls_on(
    lookupd_factory: Any, tmp_path: Path
) -> None:
    certs = make_certs(tmp_path / "certs")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    lookupd = lookupd_factory(
        f"--data-path={tmp_path / 'lookupd'}", f"--cluster-secret-file={secret_file}"
    )
    nodes = [
        start_node(
            tmp_path / f"nsqd{i}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
            f"--cluster-secret={SECRET}",
            *certs.nsqd_flags(),
            "--tls-required=tcp-https",  # clients over TLS; the HTTP API stays plain
        )
        for i in range(2)
    ]
    until(lambda: len(lookupd.json("/nodes")["producers"]) == 2, what="two nsqd")
    base = f"http://{lookupd.http_address}"
    create = f"{base}/topic/create?topic=members&partition_num=1&replicator=2"
    # a stranger cannot create a topic; a wrong secret is a stranger
    for secret in (None, "guess"):
        status, body = request("POST", create, secret=secret)
        assert status == 403 and json.loads(body) == {"message": "E_NOT_A_MEMBER"}, body
    assert lookupd.json("/topics")["topics"] == []
    # lookups stay open to everyone
    status, _, _ = http_request(f"{base}/lookup?topic=members")
    assert status == 404
    status, body = request("POST", create, secret=SECRET)
    assert status == 200, body
    port = until(lambda: leader_port(lookupd, "members"), what="a leader")
    leader = next(n for n in nodes if n.tcp_port == port)
    follower = next(n for n in nodes if n is not leader)
    state = until(
        lambda: (s := partition_state(leader, "members")) and s.get("followers") and s,
        what="the follower streaming",
    )
    # a stranger cannot demote the leader, fence it or pull the log
    demote = {**{k: state[k] for k in ("epoch", "isr", "replicas")}, "replica": 2}
    demote.update(leader="stranger", leader_http="127.0.0.1:1", epoch=state["epoch"] + 1)
    for path, body in (
        ("/partition/role?topic=members&partition=0", json.dumps(demote).encode()),
        (f"/partition/fence?topic=members&partition=0&epoch={state['epoch']}", b""),
    ):
        for secret in (None, "guess"):
            status, answer = request("POST", f"{leader.http_url}{path}", body, secret)
            assert status == 403 and json.loads(answer) == {"message": "E_NOT_A_MEMBER"}
    status, answer = request(
        "GET", f"{leader.http_url}/replication/stream?node=stranger&topic=members&partition=0"
    )
    assert status == 403, answer
    # nor move the leadership, drain a node, or speak for a node in the cluster
    for path in (
        "/topic/partition/move?topic=members&partition=0&move_leader=true",
        f"/cluster/node/drain?node={state['node']}",
        f"/cluster/node/roles?node={state['node']}",
        f"/partition/leader/unreachable?topic=members&partition=0&node=x&epoch={state['epoch']}",
    ):
        status, _ = request("POST", f"{base}{path}")
        assert status == 403, path
    after = partition_state(leader, "members") or {}
    assert (after.get("role"), after.get("epoch")) == ("leader", state["epoch"])
    # the members replicate: each publish is answered once the ISR holds it (TCP
    # clients must upgrade to TLS here: the HTTP API publishes)
    for i in range(20):
        status, _ = request("POST", f"{leader.http_url}/pub?topic=members", b"m%d" % i)
        assert status == 200
    assert (partition_state(follower, "members") or {}).get("end") == 20
    for n in nodes:
        n.stop(signal.SIGKILL)
