"""The cluster secret's flags, shared by the daemons and tools (nsqx.wire.members;
nsqx.cluster_secret reads them when the daemon starts)."""

from __future__ import annotations

from nsqx.cli.goflags import FlagSpec, Kind
from nsqx.wire.members import ENV


def secret_flags(tool: str) -> tuple[FlagSpec, FlagSpec]:
    """``--cluster-secret`` and ``--cluster-secret-file``, worded for ``tool``."""
    return (
        FlagSpec(
            "cluster-secret",
            Kind.STR,
            "cluster_secret",
            "",
            f"[nsqx] shared secret of the cluster's members: {tool} sends it, and"
            " (daemons) refuses members-only endpoints without it (default:"
            f" ${ENV}; empty: open, as NSQ)",
            metavar="secret",
        ),
        FlagSpec(
            "cluster-secret-file",
            Kind.STR,
            "cluster_secret_file",
            "",
            "[nsqx] read --cluster-secret from this file (its first line)",
            metavar="path",
        ),
    )
