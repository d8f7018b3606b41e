"""The barrier job's two Spark APIs side by side on a classic session: the RDD barrier API
(what torchspark.TorchDistributor uses on classic sessions) against
DataFrame.mapInArrow(barrier=True) (what it uses under Spark Connect, and what PySpark's
own TorchDistributor uses everywhere). Alternating, after one warm-up each, medians of N.

    .venv/bin/python -m bench.job_api_bench [--runs 7]

Cases on local-cluster[2,1,1024], 2 tasks: a bare barrier job (one allGather, a 100-byte
row back), and TorchDistributor.run() of a function that returns a number (no torch
import) through each API.
"""
import json
import time

from bench import harness
from torchspark import TorchDistributor
from torchspark.driver import _job


def bare_rdd_task(_):
    from pyspark import BarrierTaskContext
    BarrierTaskContext.get().allGather("x")
    yield b"r" * 100


def bare_arrow_task(batches):
    import pyarrow as pa
    from pyspark import BarrierTaskContext
    for _ in batches:
        pass
    BarrierTaskContext.get().allGather("x")
    yield pa.RecordBatch.from_pydict({"chunk": [b"r" * 100]})


def number():
    return 42


def main() -> None:
    a = harness.parse(harness.cli(__doc__, runs=7))
    run = harness.Run("job_api_bench", a)
    s = harness.spark_session("local-cluster[2,1,1024]")
    sc = s.sparkContext
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

    def run_via(arrow):
        def go():
            _job.CLASSIC_VIA_ARROW = arrow
            assert d.run(number) == 42
        return go

    cases = {
        "bare job, RDD barrier": lambda: sc.parallelize(range(2), 2).barrier()
        .mapPartitions(bare_rdd_task).collect(),
        "bare job, mapInArrow": lambda: s.range(0, 2, 1, 2).mapInArrow(
            bare_arrow_task, "chunk binary", barrier=True).toArrow(),
        "run(), RDD barrier": run_via(False),
        "run(), mapInArrow": run_via(True),
    }
    times = {k: [] for k in cases}
    for f in cases.values():
        f()  # warm-up
    for _ in range(a.runs):
        for k, f in cases.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    s.stop()
    # Both paths are torchspark's: mapInArrow is the "ours" side, RDD barrier the baseline.
    for what in ("bare job", "run()"):
        run.compare(what, times[f"{what}, mapInArrow"], times[f"{what}, RDD barrier"], "s",
                    "mapInArrow", "RDD barrier", 3)
    out = {k: {"median_s": round(harness.median(v), 3), "min_s": round(min(v), 3),
               "max_s": round(max(v), 3)} for k, v in times.items()}
    print(json.dumps(out, indent=1))
    run.results = out
    run.finish()


if __name__ == "__main__":
    main()
