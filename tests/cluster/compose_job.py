"""The driver program of test_compose.py, run in the compose cluster's driver service:

    podman-compose ... run --rm --name NAME spark-driver python3 compose_job.py \
        --master spark://spark-master:7077 --driver-host spark-driver

One Spark application, two torchspark TorchDistributor runs over the two worker containers:
  fail:   rank 1 prints its host and raises: the TorchDistributorError is expected;
  cancel: training that would last minutes; once the file /tmp/tsp-cancel exists in this
          container (the test creates it with `exec` when it sees training processes in
          both workers), the job is cancelled through SparkContext.cancelAllJobs().
Prints one ``COMPOSE_RESULT <json>`` line per run: tag, error_type, message, rank, host.
"""

import argparse
import json
import os
import sys
import threading
import time

CANCEL_FILE = "/tmp/tsp-cancel"


def train(fail_rank, steps, sleep):
    import socket

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"COMPOSE_TRAIN rank {rank} on {socket.gethostname()} pid {os.getpid()}", flush=True)
    # Data-parallel SGD with the gradients averaged by gloo's all_reduce, as DDP does; not
    # DDP itself: its first construction imports about 900 modules (sympy, dynamo), 2.4 s of
    # CPU per rank and run on these machines, and the demo trains with DDP already.
    model = torch.nn.Linear(8, 1)
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        time.sleep(sleep)
    if rank == fail_rank:
        raise ValueError(f"injected failure on rank {rank}")
    dist.destroy_process_group()


def run(tag, distributor_cls, *args):
    out = {"tag": tag, "error_type": None, "message": None, "rank": None, "host": None}
    try:
        distributor_cls(num_processes=2, local_mode=False, use_gpu=False).run(train, *args)
    except Exception as e:  # noqa: BLE001 - the test wants to see whatever run() raised
        out.update(error_type=type(e).__name__, message=str(e)[-6000:],
                   rank=getattr(e, "rank", None), host=getattr(e, "host", None))
    print("COMPOSE_RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--driver-host", required=True)
    a = ap.parse_args()
    from pyspark.sql import SparkSession

    from torchspark import TorchDistributor
    spark = (SparkSession.builder.master(a.master).appName("torchspark-compose-test")
             .config("spark.driver.host", a.driver_host)
             .config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
             .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "180s")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    run("fail", TorchDistributor, 1, 3, 0.0)

    def cancel_when_asked():
        deadline = time.monotonic() + 240
        while not os.path.exists(CANCEL_FILE) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"COMPOSE_CANCEL at {time.time():.3f}", flush=True)
        spark.sparkContext.cancelAllJobs()

    threading.Thread(target=cancel_when_asked, daemon=True).start()
    run("cancel", TorchDistributor, None, 100000, 0.05)
    spark.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
