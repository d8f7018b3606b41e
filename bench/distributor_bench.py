"""PySpark's TorchDistributor vs torchspark.TorchDistributor, side by side in one run on
the same Spark, medians of N runs (alternating, after one warm-up each).

    .venv/bin/python bench/distributor_bench.py [--runs 5] [--big-gib 1]

Cases: run() of a function that imports torch and returns a number, in local mode
(local[2], 2 processes) and distributed on local-cluster[2,1,1024] (2 tasks); then a
1 GiB return value (distributed, 1 task; one attempt each: it either fits or it fails).
"""
import argparse
import json
import os
import statistics
import sys
import time

import pyspark
from pyspark.ml.torch.distributor import TorchDistributor as Stock
from pyspark.sql import SparkSession

from torchspark import TorchDistributor as Ours


def small():
    import torch
    return float(torch.ones(1).item())


def big(n):
    return b"\1" * n


def session(master):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    s = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
         .config("spark.testing", "true").config("spark.test.home", os.path.dirname(pyspark.__file__))
         .config("spark.executor.memory", "1024m").config("spark.driver.memory", "4g")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(label, runs, make_stock, make_ours):
    times = {"stock": [], "torchspark": []}
    makers = {"stock": make_stock, "torchspark": make_ours}
    for name in makers:  # warm-up: Python workers, imports, JIT
        timed(makers[name])
    for _ in range(runs):
        for name in makers:
            times[name].append(timed(makers[name]))
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"case": label, "runs": runs, "stock_median_s": round(med["stock"], 3),
           "torchspark_median_s": round(med["torchspark"], 3),
           "ratio": round(med["torchspark"] / med["stock"], 3),
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
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--big-gib", type=float, default=1.0)
    p.add_argument("--skip-big", action="store_true")
    a = p.parse_args()
    out = []
    s = session("local[2]")
    out.append(compare("local mode, 2 processes, import torch", a.runs,
                       lambda: Stock(2, True, False).run(small),
                       lambda: Ours(2, True, False).run(small)))
    s.stop()
    s = session("local-cluster[2,1,1024]")
    out.append(compare("local-cluster[2,1,1024], 2 tasks, import torch", a.runs,
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
    return out


if __name__ == "__main__":
    main()
