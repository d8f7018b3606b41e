"""Recovery from executor loss (issue 20): N SIGKILLs of an executor JVM (a random node's,
rank 0's or another's, each after a random number of steps of its attempt) during one
torchspark run with max_restarts=N on local-cluster[2,1,1024]; then the same kill on stock
PySpark TorchDistributor.

Per kill: the recovery time, from the SIGKILL to the first training step of the resumed
attempt (rank 0's step log, tests/e2e/agent_scripts/resume_train.py). Checked: every kill
recovered, the final weights bit-identical to an uninterrupted run's, no step skipped, no
training process left.

    .venv/bin/python bench/restart_bench.py [KILLS=20] [SEED=1]
"""
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import test_restart as tr  # noqa: E402
import tsp_spark  # noqa: E402
from torchspark import TorchDistributor  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    kills = [rng.randrange(2) for _ in range(n)]
    after = [rng.randint(3, 2 * tr.STEPS_PER_ATTEMPT) for _ in range(n)]
    steps = sum(after) + 10
    spark = tsp_spark.session("local-cluster[2,1,1024]", {
        f"spark.executorEnv.{tsp_spark.MARK}": tr.MARK_VALUE,
        "spark.torchspark.job.replacementTimeout": "180s",
    })
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
        # Stock on the same kill: the job fails.
        t0 = time.time()
        stock = "did not fail"
        try:
            tr.test_stock_fails_on_the_same_kill(spark, tmp)
            stock = "the job failed (barrier ResultStage aborted)"
        except AssertionError as e:
            stock = f"unexpected: {e}"
        stock_s = time.time() - t0
    finally:
        spark.stop()
    by = {0: [r for r, k in zip(recovery, kills, strict=True) if k == 0],
          1: [r for r, k in zip(recovery, kills, strict=True) if k == 1]}
    res = {
        "kills": n, "recovered": len(recovery), "bit_identical": identical,
        "left": len(left), "steps": steps, "reference_s": round(ref_s, 1),
        "killed_run_s": round(run_s, 1),
        "recovery_s": [round(r, 2) for r in recovery],
        "median_s": round(statistics.median(recovery), 2),
        "min_s": round(min(recovery), 2), "max_s": round(max(recovery), 2),
        "median_rank0_executor_s": round(statistics.median(by[0]), 2) if by[0] else None,
        "median_other_executor_s": round(statistics.median(by[1]), 2) if by[1] else None,
        "stock": stock, "stock_s": round(stock_s, 1),
    }
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
