"""torchspark.report(): the cost to a step loop, and report() -> on_report latency; with
--mode, the investigations behind it (time inside one call, CPU per call, where the CPU goes).

    .venv/bin/python -m bench.report_bench [--runs 5] [--steps 1000] [--matmuls 12]
        [--mode loop|call|cpu|pieces]

loop (the default): TorchDistributor.run() on local-cluster[2,1,1024] (2 ranks, one per
executor). Each run trains nothing but does a fixed amount of work per step (12 CPU matmuls
of 160x160 on one thread: 3.2 ms of CPU on the shared 2-core VM of docs/benchmarks.md,
"torchspark.report(): cost to the step loop and latency"), then computes a metric from it.
--matmuls 36 makes the step ~10 ms of CPU: report() on every step is then the issue's rate,
100 calls/s per rank. The same function runs alternately with report() of that metric and
two constants on every step and without it (the loops differ by the report() call only); the
loop's time on each rank is measured inside the worker (perf_counter around the loop).
The process's CPU time over the loop (time.process_time: every thread, the report sender's
included, until what report() queued is sent) is measured beside it: on a shared, loaded
machine the wall time varies by +-25 % between runs, the CPU time much less.
Latency: the driver's wall time when on_report got the report minus the worker's wall time
at report() (one host, one clock), over every report of every "with" run.

call: time inside torchspark.report() itself: --steps calls (default here 1000) of 3 metrics
from one rank in local mode (local[2], the agent on the driver), each after ~5 ms of
pure-Python work; the 10/50/90/99/100th percentiles of one call in ms, and their sum in s.

cpu: report()'s CPU per call in one process: the process's CPU time (every thread, the
report sender's included) over --steps steps (default here 5000) of 1 ms busy work with a
report() each, against the same steps without it; the agent's end is a thread reading a
Unix socket.

pieces: where report()'s CPU goes, in one process: the loop's step (--matmuls matmuls, then a
metric) --steps times (default here 500), with each piece of report() added in turn, --runs
rounds (default here 12): none, the step alone; check, the record checked and built
(torchspark.worker._metrics._record, on the calling thread), then dropped; queue, the same,
appended to a list (what report() does on the calling thread, but no sender thread);
report, torchspark.report() itself, into a Unix socket that another process reads (the
agent's end; its CPU is not this process's). The modes run in turns (the order reversed
every other round); each figure is the median over the rounds of the process's CPU
(time.process_time, every thread) per step.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench import harness

MODES = ("loop", "call", "cpu", "pieces")
# The investigations' own defaults (--steps, --runs) where the command line leaves them.
MODE_DEFAULTS = {"call": {"steps": 1000}, "cpu": {"steps": 5000},
                 "pieces": {"steps": 500, "runs": 12}}
METRICS = {"lr": 0.001, "step_time": 0.01}


def loop(steps, reporting, matmuls=12):
    import torch
    import torch.distributed as dist

    import torchspark

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    a = torch.rand(160, 160)
    b = torch.rand(160, 160)
    for _ in range(20):  # warm-up
        a @ b
    dist.barrier()
    c0 = time.process_time()  # this process's CPU, every thread (the report sender's too)
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(matmuls):
            c = a @ b
        loss = float(c[0, 0])  # both loops compute the metric: they differ by report() only
        if reporting:
            torchspark.report({"loss": loss, "lr": 0.001, "step_time": 0.01}, step=step)
    took = time.perf_counter() - t0
    if reporting:  # what report() queued is sent (the sender's CPU counts)
        import torchspark.worker._metrics as m
        if m._sender is not None:
            m._sender.close()
            m._sender = None
    cpu = time.process_time() - c0
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (took, cpu))
    dist.destroy_process_group()
    return everyone


def pct(with_, without):
    return [100 * (w - wo) / wo for w, wo in zip(with_, without, strict=True)]


def run_loop(args, run):
    from torchspark import TorchDistributor

    spark = harness.spark_session("local-cluster[2,1,1024]")
    latencies, times, cpus = [], {True: [], False: []}, {True: [], False: []}
    try:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(loop, 50, True)
        for i in range(args.runs):
            for reporting in (False, True) if i % 2 == 0 else (True, False):
                got = []
                d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                     on_report=got.append, progress=False)
                took = d.run(loop, args.steps, reporting, args.matmuls)
                times[reporting].append(harness.median(t for t, _ in took))
                cpus[reporting].append(harness.median(c for _, c in took))
                if reporting:
                    assert len(got) == 2 * args.steps, len(got)
                    latencies += [r.received - r.time for r in got]
    finally:
        spark.stop()
    latencies.sort()
    wall = run.compare("loop wall", times[True], times[False], "s", "with report()", "without")
    cpu = run.compare("loop CPU", cpus[True], cpus[False], "s", "with report()", "without")
    pairs, cpu_pairs = pct(times[True], times[False]), pct(cpus[True], cpus[False])
    run.figure("overhead, pair by pair", pairs, "%", 2)
    run.figure("CPU overhead, pair by pair", cpu_pairs, "%", 2)
    run.figure("CPU per report()", [1e6 * (w - wo) / args.steps for w, wo in
                                    zip(cpus[True], cpus[False], strict=True)], "us", 1)
    run.figure("report() -> on_report latency", [1000 * x for x in latencies], "ms", 2)
    base, rep = wall["stock_median"], wall["ours_median"]
    out = {
        "steps": args.steps, "runs": args.runs, "matmuls": args.matmuls,
        "loop_s_without": round(base, 4), "loop_s_with": round(rep, 4),
        "overhead_pct": round(100 * (rep - base) / base, 2),
        "step_rate_per_rank": round(args.steps / base, 1),
        "pair_overhead_pct": [round(x, 2) for x in pairs],
        "pair_overhead_pct_median": round(harness.median(pairs), 2),
        "cpu_s_without": round(cpu["stock_median"], 4), "cpu_s_with": round(cpu["ours_median"], 4),
        "cpu_overhead_pct": round(100 * (cpu["ours_median"] / cpu["stock_median"] - 1), 2),
        "cpu_pair_overhead_pct": [round(x, 2) for x in cpu_pairs],
        "cpu_pair_overhead_pct_median": round(harness.median(cpu_pairs), 2),
        "cpu_us_per_report_median": run.figures["CPU per report()"]["median"],
        "cpus_without": [round(t, 4) for t in cpus[False]],
        "cpus_with": [round(t, 4) for t in cpus[True]],
        "runs_without": [round(t, 4) for t in times[False]],
        "runs_with": [round(t, 4) for t in times[True]],
        "latency_ms_p50": round(1000 * latencies[len(latencies) // 2], 2),
        "latency_ms_p99": round(1000 * latencies[int(len(latencies) * 0.99)], 2),
        "latency_ms_max": round(1000 * latencies[-1], 2),
        "reports": len(latencies),
    }
    return out


def call_fn(n):
    import time

    import torchspark
    ts = []
    for i in range(n):
        x = 0
        for _ in range(30000):
            x += 1
        a = time.perf_counter()
        torchspark.report({"loss": 0.5, "lr": 0.001, "step_time": 0.01}, step=i)
        ts.append(time.perf_counter() - a)
    return ts


def run_call(args, run):
    from torchspark import TorchDistributor

    spark = harness.spark_session("local[2]")
    try:
        d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False, progress=False)
        ts = d.run(call_fn, args.steps)
    finally:
        spark.stop()
    run.figure("time in one report() call", [1e3 * t for t in ts], "ms", 4)
    s = sorted(ts)
    quantiles = [round(s[int(q * (len(s) - 1))] * 1e3, 3) for q in (0.1, 0.5, 0.9, 0.99, 1.0)]
    print("quantiles ms, total s:", (quantiles, sum(ts)), run.load())
    return {"quantiles_ms": quantiles, "total_s": sum(ts)}


def drain_socket(path):
    """The agent's end: a thread in this process reading every connection to path."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)

    def drain(conn):
        while conn.recv(1 << 16):
            pass

    def accept():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def busy(steps, reporting, report):
    c0 = time.process_time()
    for i in range(steps):
        if reporting:
            report({"loss": 0.5, **METRICS}, step=i)
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
    return time.process_time() - c0


def run_cpu(args, run):
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    drain_socket(path)
    os.environ["TORCHSPARK_REPORT_SOCKET"] = path
    import torchspark

    torchspark.report({"warm": 1}, step=0)
    with_s = busy(args.steps, True, torchspark.report)
    without_s = busy(args.steps, False, torchspark.report)
    per = 1e6 * (with_s - without_s) / args.steps
    run.compare("CPU per step", [1e6 * with_s / args.steps], [1e6 * without_s / args.steps], "us",
                "with report()", "without", 1)
    print(f"CPU per step: with report() {1e6 * with_s / args.steps:.1f} us, without "
          f"{1e6 * without_s / args.steps:.1f} us: report() {per:.1f} "
          f"us per call ({run.load()})")
    return {"us_per_call": round(per, 1)}


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


def run_pieces(args, run):
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    drainer = subprocess.Popen([sys.executable, "-c", DRAIN, path])
    while not os.path.exists(path):
        time.sleep(0.01)
    os.environ["TORCHSPARK_REPORT_SOCKET"] = path
    import torch

    import torchspark
    import torchspark.worker._metrics as m

    torch.set_num_threads(1)
    a, b = torch.rand(160, 160), torch.rand(160, 160)
    torchspark.report({"warm": 1}, step=0)
    sink = []

    def step_loop(mode):
        c0 = time.process_time()
        for step in range(args.steps):
            for _ in range(args.matmuls):
                c = a @ b
            metrics = {"loss": float(c[0, 0]), **METRICS}
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
    try:
        for r in range(args.runs):
            for k in modes if r % 2 == 0 else modes[::-1]:
                cpu[k].append(step_loop(k))
    finally:
        drainer.kill()
    base = harness.median(cpu["none"])
    for k in modes:
        run.figure(f"CPU per step, {k}", [1e3 * x / args.steps for x in cpu[k]], "ms")
        c = harness.median(cpu[k])
        print(f"{k:7s} CPU {1e3 * c / args.steps:.3f} ms/step, {1e6 * (c - base) / args.steps:+.1f} "
              f"us/step ({100 * (c - base) / base:+.2f} %)")
    return {}


def main():
    ap = harness.cli(__doc__, runs=5, quick={"steps": 50, "matmuls": 2})
    ap.add_argument("--steps", type=int, default=1000, help="steps a loop (default 1000)")
    ap.add_argument("--matmuls", type=int, default=12, help="160x160 matmuls per step")
    ap.add_argument("--mode", choices=MODES, default="loop",
                    help="loop (the benchmark), or one of the investigations behind it")
    args = harness.parse(ap)
    for key, value in MODE_DEFAULTS.get(args.mode, {}).items():
        if getattr(args, key) == ap.get_default(key) and not args.quick:
            setattr(args, key, value)
    run = harness.Run("report_bench" if args.mode == "loop" else f"report_bench_{args.mode}", args)
    out = {"loop": run_loop, "call": run_call, "cpu": run_cpu, "pieces": run_pieces}[args.mode](args, run)
    run.results = out
    if args.mode == "loop":
        import json
        print(json.dumps(out, indent=1))
    run.finish()


if __name__ == "__main__":
    main()
