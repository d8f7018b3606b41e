"""A small real DDP training (gloo, CPU, synthetic data) written for torchrun.

Runs unchanged under `torchrun` and under `torchspark-run`:
    torchspark-run --standalone --nproc-per-node 2 ddp_train.py --steps 20
Rank 0 prints the loss as it goes and writes the final metrics as JSON to --out if given.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default=None, help="rank 0 writes final metrics (JSON) here")
    p.add_argument("--save", default=None, help="rank 0 saves the final state_dict here")
    args = p.parse_args()

    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # Synthetic regression data: each rank draws its own shard from a fixed generator.
    g = torch.Generator().manual_seed(1234 + rank)
    w_true = torch.linspace(-1, 1, 16).unsqueeze(1)
    t0 = time.time()
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=g)
        y = x @ w_true + 0.01 * torch.randn(args.batch, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.5f}", flush=True)
    metrics = {"world_size": world, "steps": args.steps, "final_loss": loss.item(),
               "seconds": round(time.time() - t0, 3)}
    if rank == 0:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(metrics, f)
        if args.save:
            torch.save(model.module.state_dict(), args.save)
        print(f"rank 0 done: {json.dumps(metrics)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
