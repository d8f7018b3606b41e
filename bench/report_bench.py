"""torchspark.report(): the cost to a step loop, and report() -> on_report latency, through
TorchDistributor.run() on local-cluster[2,1,1024] (2 ranks, one per executor).

    .venv/bin/python bench/report_bench.py [--runs 5] [--steps 1000] [--matmuls 12]

Each run trains nothing but does a fixed amount of work per step (12 CPU matmuls of
160x160 on one thread: 3.2 ms of CPU on the shared 2-core VM of docs/benchmarks.md,
"torchspark.report(): cost to the step loop and latency"), then
computes a metric from it. --matmuls 36 makes the step ~10 ms of CPU: report() on every
step is then the issue's rate, 100 calls/s per rank. The same function runs alternately with report() of that
metric and two constants on every step and without it (the loops differ by the report()
call only); the loop's time on each rank is measured inside the worker (perf_counter
around the loop).
The process's CPU time over the loop (time.process_time: every thread, the report
sender's included, until what report() queued is sent) is measured beside it: on a shared,
loaded machine the wall time varies by +-25 % between runs, the CPU time much less.
Latency: the driver's wall time when on_report got the report minus the worker's wall
time at report() (one host, one clock), over every report of every "with" run.
"""
import argparse
import json
import os
import statistics
import sys
import time

import pyspark
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from torchspark import TorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def loop(steps, reporting, matmuls=12):
    import torch
    import torch.distributed as dist

    import torchspark

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    a = torch.rand(160, 160)
    b = torch.rand(160, 160)
    for _ in range(20):  # warm-up
        a @ b
    dist.barrier()
    c0 = time.process_time()  # this process's CPU, every thread (the report sender's too)
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(matmuls):
            c = a @ b
        loss = float(c[0, 0])  # both loops compute the metric: they differ by report() only
        if reporting:
            torchspark.report({"loss": loss, "lr": 0.001, "step_time": 0.01}, step=step)
    took = time.perf_counter() - t0
    if reporting:  # what report() queued is sent (the sender's CPU counts)
        import torchspark._metrics as m
        if m._sender is not None:
            m._sender.close()
            m._sender = None
    cpu = time.process_time() - c0
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (took, cpu))
    dist.destroy_process_group()
    return everyone


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--matmuls", type=int, default=12, help="160x160 matmuls per step")
    args = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    s = (SparkSession.builder.master("local-cluster[2,1,1024]")
         .config("spark.ui.enabled", "false").config("spark.testing", "true")
         .config("spark.test.home", os.path.dirname(pyspark.__file__))
         .config("spark.executor.memory", "1024m").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    load_at_start = os.getloadavg()
    latencies, times, cpus = [], {True: [], False: []}, {True: [], False: []}
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(loop, 50, True)
    for i in range(args.runs):
        for reporting in (False, True) if i % 2 == 0 else (True, False):
            got = []
            d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                 on_report=got.append, progress=False)
            took = d.run(loop, args.steps, reporting, args.matmuls)
            times[reporting].append(statistics.median(t for t, _ in took))
            cpus[reporting].append(statistics.median(c for _, c in took))
            if reporting:
                assert len(got) == 2 * args.steps, len(got)
                latencies += [r.received - r.time for r in got]
    latencies.sort()
    base, rep = statistics.median(times[False]), statistics.median(times[True])
    cbase, crep = statistics.median(cpus[False]), statistics.median(cpus[True])
    pairs = [100 * (w - wo) / wo for w, wo in zip(times[True], times[False], strict=True)]
    cpu_pairs = [100 * (w - wo) / wo for w, wo in zip(cpus[True], cpus[False], strict=True)]
    out = {
        "steps": args.steps, "runs": args.runs, "matmuls": args.matmuls,
        "loop_s_without": round(base, 4), "loop_s_with": round(rep, 4),
        "overhead_pct": round(100 * (rep - base) / base, 2),
        "step_rate_per_rank": round(args.steps / base, 1),
        "pair_overhead_pct": [round(x, 2) for x in pairs],
        "pair_overhead_pct_median": round(statistics.median(pairs), 2),
        "cpu_s_without": round(cbase, 4), "cpu_s_with": round(crep, 4),
        "cpu_overhead_pct": round(100 * (crep - cbase) / cbase, 2),
        "cpu_pair_overhead_pct": [round(x, 2) for x in cpu_pairs],
        "cpu_pair_overhead_pct_median": round(statistics.median(cpu_pairs), 2),
        "cpu_us_per_report_median": round(statistics.median(
            1e6 * (w - wo) / args.steps for w, wo in zip(cpus[True], cpus[False], strict=True)), 1),
        "cpus_without": [round(t, 4) for t in cpus[False]],
        "cpus_with": [round(t, 4) for t in cpus[True]],
        "runs_without": [round(t, 4) for t in times[False]],
        "runs_with": [round(t, 4) for t in times[True]],
        "latency_ms_p50": round(1000 * latencies[len(latencies) // 2], 2),
        "latency_ms_p99": round(1000 * latencies[int(len(latencies) * 0.99)], 2),
        "latency_ms_max": round(1000 * latencies[-1], 2),
        "reports": len(latencies),
        "loadavg_start": load_at_start,
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(out, indent=1))
    s.stop()


if __name__ == "__main__":
    main()
