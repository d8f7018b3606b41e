"""Time inside torchspark.report() itself: 1000 calls of 3 metrics from one rank in local
mode (local[2], the agent on the driver), each after ~5 ms of pure-Python work; prints the
10/50/90/99/100th percentiles of one call in ms, and their sum in seconds.

    .venv/bin/python bench/report_call_bench.py
"""
import os

from pyspark.sql import SparkSession

from torchspark import TorchDistributor


def fn(n):
    import time

    import torchspark
    ts = []
    for i in range(n):
        x = 0
        for _ in range(30000):
            x += 1
        a = time.perf_counter()
        torchspark.report({"loss": 0.5, "lr": 0.001, "step_time": 0.01}, step=i)
        ts.append(time.perf_counter() - a)
    ts.sort()
    return [round(ts[int(q * (n - 1))] * 1e3, 3) for q in (0.1, 0.5, 0.9, 0.99, 1.0)], sum(ts)


if __name__ == "__main__":
    SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False, progress=False)
    print("quantiles ms, total s:", d.run(fn, 1000), "loadavg", os.getloadavg())
