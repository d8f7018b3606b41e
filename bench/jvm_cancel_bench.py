"""Cancel-to-gone with and without TorchSparkPlugin, side by side in one run, and the wall
time of a TorchSparkRunner run beside PySpark's TorchDistributor (torchspark's) for the
same script. Real Spark (local-cluster[2,1,1024]), real torch (ddp_train.py, 2 processes).

  .venv/bin/python bench/jvm_cancel_bench.py --rounds 5

Also the stock path side by side: PySpark's own pyspark.ml TorchDistributor (torchrun
workers), cancelled the same way in the session without the plugin.

Cancel: a training of 2 processes across 2 executors, sc.cancelAllJobs() 3 s after its 4
processes (2 agents, 2 workers) are up; ms until none of them is alive (polled every 5 ms
from the driver's host; -1: still alive after 15 s, then killed by the bench).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
import jvmutil  # noqa: E402


def med(xs):
    ok = [x for x in xs if x >= 0]
    return round(statistics.median(ok), 1) if len(ok) == len(xs) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--only-stock", action="store_true",
                    help="only the stock pyspark.ml TorchDistributor, without the plugin")
    args = ap.parse_args()
    if not jvmutil.built():
        sys.exit("build the JVM part first (cmake --build build)")
    res = {}
    if args.only_stock:
        mark = jvmutil.new_mark()
        spark = jvmutil.pyspark_session(plugin=False, mark=mark)
        try:
            res["stock pyspark.ml TorchDistributor"] = jvmutil.cancel_pyspark(
                spark, mark, args.rounds, stock=True)
        finally:
            spark.stop()
        report(res)
        return
    for plugin in (True, False):
        name = "with plugin" if plugin else "without plugin"
        out, _ = jvmutil.spark_submit("cancel", plugin=plugin, rounds=args.rounds, timeout=1800)
        res[f"TorchSparkRunner, {name}"] = [float(x) for x in out["GONE_MS"]]
        print("partial:", json.dumps(res), flush=True)
        mark = jvmutil.new_mark()
        spark = jvmutil.pyspark_session(plugin=plugin, mark=mark)
        try:
            res[f"PySpark TorchDistributor, {name}"] = jvmutil.cancel_pyspark(spark, mark, args.rounds)
            if not plugin:
                # The stock path: PySpark's own TorchDistributor (torchrun), no torchspark.
                res["stock pyspark.ml TorchDistributor"] = jvmutil.cancel_pyspark(
                    spark, mark, args.rounds, stock=True)
            if not plugin and not args.skip_time:
                from torchspark import TorchDistributor
                runs = []
                for _ in range(args.rounds):
                    t0 = time.monotonic()
                    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                        str(jvmutil.DDP), "--steps", "12")
                    runs.append(round((time.monotonic() - t0) * 1000))
                res["run wall ms, PySpark TorchDistributor"] = runs
        finally:
            spark.stop()
    if not args.skip_time:
        out, _ = jvmutil.spark_submit("time", plugin=False, rounds=args.rounds, timeout=1800)
        res["run wall ms, TorchSparkRunner"] = [float(x) for x in out["RUN_MS"]]
    report(res)


def report(res) -> None:
    print(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k:45s} median {med(v)}  runs {v}")


if __name__ == "__main__":
    main()
