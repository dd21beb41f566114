"""Youzan's NSQ as the cluster under test (``run.py --target youzan``): the same lab,
workload and checker as nsqx's, with youzan/nsq's nsqd and nsqlookupd over etcd.

The binaries are the reference build in ``../shared/reference/youzan-nsq-bin`` (next to
the checkout; ``NSQX_YOUZAN_BIN`` overrides), never in a user's clone: without them
``--target youzan`` says so and exits. Needs ``etcd`` (3.4, v2 API) on the PATH.

Layout, as that directory's cluster.sh starts it but with the lab hosts' addresses: etcd
(one member, or three for the three-nsqlookupd scenarios) in ``etcd1``.., Youzan's
nsqlookupd in ``lk1``.., three Youzan nsqd in ``n1``..``n3``, each in its own namespace,
on NSQ's usual ports (nsqd RPC 4250, nsqlookupd RPC 4260). nsqd finds nsqlookupd through
etcd (it has no lookupd address of its own).

What differs from nsqx's cluster for the harness:

- nsqlookupd and nsqd exit when etcd (or, for nsqd, a leading nsqlookupd) is not there
  yet, so only etcd starts in ``build``; :meth:`YouzanCluster.wait_ready` starts the rest
  in order;
- a topic takes writes only once each partition's leader has a channel (created here on
  the leader, ``POST /channel/create``) and its leader session, which nsqlookupd hands
  out at a full topic check: up to two minutes after ``/topic/create``, a few seconds
  when the create is repeated (:meth:`YouzanCluster.wait_writable`);
- there is no ``/partition/history``: leaders and ISRs are read from etcd (each
  partition's ``ReplicaInfo`` and ``LeaderSession``), and a poller records every change
  it sees, at the moment it sees it (every 0.25 s). That record shows what happened, but
  it is too coarse to tell a fenced acknowledgement from a new leader's first one, so
  the verdict's fenced column is "n/a"; :func:`polled_fenced` counts only the
  acknowledgements that the polled view proves late (a lower bound, in the details);
- failover waits for etcd's 20 s TTL on the dead node's key, so its runs keep writing
  longer after the fault (:data:`AFTER`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from chaos.cluster import (
    ETCD_CLIENT,
    ETCD_PEER,
    LOOKUPD_HTTP,
    LOOKUPD_TCP,
    NSQD_HTTP,
    NSQD_TCP,
    ChaosCluster,
    Proc,
)

NSQD_RPC, LOOKUPD_RPC = 4250, 4260
CLUSTER_ID = "nsqx-chaos"
ETCD_ROOT = f"/v2/keys/NSQMetaData/{CLUSTER_ID}"
#: seconds of traffic after the fault is undone (nsqx's runs: run.AFTER)
AFTER = 60.0
#: how long a new topic may take to take writes
WRITABLE_TIMEOUT = 180.0
#: the channel the workload's consumers read (created on each partition's leader)
CHANNEL = "c"
POLL = 0.25

#: scenarios that cannot run against Youzan's cluster, and why (none so far: the
#: three-nsqlookupd ones run with three Youzan nsqlookupd over a three-member etcd,
#: which elect their leader there as nsqx's do)
UNSUPPORTED: dict[str, str] = {}


def bin_dir() -> Path:
    env = os.environ.get("NSQX_YOUZAN_BIN")
    if env:
        return Path(env)
    # tests/chaos/youzan_cluster.py -> the checkout -> its parent's shared/
    return Path(__file__).resolve().parents[2].parent / "shared/reference/youzan-nsq-bin"


def unavailable() -> str | None:
    """Why Youzan's cluster cannot run here, or None."""
    d = bin_dir()
    missing = [b for b in ("nsqd", "nsqlookupd") if not os.access(d / b, os.X_OK)]
    if missing:
        return (
            f"Youzan's {' and '.join(missing)} not found in {d} (they live only next to the "
            "project's checkout, in ../shared/reference/youzan-nsq-bin; NSQX_YOUZAN_BIN "
            "names another directory)"
        )
    if shutil.which("etcd") is None:
        return "etcd is not installed (apt-get install -y etcd-server)"
    return None


def unsupported(name: str) -> str | None:
    """Why a scenario is skipped against Youzan's cluster, or None."""
    return UNSUPPORTED.get(name)


def _toml(items: dict[str, Any]) -> str:
    lines = []
    for k, v in items.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, int):
            lines.append(f"{k} = {v}")
        elif isinstance(v, list):
            lines.append(f"{k} = [{', '.join(json.dumps(x) for x in v)}]")
        else:
            lines.append(f"{k} = {json.dumps(str(v))}")
    return "\n".join(lines) + "\n"


@dataclass
class YouzanCluster(ChaosCluster):
    """Youzan's nsqlookupd (one, or three) over etcd (one member, or three), ``nodes``
    Youzan nsqd; the harness's interface of ChaosCluster."""

    #: (topic, partition) -> what the poller saw in etcd, in order
    seen: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    #: topic -> (partitions, its /topic/create path)
    _topics: dict[str, tuple[int, str]] = field(default_factory=dict)
    _poller: asyncio.Task[None] | None = None

    # -- building ---------------------------------------------------------------------

    def build(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        bins = bin_dir()
        n_etcd = 3 if self.lookupds > 1 else 1
        etcd_hosts = [self.lab.add_host(f"etcd{i}") for i in range(1, n_etcd + 1)]
        lk_hosts = [self.lab.add_host(f"lk{i}") for i in range(1, self.lookupds + 1)]
        n_hosts = [self.lab.add_host(f"n{i}") for i in range(1, self.nodes + 1)]
        initial = ",".join(f"{h.name}=http://{h.ip}:{ETCD_PEER}" for h in etcd_hosts)
        for h in etcd_hosts:
            argv = [
                shutil.which("etcd") or "etcd",
                f"--name={h.name}",
                f"--data-dir={self.run_dir / h.name}",
                "--enable-v2=true",
                f"--listen-client-urls=http://{h.ip}:{ETCD_CLIENT}",
                f"--advertise-client-urls=http://{h.ip}:{ETCD_CLIENT}",
                f"--listen-peer-urls=http://{h.ip}:{ETCD_PEER}",
                f"--initial-advertise-peer-urls=http://{h.ip}:{ETCD_PEER}",
                f"--initial-cluster={initial}",
                "--initial-cluster-state=new",
            ]
            self.etcd[h.name] = self._start(Proc("etcd", h, argv, self.run_dir / f"{h.name}.log"))
        endpoints = ",".join(f"http://{h.ip}:{ETCD_CLIENT}" for h in etcd_hosts)
        for h in lk_hosts:
            logs = self.run_dir / f"{h.name}-glog"
            logs.mkdir(exist_ok=True)
            cfg = self.run_dir / f"{h.name}.cfg"
            cfg.write_text(
                _toml(
                    {
                        "tcp_address": f"{h.ip}:{LOOKUPD_TCP}",
                        "http_address": f"{h.ip}:{LOOKUPD_HTTP}",
                        "rpc_port": str(LOOKUPD_RPC),
                        "broadcast_address": h.ip,
                        "broadcast_interface": "eth0",
                        "cluster_id": CLUSTER_ID,
                        "cluster_leadership_addresses": endpoints,
                        "inactive_producer_timeout": "100s",
                        "nsqd_ping_timeout": "15s",
                        "tombstone_lifetime": "45s",
                        "log_level": 2,
                        "log_dir": str(logs),
                        "balance_interval": ["0", "0"],
                    }
                )
            )
            argv = [str(bins / "nsqlookupd"), f"-config={cfg}"]
            # started by wait_ready, once etcd answers (they exit without it)
            self.lookupd[h.name] = Proc("nsqlookupd", h, argv, self.run_dir / f"{h.name}.log")
        for i, h in enumerate(n_hosts, 1):
            data = self.run_dir / h.name
            data.mkdir(exist_ok=True)
            if self.tmpfs_mb:
                self.lab.tmpfs(str(data), self.tmpfs_mb)
            logs = self.run_dir / f"{h.name}-glog"
            logs.mkdir(exist_ok=True)
            cfg = self.run_dir / f"{h.name}.cfg"
            cfg.write_text(
                _toml(
                    {
                        "id": i,
                        "cluster_id": CLUSTER_ID,
                        "cluster_leadership_addresses": endpoints,
                        "rpc_port": str(NSQD_RPC),
                        "broadcast_address": h.ip,
                        "broadcast_interface": "eth0",
                        "tcp_address": f"{h.ip}:{NSQD_TCP}",
                        "http_address": f"{h.ip}:{NSQD_HTTP}",
                        "https_address": "",
                        "lookup_ping_interval": "1s",
                        "data_path": str(data),
                        "log_dir": str(logs),
                        "log_level": 2,
                        "retention_days": 1,
                        "mem_queue_size": 10000,
                        "sync_every": 2500,
                        "sync_timeout": "2s",
                        "msg_timeout": "60s",
                        "max_msg_timeout": "15m",
                        "max_req_timeout": "24h",
                        "req_to_end_threshold": "15m",
                        "queue_scan_interval": "100ms",
                    }
                )
            )
            argv = [str(bins / "nsqd"), f"-config={cfg}"]
            # started by wait_ready, once an nsqlookupd leads (they exit without one)
            self.nsqd[h.name] = Proc("nsqd", h, argv, self.run_dir / f"{h.name}.log")

    # -- etcd -----------------------------------------------------------------------------

    async def etcd_get(self, key: str, recursive: bool = False) -> Any:
        """A v2 GET of ``key`` under the cluster's root from the first member that answers
        (its ``node``), or None."""
        q = "?recursive=true" if recursive else ""
        for p in self.etcd.values():
            try:
                url = f"http://{p.host.ip}:{ETCD_CLIENT}{ETCD_ROOT}{key}{q}"
                async with self.http().get(url) as resp:
                    if resp.status == 404:
                        return None
                    if resp.status != 200:
                        continue
                    return json.loads(await resp.read()).get("node")
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                continue
        return None

    async def replica_info(self, topic: str) -> dict[int, dict[str, Any]] | None:
        """partition -> its ReplicaInfo (Leader, ISR, EpochForWrite...) with ``Session``:
        the node holding its leader session ('' if none); None if etcd did not answer."""
        node = await self.etcd_get(f"/Topics/{topic}", recursive=True)
        if node is None:
            return None
        out: dict[int, dict[str, Any]] = {}
        for part in node.get("nodes") or []:
            pid = part["key"].rsplit("/", 1)[-1]
            if not pid.isdigit():
                continue
            info: dict[str, Any] = {"Session": ""}
            for leaf in part.get("nodes") or []:
                name = leaf["key"].rsplit("/", 1)[-1]
                try:
                    value = json.loads(leaf.get("value") or "null") or {}
                except ValueError:
                    continue
                if name == "ReplicaInfo":
                    info.update(value)
                elif name == "LeaderSession":
                    info["Session"] = (value.get("LeaderNode") or {}).get("ID", "")
            out[int(pid)] = info
        return out

    async def _poll(self) -> None:
        while True:
            for topic in list(self._topics):
                infos = await self.replica_info(topic)
                now = time.time()
                for pid, info in (infos or {}).items():
                    entry = {
                        "epoch": info.get("EpochForWrite", 0),
                        "leader": info.get("Leader", ""),
                        "isr": list(info.get("ISR") or []),
                        "session": info.get("Session", ""),
                        "catchup": list(info.get("CatchupList") or []),
                    }
                    seen = self.seen.setdefault((topic, pid), [])
                    last = seen[-1] if seen else None
                    if last is None or any(last[k] != v for k, v in entry.items()):
                        seen.append({**entry, "at": now * 1000})
            await asyncio.sleep(POLL)

    # -- the harness's interface ------------------------------------------------------------

    def close(self) -> None:
        """nsqd first, then nsqlookupd, then etcd (so that none spends its stop retrying
        a daemon already gone)."""
        for p in [*self.nsqd.values(), *self.lookupd.values(), *self.etcd.values()]:
            if p.proc is not None and p.proc.poll() is None:
                if p.stopped:
                    os.kill(p.proc.pid, signal.SIGCONT)
                self.lab.stop(p.proc, grace=3.0)

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        await super().aclose()

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Every daemon answers, every nsqd is registered in etcd and with nsqlookupd, and
        the nsqlookupds have a leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        async def until(what: str, check: Any) -> None:
            while not await check():
                if loop.time() > deadline:
                    raise RuntimeError(f"Youzan's cluster: {what} (see the logs in the run dir)")
                await asyncio.sleep(0.3)

        async def etcd_up() -> bool:
            return all(
                [
                    await self.get(p.host, ETCD_CLIENT, "/v2/keys") is not None
                    for p in self.etcd.values()
                ]
            )

        async def lookupd_leads() -> bool:
            listing = await self.lookupd_get("/listlookup")
            return bool(((listing or {}).get("lookupdleader") or {}).get("ID"))

        await until("etcd did not answer", etcd_up)
        for p in self.lookupd.values():
            if p.proc is None:
                self._start(p)
        await until("no nsqlookupd leads", lookupd_leads)
        for p in self.nsqd.values():
            if p.proc is None:
                self._start(p)
        while True:
            ok = True
            for p in self.nsqd.values():
                ok = ok and await self.get(p.host, NSQD_HTTP, "/info") is not None
            for p in self.lookupd.values():
                nodes = await self.get(p.host, LOOKUPD_HTTP, "/nodes")
                ok = ok and nodes is not None and len(nodes.get("producers") or []) == self.nodes
            if ok:
                listing = await self.lookupd_get("/listlookup")
                leader = (listing or {}).get("lookupdleader") or {}
                ok = bool(leader.get("ID"))
            if ok:
                registered = await self.etcd_get("/NsqdNodes")
                ok = registered is not None and len(registered.get("nodes") or []) == self.nodes
            if ok:
                break
            if loop.time() > deadline:
                raise RuntimeError("Youzan's cluster did not come up (see the logs in the run dir)")
            await asyncio.sleep(0.3)
        await self.learn_node_ids()

    async def learn_node_ids(self) -> None:
        """node id (``ip:rpc:tcp:id``, as etcd and ReplicaInfo name nodes) -> host name."""
        doc = await self.etcd_get("/NsqdNodes")
        for leaf in (doc or {}).get("nodes") or []:
            try:
                info = json.loads(leaf.get("value") or "{}")
            except ValueError:
                continue
            for name, p in self.nsqd.items():
                if p.host.ip == info.get("NodeIP"):
                    self.node_ids[info["ID"]] = name

    def host_of_node(self, node_id: str) -> str:
        if node_id in self.node_ids:
            return self.node_ids[node_id]
        ip = node_id.split(":", 1)[0]
        for name, p in self.nsqd.items():
            if p.host.ip == ip:
                return name
        return node_id

    async def create_topic(
        self, topic: str, partitions: int, replicator: int, ordered: bool
    ) -> None:
        path = f"/topic/create?topic={topic}&partition_num={partitions}&replicator={replicator}" + (
            "&orderedmulti=true" if ordered else "&multipart=true"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            status, body = await self.leading_lookupd_post(path)
            if status == 200:
                break
            if loop.time() > deadline:
                raise RuntimeError(f"create {topic}: {status} {body[:200]!r}")
            await asyncio.sleep(0.5)
        self._topics[topic] = (partitions, path)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())

    async def wait_writable(self, timeout: float = WRITABLE_TIMEOUT) -> float:
        """Each partition of the created topics with its channel on its leader and listed
        by nsqlookupd for writing; returns the seconds it took.

        A new topic's partitions take writes after nsqlookupd's next full topic check.
        /topic/create asks for one, but nsqlookupd skips it within 6 s of the last one
        (a node joining makes one too), and the periodic one comes every 60 s, skipping
        the first: up to two minutes. So, as Youzan's code suggests ("re-create again to
        make sure partitions are all ready"), the create is repeated every 7 s until
        every partition takes writes."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + timeout
        pending = {t: set(range(n)) for t, (n, _) in self._topics.items()}

        async def nudge() -> None:
            while any(pending.values()):
                await asyncio.sleep(7.0)
                for t, parts in pending.items():
                    if parts:
                        await self.leading_lookupd_post(self._topics[t][1])

        async def one(topic: str, pid: int) -> None:
            made = False
            while True:
                if not made:
                    leaders = await self.leaders(topic)
                    lead = self.nsqd.get(leaders.get(pid, ""))
                    if lead is not None:
                        q = f"/channel/create?topic={topic}&channel={CHANNEL}&partition={pid}"
                        status, _ = await self.post(lead.host, NSQD_HTTP, q)
                        made = status == 200
                if made:
                    doc = await self.lookupd_get(f"/lookup?topic={topic}&access=w")
                    if str(pid) in ((doc or {}).get("partitions") or {}):
                        pending[topic].discard(pid)
                        return
                if loop.time() > deadline:
                    raise RuntimeError(
                        f"{topic}:{pid} not writable {timeout:.0f} s after it was created "
                        f"(channel created: {made})"
                    )
                await asyncio.sleep(1.0)

        nudger = asyncio.create_task(nudge())
        try:
            await asyncio.gather(*(one(t, pid) for t, parts in pending.items() for pid in parts))
        finally:
            nudger.cancel()
        return loop.time() - began

    async def leaders(self, topic: str) -> dict[int, str]:
        """partition -> the leader's host name, by its ReplicaInfo in etcd."""
        infos = await self.replica_info(topic) or {}
        return {pid: self.host_of_node(i.get("Leader", "")) for pid, i in infos.items()}

    async def followers(self, topic: str, pid: int) -> list[str]:
        info = (await self.replica_info(topic) or {}).get(pid) or {}
        leader = info.get("Leader")
        return [self.host_of_node(n) for n in info.get("ISR") or [] if n != leader]

    async def history(self, topic: str) -> dict[str, Any]:
        """What the poller saw, in /partition/history's shape (``at``: when it was seen,
        not when it changed)."""
        out: dict[str, Any] = {}
        for (t, pid), seen in sorted(self.seen.items()):
            if t != topic:
                continue
            hist = []
            for e in seen:
                reason = "seen in etcd"
                if e["session"] != e["leader"]:
                    sess = self.host_of_node(e["session"]) if e["session"] else "none"
                    reason += f", leader session: {sess}"
                if e["catchup"]:
                    reason += ", catching up: " + ",".join(
                        self.host_of_node(n) for n in e["catchup"]
                    )
                hist.append(
                    {
                        "epoch": e["epoch"],
                        "leader": e["leader"],
                        "isr": e["isr"],
                        "at": e["at"],
                        "reason": reason,
                        "polled": True,
                    }
                )
            last = seen[-1] if seen else {}
            out[str(pid)] = {
                "leader": last.get("leader", ""),
                "replicas": last.get("isr", []),
                "history": hist,
            }
        return out


def polled_fenced(rec: Any, histories: dict[str, dict[str, Any]], host_of: Any) -> list[str]:
    """Acknowledgements that etcd's polled view proves came from a node that was no
    longer the partition's leader: the view last seen before the PUB was sent and the
    first one seen after its answer (or the last one, if none came after) both name
    another leader. A lower bound: a stale leader's acknowledgement between two polls
    that disagree is not counted. Returns detail lines, the count in the first."""
    late = []
    for s in rec.acked():
        a = s.acked
        seen = (histories.get(s.topic) or {}).get(str(s.pid), {}).get("history", [])
        before = [e for e in seen if e["at"] <= a.sent * 1000]
        after = [e for e in seen if e["at"] >= a.done * 1000] or seen[-1:]
        if not before or not after:
            continue
        lead_before, lead_after = host_of(before[-1]["leader"]), host_of(after[0]["leader"])
        if a.node not in (lead_before, lead_after):
            late.append(
                f"late ack: {s.body!r} acknowledged by {a.node} at {a.done:.3f} while "
                f"etcd named {lead_before}"
            )
    head = (
        "fenced acks: n/a (Youzan keeps no leader history); by etcd, polled every "
        f"{POLL} s: {len(late)} acknowledgements provably from a node after etcd named "
        "another leader (a lower bound)"
    )
    return [head, *late[:10]]
