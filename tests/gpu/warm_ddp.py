"""Function-mode DDP with NCCL through the warm pool, by the PySpark glue's own path without
Spark (tests/gpu/run.sh; docs/gpu.md, "Running the device check on a GPU machine").

This process plays the executor's Python worker running one barrier task of
``TorchDistributor(use_gpu=True).run(fn)`` (torchspark/task/_task.py, ``run_node`` and
``_run_agent``): it elects the master (``_elect.elect_master``, holding the ports), starts
or finds the executor's warm pool (``_warm.ensure_quietly``), builds the agent's command
(``tsp_plan_argv`` through ``_lib.json_call`` with ``--gpus``, ``--warm-socket`` and the election's
``nccl_port``), runs it (``_launch.run_agent``) with the function pickled as the driver pickles
it (pyspark's cloudpickle), and reads rank 0's result. Checked on the hardware:

- the training process was forked by the pool (its parent is the pool; torch was imported
  before the function ran), not the shim's fallback; a run without the pool is the control
  (its parent is the agent);
- at the function's start ``torch.cuda.is_initialized()`` and ``torch.cuda._is_in_bad_fork()``
  are False, and the process holds no ``/dev/nvidia*`` descriptor;
- the pool holds no ``/dev/nvidia*`` descriptor and is absent from ``nvidia-smi
  --query-compute-apps`` while the worker trains (the worker is present) and after;
- NCCL all_reduce and a DDP step give the right values, also after the NCCL check;
- with ``--dataframe``: a DataFrame partition, staged as a barrier task stages the Arrow
  batches ``mapInArrow`` gives it (``_partition.stage``), read with
  ``torchspark.data.partition_batches`` and loaded onto the GPU: every row, the right sums
  and dtypes (skipped without pyarrow).

Exit status 0 passed, 1 failed, 77 skipped; "FIGURE | " lines as in checks.py.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

SKIP = 77
ROWS = 100_000
SPARK_BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch: what mapInArrow hands a task
VEC = 4
SCHEMA_JSON = ('{"type":"struct","fields":['
               '{"name":"id","type":"long","nullable":false,"metadata":{}},'
               '{"name":"x","type":"float","nullable":false,"metadata":{}},'
               '{"name":"v","type":{"type":"array","elementType":"float","containsNull":false},'
               '"nullable":false,"metadata":{}}]}')


def say(*a: object) -> None:
    print(*a, flush=True)


def figure(fid: str, what: str, value: str, runs: str = "") -> None:
    say(f"FIGURE | {fid} | {what} | {value} | {runs} |")


# ---- in the training process (pickled by value with this module's functions) -----------

def _nvidia_fds(pid: int) -> List[str]:
    import os

    found = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return [f"(cannot read /proc/{pid}/fd)"]
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.append(target)
    return found


def train(launch_t0: float, dataframe: bool) -> Dict[str, Any]:
    import os
    import subprocess
    import sys
    import time

    info: Dict[str, Any] = {"pid": os.getpid(), "ppid": os.getppid(),
                            "torch_before_fn": "torch" in sys.modules,
                            "fn_started_after_launch": time.time() - launch_t0}
    import torch

    info["cuda_initialized_at_start"] = torch.cuda.is_initialized()
    info["bad_fork_at_start"] = torch.cuda._is_in_bad_fork()
    info["own_nvidia_fds_at_start"] = _nvidia_fds(os.getpid())
    info["parent_nvidia_fds_at_start"] = _nvidia_fds(os.getppid())
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    info["first_allreduce_after_launch"] = time.time() - launch_t0
    info["allreduce_ok"] = bool((x == world).all().item())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).cuda(),
                                                      device_ids=[local])
    loss = model(torch.randn(32, 64, device="cuda")).square().mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.cuda.synchronize()
    info["ddp_step_ok"] = bool(torch.isfinite(loss).item())
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True)
    info["compute_pids"] = [int(p) for p in smi.stdout.split() if p.strip().isdigit()]
    info["parent_nvidia_fds_while_training"] = _nvidia_fds(os.getppid())
    if dataframe:
        from torchspark.data import partition_batches, partition_num_rows

        t = time.time()
        rows, ids, xs, vs, dtypes, devices = 0, 0, 0.0, 0.0, set(), set()
        for b in partition_batches(4096, columns=["id", "x", "v"]):
            g = {k: v.to("cuda", non_blocking=True) for k, v in b.items()}
            rows += g["id"].shape[0]
            ids += int(g["id"].sum().item())
            xs += float(g["x"].double().sum().item())
            vs += float(g["v"].double().sum().item())
            dtypes |= {f"{k}:{v.dtype}:{tuple(v.shape[1:])}" for k, v in g.items()}
            devices |= {str(v.device) for v in g.values()}
        torch.cuda.synchronize()
        info["partition"] = {"rows": rows, "num_rows": partition_num_rows(), "id_sum": ids,
                             "x_sum": xs, "v_sum": vs, "dtypes": sorted(dtypes),
                             "devices": sorted(devices), "seconds": time.time() - t}
    dist.destroy_process_group()
    return info


# ---- the task's side ---------------------------------------------------------------------

def elect() -> Tuple[Any, Any]:
    """Rank 0's election as run_node does it, towards this host (a one-node job)."""
    from torchspark.native import _elect

    try:
        record, _, held = _elect.elect_master(socket.gethostname())
    except _elect.ElectionError:
        record, _, held = _elect.elect_master("127.0.0.1")
    return record, held


def stage_partition(workdir: str):
    """The partition as a barrier task of train_on_dataframe stages it: Arrow record
    batches of Spark's size, as mapInArrow hands them, written once (torchspark/task/_partition.py)."""
    import numpy as np
    import pyarrow as pa

    from torchspark.task import _partition

    def batches():
        for lo in range(0, ROWS, SPARK_BATCH):
            ids = np.arange(lo, min(ROWS, lo + SPARK_BATCH), dtype=np.int64)
            v = (ids[:, None] % 7 + np.arange(VEC)).astype(np.float32)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array((ids % 100).astype(np.float32) * 0.5),
                 pa.ListArray.from_arrays(pa.array(np.arange(0, len(ids) * VEC + 1, VEC,
                                                             dtype=np.int32)),
                                          pa.array(v.reshape(-1)))],
                names=["id", "x", "v"])

    ids = np.arange(ROWS, dtype=np.int64)
    expect = {"rows": ROWS, "id_sum": int(ids.sum()),
              "x_sum": float(((ids % 100).astype(np.float32) * 0.5).astype(np.float64).sum()),
              "v_sum": float((ids[:, None] % 7 + np.arange(VEC)).astype(np.float64).sum())}
    return _partition.stage(batches(), SCHEMA_JSON, 0, workdir), expect


def run_fn(cloudpickle, workdir: str, tag: str, gpus: str, warm: Optional[str],
           nccl_check: float, dataframe: bool, env: Dict[str, str]) -> Tuple[Dict, float, int]:
    """One function-mode run on this node: (rank 0's result, wall, 0, or 1 when it failed)."""
    from torchspark.native import _lib
    from torchspark.task import _launch

    record, held = elect()
    env = dict(env)
    if record["ifname"]:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.setdefault(var, record["ifname"])
    fn_file = os.path.join(workdir, f"{tag}.fn")
    out_file = os.path.join(workdir, f"{tag}.out")
    error_file = os.path.join(workdir, f"{tag}.error.json")
    launch_t0 = time.time()
    with open(fn_file, "wb") as f:
        cloudpickle.dump((train, (launch_t0, dataframe), {}), f)
    cmd = _lib.json_call("tsp_plan_argv", {
        "agent": _lib.agent_path(), "nnodes": 1, "node_rank": 0, "gpus": gpus,
        "master_addr": record["master_addr"], "master_port": record["master_port"],
        "run_id": record["run_id"], "error_file": error_file, "python": sys.executable,
        "nccl_check": nccl_check, "nccl_port": record["nccl_port"], "warm_socket": warm,
        "shutdown_timeout": 5,  # the task plan's (TSP_TASK_SHUTDOWN_TIMEOUT_S)
        "nccl_lib": os.environ.get("TORCHSPARK_NCCL_LIB") or _launch.find_libnccl()
    }) + ["-m", "torchspark.worker._fn_runner", fn_file, out_file]
    say(f"[{tag}] {' '.join(cmd)}")
    t0 = time.monotonic()
    plan = {"argv": cmd, "env": env, "env_default": {}, "finish": {
        "files": {"error": error_file, "output": out_file}, "collect": True, "node_rank": 0,
        "nproc_per_node": 1}}
    with held:
        done = _launch.run_agent(plan, echo=False, hand_all=True,
                                 hand=lambda ln: say(f"[{tag}] {ln}"))
    wall = time.monotonic() - t0
    if done["failure"] is not None or done["missing"]:
        say(f"[{tag}] {done['failure']['message'] if done['failure'] else 'no output file'}")
        return {}, wall, 1
    with open(out_file, "rb") as f:
        return cloudpickle.load(f), wall, 0


def check_partition(expect, tag: str, part: Dict[str, Any], exp: Dict[str, Any]) -> None:
    expect(part.get("rows") == exp["rows"] == part.get("num_rows"),
           f"[{tag}] every row of the partition read: {part.get('rows')}")
    expect(part.get("id_sum") == exp["id_sum"]
           and abs(part.get("x_sum", 0) - exp["x_sum"]) < 1e-6 * exp["x_sum"]
           and abs(part.get("v_sum", 0) - exp["v_sum"]) < 1e-6 * exp["v_sum"],
           f"[{tag}] the sums on the GPU equal the data's")
    expect(part.get("dtypes") == ["id:torch.int64:()", "v:torch.float32:(4,)",
                                  "x:torch.float32:()"] and part.get("devices") == ["cuda:0"],
           f"[{tag}] dtypes and device {part.get('dtypes')} {part.get('devices')}")
    if part.get("seconds"):
        figure("D", f"partition_batches to the GPU: {ROWS} rows (bigint, float, "
               "array<float>[4]), batches of 4096", f"{part['seconds']:.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataframe", action="store_true",
                    help="load a staged DataFrame partition onto the GPU (needs pyarrow)")
    ap.add_argument("--gpus", default="0", help="Spark's GPU addresses for the task")
    a = ap.parse_args()
    if a.dataframe:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            say("skipped: pyarrow is not installed for this Python (the executors' Arrow; "
                "docs/gpu.md)")
            return SKIP

    from torchspark.worker import _cloudpickle, _warm

    cloudpickle = _cloudpickle.load()  # pyspark's, as the driver pickles run()'s function
    ok = True
    results: List[Tuple[str, Dict, float]] = []

    def expect(cond: bool, what: str) -> None:
        nonlocal ok
        say(f"{'ok ' if cond else 'BAD'} {what}")
        ok &= bool(cond)

    workdir_obj = tempfile.TemporaryDirectory(prefix="tsp-gpu-warm-")
    workdir = workdir_obj.name
    env = dict(os.environ)
    staged = exp = None
    if a.dataframe:
        # As run_node: the partition is staged first, its variables in the agent's
        # environment, and then the task asks for the pool.
        staged, exp = stage_partition(workdir)
        env.update(staged.env)
        runs = [("dataframe", True, 0.0)]
    else:
        runs = [("pool-cold", True, 0.0), ("pool-warm+check", True, 60.0),
                ("no-pool", False, 0.0)]
    anchor = os.getpid()  # the pool ends with this process, as with local mode's driver
    nproc = len(a.gpus.split(","))
    t0 = time.monotonic()
    warm = _warm.ensure_quietly(env, nproc, anchor, 120)
    started = [p for p in _warm._started if p.poll() is None]
    if warm is None or not started:
        say("FAIL: no warm pool could be started")
        return 1
    pool = started[-1].pid
    key = _warm.pool_key(sys.executable, anchor, _warm.worker_env(env, nproc))
    log = os.path.join(_warm.pool_dir() or "/nonexistent", key + ".log")
    say(f"warm pool {pool} at {warm} (ready in {time.monotonic() - t0:.2f} s), log {log}")
    try:
        for tag, use_pool, check in runs:
            sock = warm if use_pool else None
            info, wall, rc = run_fn(cloudpickle, workdir, tag, a.gpus, sock, check,
                                    a.dataframe, env)
            if rc != 0:
                expect(False, f"[{tag}] the run succeeded")
                continue
            say(f"[{tag}] rank 0: {info}")
            results.append((tag, info, wall))
            from_pool = info["ppid"] == pool and info["torch_before_fn"]
            if sock:
                expect(from_pool, f"[{tag}] forked by the pool {pool} (parent "
                       f"{info['ppid']}, torch imported before the function: "
                       f"{info['torch_before_fn']}), not the fallback")
            else:
                expect(not from_pool, f"[{tag}] the control: a fresh Python (parent "
                       f"{info['ppid']})")
            expect(not info["cuda_initialized_at_start"],
                   f"[{tag}] torch.cuda.is_initialized() False at the start")
            expect(not info["bad_fork_at_start"],
                   f"[{tag}] torch.cuda._is_in_bad_fork() False at the start")
            expect(not info["own_nvidia_fds_at_start"],
                   f"[{tag}] no /dev/nvidia* in the worker at the start "
                   f"{info['own_nvidia_fds_at_start']}")
            expect(info["allreduce_ok"] and info["ddp_step_ok"],
                   f"[{tag}] NCCL all_reduce and a DDP step")
            expect(info["pid"] in info["compute_pids"],
                   f"[{tag}] the worker is among nvidia-smi's compute apps "
                   f"{info['compute_pids']} (when it is not, nvidia-smi shows another PID "
                   "namespace's numbers, e.g. the host's from a container, and the pool's "
                   "absence proves nothing)")
            if sock:
                expect(pool not in info["compute_pids"],
                       f"[{tag}] the pool is not among nvidia-smi's compute apps")
                expect(not info["parent_nvidia_fds_while_training"],
                       f"[{tag}] the pool holds no /dev/nvidia* while the worker trains "
                       f"{info['parent_nvidia_fds_while_training']}")
            if a.dataframe and exp is not None:
                check_partition(expect, tag, info.get("partition") or {}, exp)
    finally:
        if staged is not None:
            staged.close()
        workdir_obj.cleanup()
    # After the runs: the pool is alive, holds no GPU, and is not a compute app.
    fds = []
    try:
        for fd in os.listdir(f"/proc/{pool}/fd"):
            target = os.readlink(f"/proc/{pool}/fd/{fd}")
            if target.startswith("/dev/nvidia"):
                fds.append(target)
        alive = True
    except OSError:
        alive = False
    expect(alive, f"the pool {pool} is alive after the runs")
    expect(not fds, f"the pool holds no /dev/nvidia* after the runs {fds}")
    import subprocess

    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    expect(str(pool) not in smi, f"the pool is not among nvidia-smi's compute apps {smi}")
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        say("pool log:\n  " + text.strip().replace("\n", "\n  "))
        expect("refused" not in text, "the pool refused no request")
    except OSError:
        pass
    for tag, info, wall in results:
        figure("W", f"function-mode run() on 1 node, {tag}: launch to the function's start",
               f"{info['fn_started_after_launch']:.2f} s")
        figure("W", f"function-mode run() on 1 node, {tag}: launch to the first NCCL all_reduce",
               f"{info['first_allreduce_after_launch']:.2f} s")
        figure("W", f"function-mode run() on 1 node, {tag}: the agent's wall", f"{wall:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
