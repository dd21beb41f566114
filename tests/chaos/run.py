"""The fault-injection suite: ``make chaos`` (every scenario), or
``python tests/chaos/run.py --short`` (what CI runs), as root on Linux.

For each scenario: a network lab of its own (tests/chaos/netns.py), a cluster in it
(three nsqd and one nsqlookupd, or three nsqlookupd over a three-member etcd), two
replicated topics (``plain``: 2 partitions; ``ord``: 2 ordered partitions), publishers
and consumers running throughout; the fault is injected, held, undone; then every
acknowledged message is read back and the checker (tests/chaos/checker.py) gives the
verdict. A table at the end, one row per run; ``--json`` writes every verdict with its
epoch history. Exit status 1 if any run broke an invariant (lost, phantom, order,
fenced acknowledgement).

Options: ``--scenario NAME`` (repeatable; a substring), ``--repeat N``, ``--short``
(the CI set, faults scaled down), ``--scale F`` (fault durations), ``--replicator N``,
``--keep DIR`` (keep logs and data there), ``--list``, ``--storage`` (only the power-loss
and corruption scenarios, whose nodes keep their data on faultfs, tests/faultfs; they
are skipped, with the reason, where FUSE is unavailable), ``--seed N`` (the random
timings and cut seeds of each run; otherwise random, and printed in the timeline).

``--target youzan`` runs the same scenarios, workload and checker against Youzan's
nsqd and nsqlookupd (tests/chaos/youzan_cluster.py; the reference binaries next to the
checkout, in ../shared, only), for a side-by-side comparison. Its failover waits for
etcd's 20 s TTL, so its runs keep writing longer after the fault (``--after S``
overrides either target's window), and it keeps no leader history: fenced acks are
"n/a". Scenarios it cannot run are skipped with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos import youzan_cluster
from chaos.checker import HEADER, Verdict, judge
from chaos.cluster import ChaosCluster
from chaos.netns import Lab
from chaos.scenarios import ORDERED, PLAIN, SCENARIOS, Context, Scenario
from chaos.workload import Workload
from chaos.youzan_cluster import YouzanCluster
from faultfs import unavailable as faultfs_unavailable

#: seconds of traffic before the fault, and after it is undone
WARMUP = 3.0
AFTER = 5.0
TARGETS = ("nsqx", "youzan")


async def _run_one(
    sc: Scenario,
    lab: Lab,
    cl: ChaosCluster,
    scale: float,
    log: list[str],
    after: float = AFTER,
    seed: int | None = None,
) -> Verdict:
    await cl.wait_ready()
    await cl.create_topic(PLAIN, 2, sc.replicator, ordered=False)
    await cl.create_topic(ORDERED, 2, sc.replicator, ordered=True)
    if isinstance(cl, YouzanCluster):
        took = await cl.wait_writable()
        lab.events.append((time.time(), f"youzan: topics writable after {took:.1f}s"))
    wl = Workload(cl, [(PLAIN, 2, False), (ORDERED, 2, True)], deferred_ms=sc.deferred_ms)
    wl.start()
    # every partition acknowledging before the fault
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        parts = {(s.topic, s.pid) for s in wl.rec.acked()}
        if len(parts) == 4:
            break
        if loop.time() > deadline:
            raise RuntimeError(f"not every partition takes writes: {sorted(parts)}")
        await asyncio.sleep(0.1)
    await asyncio.sleep(WARMUP)
    if seed is None:
        seed = random.randrange(1 << 32)
    lab.events.append((time.time(), f"seed {seed}"))
    ctx = Context(lab, cl, scale, random.Random(seed))
    fault_at = time.time()
    lab.events.append((fault_at, f"fault: {sc.name}"))
    await sc.inject(ctx)
    fault_at = ctx.struck or fault_at
    lab.events.append((time.time(), "fault undone"))
    await asyncio.to_thread(cl.heal_processes)
    await asyncio.sleep(after)
    stopped_at = time.time()
    await wl.stop_publishing()
    await wl.drain()
    histories = {t: await cl.history(t) for t in (PLAIN, ORDERED)}
    await cl.learn_node_ids()
    youzan = isinstance(cl, YouzanCluster)
    verdict = judge(
        sc.name,
        wl.rec,
        histories,
        cl.node_ids,
        fault_at,
        {ORDERED},
        fenced_known=not youzan,
        stopped_at=stopped_at,
        loss_window=sc.loss_window,
        max_lost=sc.max_lost,
        strict=sc.strict,
    )
    if youzan:
        verdict.target = "youzan"
        verdict.details[:0] = youzan_cluster.polled_fenced(wl.rec, histories, cl.host_of_node)
    return verdict


async def _run_and_close(
    sc: Scenario,
    lab: Lab,
    cl: ChaosCluster,
    scale: float,
    log: list[str],
    after: float = AFTER,
    seed: int | None = None,
) -> Verdict:
    try:
        return await _run_one(sc, lab, cl, scale, log, after, seed)
    finally:
        await cl.aclose()
        log.append(lab.timeline())


def run_scenario(
    sc: Scenario,
    scale: float,
    keep: Path | None,
    target: str = "nsqx",
    after: float = AFTER,
    seed: int | None = None,
) -> Verdict:
    base = Path(tempfile.mkdtemp(prefix=f"{target}-chaos-", dir=keep))
    log: list[str] = []
    with Lab() as lab:
        kind = YouzanCluster if target == "youzan" else ChaosCluster
        cl = kind(
            lab,
            base,
            lookupds=sc.lookupds,
            tmpfs_mb=sc.tmpfs_mb,
            faultfs=sc.faultfs,
            nsqd_args=sc.nsqd_args,
        )
        try:
            cl.build()
            lab.enter(lab.hub)
            try:
                verdict = asyncio.run(_run_and_close(sc, lab, cl, scale, log, after, seed))
            finally:
                lab.leave()
        except Exception as err:
            verdict = Verdict(sc.name, 0, 0, 0, 0, -1, -1, 0, -1, -1, 0.0, target=target)
            verdict.details.append(f"the run failed: {type(err).__name__}: {err}")
        finally:
            cl.close()
    (base / "timeline.txt").write_text("\n".join(log) + "\n")
    (base / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=1))
    if keep is None and verdict.ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        verdict.details.append(f"logs: {base}")
    return verdict


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--replicator", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--storage", action="store_true", help="the faultfs scenarios only")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--target", choices=TARGETS, default="nsqx")
    ap.add_argument(
        "--after",
        type=float,
        default=None,
        help=f"seconds of traffic after the fault is undone (nsqx: {AFTER:g}, "
        f"youzan: {youzan_cluster.AFTER:g})",
    )
    args = ap.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.short or s.short]
    if args.storage:
        chosen = [s for s in chosen if s.faultfs]
    if args.scenario:
        chosen = [s for s in chosen if any(p == s.name for p in args.scenario)] or [
            s for s in chosen if any(p in s.name for p in args.scenario)
        ]
    if args.list:
        for s in chosen:
            print(s.name)
        return 0
    why = Lab.unavailable()
    if why:
        print(f"chaos: cannot run here: {why}", file=sys.stderr)
        return 2
    after = args.after if args.after is not None else AFTER
    if any(s.faultfs for s in chosen):
        why = faultfs_unavailable()
        if why:
            print(f"skipped: the power-loss and corruption scenarios: {why}", flush=True)
            chosen = [s for s in chosen if not s.faultfs]
    if args.target == "youzan":
        why = youzan_cluster.unavailable()
        if why:
            print(f"chaos: --target youzan: {why}", file=sys.stderr)
            return 2
        after = args.after if args.after is not None else youzan_cluster.AFTER
        for s in chosen:
            skip = youzan_cluster.unsupported(s.name)
            if skip:
                print(f"skipped for youzan: {s.name}: {skip}", flush=True)
        chosen = [s for s in chosen if not youzan_cluster.unsupported(s.name) and not s.faultfs]
    scale = args.scale if args.scale is not None else (0.5 if args.short else 1.0)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    verdicts: list[Verdict] = []
    # SIGINT and SIGTERM stop the whole run, through every cleanup on the way out (the
    # namespaces, iptables rules and processes of the running scenario); asyncio.run's
    # own SIGINT handling only cancels a scenario, which may then end as if done
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        for _ in range(args.repeat):
            for sc in chosen:
                if args.replicator is not None:
                    sc.replicator = args.replicator
                began = time.monotonic()
                v = run_scenario(sc, scale, args.keep, args.target, after, args.seed)
                verdicts.append(v)
                print(f"{v.row()}   ({time.monotonic() - began:.0f}s)", flush=True)
                for line in v.details[:12]:
                    print(f"    {line}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the runs done so far follow", flush=True)
        verdicts.append(Verdict("(interrupted)", 0, 0, 0, 0, -1, -1, 0, -1, -1, 0.0))
    print()
    print(HEADER)
    for v in verdicts:
        print(v.row())
        for key, lines in v.history.items():
            if len(lines) > 1:
                print(f"    {key}: " + " | ".join(lines[-4:]))
    if args.json is not None:
        args.json.write_text(json.dumps([v.to_json() for v in verdicts], indent=1))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
