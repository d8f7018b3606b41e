"""Where the seconds of one TorchDistributor.run() go: torchspark's waterfall beside stock's
run() and beside the floor, all measured in one run on one Spark.

    .venv/bin/python -m bench.waterfall_bench [--runs 5] [--json FILE] [--no-stock]

(--no-stock: torchspark and the floor only, for a quick check of the phases; the ratio to
stock is then not reported.)

The case: run() of a small DDP function (import torch, init_process_group("gloo"), one
all_reduce, return a number) with 2 processes on local-cluster[2,1,1024] (2 tasks).

Floor, measured in the same run, each part alone, medians:
  job    a bare barrier job over 2 partitions that returns at once (collect())
  torch  a fresh `python -c "import torch"`
  pg     init_process_group("gloo") on 2 fresh processes (torch already imported; the
         slower of the two, from the call to its return)
  floor = job + torch + pg

torchspark runs with TORCHSPARK_TIMING=1: the phases of each run() (torchspark/driver/_timing.py)
are kept and their medians printed; stock's run() is timed as a whole. Each run() is
recorded, the first of each implementation apart (a new session's first run starts the
executors' Python workers, and torchspark's its warm worker pools), the later ones
alternating stock / torchspark without the warm pool (TORCHSPARK_WARM=0: a fresh Python
per training process) / torchspark as users get it (workers forked from the pool).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from pyspark.ml.torch.distributor import TorchDistributor as Stock

from bench import harness
from tests.helpers.agentutil import free_port

os.environ["TORCHSPARK_TIMING"] = "1"
from torchspark import TorchDistributor as Ours  # noqa: E402
from torchspark.driver import _timing  # noqa: E402

PG = r'''
import os, sys, time
import torch.distributed as dist
t = time.time()
dist.init_process_group("gloo")
print(time.time() - t)
dist.destroy_process_group()
'''


def ddp() -> float:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t.item())


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bare_job(sc) -> float:
    return timed(lambda: sc.parallelize(range(2), 2).barrier()
                 .mapPartitions(lambda it: [0]).collect())


def import_torch() -> float:
    return timed(lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True))


def init_pg() -> float:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-c", PG], env=env,
                                      stdout=subprocess.PIPE, text=True))
    return max(float(p.communicate()[0].strip().splitlines()[-1]) for p in procs)


def ours_run(warm: bool = True) -> dict:
    d = Ours(2, False, False)
    os.environ["TORCHSPARK_WARM"] = "1" if warm else "0"
    t = time.perf_counter()
    assert d.run(ddp) == 2.0
    wall = time.perf_counter() - t
    os.environ.pop("TORCHSPARK_WARM")
    marks = d._clock.marks
    t0 = marks["run_called"]
    return {"wall_s": wall, "phases": {k: round(marks[k] - t0, 3) for k, _ in _timing.PHASES
                                       if k in marks}}


def stock_run() -> dict:
    t = time.perf_counter()
    assert Stock(2, False, False).run(ddp) == 2.0
    return {"wall_s": time.perf_counter() - t}


def main() -> None:
    p = harness.cli(__doc__, runs=5)
    p.add_argument("--master", default="local-cluster[2,1,1024]")
    p.add_argument("--no-stock", action="store_true")
    a = harness.parse(p)
    run = harness.Run("waterfall_bench", a)
    spark = harness.spark_session(a.master)
    sc = spark.sparkContext
    first = {"torchspark": ours_run()}
    if not a.no_stock:
        first["stock"] = stock_run()
    print(json.dumps({"first": first}), flush=True)
    first["torchspark_cold"] = ours_run(warm=False)
    rows = {"torchspark": [], "torchspark_cold": [], "stock": [], "job": [], "torch": [],
            "pg": []}
    for i in range(a.runs):
        rows["job"].append(bare_job(sc))
        rows["torch"].append(import_torch())
        rows["pg"].append(init_pg())
        if not a.no_stock:
            rows["stock"].append(stock_run())
        rows["torchspark_cold"].append(ours_run(warm=False))
        rows["torchspark"].append(ours_run())
        print(json.dumps({"run": i, **{k: v[-1] for k, v in rows.items() if v}}), flush=True)
    med = harness.median
    floor = {k: run.figure(f"floor: {k}", rows[k], "s", 3)["median"] for k in ("job", "torch", "pg")}
    floor_s = sum(floor.values())
    stock_runs = [r["wall_s"] for r in rows["stock"]]
    ours = run.compare("run()", [r["wall_s"] for r in rows["torchspark"]], stock_runs, "s",
                       digits=3)["ours_median"]
    cold = run.compare("run() without the warm pool", [r["wall_s"] for r in rows["torchspark_cold"]],
                       stock_runs, "s", "torchspark_cold", digits=3)["ours_median"]
    stock = med(stock_runs) if stock_runs else float("nan")
    phases = {k: med(r["phases"][k] for r in rows["torchspark"] if k in r["phases"])
              for k, _ in _timing.PHASES if all(k in r["phases"] for r in rows["torchspark"])}
    summary = {"runs": a.runs, "floor_parts_s": {k: round(v, 3) for k, v in floor.items()},
               "floor_s": round(floor_s, 3), "torchspark_s": round(ours, 3),
               "stock_s": round(stock, 3), "torchspark_over_floor": round(ours / floor_s, 2),
               "torchspark_over_stock": round(ours / stock, 3),
               "torchspark_without_warm_pool_s": round(cold, 3),
               "without_warm_pool_over_floor": round(cold / floor_s, 2),
               "without_warm_pool_over_stock": round(cold / stock, 3),
               "first_run_s": {k: round(v["wall_s"], 3) for k, v in first.items()},
               "torchspark_phases_median_s": phases}
    print(json.dumps(summary), flush=True)
    print(f"\nfloor {floor_s:.3f} s = bare barrier job {floor['job']:.3f} + import torch "
          f"{floor['torch']:.3f} + init_process_group {floor['pg']:.3f}")
    print(f"stock run() {stock:.3f} s; torchspark run() {ours:.3f} s "
          f"({ours / floor_s:.2f}x floor, {ours / stock:.3f}x stock)")
    print(f"torchspark run() without the warm pool (TORCHSPARK_WARM=0) {cold:.3f} s "
          f"({cold / floor_s:.2f}x floor, {cold / stock:.3f}x stock)")
    print("torchspark phases (medians, seconds since run() was called):")
    prev = 0.0
    for k, label in _timing.PHASES:
        if k in phases:
            print(f"  {label:<20} {phases[k]:7.3f}  (+{phases[k] - prev:.3f})")
            prev = phases[k]
    run.results = {"summary": summary, "rows": rows, "first": first}
    run.finish()
    spark.stop()


if __name__ == "__main__":
    main()
