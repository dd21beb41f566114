"""The faults: each scenario names the cluster it needs and injects its fault into a
running workload, then undoes it. The target is the node that leads the ordered topic's
partition 0 (so that order is checked across the failover); the plain topic has
partitions on it too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from chaos.cluster import ChaosCluster
from chaos.netns import Lab

ORDERED = "ord"
PLAIN = "plain"


@dataclass
class Context:
    lab: Lab
    cl: ChaosCluster
    #: how long a fault lasts (the --short run scales it down)
    scale: float = 1.0
    #: random timings and seeds of a run (its seed is in the timeline)
    rng: random.Random = field(default_factory=random.Random)
    #: when the fault struck, where an injection waits a random time first (time.time)
    struck: float | None = None

    def strike(self) -> None:
        """The fault strikes now (the checker measures from here)."""
        self.struck = time.time()
        self.lab.events.append((self.struck, "fault strikes"))

    def secs(self, long: float) -> float:
        return max(long * self.scale, 3.0)

    async def leader(self) -> str:
        leaders = await self.cl.leaders(ORDERED)
        return leaders[0]

    async def followers(self) -> list[str]:
        return await self.cl.followers(ORDERED, 0)

    def host(self, name: str):  # type: ignore[no-untyped-def]
        return self.lab.host(name)

    async def run(self, fn: Callable[..., object], *args: object) -> None:
        """A blocking lab call (iptables, signals) off the workload's loop."""
        await asyncio.to_thread(fn, *args)


Inject = Callable[[Context], Awaitable[None]]


@dataclass
class Scenario:
    name: str
    inject: Inject
    lookupds: int = 1
    replicator: int = 3
    tmpfs_mb: int = 0
    #: part of the short run CI makes
    short: bool = False
    #: data directories on faultfs (tests/faultfs): power cuts and corruption
    faultfs: bool = False
    nsqd_args: tuple[str, ...] = ()
    #: DPUB publishers with this delay (ms), checked for early deliveries
    deferred_ms: int = 0
    #: messages acknowledged this long before the fault may be lost (None: none may)
    loss_window: float | None = None
    #: at most this many may be lost (a damaged batch)
    max_lost: int | None = None
    #: the checks that decide the verdict besides loss, phantoms, order, fencing and ids
    strict: tuple[str, ...] = ()


async def leader_isolated(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    await ctx.run(ctx.lab.isolate, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def leader_cut_from_lookupd(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    for lk in ctx.cl.lookupd_hosts():
        await ctx.run(ctx.lab.cut, lead, lk)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def follower_cut_from_leader(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    follower = ctx.host((await ctx.followers())[0])
    await ctx.run(ctx.lab.cut, follower, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, follower, lead)


async def leader_cut_from_followers(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    for name in await ctx.followers():
        await ctx.run(ctx.lab.cut, lead, ctx.host(name))
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def oneway_leader_to_lookupd(ctx: Context) -> None:
    """The leader's packets to nsqlookupd are dropped; nsqlookupd's still arrive."""
    lead = ctx.host(await ctx.leader())
    for lk in ctx.cl.lookupd_hosts():
        await ctx.run(ctx.lab.cut_oneway, lead, lk)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def oneway_lookupd_to_leader(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    for lk in ctx.cl.lookupd_hosts():
        await ctx.run(ctx.lab.cut_oneway, lk, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def oneway_leader_to_followers(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    for name in await ctx.followers():
        await ctx.run(ctx.lab.cut_oneway, lead, ctx.host(name))
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)


async def lookupd_cannot_connect_to_leader(ctx: Context) -> None:
    """nsqlookupd cannot open connections to the leader (its HTTP calls fail), the
    leader's registration stays; meanwhile a follower is killed (a new ISR to tell)."""
    lead = ctx.host(await ctx.leader())
    follower = (await ctx.followers())[0]
    for lk in ctx.cl.lookupd_hosts():
        await ctx.run(ctx.lab.block_connect, lk, lead)
    await ctx.run(ctx.cl.kill, follower)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, lead)
    await ctx.run(ctx.cl.restart, follower)


async def delay_and_loss(ctx: Context) -> None:
    """200 ms each way and 5 % loss on every replication link of the leader."""
    lead = ctx.host(await ctx.leader())
    for name in await ctx.followers():
        await ctx.run(ctx.lab.delay, lead, ctx.host(name), 200.0, 0.0, 5.0)
    await asyncio.sleep(ctx.secs(20))
    await ctx.run(ctx.lab.heal, lead)


async def flapping_link(ctx: Context) -> None:
    lead = ctx.host(await ctx.leader())
    follower = ctx.host((await ctx.followers())[0])
    flap = ctx.lab.flap(lead, follower, 2.0, ctx.secs(30))
    await asyncio.to_thread(flap.join)
    await ctx.run(ctx.lab.heal, lead, follower)


def leader_stopped(seconds: float) -> Inject:
    async def inject(ctx: Context) -> None:
        lead = await ctx.leader()
        await ctx.run(ctx.cl.sigstop, lead)
        await asyncio.sleep(ctx.secs(seconds))
        await ctx.run(ctx.cl.sigcont, lead)

    return inject


async def leader_killed(ctx: Context) -> None:
    lead = await ctx.leader()
    await ctx.run(ctx.cl.kill, lead)
    await asyncio.sleep(ctx.secs(5))
    await ctx.run(ctx.cl.restart, lead)


async def leader_drained(ctx: Context) -> None:
    """A rolling restart's step: the leader is stopped as an operator stops it (SIGTERM:
    it drains, leaves nsqlookupd, exits) while publishers and consumers run, then
    started again."""
    lead = await ctx.leader()
    await ctx.run(ctx.cl.terminate, lead)
    await asyncio.sleep(ctx.secs(5))
    await ctx.run(ctx.cl.restart, lead)


async def leader_disk_full(ctx: Context) -> None:
    lead = await ctx.leader()
    data = ctx.cl.run_dir / lead
    await ctx.run(ctx.lab.fill, str(data))
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.unfill, str(data))


async def _leading_lookupd(ctx: Context) -> str:
    name = await ctx.cl.leading_lookupd()
    if name is None:
        raise RuntimeError("no leading nsqlookupd")
    return name


async def leading_lookupd_killed_with_leader(ctx: Context) -> None:
    lk, lead = await _leading_lookupd(ctx), await ctx.leader()
    await ctx.run(ctx.cl.kill, lk)
    await ctx.run(ctx.cl.kill, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.cl.restart, lk)
    await ctx.run(ctx.cl.restart, lead)


async def leading_lookupd_isolated_leader_killed(ctx: Context) -> None:
    lk, lead = await _leading_lookupd(ctx), await ctx.leader()
    await ctx.run(ctx.lab.isolate, ctx.host(lk))
    await ctx.run(ctx.cl.kill, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.lab.heal, ctx.host(lk))
    await ctx.run(ctx.cl.restart, lead)


async def leading_lookupd_stopped_leader_killed(ctx: Context) -> None:
    lk, lead = await _leading_lookupd(ctx), await ctx.leader()
    await ctx.run(ctx.cl.sigstop, lk)
    await ctx.run(ctx.cl.kill, lead)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.cl.sigcont, lk)
    await ctx.run(ctx.cl.restart, lead)


async def etcd_member_killed(ctx: Context) -> None:
    member = next(iter(ctx.cl.etcd))
    await ctx.run(ctx.cl.kill, member)
    await asyncio.sleep(ctx.secs(10))
    await ctx.run(ctx.cl.restart, member)


# -- storage faults: nodes on faultfs -------------------------------------------------------


async def _pick(ctx: Context, who: str) -> list[str]:
    """The hosts a storage fault hits: "leader" (of ord:0), "follower" (of ord:0, one
    that leads no partition where there is one), "two" (the leader and that follower),
    "all" (every nsqd), "lookupd+leader"."""
    lead = await ctx.leader()
    if who == "leader":
        return [lead]
    followers = await ctx.followers()
    # a follower that leads no partition, where there is one: a follower alone
    leading = {n for t in (ORDERED, PLAIN) for n in (await ctx.cl.leaders(t)).values()}
    follower = next((n for n in followers if n not in leading), followers[0])
    if who == "follower":
        return [follower]
    if who == "two":
        return [lead, follower]
    if who == "all":
        return list(ctx.cl.nsqd)
    if who == "lookupd+leader":
        return [*ctx.cl.lookupd, lead]
    raise ValueError(who)


def power_cut(who: str, mode: str = "all", down: float = 3.0) -> Inject:
    """Cut the power of ``who`` at a random moment (SIGKILL, the unsynced writes lost as
    ``mode`` says), keep them down ``down`` s, start them again on what was durable."""

    async def inject(ctx: Context) -> None:
        await asyncio.sleep(ctx.rng.uniform(0, 2))
        names = await _pick(ctx, who)
        ctx.strike()
        await ctx.run(ctx.cl.power_off, names, mode, ctx.rng.randrange(1 << 30))
        await asyncio.sleep(ctx.secs(down))
        for name in names:
            await ctx.run(ctx.cl.restart, name)

    return inject


def _segment(ctx: Context, name: str, suffixes: tuple[str, ...] = (".seg",)) -> str:
    """A random file of ord:0's log on ``name`` (the largest segment, for .seg alone)."""
    files = ctx.cl.files(name, f"{ORDERED}.topic/p0", suffixes)
    if not files:
        files = ctx.cl.files(name, "", suffixes)
    if not files:
        raise RuntimeError(f"{name} has no {suffixes} file")
    if suffixes == (".seg",):
        root = ctx.cl.run_dir / name
        return max(files, key=lambda f: (root / f).stat().st_size)
    return ctx.rng.choice(files)


def damaged(who: str, how: str, failover: bool = True, down: float = 3.0) -> Inject:
    """``who`` (leader or follower of ord:0) is killed, one of its ord:0 segments gets a
    flipped bit (``how`` = "flip") or is cut at a random length ("truncate") on its
    disk, it is started again; then (``failover``) the partition's leader is killed and
    started again 5 s later."""

    async def inject(ctx: Context) -> None:
        await asyncio.sleep(ctx.rng.uniform(0, 2))
        (name,) = await _pick(ctx, who)
        ctx.strike()
        await ctx.run(ctx.cl.kill, name)
        if how == "flip":
            path = _segment(ctx, name, (".seg", ".idx"))
            await ctx.run(ctx.cl.flip_bit, name, path, ctx.rng.randrange(1 << 30))
        else:
            path = _segment(ctx, name)
            size = (ctx.cl.run_dir / name / path).stat().st_size
            await ctx.run(ctx.cl.truncate, name, path, ctx.rng.randrange(size))
        await asyncio.sleep(ctx.secs(down))
        await ctx.run(ctx.cl.restart, name)
        if failover:
            await asyncio.sleep(ctx.secs(5))
            lead = await ctx.leader()
            await ctx.run(ctx.cl.kill, lead)
            await asyncio.sleep(ctx.secs(5))
            await ctx.run(ctx.cl.restart, lead)

    return inject


#: the checks of every storage scenario: schedules kept, positions not moved back,
#: every partition back in service
_STRICT = ("schedule", "positions", "resumed")
_SYNC = ("--sync-before-ack",)


def _power(name: str, inject: Inject, **kw: object) -> Scenario:
    kw.setdefault("strict", _STRICT)
    return Scenario(name, inject, faultfs=True, deferred_ms=5000, **kw)  # type: ignore[arg-type]


#: issue 43's power-loss and corruption scenarios (docs/replication.md, "Fault injection")
STORAGE: list[Scenario] = [
    # the control: the same cluster on faultfs, the leader SIGKILLed (its page cache kept)
    _power("killed: the leader, no power cut", leader_killed),
    _power(
        "power: one nsqd, sync-before-ack",
        power_cut("leader"),
        replicator=1,
        nsqd_args=_SYNC,
    ),
    _power("power: one nsqd, defaults", power_cut("leader"), replicator=1, loss_window=2.5),
    _power("power: all nodes at once", power_cut("all")),
    _power("power: all nodes, sync-before-ack", power_cut("all"), nsqd_args=_SYNC),
    _power("power: the leader alone", power_cut("leader")),
    _power("power: a follower alone", power_cut("follower")),
    _power("power: two of three", power_cut("two")),
    _power("power: lookupd and the leader", power_cut("lookupd+leader")),
    _power(
        "torn: one nsqd, sync-before-ack",
        power_cut("leader", "torn"),
        replicator=1,
        nsqd_args=_SYNC,
    ),
    _power("torn: the leader alone", power_cut("leader", "torn")),
    _power("torn: all nodes, sync-before-ack", power_cut("all", "torn"), nsqd_args=_SYNC),
    _power("reorder: all nodes, sync-before-ack", power_cut("all", "reorder"), nsqd_args=_SYNC),
    _power(
        "flip: one nsqd's segment",
        damaged("leader", "flip", failover=False),
        replicator=1,
        max_lost=2,
    ),
    _power("flip: a follower's segment, failover", damaged("follower", "flip")),
    _power("flip: the leader's segment, failover", damaged("leader", "flip")),
    _power("truncate: a follower's segment, failover", damaged("follower", "truncate")),
    _power("truncate: the leader's segment, failover", damaged("leader", "truncate")),
]


SCENARIOS: list[Scenario] = [
    Scenario("leader killed", leader_killed, short=True),
    Scenario("leader drained (SIGTERM)", leader_drained, short=True),
    Scenario("leader stopped 10s", leader_stopped(10), short=True),
    Scenario("leader stopped 30s", leader_stopped(30)),
    Scenario("leader isolated 10s", leader_isolated, short=True),
    Scenario("leader cut from nsqlookupd", leader_cut_from_lookupd),
    Scenario("leader cut from its followers", leader_cut_from_followers),
    Scenario("follower cut from the leader", follower_cut_from_leader),
    Scenario("one-way: leader -> nsqlookupd", oneway_leader_to_lookupd),
    Scenario("one-way: nsqlookupd -> leader", oneway_lookupd_to_leader),
    Scenario("one-way: leader -> followers", oneway_leader_to_followers),
    Scenario("no connect nsqlookupd->leader", lookupd_cannot_connect_to_leader),
    Scenario("200ms delay, 5% loss", delay_and_loss, short=True),
    Scenario("flapping link 2s", flapping_link),
    Scenario("leader's disk full", leader_disk_full, tmpfs_mb=48),
    Scenario("etcd: leading lookupd+leader killed", leading_lookupd_killed_with_leader, lookupds=3),
    Scenario(
        "etcd: lookupd isolated, leader dies", leading_lookupd_isolated_leader_killed, lookupds=3
    ),
    Scenario(
        "etcd: lookupd stopped, leader dies", leading_lookupd_stopped_leader_killed, lookupds=3
    ),
    Scenario("etcd: a member killed", etcd_member_killed, lookupds=3),
    *STORAGE,
]
