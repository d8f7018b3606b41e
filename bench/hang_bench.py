"""The hang doctor's series: injected hangs of 4 gloo ranks over 2 executors
(local-cluster[2,2,1024], function mode), hangAction=cancel, each kind N times with the
stuck rank going round 0..3.

    .venv/bin/python -m bench.hang_bench [--per-kind 10] [--timeout 3s] [--kinds sleep,...]

A run counts as correct when the doctor's one line names exactly the stuck rank and, but
for SIGSTOP, its function (tests/e2e/agent_scripts/hang_worker.py), and every other rank
waits in all_reduce (a miss prints every rank's stacks on stderr). "named after" is the
driver's time from the ranks' last line (the stuck rank prints one right before it hangs)
to the line naming the culprit: the goal is within hangTimeout + 10 s. Prints one JSON
line per run and a summary per kind.
"""
import json
import os
import sys
import time

from pyspark import cloudpickle

from bench import harness
from torchspark import TorchDistributor, TorchDistributorError

hang_worker = harness.helper("hang_worker")
cloudpickle.register_pickle_by_value(hang_worker)

FUNCS = {"sleep": "sleeps_before_the_collective", "lock": "deadlocks_on_a_lock",
         "loop": "spins_forever", "sigstop": None}


def one(kind, victim, timeout):
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False,
                         hang_timeout=timeout, hang_action="cancel")
    t0 = time.monotonic()
    try:
        d.run(hang_worker.train, kind, victim)
        error = "the run did not fail"
    except TorchDistributorError as e:
        error = None if e.report and e.report.get("kind") == "hang" else str(e)[:300]
    wall = time.monotonic() - t0
    diag = d.hang_reports[0] if d.hang_reports else None
    func = FUNCS[kind]
    others = [r for r in range(4) if r != victim]
    ok = (error is None and diag is not None and diag.culprits == [victim]
          and (f"({func})" in diag.line if func else "stopped (SIGSTOP)" in diag.line)
          and diag.waiting == {"all_reduce": others})
    if diag is not None and not ok:  # a miss explains itself: every rank's stacks
        print(f"--- {kind} victim {victim}: {diag.line}\n{diag.stacks_text()}",
              file=sys.stderr, flush=True)
    return {"kind": kind, "victim": victim, "correct": ok,
            "named_after_s": round(diag.after_s, 2) if diag else None,
            "run_s": round(wall, 1), "line": diag.line if diag else None, "error": error}


def main():
    ap = harness.cli(__doc__, runs=None, quick={"per_kind": 1, "kinds": "sleep"})
    ap.add_argument("--per-kind", type=int, default=10, help="runs of each kind (default 10)")
    ap.add_argument("--timeout", default="3s")
    ap.add_argument("--kinds", default="sleep,sigstop,lock,loop")
    args = harness.parse(ap)
    run = harness.Run("hang_bench", args)
    os.environ.setdefault("TORCHSPARK_WARM_IDLE_TIMEOUT", "60s")
    spark = harness.spark_session("local-cluster[2,2,1024]")
    results = []
    try:
        for kind in args.kinds.split(","):
            for i in range(args.per_kind):
                r = one(kind, i % 4, args.timeout)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        spark.stop()
    limit = float(args.timeout.rstrip("s")) + 10
    for kind in args.kinds.split(","):
        mine = [r for r in results if r["kind"] == kind]
        after = run.figure(f"{kind}: named after", [r["named_after_s"] for r in mine
                                                      if r["named_after_s"] is not None], "s", 2)
        print(json.dumps({
            "kind": kind, "runs": len(mine), "correct": sum(r["correct"] for r in mine),
            "named_after_median_s": after["median"], "named_after_max_s": after["max"],
            f"within_{limit:g}s": sum(a <= limit for a in after["samples"]),
            "run_median_s": harness.median(r["run_s"] for r in mine),
        }), flush=True)
    run.results = {"runs": results}
    run.finish()


if __name__ == "__main__":
    main()
