"""A DDP function whose gloo worker threads are starved at the very end, for function mode.

The worker thread that ran the last allreduce drops its AsyncWork only when the main thread
blocks; by then the main thread has returned from the function and is in interpreter
finalization (the race behind "terminate called without an active exception", see
docs/cli.md). Pinning every thread of the process to one CPU and giving all but the main
thread SCHED_IDLE widens a window that a busy machine opens a few times in a hundred runs.
"""


def late_gloo_fn(steps: int) -> dict:
    import os
    import threading

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    x = torch.randn(8, 16)
    for _ in range(steps - 1):
        model(x).sum().backward()
    main = threading.get_native_id()
    cpu = {min(os.sched_getaffinity(0))}
    starved = 0
    for tid in map(int, os.listdir("/proc/self/task")):
        os.sched_setaffinity(tid, cpu)
        if tid != main:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            starved += 1
    model(x).sum().backward()  # the last allreduce: its gloo thread is now starved
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "starved_threads": starved}


if __name__ == "__main__":  # script mode: torchspark-run late_gloo.py STEPS
    import sys

    print(late_gloo_fn(int(sys.argv[1])))
