"""Cancel-to-gone with and without TorchSparkPlugin and on the stock path, side by side in
one run, and the wall time of a TorchSparkRunner run beside PySpark's TorchDistributor
(torchspark's and the stock pyspark.ml one) for the same script. Real Spark
(local-cluster[2,1,1024]), real torch (ddp_train.py, 2 processes on 2 executors).

  .venv/bin/python -m bench.jvm_cancel_bench --rounds 5

Cases, in this order (one application each, so every case of a run shares the machine's
state): TorchSparkRunner with the plugin (spark-submit of tests/java TrainApp), torchspark's
PySpark TorchDistributor with the plugin, TorchSparkRunner without, torchspark's
TorchDistributor without, and the stock path: PySpark's own pyspark.ml TorchDistributor
(its wrapper, torchrun and workers; no torchspark anywhere in that session).

Cancel: sc.cancelAllJobs() 3 s after the training's processes are up (2 agents and 2 workers;
stock: 2 wrappers, 2 torchruns, 2 workers); ms until none of them is alive (polled every 5 ms
through /proc on the driver's host; -1: still alive after 15 s, then killed by the bench;
-2: the training was not up within --start-timeout, a slow start that is reported, not
measured). A case that fails outright is reported as such and the others still run.

Wall time (unless --skip-time): one run of ddp_train.py --steps 12, as its caller sees it,
after one unmeasured warm-up run in the same application (executors and Python workers up);
TorchSparkRunner twice, its election through the driver's rendezvous (the default) and
through allGather (TORCHSPARK_RENDEZVOUS=0 on the driver), one application each.
"""
import argparse
import json
import subprocess
import sys
import time
import traceback

from bench import harness

_, jvmutil = harness.helpers("tsp_spark", "jvmutil")


def med(xs):
    """Median of the measured runs: -1 (not gone in 15 s) counts as the slowest, -2 (not
    started) is left out."""
    ok = [float("inf") if x == -1 else x for x in xs if x != jvmutil.NOT_STARTED]
    return round(harness.median(ok), 1) if ok else None


def wall_ms(distributor, rounds: int):
    def once():
        t0 = time.monotonic()
        distributor(num_processes=2, local_mode=False, use_gpu=False).run(
            str(jvmutil.DDP), "--steps", "12")
        return round((time.monotonic() - t0) * 1000)

    once()  # warm-up: the executors' Python workers and imports
    return [once() for _ in range(rounds)]


def pyspark_case(res, args, plugin: bool, stock: bool) -> None:
    name = ("stock pyspark.ml TorchDistributor" if stock
            else "PySpark TorchDistributor, " + ("with plugin" if plugin else "without plugin"))
    mark = jvmutil.new_mark()
    spark = jvmutil.pyspark_session(plugin=plugin, mark=mark)
    try:
        res[f"cancel ms, {name}"] = jvmutil.cancel_pyspark(
            spark, mark, args.rounds, stock=stock, start_timeout=args.start_timeout)
        if not plugin and not args.skip_time:
            if stock:
                from pyspark.ml.torch.distributor import TorchDistributor
            else:
                from torchspark import TorchDistributor
            wall = "stock pyspark.ml TorchDistributor" if stock else "PySpark TorchDistributor (torchspark's)"
            res[f"run wall ms, {wall}"] = wall_ms(TorchDistributor, args.rounds)
    finally:
        spark.stop()


def runner_case(res, args, plugin: bool) -> None:
    name = "TorchSparkRunner, " + ("with plugin" if plugin else "without plugin")
    out, _ = jvmutil.spark_submit("cancel", plugin=plugin, rounds=args.rounds, timeout=3600)
    res[f"cancel ms, {name}"] = [float(x) for x in out["GONE_MS"]]
    if not plugin and not args.skip_time:
        # The election through the driver's rendezvous (the default), then through Spark's
        # allGather (TORCHSPARK_RENDEZVOUS=0), one application each.
        for key, env in (("", None), (" (allGather)", "0")):
            out, _ = jvmutil.spark_submit("time", plugin=False, rounds=args.rounds, timeout=3600,
                                          env={"TORCHSPARK_RENDEZVOUS": env})
            want = "allGather" if env else "rendezvous"
            if set(out["ELECTION"]) != {want}:
                raise RuntimeError(f"the runner's election went through {out['ELECTION']}, not {want}")
            res["run wall ms, TorchSparkRunner" + key] = [float(x) for x in out["RUN_MS"]]


def main() -> None:
    ap = harness.cli(__doc__, runs=None, quick={"rounds": 1, "skip_time": True})
    ap.add_argument("--rounds", type=int, default=5, help="measured runs per case (medians)")
    ap.add_argument("--skip-time", action="store_true", help="cancel-to-gone only")
    ap.add_argument("--start-timeout", type=float, default=600.0,
                    help="s a training may take to come up before its round counts as -2")
    ap.add_argument("--case", choices=("pyspark-plugin", "pyspark", "stock"), help=argparse.SUPPRESS)
    args = harness.parse(ap)
    if not jvmutil.built():
        sys.exit("build the JVM part first (cmake --build build)")
    # Every PySpark case runs in a fresh interpreter: spark.plugins and spark.jars reach the
    # driver JVM only when it starts (docs/jvm.md), and the stock case must not see the plugin.
    if args.case:
        return one_case(args)
    run = harness.Run("jvm_cancel_bench", args)
    res = {}
    failed = []
    for case in ("runner-plugin", "pyspark-plugin", "runner", "pyspark", "stock"):
        t0 = time.monotonic()
        try:
            res.update(run_case(case, args))
        except Exception as e:  # noqa: BLE001 - reported, the other cases still run
            failed.append(f"{case}: {e}")
            traceback.print_exc()
        print(f"partial ({case}, {time.monotonic() - t0:.0f} s):", json.dumps(res), flush=True)
    report(run, res, failed)


def run_case(case: str, args) -> dict:
    if case.startswith("runner"):
        res = {}
        runner_case(res, args, plugin=case == "runner-plugin")
        return res
    cmd = [sys.executable, "-m", "bench.jvm_cancel_bench", "--case", case, "--rounds",
           str(args.rounds), "--start-timeout", str(args.start_timeout)] + (
               ["--skip-time"] if args.skip_time else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, timeout=7200, cwd=harness.ROOT)
    lines = [ln for ln in p.stdout.decode(errors="replace").splitlines() if ln.startswith("CASE ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"exited {p.returncode} without a result")
    return json.loads(lines[-1][len("CASE "):])


def one_case(args) -> None:
    res = {}
    pyspark_case(res, args, plugin=args.case == "pyspark-plugin", stock=args.case == "stock")
    print("CASE " + json.dumps(res), flush=True)


def report(run, res, failed) -> None:
    print(json.dumps(res, indent=1))
    for k, v in res.items():  # -1 (not gone in 15 s) and -2 (not started) stay in the samples
        run.figure(k, v, "ms", 1)
    stock_key = "cancel ms, stock pyspark.ml TorchDistributor"
    for k in ("cancel ms, TorchSparkRunner, with plugin", "cancel ms, PySpark TorchDistributor, with plugin"):
        ours, stock = med(res.get(k, [])), med(res.get(stock_key, []))
        if ours and stock:
            run.comparisons.append({"figure": "cancel to every process gone", "unit": "ms",
                                    "ours": k[len("cancel ms, "):], "stock": stock_key[len("cancel ms, "):],
                                    "ours_median": ours, "stock_median": stock,
                                    "ratio": round(ours / stock, 4)})
    run.results = {"runs": res, "failed": failed}
    run.finish()
    for k, v in res.items():
        print(f"{k:52s} median {med(v)}  runs {v}")
    rdv = med(res.get("run wall ms, TorchSparkRunner", []))
    gather = med(res.get("run wall ms, TorchSparkRunner (allGather)", []))
    if rdv and gather:
        print(f"TorchSparkRunner run wall, allGather / rendezvous: {gather / rdv:.2f}x")
    stock = med(res.get("cancel ms, stock pyspark.ml TorchDistributor", []))
    for k in ("cancel ms, TorchSparkRunner, with plugin", "cancel ms, PySpark TorchDistributor, with plugin"):
        m = med(res.get(k, []))
        if stock and m:
            print(f"stock / ({k[len('cancel ms, '):]}): {stock / m:.1f}x")
    for f in failed:
        print("FAILED", f)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
