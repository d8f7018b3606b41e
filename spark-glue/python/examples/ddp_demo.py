"""torchspark demo: a real DDP training (gloo, CPU, synthetic data) on an embedded
local-cluster Spark (2 executors in their own JVMs, 1 core each) through
torchspark.TorchDistributor; each rank's lines arrive on this console with their rank,
and rank 0's returned metrics are printed at the end.

    bash tests/demo.sh            # or: .venv/bin/python spark-glue/python/examples/ddp_demo.py
"""
import argparse
import json
import os
import sys
import tempfile

import pyspark
from pyspark.sql import SparkSession

from torchspark import TorchDistributor


def train(steps: int, lr: float) -> dict:
    """Runs on every rank; torchspark-run has set RANK, WORLD_SIZE, MASTER_ADDR/PORT."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1234 + rank)  # each rank its own shard
    w_true = torch.linspace(-1, 1, 16).unsqueeze(1)
    t0, loss = time.time(), torch.tensor(0.0)
    for step in range(steps):
        x = torch.randn(64, 16, generator=g)
        y = x @ w_true + 0.01 * torch.randn(64, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.5f}", flush=True)
    dist.destroy_process_group()
    return {"world_size": world, "steps": steps, "final_loss": round(loss.item(), 6),
            "seconds": round(time.time() - t0, 3)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this Python
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("torchspark-demo")
             .config("spark.executor.memory", "1024m")
             .config("spark.ui.enabled", "false")
             .config("spark.testing", "true")  # worker dirs under a temp dir, not SPARK_HOME
             .config("spark.test.home", os.path.dirname(pyspark.__file__))
             .config("spark.local.dir", tempfile.gettempdir())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        metrics = distributor.run(train, args.steps, args.lr)
    finally:
        spark.stop()
    print("rank 0 metrics:", json.dumps(metrics))
    return 0 if metrics["final_loss"] < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
