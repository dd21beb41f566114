"""Where a daemon or tool takes the cluster's secret from (nsqx.wire.members): the
file of ``--cluster-secret-file`` (its first line), else ``--cluster-secret``, else
the ``NSQX_CLUSTER_SECRET`` environment variable."""

from __future__ import annotations

import os

from nsqx.wire.members import ENV


def load_secret(flag_value: str, path: str) -> str:
    """The secret to use; ValueError naming the flag if the file cannot give one."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                secret = f.readline().strip()
        except OSError as err:
            raise ValueError(f"--cluster-secret-file: {err}") from None
        if not secret:
            raise ValueError(f"--cluster-secret-file: {path} has no secret on its first line")
        return secret
    return flag_value or os.environ.get(ENV, "")
