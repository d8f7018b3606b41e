"""run() -> first training step from 0 executors with dynamic allocation (issue 31), gang
launch, on local-cluster[2,1,1024], side by side with stock TorchDistributor in the same
session (refused at submission: SPARK-24942). Before each run the executors are left to be
released as idle (executorIdleTimeout 3s), so every run starts from 0: the first run of the
session, then "again after the executors were released as idle". --backlog alternates runs
without the driver's request for executors (requestTotalExecutors: _gang.REQUEST_EXECUTORS).

    .venv/bin/python -m bench.gang_bench [--runs 3] [--quick] [--backlog]
    sudo .venv/bin/python -m bench.gang_bench --netns [--runs 3] [--grow N]

--netns: the same on the namespace cluster (tests/helpers/netns_cluster.py: root and network
namespaces): a standalone master and 2 workers (3 with --grow) of 1 core, each host its own
namespace and address; the bench runs itself as the driver program in the driver namespace
(client mode, dynamic allocation with shuffle tracking: standalone has no external shuffle
service here), and afterwards counts the training processes left on any worker host (the marker census)
and what the teardown left. --grow N (with --netns): then, in a second session on 3 workers,
N cycles of bench/grow_bench.py --dynamic's grow-back cycle (grow_cycles()).

Figures: seconds from run() to stock's refusal; from run() to the first executor registered,
to the second, and to the first gloo DDP step of 2 ranks (the earliest of both ranks' step);
and where the time goes (torchspark's waterfall, TORCHSPARK_TIMING=1: tasks started, gang
formed and master elected, agents started, first worker exec, torch imported, process group
up). Figures are medians; the load average is printed beside them.
"""
import argparse
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import harness
from torchspark import TorchDistributor
from torchspark.driver import _gang

PHASES = ("tasks_started", "election_done", "agents_started", "worker_exec", "torch_imported",
          "pg_up")


def ddp_step():
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.ones(8, 4)).pow(2).mean().backward()
    stepped = [None] * dist.get_world_size()
    dist.all_gather_object(stepped, time.time())
    return min(stepped)


def executors(spark):
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def wait_released(spark, timeout=120):
    deadline = time.monotonic() + timeout
    while executors(spark) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return executors(spark)


def stock_refused():
    """Seconds from stock run() to its SPARK-24942 refusal."""
    from pyspark.ml.torch.distributor import TorchDistributor as Stock

    started = time.time()
    try:
        Stock(num_processes=2, local_mode=False, use_gpu=False).run(ddp_step)
    except Exception as e:  # the refusal is the figure
        assert "SPARK-24942" in f"{e} {e.__cause__}", e
        return time.time() - started
    raise AssertionError("stock TorchDistributor was not refused under dynamic allocation")


def one(spark, request):
    _gang.REQUEST_EXECUTORS = request
    seen = {}
    stop = threading.Event()
    started = time.time()

    def watch():
        while not stop.is_set():
            n = executors(spark)
            for k in range(1, n + 1):
                seen.setdefault(k, time.time() - started)
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    try:
        first = d.run(ddp_step)
    finally:
        stop.set()
        t.join()
    marks = d._clock.marks
    phases = {k: marks[k] - marks["run_called"] for k in PHASES if k in marks}
    return seen.get(1), seen.get(2), first - started, phases


DYNAMIC = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.minExecutors": "0",
    "spark.dynamicAllocation.initialExecutors": "0",
    "spark.dynamicAllocation.maxExecutors": "2",
    "spark.dynamicAllocation.executorIdleTimeout": "3s",
    "spark.torchspark.warmWorkers": "false",
}


def on_netns(args, argv):
    """--netns: builds the namespace cluster, runs this bench (argv) as its driver program in
    the driver namespace, then counts what is left on the hosts; returns the exit code."""
    nc, ch = harness.helpers("netns_cluster", "cluster_harness")
    why = nc.namespaces_supported()
    if why:
        print(f"gang_bench --netns: the namespace cluster is unavailable: {why}", file=sys.stderr)
        return 2
    out = args.json or harness.OUT / "gang_bench_netns.json"
    c = nc.NetnsCluster(workers=3 if args.grow else 2, cores=1,
                        run_dir=tempfile.mkdtemp(prefix="tsp-gang-"))
    rc, left = None, None
    try:
        c.start()
        d = c.hosts["driver"]
        child = [c.python, "-m", "bench.gang_bench", *argv, "--json", str(out),
                 "--driver-of", f"{c.master_url},{d.name},{d.addr}"]
        p = c.popen("driver", child, cwd=str(harness.ROOT))
        try:
            rc = p.wait(timeout=600 + 300 * args.runs)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        left = ch.wait_no_training_processes(c, 30)
    finally:
        c.stop()
    gone = c.leftovers()
    doc = json.loads(out.read_text()) if rc == 0 else None
    print(f"gang_bench --netns: driver exited {rc}; training processes left on the hosts: "
          f"{len(left or [])}; left after the teardown: {len(gone)}", flush=True)
    if doc is None:
        return rc or 1
    doc["options"].pop("driver_of", None)
    doc["options"]["netns"] = True
    doc["command"] = harness.command()
    doc["results"]["netns"] = {
        "cluster": f"standalone master + {len(c.worker_names)} workers of 1 core, in network "
                   "namespaces", "processes_left": left, "teardown_left": gone}
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"# results: {out}", flush=True)
    return 0 if not left and not gone else 1


def session(args, conf=None):
    """The bench's session: local-cluster, or (--driver-of) the namespace cluster's master,
    this process being its driver in the driver namespace."""
    conf = conf or DYNAMIC
    if not args.driver_of:
        return harness.spark_session("local-cluster[2,1,1024]", conf)
    master, host, addr = args.driver_of.split(",")
    light = harness.helper("netns_cluster").JVM_LIGHT
    return harness.spark_session(master, dict(conf, **{
        "spark.driver.host": host, "spark.driver.bindAddress": addr,
        "spark.executor.cores": "1", "spark.executor.memory": "512m",
        "spark.driver.extraJavaOptions": light, "spark.executor.extraJavaOptions": light}))


def grow_cycles(args, run):
    """--grow N: bench/grow_bench.py --dynamic's cycle N times on this cluster (3 workers):
    node 1's executor JVM SIGKILLed, the run goes on with 2 nodes, the standalone worker
    starts a replacement within Spark's requested total, the run grows back to 3 nodes from
    the step it checkpointed (0 steps lost), no training process left."""
    gb = importlib.import_module("bench.grow_bench")
    mark = harness.helper("tsp_spark").MARK
    spark = session(args, {**gb.DYNAMIC, f"spark.executorEnv.{mark}": gb.tr.MARK_VALUE,
                           "spark.torchspark.job.replacementTimeout": "180s"})
    cycles = []
    try:
        for i in range(args.grow):
            tmp = Path(tempfile.mkdtemp(prefix="tsp-grow-netns-"))
            try:
                cycles.append(gb.cycle(spark, tmp, i))
            except AssertionError as e:
                cycles.append({"passed": False, "error": str(e)[:300]})
            print(f"grow cycle {i}: {json.dumps(cycles[-1])}; load {os.getloadavg()[0]:.1f}",
                  flush=True)
    finally:
        spark.stop()
    ok = [c for c in cycles if c["passed"]]
    run.figure("grow: 3 slots -> the 2-node attempt stopped", [c["stopped_s"] for c in ok], "s", 2)
    run.figure("grow: 3 slots -> first step on 3 nodes", [c["regrow_s"] for c in ok], "s", 2)
    run.results["grow"] = {"cycles": len(cycles), "passed": len(ok), "each": cycles}


def main():
    ap = harness.cli(__doc__, runs=3)
    ap.add_argument("--backlog", action="store_true",
                    help="alternate runs without the driver's requestTotalExecutors")
    ap.add_argument("--netns", action="store_true",
                    help="on the namespace cluster (root): standalone, 2 workers of 1 core")
    ap.add_argument("--grow", type=int, default=0, metavar="N",
                    help="with --netns: then N grow-back cycles on 3 workers (bench/grow_bench.py)")
    ap.add_argument("--driver-of", help=argparse.SUPPRESS)  # --netns's driver program
    args = harness.parse(ap)
    if args.grow and not (args.netns or args.driver_of):
        ap.error("--grow needs --netns (on local-cluster: bench/grow_bench.py --dynamic)")
    if args.netns:
        argv = [a for a in sys.argv[1:] if a != "--netns"]
        if args.json:  # the driver writes it, then --netns adds the hosts' census
            i = argv.index("--json")
            del argv[i:i + 2]
        return on_netns(args, argv)
    os.environ["TORCHSPARK_TIMING"] = "1"
    spark = session(args)
    run = harness.Run("gang_bench_netns" if args.driver_of else "gang_bench", args)
    modes = (True, False) if args.backlog else (True,)
    got = {m: [] for m in modes}
    stock = []
    try:
        for i in range(args.runs):
            stock.append(stock_refused())
            for request in modes:
                left = wait_released(spark)
                sample = one(spark, request)
                got[request].append(sample)
                where = ", ".join(f"{k} {v:.1f}" for k, v in sample[3].items())
                print(f"run {i} request={request} (executors before: {left}; stock refused "
                      f"after {stock[-1]:.2f} s): first executor {sample[0]:.2f} s, second "
                      f"{sample[1]:.2f} s, first step {sample[2]:.2f} s; {where}; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        spark.stop()
    run.figure("stock run() -> refused (SPARK-24942)", stock, "s", 3)
    for request in modes:
        name = "with requestTotalExecutors" if request else "backlog only"
        rows = got[request]
        for idx, what in enumerate(("first executor", "second executor", "first step")):
            run.figure(f"run() -> {what}, {name}", [s[idx] for s in rows], "s", 3)
        run.figure(f"run() -> first step, first run of the session, {name}", [rows[0][2]], "s", 3)
        if len(rows) > 1:
            run.figure(f"run() -> first step after the executors were released, {name}",
                       [s[2] for s in rows[1:]], "s", 3)
        for k in PHASES:
            vals = [s[3][k] for s in rows if k in s[3]]
            if vals:
                run.figure(f"run() -> {k}, {name}", vals, "s", 3)
    if args.backlog:
        run.compare("run() -> first training step from 0 executors",
                    [s[2] for s in got[True]], [s[2] for s in got[False]], "s",
                    ours_name="requestTotalExecutors", stock_name="backlog only", digits=3)
    if args.grow:
        grow_cycles(args, run)
    for k, v in run.figures.items():
        print(f"{k}: median {v['median']} s ({v['samples']})")
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
