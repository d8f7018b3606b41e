"""What each barrier task runs (in the executor's Python worker): one node of the job.

node_rank = partitionId(), nnodes = len(getTaskInfos()); rank 0 elects the master
(native elect module: address of its route to the others, interface, port held until its
agent exits, run id) and the record reaches every task through the driver
(_rendezvous.py; one allGather without it); then the task runs the torchspark-run agent
with the topology and waits for it.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

from torchspark.driver import _gang, _report, _timing
from torchspark.native import _elect, _rendezvous
from torchspark.task import _launch, _partition, _report_rows
from torchspark.worker import _warm
from torchspark.native._lib import agent_path, json_call
from torchspark.task._spec import NodeSpec

RESULT_CHUNK = 4 << 20  # bytes per row of the collect() fallback


def _node_gpus(spec: NodeSpec, ctx: Any, node_rank: int) -> Optional[List[str]]:
    """The GPUs of this node's processes (None for a CPU job): Spark's raw addresses, which
    the agent assigns against the executor's own CUDA_VISIBLE_DEVICES (--gpus, rules R0-R8
    in docs/gpu.md), which it inherits as is."""
    if not spec["use_gpu"]:
        return None
    if spec["local_master"]:
        k = spec["gpus_per_task"]  # the driver checked that every slice is whole (G11)
        return list(spec["driver_gpus"][node_rank * k:(node_rank + 1) * k])
    res = ctx.resources().get(spec["gpu_resource"])
    return list(res.addresses) if res is not None else []


def work_root() -> Optional[str]:
    """Where a node's work directory goes: this executor's local root (the parent of the
    block manager directories that PySpark hands its workers in SPARK_LOCAL_DIRS), which
    Spark and the cluster manager remove with the application, so that an executor that
    dies before the task's cleanup (SIGKILL, a preemption) leaves no /tmp/torchspark-*
    behind (NodeTask.workRoot: the same root). None (the temporary directory) elsewhere."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].rstrip("/")
    root = os.path.dirname(first) if first else ""
    return root if root and os.path.isdir(root) else None


def run_node(spec: NodeSpec, iterator: Iterator[Any]) -> Iterator[bytes]:
    timing = _timing.TaskTiming(spec["timing_env"])
    # A barrier task's context, or a gang task's once every node joined (_gang.py); the
    # nodes' addresses as Spark gives them (the election drops their ports, elect.c).
    ctx, node_rank, hosts = _gang.task_context(spec, str)
    reservation = staged = None
    workdir = tempfile.mkdtemp(prefix="torchspark-", dir=work_root())
    try:
        # train_on_dataframe: the partition staged for the node's processes; run(): nothing.
        staged = _partition.stage_task_input(spec, iterator, ctx)
        packed = ""
        if node_rank == 0:
            _, packed, reservation = _elect.elect_master(hosts=hosts,
                                                         driver_host=spec["driver_host"])
        # Rank 0's record as received: the C core reads it and finds this node's interface.
        packed = _rendezvous.exchange(spec["rendezvous"], spec["log_secret_hex"], ctx,
                                      node_rank, packed)
        timing.mark("election_done")
        # Reports the channel could not deliver come back as rows (_report_rows.py).
        tag = spec.get("report_rows")
        spill = _report_rows.Spill(tag, workdir) if tag else None
        env = {**spec["attempt_env"], **(staged.env if staged is not None else {})}
        facts = {"nnodes": len(hosts), "node_rank": node_rank, "packed": packed,
                 "task_attempt_id": ctx.taskAttemptId(), "env": timing.env(env),
                 "gpus": _node_gpus(spec, ctx, node_rank)}
        out_file = _run_agent(spec, facts, workdir, spill)
        if reservation is not None:
            reservation.release()
        if out_file is not None:
            # Read in chunks: a large result is never held twice in the worker.
            with open(out_file, "rb") as f:
                while True:
                    chunk = f.read(RESULT_CHUNK)
                    if not chunk:
                        break
                    yield chunk
        if spill is not None:
            yield from spill.rows()
    finally:
        if reservation is not None:
            reservation.release()
        if staged is not None:
            staged.close()
        shutil.rmtree(workdir, ignore_errors=True)


class NodeFailed(RuntimeError):
    """A node's agent failed: the message carries its finished document (the task's
    carrier, docs/protocol.md section 3); ``failure`` for local mode."""

    def __init__(self, message: str, failure: _report.Failure) -> None:
        super().__init__(message)
        self.failure = failure


def _run_agent(spec: NodeSpec, facts: Dict[str, Any], workdir: str,
               spill: Optional[_report_rows.Spill] = None, echo: bool = True,
               hand: Optional[Callable[[str], None]] = None,
               warm_anchor: Optional[int] = None) -> Optional[str]:
    """Runs this node's agent (holding the caller's port reservation meanwhile) as the C
    core plans it from the task's facts (docs/protocol.md section 12); returns the result
    file to send through collect(), or None; raises NodeFailed with a failure report.
    echo: its lines to stderr (the executor's own log keeps every line, with or without the
    channel); hand: each of its lines to this instead (else its stderr lines to spill).
    facts {"standalone": True, ...}: local mode, the one node of a standalone run (no
    election, no rendezvous, no staging), its warm pool anchored at warm_anchor (the
    driver)."""
    fn, endpoint = spec["fn_bytes"], spec["log_endpoint"]
    request = {"agent": agent_path(), "python": sys.executable, "workdir": workdir,
               "log_endpoint": endpoint, "nccl_check": spec["nccl_check"],
               "output": fn is not None, "output_channel": spec["result_via_channel"],
               "program": ["-m", "torchspark.worker._fn_runner", "{fn}", "{output}"]
               if fn is not None else [spec["script"], *spec["script_args"]], **facts}
    if spec["nccl_check"] > 0 and facts.get("gpus"):
        request["nccl_lib"] = os.environ.get("TORCHSPARK_NCCL_LIB") or _launch.find_libnccl()
    plan = json_call("tsp_task_launch", request)
    if fn is not None:
        with open(plan["files"]["fn"], "wb") as f:
            f.write(fn)
    if spec["warm_idle_s"] and fn is not None:
        # The agent's environment as agentproc.c composes it (env_default: only where the
        # task's own environment has no value): the pool's workers must match it.
        env = {**plan["env_default"], **os.environ, **plan["env"]}
        warm = _warm.ensure_quietly(env, plan["nproc_per_node"],
                         _warm.executor_anchor() if warm_anchor is None else warm_anchor,
                         spec["warm_idle_s"])
        plan = json_call("tsp_task_launch", dict(request, warm_socket=warm)) if warm else plan
    done = _launch.run_agent(plan, spec["log_secret_hex"] if endpoint else None,
                             echo, hand or (spill.stderr_line if spill else None), hand is not None)
    if done["failure"] is not None:
        failure = _report.Failure(done["failure"]["document"])
        raise NodeFailed(done["failure"]["message"], failure)
    for line in done["log"]:
        sys.stderr.write(line + "\n")
    if done["missing"]:
        raise RuntimeError("TorchDistributor failed during training."
                           "View stdout logs for detailed error message.")
    result: Optional[str] = done["result"]
    return result
