"""What a worker process is told by its supervisor: its place and its listeners."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

#: the environment variable that carries a worker's spec (JSON) to its process
SPEC_ENV = "NSQX_WORKER_SPEC"


@dataclass
class WorkerSpec:
    """A worker's index among ``count``, the node's link prefix (see .links), and the
    descriptors of the listening sockets it inherits (-1: none)."""

    index: int
    count: int
    prefix: str
    tcp_fd: int = -1
    http_fd: int = -1
    https_fd: int = -1
    #: this worker's own HTTP listener on loopback, where the other workers send the
    #: requests it must answer (its partitions), and every worker's port there
    internal_http_fd: int = -1
    internal_http_ports: list[int] = field(default_factory=list)
    #: the node's secret between its workers: a request forwarded by a worker carries it
    #: (nothing else may pass for one)
    token: str = ""
    #: where the worker writes one byte once it started (-1: nobody asks)
    ready_fd: int = -1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))
