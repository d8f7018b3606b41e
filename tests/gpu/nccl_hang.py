"""The hang doctor on NCCL with torch's flight recorder (docs/distributor.md, "The hang
doctor"; docs/protocol.md 1.9), without Spark: the driver's own pieces (the native log
server, torchspark.driver._doctor.HangDoctor, torchspark.driver._hang) and torchspark-run, one process
per GPU (at most 2).

- Two GPUs or more: 2 ranks; both do one NCCL all_reduce, then rank 1 sleeps in Python
  while rank 0 enqueues the second all_reduce (NCCL returns at once) and waits in
  torch.cuda.synchronize. The doctor must name rank 1 in its sleep, after all_reduce #1,
  and rank 0 waiting in all_reduce #2 (from its flight recorder: its stack is not in
  torch.distributed).
- One GPU (NCCL refuses two ranks on one device): 1 rank whose second all_reduce queues
  behind a kernel that spins for minutes (torch.cuda._sleep): the doctor must say the hang
  is inside all_reduce #2.

    python tests/gpu/nccl_hang.py          (tests/gpu/run.sh runs it as `nccl-hang`)
    python tests/gpu/nccl_hang.py --cpu    (the same wiring with gloo on 2 CPU ranks: a
                                            dry run of this script where no GPU is)

Exit 0 when the line is right, 1 when not, 77 (skip) without CUDA."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT_S = 3.0

WORKER = r'''
import os, sys, time
import torch
import torch.distributed as dist

cpu = sys.argv[1:] == ["--cpu"]
if not cpu:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("gloo" if cpu else "nccl")
x = torch.ones(1 << 16, device="cpu" if cpu else "cuda")
dist.all_reduce(x)
if not cpu:
    torch.cuda.synchronize()
print(f"rank {dist.get_rank()} passed the first all_reduce", flush=True)
if dist.get_world_size() == 1:
    torch.cuda._sleep(1 << 62)  # a kernel that spins: the next all_reduce queues behind it
elif dist.get_rank() == 1:
    time.sleep(3600)  # NCCL-HANG-SLEEP
dist.all_reduce(x)
if not cpu:
    torch.cuda.synchronize()  # NCCL-HANG-WAIT
'''


def say(*a: object) -> None:
    print(*a, flush=True)


class Pump(threading.Thread):
    """The log server's lines to stdout."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stopping = False

    def run(self) -> None:
        while not self.stopping:
            for line in self.server.read_text(1024, 200).splitlines():  # "[rank N] text"
                say(line.rstrip())


def main() -> int:
    try:
        import torch
    except ImportError:
        say("SKIP: no torch")
        return 77
    cpu = sys.argv[1:] == ["--cpu"]
    if not cpu and not torch.cuda.is_available():
        say("SKIP: no CUDA device visible to torch")
        return 77
    from torchspark.driver import _doctor
    from torchspark.native._lib import agent_path
    from tests.helpers.logserver import LogServer

    world = 2 if cpu else min(2, torch.cuda.device_count())
    work = tempfile.mkdtemp(prefix="tsp-nccl-hang-")
    script = os.path.join(work, "nccl_hang_worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    server = LogServer("127.0.0.1", 0)  # the doctor's watch raises its tails (a dump fits)
    pump = Pump(server)
    pump.start()
    env = dict(os.environ, TORCHSPARK_LOG_SECRET=server.secret_hex)
    gpus = [] if cpu else [f"--gpus={','.join(str(i) for i in range(world))}"]
    cmd = [agent_path(), "--standalone", f"--nproc-per-node={world}", *gpus, "--log-endpoint",
           server.endpoint, "--python", sys.executable, script, *sys.argv[1:]]
    say("world", world, ":", " ".join(cmd))
    t0 = time.monotonic()
    doctor = _doctor.HangDoctor(server, TIMEOUT_S, "cancel", world)  # the server's watchdog
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        say("FAIL: the agent did not end within 120 s of the start (the doctor did not cancel)")
        os.killpg(p.pid, 9)
        p.wait()
    doctor.poll()  # the events the watchdog queued
    pump.stopping = True
    server.close(2.0)
    pump.join(5)
    cancel = server.hang_summary()["cancel"]  # the event that cancelled the run (C's)
    diag = doctor.diagnoses[-1] if cancel is not None else None
    if diag is None:
        say(f"FAIL: no diagnosis (the agent exited {p.returncode})")
        return 1
    say(f"the doctor's line after {time.monotonic() - t0:.1f} s (agent status {p.returncode}):")
    say("  " + diag.line)
    text = diag.stacks_text()
    ok = "torchspark: flight recorder: pg " in text
    if world == 1:
        want = r"^every rank waits in the same collective \(rank 0 waits in all_reduce #2\)"
    else:
        want = (r"^rank 1 \(host [^,]+, pid \d+\) is in nccl_hang_worker\.py:\d+ .*, its last "
                r"collective all_reduce #1; rank 0 waits in all_reduce #2 for it$")
    ok = ok and re.search(want, diag.line) is not None
    if not ok:
        say("FAIL: expected /" + want + "/ and the flight recorder's lines; the dumps:\n" + text)
        return 1
    say("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
