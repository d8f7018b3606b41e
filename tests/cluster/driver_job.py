"""The driver program of the cluster tests: run inside the driver namespace (client deploy mode).

    python driver_job.py CONFIG.json

CONFIG names the master, the driver's host name and address, the distributor class
("module:Class", e.g. "pyspark.ml.torch.distributor:TorchDistributor" or
"torchspark:TorchDistributor": the test body is the same for both), extra Spark conf and a
list of runs (tag, num_processes, use_gpu, files to write before the run, training
parameters), done one after the other in one Spark application (one driver and executor
start-up for all). Each run trains a tiny DDP model with gloo on CPU and prints one line
``TSP_RESULT <json>`` on stdout: {"tag", "ok", "result" (rank 0's return value), "error",
"error_type", "elapsed", "raised_at" (wall clock, on failure)}. Everything else the driver
prints (the distributor's log lines from the executors included)
goes to stdout/stderr as usual, for the test to inspect.
"""

import importlib
import json
import os
import sys
import time
import traceback


def train(tag, steps, sleep, progress_dir, fail_rank=None, lines=False):
    """Runs on every rank. Returns (on rank 0) what every rank saw, gathered over gloo.

    lines: each step prints ``TSPLINE a=<attempt> r=<rank> n=<step>``, then appends
    ``<step> <time.time()> <host>`` to progress_dir/lines-a<attempt>-r<rank>: the record of
    what the rank printed, which the driver's output must hold (kill_series.py)."""
    import os
    import socket

    import psutil
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    attempt = int(os.environ.get("TORCHSPARK_ATTEMPT", "0"))

    def write_progress(step):
        if progress_dir:
            p = os.path.join(progress_dir, f"rank{rank}.json")
            with open(p + ".tmp", "w") as f:
                json.dump({"rank": rank, "step": step, "host": host, "pid": os.getpid(),
                           "attempt": attempt}, f)
            os.replace(p + ".tmp", p)
        if lines and step >= 0:  # printed first: a rank killed in between is not "lost"
            print(f"TSPLINE a={attempt} r={rank} n={step}", flush=True)
            with open(os.path.join(progress_dir, f"lines-a{attempt}-r{rank}"), "a") as f:
                f.write(f"{step} {time.time():.3f} {host}\n")

    host = socket.gethostname()
    rank = int(os.environ["RANK"])
    print(f"TSPLOG run={tag} rank={rank} host={host} starting", flush=True)
    write_progress(-1)
    phases = {"fn_called": time.time()}
    dist.init_process_group("gloo")
    phases["pg_up"] = time.time()
    if lines:  # a restart's timeline (kill_series.py): the task's marks, then the worker's
        with open(f"/proc/{os.getpid()}/stat") as f:  # field 22: start, in clock ticks
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            boot = time.time() - float(f.read().split()[0])
        phases["worker_start"] = boot + start / os.sysconf("SC_CLK_TCK")
        phases.update(json.loads(os.environ.get("TORCHSPARK_TIMING_MARKS", "{}")))
        with open(os.path.join(progress_dir, f"phases-a{attempt}-r{rank}.json"), "w") as f:
            json.dump(phases, f)
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 10), torch.randn(64, 1)
    loss = torch.tensor(0.0)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        write_progress(step)
        if sleep:
            time.sleep(sleep)
    if fail_rank is not None and rank == fail_rank:
        raise RuntimeError(f"injected failure on rank {rank}")

    # Which local interfaces carry this process's connections to other ranks (gloo's pairs
    # and the store): the honest answer to "which interface did gloo use".
    by_addr = {a.address: name for name, addrs in psutil.net_if_addrs().items() for a in addrs}
    conns = [c for c in psutil.Process().net_connections(kind="tcp")
             if c.status == psutil.CONN_ESTABLISHED and c.raddr]
    master_port = int(os.environ.get("MASTER_PORT", "0"))
    gloo = sorted({by_addr.get(c.laddr.ip, c.laddr.ip) for c in conns
                   if c.raddr.port != master_port and c.laddr.port != master_port
                   and not c.laddr.ip.startswith("127.")})
    names = ["MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK",
             "GROUP_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TSP_TEST_MARKER"]
    info = {k: os.environ.get(k) for k in names}
    with open(f"/proc/{os.getppid()}/comm") as f:  # tsp-warm-pool: forked by torchspark's pool
        parent_comm = f.read().strip()
    info.update(host=host, pid=os.getpid(), gloo_interfaces=gloo, parent_comm=parent_comm,
                weight_sum=float(sum(p.detach().sum() for p in model.parameters())))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, info)
    print(f"TSPLOG run={tag} rank={rank} host={host} done loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        return {"ranks": gathered, "loss": float(loss.item())}
    return None


def spark_timeline(sc):
    """Spark's own view of the application, from the driver's status store (ms clocks):
    jobs (submitted, completed), their barrier tasks (launched, ended, executor) and the
    executors (added, removed). A restart's timeline (kill_series.py)."""
    store = sc._jsc.sc().statusStore()

    def seq(s):
        return [s.apply(i) for i in range(s.size())]

    def ms(opt):
        return opt.get().getTime() / 1000.0 if opt.isDefined() else None

    jobs = []
    for j in seq(store.jobsList(None)):
        tasks = []
        for sid in seq(j.stageIds()):
            for t in seq(store.taskList(int(sid), 0, 1 << 20)):
                d = t.duration()
                launch = t.launchTime().getTime() / 1000.0
                tasks.append({"index": int(t.index()), "executor": str(t.executorId()),
                              "host": str(t.host()), "status": str(t.status()),
                              "launched": launch,
                              "ended": launch + int(d.get()) / 1000.0 if d.isDefined()
                              else None})
        jobs.append({"id": int(j.jobId()), "submitted": ms(j.submissionTime()),
                     "completed": ms(j.completionTime()), "status": str(j.status()),
                     "tasks": tasks})
    execs = [{"id": str(e.id()), "host": str(e.hostPort()), "added": e.addTime().getTime()
              / 1000.0, "removed": ms(e.removeTime())} for e in seq(store.executorList(False))]
    return {"jobs": jobs, "executors": execs}


def main() -> int:
    cfg = json.load(open(sys.argv[1]))
    os.environ.update(cfg.get("env", {}))  # e.g. TORCHSPARK_TIMING=1 (the task's marks)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.master(cfg["master_url"]).appName(cfg.get("app", "tsp-cluster-test"))
    conf = {
        "spark.driver.host": cfg["driver_host"],
        "spark.driver.bindAddress": cfg["driver_addr"],
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.task.cpus": "1",
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        # Schedule the barrier stage only when every executor is there (no slot retries).
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
    }
    conf.update(cfg.get("conf", {}))
    # The executors' Python is the driver's PYSPARK_PYTHON when PySpark creates the context.
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    mod, _, cls = cfg["distributor"].partition(":")
    Distributor = getattr(importlib.import_module(mod), cls)
    # A bench's side-by-side "before": {"module": {"NAME": value}} set on those modules.
    for name, attrs in cfg.get("patch", {}).items():
        m = importlib.import_module(name)
        for k, v in attrs.items():
            if not hasattr(m, k):
                raise SystemExit(f"driver_job: {name} has no {k} to patch")
            setattr(m, k, v)
    all_ok = True
    for run in cfg["runs"]:
        t = run["train"]
        out = {"tag": run["tag"], "ok": False, "result": None, "error": None, "error_type": None}
        for path, text in run.get("files_before", {}).items():
            with open(path, "w") as f:
                f.write(text)
        t0 = time.monotonic()
        try:
            d = Distributor(num_processes=run["num_processes"], local_mode=False,
                            use_gpu=run.get("use_gpu", False), **run.get("kw", {}))
            try:
                out["result"] = d.run(train, run["tag"], t["steps"], t.get("sleep", 0.0),
                                      t.get("progress_dir"), t.get("fail_rank"),
                                      t.get("lines", False))
            finally:  # torchspark's restarts (docs/distributor.md): each attempt's record
                out["attempts"] = getattr(d, "attempts", None)
            out["ok"] = True
        except BaseException as e:  # noqa: B902 - the test wants to see whatever run() raised
            text = "".join(traceback.format_exception_only(type(e), e))
            # Keep the head (what happened) and the tail (the root cause of a Java error).
            out["error"] = text if len(text) <= 6000 else text[:3000] + "\n...\n" + text[-3000:]
            out["error_type"] = type(e).__name__
            out["raised_at"] = time.time()
            all_ok = False
        out["elapsed"] = time.monotonic() - t0
        if cfg.get("spark_timeline"):
            try:
                out["spark"] = spark_timeline(spark.sparkContext)
            except Exception as e:  # noqa: B902 - a timeline is a bench's extra
                out["spark"] = {"error": repr(e)}
        print("TSP_RESULT " + json.dumps(out), flush=True)
    if all_ok:
        spark.stop()
    # After a fault a graceful stop can wait on a lost host: leave at once (the gateway JVM
    # exits when our stdin pipe closes; the cluster teardown reaps whatever is left).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
