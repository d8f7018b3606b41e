"""run() -> first training step from 0 executors with dynamic allocation (issue 31), gang
launch, on local-cluster[2,1,1024]; with and without the driver's request for executors
(requestTotalExecutors: _gang.REQUEST_EXECUTORS), alternating; before each run the executors
are left to be released as idle (executorIdleTimeout 3s), so every run starts from 0.

    .venv/bin/python -m bench.gang_bench [--runs 3] [--quick]

Figures: seconds from run() to the first executor registered, to the second, and to the
first gloo DDP step of 2 ranks (rank 0's clock, the earliest of both ranks' step).
"""
import threading
import time

from bench import harness
from torchspark import TorchDistributor
from torchspark.driver import _gang


def ddp_step():
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.ones(8, 4)).pow(2).mean().backward()
    stepped = [None] * dist.get_world_size()
    dist.all_gather_object(stepped, time.time())
    return min(stepped)


def executors(spark):
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def wait_released(spark, timeout=120):
    deadline = time.monotonic() + timeout
    while executors(spark) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return executors(spark)


def one(spark, request):
    _gang.REQUEST_EXECUTORS = request
    seen = {}
    stop = threading.Event()
    started = time.time()

    def watch():
        while not stop.is_set():
            n = executors(spark)
            for k in range(1, n + 1):
                seen.setdefault(k, time.time() - started)
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        first = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(ddp_step)
    finally:
        stop.set()
        t.join()
    return seen.get(1), seen.get(2), first - started


def main():
    ap = harness.cli(__doc__, runs=3)
    args = harness.parse(ap)
    spark = harness.spark_session("local-cluster[2,1,1024]", {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.initialExecutors": "0",
        "spark.dynamicAllocation.maxExecutors": "2",
        "spark.dynamicAllocation.executorIdleTimeout": "3s",
        "spark.torchspark.warmWorkers": "false",
    })
    run = harness.Run("gang_bench", args)
    got = {True: [], False: []}
    try:
        for i in range(args.runs):
            for request in (True, False):
                left = wait_released(spark)
                sample = one(spark, request)
                got[request].append(sample)
                print(f"run {i} request={request} (executors before: {left}): first executor "
                      f"{sample[0]:.2f} s, second {sample[1]:.2f} s, first step "
                      f"{sample[2]:.2f} s", flush=True)
    finally:
        spark.stop()
    for request, name in ((True, "with requestTotalExecutors"), (False, "backlog only")):
        for idx, what in enumerate(("first executor", "second executor", "first step")):
            run.figure(f"run() -> {what}, {name}", [s[idx] for s in got[request]], "s", 3)
    run.compare("run() -> first training step from 0 executors",
                [s[2] for s in got[True]], [s[2] for s in got[False]], "s",
                ours_name="requestTotalExecutors", stock_name="backlog only", digits=3)
    for k, v in run.figures.items():
        print(f"{k}: median {v['median']} s ({v['samples']})")
    run.finish()


if __name__ == "__main__":
    main()
