"""Replication of a partition's log to its in-sync replicas: the leader's and the
follower's streams, the node's lease, and the roles nsqlookupd tells (docs/replication.md)."""
