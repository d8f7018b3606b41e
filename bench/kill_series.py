"""Issue 20's series: N faults (default 20) on the network-namespace multi-host cluster
(tests/helpers/netns_cluster.py: needs root and network namespaces, as tests/cluster does),
each at a random time, cycling the three kinds: SIGKILL of a non-rank-0 executor JVM
(exec_kill), a host's link taken down (link_cut), SIGKILL of rank 0's executor JVM
(rank0_kill). The faults run in rounds of (by default) 3: each round is a fresh 3-worker
cluster and one torchspark job with max_restarts = the round's faults and min_nodes=1, which
must recover from each of them (tests/cluster/kill_series.py, the same code as the CI test
test_faults.py::test_three_faults_restart_in_one_job, 3 rounds of 3). A cut host stays gone for
the round.

Per fault: kind, victim host (and its ranks), the time from the fault to the first step of
the next attempt (the ranks' own clocks: time.time() on one machine), the time the driver
named the root cause; per round: the training processes left on any host after the run (the
marker census) and the lines lost: every ``TSPLINE`` line a rank printed (and recorded in its
file) must be in the driver's output, prefixed ``[attempt k] [rank r]`` with its own attempt
k. Lines the victim's ranks printed after the fault (their executor or network gone) are
counted apart as undeliverable. Prints a table and the totals.

    sudo .venv/bin/python -m bench.kill_series [KILLS=20] [PER_ROUND=3] [MAX_DELAY_S=4] [SEED]
        [--kinds=exec_kill,rank0_kill,link_cut] [--phases] [--no-revive] [--replacement]

--kinds: the kinds to cycle, in this order (default: the three). --phases: each fault's
timeline too (kill_series.PHASES: Spark's status store, the task's TORCHSPARK_TIMING marks,
the training processes' own), and the median of each phase by kind. --no-revive: the
driver does not ask Spark for offers while a restarted attempt's tasks wait for cores
(torchspark.driver._job.REVIVE_ON_RESTART off: the side-by-side "before"). --replacement: no
min_nodes, so each next attempt waits for the killed executor's replacement (the standalone
worker starts a new executor JVM) and runs on every worker again: the replacement path
(with --kinds=exec_kill,rank0_kill; a cut host has no replacement).
"""

import os
import sys
import tempfile
import time

from bench import harness

# tests/cluster's helpers: the series (kill_series.py) needs its harness.py and the cluster.
nc, _, ks = harness.helpers("netns_cluster", "cluster_harness", "kill_series")


def main() -> int:
    ap = harness.cli(__doc__, runs=None, quick={"kills": 1, "per_round": 1, "max_delay": 1.0})
    ap.add_argument("kills", nargs="?", type=int, default=20, help="faults in all (default 20)")
    ap.add_argument("per_round", nargs="?", type=int, default=3, help="faults a round (default 3)")
    ap.add_argument("max_delay", nargs="?", type=float, default=4.0,
                    help="the most seconds before a fault (default 4)")
    ap.add_argument("seed", nargs="?", type=int, default=None, help="default: the time")
    ap.add_argument("--kinds", default=",".join(ks.KINDS), help="the kinds to cycle, in this order")
    ap.add_argument("--phases", action="store_true", help="each fault's timeline too")
    ap.add_argument("--no-revive", action="store_true", help="REVIVE_ON_RESTART off (the before)")
    ap.add_argument("--replacement", action="store_true", help="no min_nodes: wait for replacements")
    args = harness.parse(ap)
    kills, per_round, max_delay = args.kills, args.per_round, args.max_delay
    seed = args.seed if args.seed is not None else int(time.time())
    cycle = args.kinds.split(",")
    if [k for k in cycle if k not in ks.KINDS] or not cycle:
        ap.error(f"--kinds={args.kinds}: give kinds among {','.join(ks.KINDS)}")
    timeline = args.phases
    patch = {"torchspark.driver._job": {"REVIVE_ON_RESTART": False}} if args.no_revive else None
    min_nodes = None if args.replacement else 1
    run = harness.Run("kill_series", args)
    why = nc.namespaces_supported()
    if why:
        print(f"kill_series: the namespace cluster is unavailable: {why}", file=sys.stderr)
        return 2
    kinds = [cycle[i % len(cycle)] for i in range(kills)]
    rows, rounds = [], []
    t_start = time.monotonic()
    for rnd, i in enumerate(range(0, kills, per_round)):
        part = kinds[i:i + per_round]
        c = nc.NetnsCluster(workers=3, run_dir=tempfile.mkdtemp(prefix="tsp-kills-"))
        try:
            c.start()
            t0 = time.monotonic()
            try:
                s = ks.run_series(c, part, steps=150, sleep=0.1, max_delay=max_delay,
                                  seed=seed + rnd, tag=f"round{rnd}", timeline=timeline,
                                  patch=patch, min_nodes=min_nodes,
                                  log=lambda m, r=rnd: print(f"  round {r}: {m}", flush=True))
                err = None if s["result"]["ok"] else s["result"]["error"]
            except AssertionError as e:
                s, err = None, str(e)
            wall = time.monotonic() - t0
        finally:
            c.stop()
            left_after_stop = c.leftovers()
        if s is None:
            rounds.append({"round": rnd, "ok": False, "error": err[:2000], "wall": wall})
            print(f"round {rnd}: FAILED: {err[:2000]}", flush=True)
            continue
        for f in s["faults"]:
            rows.append(dict(f, round=rnd, ok=s["result"]["ok"]))
        rounds.append({"round": rnd, "ok": s["result"]["ok"], "error": err, "wall": wall,
                       "nodes": [a["nodes"] for a in s["attempts"]], "left": s["left"],
                       "written": s["written"], "lost": s["lost"],
                       "undeliverable": s["undeliverable"], "wrong": s["wrong_prefix"],
                       "teardown_left": left_after_stop})
        rr = rounds[-1]
        print(f"round {rnd}: ok={rr['ok']} attempts' nodes {rr['nodes']} lines "
              f"{rr['written']} lost {len(rr['lost'])} undeliverable {len(rr['undeliverable'])}"
              f" wrong-prefix {len(rr['wrong'])} processes left {len(rr['left'])} "
              f"wall {wall:.0f}s" + (f" error {err[:300]}" if err else ""), flush=True)
        for f in s["faults"]:
            print(f"  round {rnd}: {f['kind']} on {f['victim']} (ranks {f['victim_ranks']}): "
                  f"named after {f['noticed_after_s']} s, resumed after "
                  f"{f['resumed_after_s']} s", flush=True)
            if timeline:
                print(f"    phases (s after the fault): {f['phases']}", flush=True)

    print()
    print(f"{'#':>3} {'round':>5} {'kind':<11} {'victim':<12} {'ranks':<7} {'step':>4} "
          f"{'noticed_s':>9} {'resumed_s':>9} recovered")
    for n, f in enumerate(rows):
        print(f"{n:>3} {f['round']:>5} {f['kind']:<11} {f['victim']:<12} "
              f"{','.join(map(str, f['victim_ranks'])):<7} {f['step_at_fault']:>4} "
              f"{f['noticed_after_s'] if f['noticed_after_s'] is not None else '-':>9} "
              f"{f['resumed_after_s'] if f['resumed_after_s'] is not None else '-':>9} "
              f"{'yes' if f['resumed_after_s'] is not None and f['ok'] else 'NO'}")
    recovered = sum(1 for f in rows if f["resumed_after_s"] is not None and f["ok"])
    failed_rounds = [r for r in rounds if not r["ok"]]
    print()
    print(f"faults: {kills} asked, {len(rows)} injected, {recovered} recovered; rounds "
          f"{len(rounds)}, failed {len(failed_rounds)}")
    for kind in ks.KINDS:
        v = [f["resumed_after_s"] for f in rows if f["kind"] == kind
             and f["resumed_after_s"] is not None]
        if v:
            s = run.figure(f"{kind}: fault -> first resumed step", v, "s", 2)
            print(f"  {kind:<11} fault -> first resumed step: median {s['median']:.1f} s"
                  f" (min {s['min']:.1f}, max {s['max']:.1f}, n={s['n']})")
    if timeline:
        print("median phases, seconds after the fault (kind: n):")
        used = [k for k in ks.KINDS if any(f["kind"] == k for f in rows)]
        print(f"  {'phase':<52} " + " ".join(f"{k:>10}" for k in used))
        for key, what in ks.PHASES:
            cells = []
            for k in used:
                v = [f["phases"][key] for f in rows if f["kind"] == k
                     and f.get("phases", {}).get(key) is not None]
                cells.append(f"{harness.median(v):>10.2f}" if v else f"{'-':>10}")
            print(f"  {what:<52} " + " ".join(cells))
    ok = [r for r in rounds if "left" in r]
    print(f"processes left on any host after the runs: {sum(len(r['left']) for r in ok)}; "
          f"after teardown: {sum(len(r['teardown_left']) for r in ok)}")
    print(f"lines: {sum(r['written'] for r in ok)} printed by the ranks, "
          f"{sum(len(r['lost']) for r in ok)} lost, "
          f"{sum(len(r['wrong']) for r in ok)} with a wrong attempt prefix, "
          f"{sum(len(r['undeliverable']) for r in ok)} undeliverable (victim, after the fault)")
    for r in ok:
        if r["lost"]:
            print(f"  round {r['round']} lost (attempt, rank, step): {r['lost'][:20]}")
    print(f"wall {time.monotonic() - t_start:.0f} s; {run.load()}; {os.cpu_count()} CPUs")
    run.results = {"seed": seed, "faults": rows, "rounds": rounds}
    run.finish()
    return 0 if recovered == kills and not failed_rounds and all(
        not r["lost"] and not r["left"] for r in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
