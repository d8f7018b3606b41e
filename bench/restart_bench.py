"""Recovery from executor loss (issue 20): N SIGKILLs of an executor JVM (a random node's,
rank 0's or another's, each after a random number of steps of its attempt) during one
torchspark run with max_restarts=N on local-cluster[2,1,1024]; then the same kill on stock
PySpark TorchDistributor.

Per kill: the recovery time, from the SIGKILL to the first training step of the resumed
attempt (rank 0's step log, tests/e2e/agent_scripts/resume_train.py). Checked: every kill
recovered, the final weights bit-identical to an uninterrupted run's, no step skipped, no
training process left.

    .venv/bin/python -m bench.restart_bench [KILLS=20] [SEED=1]
"""
import json
import random
import tempfile
import time
from pathlib import Path

from bench import harness

tsp_spark, tr = harness.helpers("tsp_spark", "test_restart")


def restart_session():
    """local-cluster[2,1,1024] with the suites' process mark and a 180 s replacement wait."""
    return harness.spark_session("local-cluster[2,1,1024]", {
        f"spark.executorEnv.{tsp_spark.MARK}": tr.MARK_VALUE,
        "spark.torchspark.job.replacementTimeout": "180s",
    })


def stock_on_the_same_kill(spark, tmp: Path) -> dict:
    """Stock PySpark TorchDistributor on the same kill (test_restart's stock test): the job
    fails."""
    t0 = time.time()
    stock = "did not fail"
    try:
        tr.test_stock_fails_on_the_same_kill(spark, tmp)
        stock = "the job failed (barrier ResultStage aborted)"
    except AssertionError as e:
        stock = f"unexpected: {e}"
    return {"stock": stock, "stock_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = harness.cli(__doc__, runs=None, quick={"kills": 1})
    ap.add_argument("kills", nargs="?", type=int, default=20, help="SIGKILLs in the run (default 20)")
    ap.add_argument("seed", nargs="?", type=int, default=1, help="the kills' random seed (default 1)")
    args = harness.parse(ap)
    run = harness.Run("restart_bench", args)
    n = args.kills
    rng = random.Random(args.seed)
    kills = [rng.randrange(2) for _ in range(n)]
    after = [rng.randint(3, 2 * tr.STEPS_PER_ATTEMPT) for _ in range(n)]
    steps = sum(after) + 10
    from torchspark import TorchDistributor

    spark = restart_session()
    tmp = Path(tempfile.mkdtemp(prefix="restart-bench-"))
    try:
        t0 = time.time()
        ref = tr._train(tmp, "ref", steps,
                        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False))
        ref_s = time.time() - t0
        t0 = time.time()
        files, killed, error = tr.run_with_kills(tmp, "killed", kills, steps, n, after)
        run_s = time.time() - t0
        assert error is None, f"the run failed: {error!r}"
        recovery = tr.check_resumed(tr._steplog(files["steplog"]), killed, n, steps)
        identical = files["out"].read_text() == ref["out"].read_text()
        left = tsp_spark.wait_gone(tr.MARK_VALUE, 15)
        stock = stock_on_the_same_kill(spark, tmp)
    finally:
        spark.stop()
    fig = run.figure("kill -> first resumed step", recovery, "s", 2)
    by = {k: run.figure(f"kill -> first resumed step, {what}",
                        [r for r, x in zip(recovery, kills, strict=True) if x == k], "s", 2)
          for k, what in ((0, "rank 0's executor"), (1, "the other executor"))}
    res = {
        "kills": n, "recovered": len(recovery), "bit_identical": identical,
        "left": len(left), "steps": steps, "reference_s": round(ref_s, 1),
        "killed_run_s": round(run_s, 1),
        "recovery_s": fig["samples"], "median_s": fig["median"],
        "min_s": fig["min"], "max_s": fig["max"],
        "median_rank0_executor_s": by[0]["median"], "median_other_executor_s": by[1]["median"],
        **stock,
    }
    print(json.dumps(res, indent=1))
    run.results = res
    run.finish()


if __name__ == "__main__":
    main()
