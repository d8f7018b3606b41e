"""Elastic size that grows back (issue 31): cycles of one run each on
local-cluster[3,1,1024] with num_processes=3, max_restarts=1, min_nodes=2: node 1's
executor JVM is SIGKILLed mid-training, the run goes on with 2 nodes at once, the standalone
worker registers a replacement executor, and the driver grows the run back to 3 nodes from
the step it checkpointed on request (test_restart.grow_back, the suite's 2-node test).

Per cycle: passed (nodes 3 -> 2 -> 3, 0 steps lost when it grew, no training process left),
the time from Spark's 3 slots to the 2-node attempt stopped at its checkpoint (the driver's
part), and to the first step on 3 nodes (the regrow, a new attempt's start included).

    .venv/bin/python -m bench.grow_bench [--runs 10] [--quick]
"""
import json
import tempfile
import time
from pathlib import Path

from bench import harness

tsp_spark, tr = harness.helpers("tsp_spark", "test_restart")


def cycle(spark, tmp: Path, i: int) -> dict:
    t0 = time.time()
    got = tr.grow_back(spark, tmp, f"cycle{i}", nodes=3)
    att, log, back = got["attempts"], got["log"], got["back"]
    last1 = [s for a, s, _ in log if a == "1"][-1] if any(a == "1" for a, _, _ in log) else None
    grown = [s for a, s, _ in log if a == "2"]
    left = tsp_spark.wait_gone(tr.MARK_VALUE, 15)
    ok = ([a["nodes"] for a in att] == [3, 2, 3] and last1 is not None and bool(grown)
          and grown[0] == last1 + 1 and not left and back is not None)
    first2 = next((ts for a, _, ts in log if a == "2"), None)
    return {"passed": ok, "nodes": [a["nodes"] for a in att], "left": len(left),
            "stopped_s": round(att[1]["ended"] - back, 2) if ok else None,
            "regrow_s": round(first2 - back, 2) if ok and first2 else None,
            "cycle_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = harness.cli(__doc__, runs=10)
    args = harness.parse(ap)
    run = harness.Run("grow_bench", args)
    spark = harness.spark_session("local-cluster[3,1,1024]", {
        f"spark.executorEnv.{tsp_spark.MARK}": tr.MARK_VALUE,
        "spark.torchspark.job.replacementTimeout": "180s",
    })
    cycles = []
    try:
        for i in range(args.runs):
            try:
                cycles.append(cycle(spark, Path(tempfile.mkdtemp(prefix="grow-bench-")), i))
            except AssertionError as e:
                cycles.append({"passed": False, "error": str(e)[:300]})
            print(json.dumps(cycles[-1]), flush=True)
    finally:
        spark.stop()
    ok = [c for c in cycles if c["passed"]]
    stopped = run.figure("3 slots -> the 2-node attempt stopped", [c["stopped_s"] for c in ok], "s", 2)
    regrow = run.figure("3 slots -> first step on 3 nodes", [c["regrow_s"] for c in ok], "s", 2)
    res = {"cycles": len(cycles), "passed": len(ok), "stopped_median_s": stopped["median"],
           "regrow_median_s": regrow["median"], "regrow_max_s": regrow["max"], "each": cycles}
    print(json.dumps(res, indent=1))
    run.results = res
    run.finish()


if __name__ == "__main__":
    main()
