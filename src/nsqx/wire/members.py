"""Cluster membership on HTTP: the shared secret that members of an nsqx cluster send.

The endpoints that change roles or ship a log (nsqd's ``/partition/role``,
``/partition/fence``, ``/replication/stream``) and nsqlookupd's cluster and topic-admin
endpoints refuse callers that do not send the cluster's secret, once one is set
(``--cluster-secret``, ``--cluster-secret-file`` or ``NSQX_CLUSTER_SECRET``). Members
(nsqd, nsqlookupd, nsqadmin, the tools) send it in :data:`HEADER`.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

#: the request header that carries the secret
HEADER = "X-Nsqx-Cluster-Secret"
#: the environment variable the daemons and tools read when no flag sets the secret
ENV = "NSQX_CLUSTER_SECRET"
#: the error code of a refusal (HTTP 403)
NOT_A_MEMBER = "E_NOT_A_MEMBER"


def headers(secret: str) -> dict[str, str]:
    """What a member adds to its requests (nothing without a secret)."""
    return {HEADER: secret} if secret else {}


def is_member(secret: str, request_headers: Mapping[str, str]) -> bool:
    """Whether a request may use a members-only endpoint: no secret is set, or it sent
    the secret (compared in constant time)."""
    if not secret:
        return True
    sent = request_headers.get(HEADER, "")
    return hmac.compare_digest(sent.encode(), secret.encode())
