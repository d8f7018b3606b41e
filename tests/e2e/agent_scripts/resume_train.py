"""A deterministic gloo training that resumes from torchspark.checkpoint (issue 20).

Seeds, data order and the gradient all-reduce are fixed, so a run killed and resumed from
its last checkpoint ends with bit-identical weights to an uninterrupted one. Rank 0 appends
"ATTEMPT STEP TIME" to --steplog for every step it finishes, and writes the SHA-256 of the
final weights to --out.

    resume_train.py --ckpt DIR --steps N --every K --sleep S --steplog FILE --out FILE
                    [--phases FILE] [--on-request] [--end-attempt A --end-after K]

--phases: every rank appends "ATTEMPT RANK PHASE TIME" for its start (before importing
torch), torch imported, process group up and checkpoint loaded (bench/restart_bench.py's
breakdown of a recovery).

With --on-request it also checkpoints when torchspark.checkpoint.requested() says so (a
decommission notice, or the driver's request when the run grows back), the one line
docs/distributor.md shows. --end-attempt A --end-after K: attempt A ends after K steps
(a run that grows back ends soon after it grew).
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torchspark import checkpoint  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--every", type=int, default=5)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--steplog", required=True)
p.add_argument("--out", required=True)
p.add_argument("--phases")
p.add_argument("--on-request", action="store_true")
p.add_argument("--end-attempt")
p.add_argument("--end-after", type=int, default=0)
a = p.parse_args()
attempt = os.environ.get("TORCHSPARK_ATTEMPT", "-")
marks = [("start", T_START), ("torch", time.time())]
dist.init_process_group("gloo")
marks.append(("pg", time.time()))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ck = checkpoint.load_latest(a.ckpt)
start = 0
if ck is not None:
    model.load_state_dict(ck.state["model"])
    opt.load_state_dict(ck.state["opt"])
    start = ck.step + 1
marks.append(("ckpt", time.time()))
if a.phases:
    with open(a.phases, "a") as f:
        f.write("".join(f"{attempt} {rank} {k} {t:.6f}\n" for k, t in marks))
print(f"attempt {attempt} rank {rank}: starting at step {start} "
      f"(cause: {os.environ.get('TORCHSPARK_RESTART_CAUSE', '-')})", flush=True)
end = a.steps if attempt != a.end_attempt else min(a.steps, start + a.end_after)
for step in range(start, end):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for prm in model.parameters():
        dist.all_reduce(prm.grad)
        prm.grad /= world
    opt.step()
    if rank == 0:
        with open(a.steplog, "a") as f:
            f.write(f"{attempt} {step} {time.time():.6f}\n")
    if step % a.every == 0 or (a.on_request and checkpoint.requested()):
        checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()}, step,
                        dir=a.ckpt)
    time.sleep(a.sleep)
if rank == 0:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    with open(a.out, "w") as f:
        f.write(h.hexdigest())
dist.destroy_process_group()
