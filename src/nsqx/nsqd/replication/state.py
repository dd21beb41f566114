"""ReplicaRole: what the coordinator told this node about one replicated partition.

nsqlookupd (the coordinator) decides who leads each partition of a topic with
``replicator`` > 1, who is in sync (the ISR) and the epoch, and tells every node that
holds a replica (``POST /partition/role``). A node keeps the newest role it was told,
with its epoch history, in ``replica.p<partition>.json`` beside the partition's files
(temp file, fsync, rename), and refuses any role of an older epoch: a node that was
cut off and comes back can never act on a stale decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from nsqx.store.durable_file import write_durable

LEADER = "leader"
FOLLOWER = "follower"


@dataclass(frozen=True)
class ReplicaRole:
    """One partition's replication state on this node.

    ``leader_http`` is the leader's ``host:port`` for the replication stream;
    ``replicas`` every node that holds (or is catching up) a replica, ``isr`` those in
    sync; ``replica`` the topic's replicator setting (the write quorum is more than
    half of it). ``history`` is the epoch history (nsqx.wire.replication).
    """

    epoch: int
    leader: str
    leader_http: str
    isr: tuple[str, ...]
    replicas: tuple[str, ...]
    replica: int
    history: tuple[tuple[int, int], ...] = field(default=())

    def role_of(self, node: str) -> str | None:
        if node == self.leader:
            return LEADER
        if node in self.replicas:
            return FOLLOWER
        return None

    @property
    def quorum_ok(self) -> bool:
        """Youzan's write rule: the ISR holds more than half of the replicas."""
        return len(self.isr) > self.replica // 2

    def with_history(self, history: tuple[tuple[int, int], ...]) -> ReplicaRole:
        return replace(self, history=history)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "leader": self.leader,
            "leader_http": self.leader_http,
            "isr": list(self.isr),
            "replicas": list(self.replicas),
            "replica": self.replica,
            "history": [list(h) for h in self.history],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ReplicaRole:
        """Decode a role (the coordinator's request body, or the saved file)."""
        if not isinstance(obj, dict):
            raise ValueError("role is not an object")
        epoch = obj.get("epoch")
        replica = obj.get("replica")
        leader = obj.get("leader")
        leader_http = obj.get("leader_http", "")
        isr = obj.get("isr")
        replicas = obj.get("replicas")
        if not isinstance(epoch, int) or epoch < 1:
            raise ValueError(f"bad epoch {epoch!r}")
        if not isinstance(replica, int) or replica < 1:
            raise ValueError(f"bad replica {replica!r}")
        if not isinstance(leader, str) or not leader:
            raise ValueError(f"bad leader {leader!r}")
        if not isinstance(leader_http, str):
            raise ValueError(f"bad leader_http {leader_http!r}")
        for name, value in (("isr", isr), ("replicas", replicas)):
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise ValueError(f"bad {name} {value!r}")
        assert isinstance(isr, list) and isinstance(replicas, list)
        history_raw = obj.get("history", [])
        if not isinstance(history_raw, list):
            raise ValueError("bad history")
        history: list[tuple[int, int]] = []
        for h in history_raw:
            if not (isinstance(h, list) and len(h) == 2 and all(isinstance(v, int) for v in h)):
                raise ValueError(f"bad history entry {h!r}")
            history.append((h[0], h[1]))
        return cls(epoch, leader, leader_http, tuple(isr), tuple(replicas), replica, tuple(history))


def read_role(path: str) -> ReplicaRole | None:
    """The saved role, or None (no file, or an unreadable one: the coordinator sends
    the current role again when the node registers)."""
    try:
        with open(path, encoding="utf-8") as f:
            return ReplicaRole.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except ValueError:
        return None


def write_role(path: str, role: ReplicaRole) -> None:
    """Save the role durably (temp file, fsync, rename, fsync of the directory)."""
    write_durable(path, json.dumps(role.to_json()).encode())
