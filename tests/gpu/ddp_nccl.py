"""H9 of docs/gpu.md: three all_reduces and one DDP step on a Linear layer with backend
nccl, one process per GPU, under torchspark-run or torchrun (tests/gpu/checks.py h9).
TSP_GPU_T0 is the launch's time.time(): rank 0 prints how long after it the first
all_reduce completed and the step ended."""
import os
import time

import torch
import torch.distributed as dist

t0 = float(os.environ.get("TSP_GPU_T0") or time.time())
started = time.time()
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
first = time.time()
for _ in range(2):
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
    print(f"ddp_nccl: world {dist.get_world_size()}; the worker started {started - t0:.2f} s, "
          f"first all_reduce after launch: {first - t0:.2f} s; DDP step done "
          f"{time.time() - t0:.2f} s after launch", flush=True)
dist.destroy_process_group()
