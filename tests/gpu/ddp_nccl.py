"""H9 of docs/gpu.md: a few all_reduces and one DDP step on a Linear layer with backend
nccl, one process per GPU, under torchspark-run or torchrun."""
import os
import time

import torch
import torch.distributed as dist

t0 = time.monotonic()
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
assert x[0].item() == dist.get_world_size() ** 3, x[0].item()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).cuda(),
                                                  device_ids=[local])
loss = model(torch.randn(32, 64, device="cuda")).square().mean()
loss.backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
torch.cuda.synchronize()
if dist.get_rank() == 0:
    print(f"ddp_nccl: world {dist.get_world_size()}, first all_reduce to DDP step done in "
          f"{time.monotonic() - t0:.2f} s since the worker started")
dist.destroy_process_group()
