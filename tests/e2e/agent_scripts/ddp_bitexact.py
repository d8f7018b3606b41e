"""A small DDP training (gloo, CPU) on fixed synthetic data with fixed seeds: every rank saves
its final state_dict to OUTDIR/state.<RANK>.pt. Run under torchrun and under torchspark-run
with the same arguments, the saved parameters must be bit-identical."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 8


def main() -> None:
    out = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env:// from the launcher's RANK, WORLD_SIZE, MASTER_*
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]) == 2, world
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(99)
    x_all, y_all = torch.randn(256, 16, generator=gen), torch.randn(256, 4, generator=gen)
    x, y = x_all[rank::world], y_all[rank::world]
    for step in range(STEPS):
        batch = slice(step * 16 % len(x), step * 16 % len(x) + 16)
        loss = nn.functional.mse_loss(ddp(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save(model.state_dict(), os.path.join(out, f"state.{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
