"""The demo the compose driver runs: DDP training (gloo, CPU) across the cluster's workers.

    python3 cluster_demo.py --master spark://spark-master:7077 --driver-host spark-driver \
        [--num-processes 2] [--wait-workers 2] [--distributor torchspark|stock] [--steps 20]

It waits until the master reports --wait-workers ALIVE workers (its JSON status, as the test
fixture does), then runs one TorchDistributor job (client deploy mode, one task per worker)
and prints rank 0's result.
"""

import argparse
import json
import sys
import time
import urllib.request

JVM_LIGHT = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def train(steps):
    import os
    import socket

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} on {socket.gethostname()}: MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
          f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234 + rank)
    w = torch.linspace(-1, 1, 16).unsqueeze(1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(64, 16, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x @ w)
        loss.backward()
        opt.step()
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()
    return {"world_size": len(hosts), "hosts": hosts, "final_loss": loss.item()} if rank == 0 else None


def wait_workers(master_url: str, n: int, timeout: float) -> None:
    host = master_url.split("//", 1)[1].split(":", 1)[0]
    url = f"http://{host}:8080/json/"
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        try:
            st = json.loads(urllib.request.urlopen(url, timeout=5).read())
            alive = sum(1 for w in st.get("workers", []) if w.get("state") == "ALIVE")
            if alive >= n:
                return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"cluster_demo: only {alive} of {n} workers ALIVE at {url} after {timeout:.0f}s: "
             "check the worker containers' logs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--driver-host", required=True, help="this container's name as the workers resolve it")
    ap.add_argument("--num-processes", type=int, default=2)
    ap.add_argument("--wait-workers", type=int, default=0)
    ap.add_argument("--distributor", choices=["torchspark", "stock"], default="torchspark")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if a.wait_workers:
        wait_workers(a.master, a.wait_workers, 180)

    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(a.master).appName("torchspark-cluster-demo")
             .config("spark.driver.host", a.driver_host)
             .config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", str(a.num_processes))
             .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
             # The driver and executor JVMs only schedule and start Python here: C1 only and
             # the serial GC start them in about half the CPU time.
             .config("spark.driver.extraJavaOptions", JVM_LIGHT)
             .config("spark.executor.extraJavaOptions", JVM_LIGHT)
             .getOrCreate())
    if a.distributor == "stock":
        from pyspark.ml.torch.distributor import TorchDistributor
    else:
        from torchspark import TorchDistributor
    result = TorchDistributor(num_processes=a.num_processes, local_mode=False,
                              use_gpu=False).run(train, a.steps)
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
