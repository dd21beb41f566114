"""The cluster under test, built into a network lab (chaos.netns): each nsqd, each
nsqlookupd and each etcd member in a namespace of its own, on NSQ's usual ports (every
namespace has its own addresses), logs and data in the run's directory.

The harness itself runs in the lab's hub (it entered it), so it reaches every node
directly; faults are made between the nodes' namespaces.

With ``faultfs=True`` every nsqd's data directory, and the embedded nsqlookupd's, is a
faultfs mount (tests/faultfs: a FUSE filesystem that forgets what was not fsynced) over
``<run dir>/<host>.disk``: :meth:`ChaosCluster.power_off` cuts the power of nodes (the
process SIGKILLed, the unsynced writes dropped, whole or torn), :meth:`flip_bit` and
:meth:`truncate` damage a node's files.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from chaos.netns import Host, Lab
from faultfs import FaultFS

NSQD_TCP, NSQD_HTTP = 4150, 4151
LOOKUPD_TCP, LOOKUPD_HTTP = 4160, 4161
ETCD_CLIENT, ETCD_PEER = 2379, 2380


@dataclass
class Proc:
    """One daemon of the cluster: where it runs, how it was started, its process."""

    kind: str  # nsqd | nsqlookupd | etcd
    host: Host
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped

    @property
    def name(self) -> str:
        return self.host.name

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class ChaosCluster:
    """nsqlookupd (one, or three over a three-member etcd), and ``nodes`` nsqd."""

    lab: Lab
    run_dir: Path
    nodes: int = 3
    lookupds: int = 1
    node_timeout: str = "2s"
    etcd_lease_ttl: str = "2s"
    #: nsqd's --replication-lag-timeout (None: its default)
    lag_timeout: str | None = None
    #: nsqd data directories on a small tmpfs each (MB; 0: on the run's disk)
    tmpfs_mb: int = 0
    #: data directories on faultfs mounts (power cuts, corruption)
    faultfs: bool = False
    #: more nsqd flags (--sync-before-ack ...)
    nsqd_args: tuple[str, ...] = ()
    #: host name -> its data directory's faultfs mount
    mounts: dict[str, FaultFS] = field(default_factory=dict)
    nsqd: dict[str, Proc] = field(default_factory=dict)
    lookupd: dict[str, Proc] = field(default_factory=dict)
    etcd: dict[str, Proc] = field(default_factory=dict)
    #: node id (as nsqlookupd knows it) -> host name
    node_ids: dict[str, str] = field(default_factory=dict)
    _http: aiohttp.ClientSession | None = None

    # -- building ---------------------------------------------------------------------

    def build(self) -> None:
        """Make the hosts and start every daemon (blocking; before the harness's loop)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        etcd_hosts = []
        if self.lookupds > 1:
            etcd_hosts = [self.lab.add_host(f"etcd{i}") for i in range(1, 4)]
        lk_hosts = [self.lab.add_host(f"lk{i}") for i in range(1, self.lookupds + 1)]
        n_hosts = [self.lab.add_host(f"n{i}") for i in range(1, self.nodes + 1)]
        if etcd_hosts:
            initial = ",".join(f"{h.name}=http://{h.ip}:{ETCD_PEER}" for h in etcd_hosts)
            for h in etcd_hosts:
                data = self.run_dir / h.name
                argv = [
                    shutil.which("etcd") or "etcd",
                    f"--name={h.name}",
                    f"--data-dir={data}",
                    f"--listen-client-urls=http://{h.ip}:{ETCD_CLIENT}",
                    f"--advertise-client-urls=http://{h.ip}:{ETCD_CLIENT}",
                    f"--listen-peer-urls=http://{h.ip}:{ETCD_PEER}",
                    f"--initial-advertise-peer-urls=http://{h.ip}:{ETCD_PEER}",
                    f"--initial-cluster={initial}",
                    "--initial-cluster-state=new",
                    "--heartbeat-interval=100",
                    "--election-timeout=1000",
                ]
                self.etcd[h.name] = self._start(
                    Proc("etcd", h, argv, self.run_dir / f"{h.name}.log")
                )
        endpoints = ",".join(f"http://{h.ip}:{ETCD_CLIENT}" for h in etcd_hosts)
        for h in lk_hosts:
            argv = [
                sys.executable,
                "-m",
                "nsqx",
                "nsqlookupd",
                f"--tcp-address={h.ip}:{LOOKUPD_TCP}",
                f"--http-address={h.ip}:{LOOKUPD_HTTP}",
                f"--broadcast-address={h.ip}",
                f"--node-timeout={self.node_timeout}",
            ]
            if endpoints:
                argv += [f"--etcd-endpoints={endpoints}", f"--etcd-lease-ttl={self.etcd_lease_ttl}"]
            else:
                argv.append(f"--data-path={self.run_dir / h.name}")
                (self.run_dir / h.name).mkdir(exist_ok=True)
                if self.faultfs:
                    self._mount(h.name)
            self.lookupd[h.name] = self._start(
                Proc("nsqlookupd", h, argv, self.run_dir / f"{h.name}.log")
            )
        for h in n_hosts:
            data = self.run_dir / h.name
            data.mkdir(exist_ok=True)
            if self.tmpfs_mb:
                self.lab.tmpfs(str(data), self.tmpfs_mb)
            if self.faultfs:
                self._mount(h.name)
            argv = [
                sys.executable,
                "-m",
                "nsqx",
                "nsqd",
                f"--data-path={data}",
                f"--tcp-address={h.ip}:{NSQD_TCP}",
                f"--http-address={h.ip}:{NSQD_HTTP}",
                f"--broadcast-address={h.ip}",
                *(f"--lookupd-tcp-address={lk.ip}:{LOOKUPD_TCP}" for lk in lk_hosts),
            ]
            if self.lag_timeout is not None:
                argv.append(f"--replication-lag-timeout={self.lag_timeout}")
            argv += self.nsqd_args
            self.nsqd[h.name] = self._start(Proc("nsqd", h, argv, self.run_dir / f"{h.name}.log"))

    def _mount(self, name: str) -> None:
        """A faultfs mount at the host's data directory (before its daemon starts: the
        daemon's mount namespace, made by ip netns exec, is a copy taken at its start)."""
        fs = FaultFS(
            self.run_dir / f"{name}.disk",
            self.run_dir / name,
            log=self.run_dir / f"{name}.faultfs.log",
        )
        fs.mount()
        self.mounts[name] = fs

    def _start(self, p: Proc) -> Proc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(p.log, "ab") as out:
            p.proc = self.lab.popen(p.host, p.argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        p.stopped = False
        return p

    def procs(self) -> list[Proc]:
        return [*self.etcd.values(), *self.lookupd.values(), *self.nsqd.values()]

    def proc_of(self, name: str) -> Proc:
        for p in self.procs():
            if p.name == name:
                return p
        raise KeyError(name)

    # -- process faults -----------------------------------------------------------------

    def sigstop(self, name: str) -> None:
        p = self.proc_of(name)
        if p.alive():
            os.kill(p.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            p.stopped = True
            self.lab.events.append((time.time(), f"SIGSTOP {name}"))

    def sigcont(self, name: str) -> None:
        p = self.proc_of(name)
        if p.alive() and p.stopped:
            os.kill(p.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        p.stopped = False
        self.lab.events.append((time.time(), f"SIGCONT {name}"))

    def kill(self, name: str) -> None:
        p = self.proc_of(name)
        if p.alive():
            os.kill(p.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            p.proc.wait(10)  # type: ignore[union-attr]
        p.stopped = False
        self.lab.events.append((time.time(), f"SIGKILL {name}"))

    def terminate(self, name: str, grace: float = 30.0) -> None:
        """SIGTERM: the daemon's own shutdown (nsqd drains its consumers first,
        docs/drain.md), waited for; SIGKILL only after ``grace`` s."""
        p = self.proc_of(name)
        if p.alive():
            self.lab.events.append((time.time(), f"SIGTERM {name}"))
            code = self.lab.stop(p.proc, grace=grace)  # type: ignore[arg-type]
            self.lab.events.append((time.time(), f"{name} exited {code}"))
        p.stopped = False

    def restart(self, name: str) -> None:
        p = self.proc_of(name)
        if p.alive():
            self.kill(name)
        self._start(p)
        self.lab.events.append((time.time(), f"restart {name}"))

    # -- storage faults (faultfs) --------------------------------------------------------

    def power_off(
        self, names: list[str], mode: str = "all", seed: int | None = None
    ) -> dict[str, Any]:
        """Cut the power of these hosts at once: each daemon SIGKILLed, then what its
        data directory had not made durable is lost (``mode``: all, reorder, torn,
        torn-last; faultfs/fs.py), and the directory mounted again over what was
        durable. The daemons stay down until :meth:`restart` (or heal_processes)."""
        for name in names:
            self.kill(name)
        reports = {}
        for i, name in enumerate(names):
            fs = self.mounts[name]
            report = fs.cut(mode, seed=None if seed is None else seed + i)
            fs.mount()
            lost = {
                path: f"{f['size']}->{f['now']}"
                for path, f in report["files"].items()
                if f["size"] != f["now"]
            }
            self.lab.events.append(
                (
                    time.time(),
                    f"power cut {name} ({mode}): {len(lost)} files shorter, "
                    f"{report['names_pending'] - report['names_kept']} of "
                    f"{report['names_pending']} name changes lost"
                    + (
                        f" (gone: {' '.join(report['lost_names'][:6])})"
                        if report["lost_names"]
                        else ""
                    ),
                )
            )
            reports[name] = report
        return reports

    def files(self, name: str, under: str = "", suffixes: tuple[str, ...] = (".seg",)) -> list[str]:
        """The files of a host's data directory (paths relative to it) under ``under``
        whose names end with one of ``suffixes``, sorted."""
        root = self.run_dir / name
        out = []
        for dirpath, _dirs, names in os.walk(root / under):
            for n in names:
                if n.endswith(suffixes):
                    out.append(str((Path(dirpath) / n).relative_to(root)))
        return sorted(out)

    def flip_bit(self, name: str, path: str, seed: int | None = None) -> dict[str, Any]:
        """Flip a random bit of a host's file (``path`` relative to its data directory)."""
        report = self.mounts[name].flip_bit(path, seed=seed)
        self.lab.events.append(
            (time.time(), f"flip {name}:{path} byte {report['offset']} of {report['size']}")
        )
        return report

    def truncate(self, name: str, path: str, length: int) -> dict[str, Any]:
        report = self.mounts[name].truncate(path, length)
        self.lab.events.append(
            (time.time(), f"truncate {name}:{path} at {length} of {report['size']}")
        )
        return report

    def heal_processes(self) -> None:
        """Every stopped daemon continued, every killed one started again."""
        for p in self.procs():
            if p.stopped:
                self.sigcont(p.name)
            elif not p.alive():
                self.restart(p.name)

    def close(self) -> None:
        for p in self.procs():
            if p.proc is not None and p.proc.poll() is None:
                if p.stopped:
                    os.kill(p.proc.pid, signal.SIGCONT)
                self.lab.stop(p.proc, grace=2.0)
        for fs in self.mounts.values():
            fs.close()

    # -- HTTP -----------------------------------------------------------------------------

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=2.0, connect=1.0),
                # NSQ's V1 answers (unwrapped), also for partitioned topics
                headers={"Accept": "application/vnd.nsq; version=1.0"},
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def get(self, host: Host, port: int, path: str) -> Any:
        """A JSON GET; None if the daemon does not answer in time or fails."""
        try:
            async with self.http().get(f"http://{host.ip}:{port}{path}") as resp:
                if resp.status != 200:
                    return None
                return json.loads(await resp.read())
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def post(self, host: Host, port: int, path: str) -> tuple[int, bytes]:
        try:
            async with self.http().post(f"http://{host.ip}:{port}{path}") as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            return 0, str(err).encode()

    def lookupd_hosts(self) -> list[Host]:
        return [p.host for p in self.lookupd.values()]

    async def lookupd_get(self, path: str) -> Any:
        """The first answer of any nsqlookupd."""
        for host in self.lookupd_hosts():
            doc = await self.get(host, LOOKUPD_HTTP, path)
            if doc is not None:
                return doc
        return None

    async def leading_lookupd_post(self, path: str) -> tuple[int, bytes]:
        """POST to each nsqlookupd until one (the leading one) takes it."""
        last: tuple[int, bytes] = (0, b"no nsqlookupd")
        for host in self.lookupd_hosts():
            last = await self.post(host, LOOKUPD_HTTP, path)
            if last[0] == 200:
                return last
        return last

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Every daemon answers, every nsqd is registered (and a leading nsqlookupd)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ok = True
            for p in self.nsqd.values():
                info = await self.get(p.host, NSQD_HTTP, "/info")
                ok = ok and info is not None
            for p in self.lookupd.values():
                nodes = await self.get(p.host, LOOKUPD_HTTP, "/nodes")
                ok = ok and nodes is not None and len(nodes.get("producers", [])) == self.nodes
            if ok and len(self.lookupd) > 1:
                listing = await self.lookupd_get("/listlookup")
                data = (listing or {}).get("data", listing) or {}
                leader = (data.get("lookupdleader") or {}) if isinstance(data, dict) else {}
                ok = bool(leader.get("ID"))
            if ok:
                break
            if loop.time() > deadline:
                raise RuntimeError("the cluster did not come up (see the logs in the run dir)")
            await asyncio.sleep(0.2)
        await self.learn_node_ids()

    async def learn_node_ids(self) -> None:
        """node id -> host, from nsqlookupd's /nodes (distributed_id of each producer)."""
        doc = await self.lookupd_get("/nodes")
        for producer in (doc or {}).get("producers", []):
            address = producer.get("broadcast_address", "")
            for name, p in self.nsqd.items():
                if p.host.ip == address:
                    node_id = producer.get("distributed_id") or f"{address}:{NSQD_TCP}"
                    self.node_ids[node_id] = name
        for name, p in self.nsqd.items():
            self.node_ids.setdefault(f"{p.host.ip}:{NSQD_TCP}", name)

    def host_of_node(self, node_id: str) -> str:
        return self.node_ids.get(node_id, node_id)

    async def create_topic(
        self, topic: str, partitions: int, replicator: int, ordered: bool
    ) -> None:
        path = f"/topic/create?topic={topic}&partition_num={partitions}&replicator={replicator}" + (
            "&orderedmulti=true" if ordered else "&multipart=true"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            status, body = await self.leading_lookupd_post(path)
            if status == 200:
                return
            if loop.time() > deadline:
                raise RuntimeError(f"create {topic}: {status} {body[:200]!r}")
            await asyncio.sleep(0.3)

    async def leaders(self, topic: str) -> dict[int, str]:
        """partition -> the leader's host name, as /partition/history says."""
        doc = await self.lookupd_get(f"/partition/history?topic={topic}")
        out: dict[int, str] = {}
        for pid, part in ((doc or {}).get("partitions") or {}).items():
            out[int(pid)] = self.host_of_node(part.get("leader", ""))
        return out

    async def followers(self, topic: str, pid: int) -> list[str]:
        doc = await self.lookupd_get(f"/partition/history?topic={topic}&partition={pid}")
        part = ((doc or {}).get("partitions") or {}).get(str(pid)) or {}
        leader = part.get("leader")
        return [self.host_of_node(n) for n in part.get("replicas", []) if n != leader]

    async def history(self, topic: str) -> dict[str, Any]:
        doc = await self.lookupd_get(f"/partition/history?topic={topic}")
        return (doc or {}).get("partitions") or {}

    async def leading_lookupd(self) -> str | None:
        """The host name of the leading nsqlookupd (several over etcd)."""
        listing = await self.lookupd_get("/listlookup")
        data = (listing or {}).get("data", listing) or {}
        leader = (data.get("lookupdleader") or {}) if isinstance(data, dict) else {}
        ip = leader.get("NodeIP")
        for p in self.lookupd.values():
            if p.host.ip == ip:
                return p.name
        return None
