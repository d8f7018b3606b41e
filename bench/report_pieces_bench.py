"""Where report()'s CPU goes, in one process: the bench's step (12 CPU matmuls of 160x160 on
one thread, then a metric from them) N times, with each piece of report() added in turn:

    .venv/bin/python bench/report_pieces_bench.py [--steps 500] [--rounds 12]

none: the step alone; check: the record checked and built (torchspark._metrics._record, on
the calling thread), then dropped; queue: the same, appended to a list (what report() does
on the calling thread, but no sender thread); report: torchspark.report() itself, into a
Unix socket that another process reads (the agent's end; its CPU is not this process's).
The modes run in turns (the order reversed every other round); each figure is the median
over the rounds of the process's CPU (time.process_time, every thread) per step.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

DRAIN = """
import socket, sys, threading
srv = socket.socket(socket.AF_UNIX); srv.bind(sys.argv[1]); srv.listen(4)
def drain(c):
    while c.recv(1 << 16):
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    drainer = subprocess.Popen([sys.executable, "-c", DRAIN, path])
    while not os.path.exists(path):
        time.sleep(0.01)
    os.environ["TORCHSPARK_REPORT_SOCKET"] = path
    import torch

    import torchspark
    import torchspark._metrics as m

    torch.set_num_threads(1)
    a, b = torch.rand(160, 160), torch.rand(160, 160)
    torchspark.report({"warm": 1}, step=0)
    sink = []

    def loop(mode):
        c0 = time.process_time()
        for step in range(args.steps):
            for _ in range(12):
                c = a @ b
            loss = float(c[0, 0])
            metrics = {"loss": loss, "lr": 0.001, "step_time": 0.01}
            if mode == "check":
                m._record(metrics, step)
            elif mode == "queue":
                sink.append(m._record(metrics, step))
            elif mode == "report":
                torchspark.report(metrics, step=step)
        sink.clear()
        return time.process_time() - c0

    modes = ["none", "check", "queue", "report"]
    cpu = {k: [] for k in modes}
    load = os.getloadavg()[0]
    try:
        for r in range(args.rounds):
            for k in modes if r % 2 == 0 else modes[::-1]:
                cpu[k].append(loop(k))
    finally:
        drainer.kill()
    base = statistics.median(cpu["none"])
    for k in modes:
        c = statistics.median(cpu[k])
        print(f"{k:7s} CPU {1e3 * c / args.steps:.3f} ms/step, {1e6 * (c - base) / args.steps:+.1f} "
              f"us/step ({100 * (c - base) / base:+.2f} %)")
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
