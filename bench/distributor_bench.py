"""PySpark's TorchDistributor vs torchspark.TorchDistributor, side by side in one run on
the same Spark, medians of N runs (alternating, after one warm-up each).

    .venv/bin/python -m bench.distributor_bench [--runs 5] [--big-gib 1] [--skip-big]

Cases: run() of a function that imports torch and returns a number, in local mode
(local[2], 2 processes) and distributed on local-cluster[2,1,1024] (2 tasks); then a
1 GiB return value (distributed, 1 task; one attempt each: it either fits or it fails).
"""
import json
import time

from pyspark.ml.torch.distributor import TorchDistributor as Stock

from bench import harness
from torchspark import TorchDistributor as Ours


def small():
    import torch
    return float(torch.ones(1).item())


def big(n):
    return b"\1" * n


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(run, label, runs, make_stock, make_ours):
    times = {"stock": [], "torchspark": []}
    makers = {"stock": make_stock, "torchspark": make_ours}
    for name in makers:  # warm-up: Python workers, imports, JIT
        timed(makers[name])
    for _ in range(runs):
        for name in makers:
            times[name].append(timed(makers[name]))
    c = run.compare(label, times["torchspark"], times["stock"], "s", digits=3)
    row = {"case": label, "runs": runs, "stock_median_s": round(c["stock_median"], 3),
           "torchspark_median_s": round(c["ours_median"], 3), "ratio": round(c["ratio"], 3),
           "stock_all": [round(x, 3) for x in times["stock"]],
           "torchspark_all": [round(x, 3) for x in times["torchspark"]]}
    print(json.dumps(row), flush=True)
    return row


def attempt(fn):
    t = time.perf_counter()
    try:
        out = fn()
        return {"ok": True, "seconds": round(time.perf_counter() - t, 3), "bytes": len(out)}
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return {"ok": False, "seconds": round(time.perf_counter() - t, 3),
                "error": f"{type(e).__name__}: {first}"}


def main():
    p = harness.cli(__doc__, runs=5, quick={"skip_big": True})
    p.add_argument("--big-gib", type=float, default=1.0)
    p.add_argument("--skip-big", action="store_true")
    a = harness.parse(p)
    run = harness.Run("distributor_bench", a)
    out = []
    conf = {"spark.driver.memory": "4g"}
    s = harness.spark_session("local[2]", conf)
    out.append(compare(run, "local mode, 2 processes, import torch", a.runs,
                       lambda: Stock(2, True, False).run(small),
                       lambda: Ours(2, True, False).run(small)))
    s.stop()
    s = harness.spark_session("local-cluster[2,1,1024]", conf)
    out.append(compare(run, "local-cluster[2,1,1024], 2 tasks, import torch", a.runs,
                       lambda: Stock(2, False, False).run(small),
                       lambda: Ours(2, False, False).run(small)))
    if not a.skip_big:
        n = int(a.big_gib * (1 << 30))
        for name, cls in (("stock", Stock), ("torchspark", Ours)):
            r = attempt(lambda cls=cls: cls(1, False, False).run(big, n))
            r.update(case=f"{a.big_gib} GiB return value, local-cluster, 1 task", impl=name)
            print(json.dumps(r), flush=True)
            out.append(r)
    s.stop()
    run.results = {"rows": out}
    run.finish()


if __name__ == "__main__":
    main()
