"""torch.distributed.rpc initialised from the launcher's environment only (as TorchOpt's
distributed mode does): rank 0 calls every other worker with rpc_sync and writes what came
back to OUTDIR/rpc.json."""
import json
import os
import sys

import torch
import torch.distributed.rpc as rpc


def whoami_add(a: torch.Tensor, b: int):
    return int(os.environ["RANK"]), os.getpid(), (a + b).tolist()


def main() -> None:
    out = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    if rank == 0:
        replies = [rpc.rpc_sync(f"worker{i}", whoami_add, args=(torch.ones(3), i))
                   for i in range(1, world)]
        with open(os.path.join(out, "rpc.json"), "w") as f:
            json.dump({"world": world, "replies": replies}, f)
    rpc.shutdown()


if __name__ == "__main__":
    main()
