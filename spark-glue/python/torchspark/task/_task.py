"""What each barrier task runs (in the executor's Python worker): one node of the job.

node_rank = partitionId(), nnodes = len(getTaskInfos()); rank 0 elects the master
(native elect module: address of its route to the others, interface, port held until its
agent exits, run id) and the record reaches every task through the driver
(_rendezvous.py; one allGather without it); then the task runs the torchspark-run agent
with the topology and waits for it.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

from torchspark.driver import _gang, _report
from torchspark.native import _elect, _rendezvous
from torchspark.task import _launch, _partition, _report_rows
from torchspark.worker import _warm
from torchspark.native._lib import GpuAssignment, GpuRequest, load_library
from torchspark.task._spec import NodeSpec

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
RESULT_CHUNK = 4 << 20  # bytes per row of the collect() fallback


def gpus_owned(addresses: List[str], visible: Optional[str], task: str = "0",
               host: Optional[str] = None) -> List[str]:
    """Spark GPU addresses + the CUDA_VISIBLE_DEVICES they were given under -> the workers'
    entries, by the native rules R0-R8 (native/src/gpu/gpu.c, docs/gpu.md): the agent applies
    the same function to its --gpus. ValueError with the rule's message on a refusal (the
    stock text for malformed addresses)."""
    req = GpuRequest(",".join(addresses).encode(),
                      None if visible is None else visible.encode(), task.encode(),
                      host.encode() if host else None)
    out = GpuAssignment()
    err = ctypes.create_string_buffer(4096)
    if load_library().tsp_gpu_assign(ctypes.byref(req), ctypes.byref(out), err, len(err)) != 0:
        raise ValueError(err.value.decode("utf-8", errors="replace"))
    mask = out.mask.decode()
    return mask.split(",") if mask else []


def _host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def _elect_master(hosts: List[str],
                  driver_host: str) -> "tuple[_elect.Record, str, _elect.PortReservation]":
    """Rank 0: elect towards another node's host, else towards the driver."""
    peers = [h for h in dict.fromkeys(hosts[1:]) if h and h != hosts[0]]
    peers += [h for h in (driver_host, hosts[0]) if h]
    errors = []
    for peer in peers:
        try:
            return _elect.elect_master(peer)
        except _elect.ElectionError as e:
            errors.append(str(e))
    raise RuntimeError(
        f"torchspark: rank 0's task on host {socket.gethostname()} could not choose a "
        f"master address reachable from the other nodes ({'; '.join(errors)}): check that "
        "the executors' host names resolve on every executor"
    )


def warm_pool(env: Dict[str, str], nproc: int, anchor: int, idle_s: float) -> Optional[str]:
    """The socket of this executor's warm worker pool (torchspark/worker/_warm.py), started when
    none lives; None (workers start as usual) when no pool can be had, said on stderr."""
    try:
        return _warm.ensure(env, nproc, anchor, idle_s)
    except Exception as e:  # never a reason to fail a run
        sys.stderr.write(f"torchspark: no warm worker pool on this executor ({e}); the "
                         "training processes start a fresh Python\n")
        return None


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


def run_node(spec: NodeSpec, iterator: Iterator[Any]) -> Iterator[bytes]:
    timing = _TaskTiming(spec["timing_env"])
    # A barrier task's context, or a gang task's once every node joined (_gang.py).
    ctx, node_rank, hosts = _gang.task_context(spec, _host_of)
    nnodes = len(hosts)
    env = dict(os.environ)
    env["TORCHSPARK_TASK_ATTEMPT_ID"] = str(ctx.taskAttemptId())  # TorchSparkPlugin finds the agent by it
    env.update(spec["attempt_env"])  # a restarted run's attempt (_restart.py)

    gpus = _node_gpus(spec, ctx, node_rank)
    nproc = max(1, len(gpus)) if gpus is not None else 1
    if gpus is None:
        env[CUDA_VISIBLE_DEVICES] = ""

    reservation = staged = None
    workdir = tempfile.mkdtemp(prefix="torchspark-")
    # Created by TorchSparkPlugin on a decommission notice (torchspark.checkpoint.requested).
    env["TORCHSPARK_CHECKPOINT_REQUEST"] = os.path.join(workdir, "checkpoint-request")
    try:
        # train_on_dataframe: the partition staged for the node's processes; run(): nothing.
        staged = _partition.stage_task_input(spec, iterator, ctx)
        env.update(staged.env if staged is not None else {})
        if node_rank == 0:
            record, packed, reservation = _elect_master(hosts, spec["driver_host"])
        else:
            packed = ""
        record = _elect.unpack_record(
            _rendezvous.exchange(spec["rendezvous"], spec["log_secret_hex"], ctx, node_rank,
                                 packed))
        timing.mark("election_done")
        ifname = record.ifname if node_rank == 0 else _elect.local_ifname(record.master_addr)
        if ifname:
            for var in IFNAME_VARS:
                env.setdefault(var, ifname)
        # Reports the channel could not deliver come back as rows (_report_rows.py).
        tag = spec.get("report_rows")
        spill = _report_rows.Spill(tag, workdir) if tag else None
        out_file = _run_agent(spec, timing.env(env), workdir, node_rank, nnodes, nproc,
                              record, gpus, spill)
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


class _TaskTiming:
    """run()'s waterfall on the task's side (torchspark/driver/_timing.py): the driver's marks,
    then this task's start and election; handed to the workers in their environment."""

    def __init__(self, timing_env: Dict[str, str]) -> None:
        self.timing_env = timing_env
        self.marks: Optional[Dict[str, float]] = None
        if timing_env:
            import json
            import time

            self.marks = dict(json.loads(timing_env.get("TORCHSPARK_TIMING_MARKS", "{}")))
            self.marks["tasks_started"] = time.time()

    def mark(self, name: str) -> None:
        if self.marks is not None:
            import time

            self.marks[name] = time.time()

    def env(self, env: Dict[str, str]) -> Dict[str, str]:
        """env with the marks so far, "agents started" being now."""
        if self.marks is None:
            return env
        import json

        self.mark("agents_started")
        return {**env, **self.timing_env, "TORCHSPARK_TIMING_MARKS": json.dumps(self.marks)}


def output_delivered(status_path: str) -> bool:
    """Whether the agent delivered rank 0's output to the driver (output_outcome)."""
    return output_outcome(status_path) == "delivered"


def output_outcome(status_path: str) -> str:
    """What became of rank 0's output, from the status document the agent writes after the
    transfer (`--output-file PATH` -> `PATH.status`, docs/cli.md): "delivered", "refused"
    (over spark.driver.maxResultSize: the driver raises its own sentence) or "failed" (also
    a status that is missing or unreadable); the sentence on stderr names the file and the
    reason."""
    try:
        with open(status_path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"torchspark: the output status {status_path} cannot be read "
                         f"({e}): rank 0's result counts as not delivered\n")
        return "failed"
    outcome = doc.get("output") if isinstance(doc, dict) else None
    if outcome in ("delivered", "refused"):
        return outcome
    if outcome == "failed":
        sys.stderr.write(f"torchspark: the output status {status_path} says the transfer "
                         f"failed: {doc.get('error')}\n")
    else:
        sys.stderr.write(f"torchspark: the output status {status_path} holds no outcome "
                         f"(\"output\": \"delivered\", \"refused\" or \"failed\"): rank 0's result counts "
                         "as not delivered\n")
    return "failed"


def node_program(workdir: str, fn_bytes: Optional[bytes],
                 script_argv: Optional[List[str]]) -> "tuple[List[str], str, str]":
    """What one node's agent runs, the same in a barrier task and in local mode (a one-node
    run): (program, error file, rank 0's output file) under workdir; a function is written
    to fn.pickle and run by torchspark.worker._fn_runner, else the script with its arguments."""
    error_file = os.path.join(workdir, "error.json")
    out_file = os.path.join(workdir, "output.pickle")
    if fn_bytes is not None:
        fn_file = os.path.join(workdir, "fn.pickle")
        with open(fn_file, "wb") as f:
            f.write(fn_bytes)
        return ["-m", "torchspark.worker._fn_runner", fn_file, out_file], error_file, out_file
    if script_argv is None:
        raise RuntimeError("torchspark: the job gave this task neither a function nor a script")
    return script_argv, error_file, out_file


def node_failure(res: "_launch.AgentResult", node_rank: int, nproc: int) -> _report.Failure:
    """A node's agent that failed: its document finished by the C core with what this
    side saw (exit status, output tail), in a barrier task and in local mode alike."""
    return _report.Failure.from_document(res.report, status=res.returncode,
                                         node_rank=node_rank, host=socket.gethostname(),
                                         nproc_per_node=nproc, tail=res.tail)


class NodeFailed(RuntimeError):
    """A node's agent failed: the message carries its finished document (the task's
    carrier, docs/protocol.md section 3); ``failure`` and ``result`` for local mode."""

    def __init__(self, message: str, failure: _report.Failure,
                 result: "_launch.AgentResult") -> None:
        super().__init__(message)
        self.failure, self.result = failure, result


def _echo(line: str) -> None:
    # The executor's own log keeps every line, with or without the channel.
    sys.stderr.write(line + "\n")


def _run_agent(spec: NodeSpec, env: Dict[str, str], workdir: str, node_rank: int,
               nnodes: int, nproc: int, record: Optional["_elect.Record"],
               gpus: Optional[List[str]] = None,
               spill: Optional[_report_rows.Spill] = None,
               echo: Optional[Callable[[str], None]] = _echo,
               warm_anchor: Optional[int] = None) -> Optional[str]:
    """Runs this node's agent (holding the caller's port reservation meanwhile); returns
    the result file to send through collect(), or None; raises NodeFailed with a failure
    report. record None: local mode, the one node of a standalone run (no election, no
    rendezvous, no staging), its warm pool anchored at warm_anchor (the driver)."""
    program, error_file, out_file = node_program(
        workdir, spec["fn_bytes"],
        None if spec["script"] is None else [spec["script"], *spec["script_args"]])
    endpoint, secret = spec["log_endpoint"], spec["log_secret_hex"]
    ship = bool(endpoint and spec["result_via_channel"] and spec["fn_bytes"] is not None
                and node_rank == 0)
    warm = None
    if spec["warm_idle_s"] and spec["fn_bytes"] is not None:
        warm = warm_pool(env, nproc if record is None or gpus is None else max(1, len(gpus)),
                         _warm.executor_anchor() if warm_anchor is None else warm_anchor,
                         spec["warm_idle_s"])
    cmd = _launch.agent_command(
        standalone=record is None, nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc,
        master_addr=record.master_addr if record else None,
        master_port=record.master_port if record else None,
        run_id=record.run_id if record else None, error_file=error_file, log_endpoint=endpoint,
        output_file=out_file if ship else None, program=program,
        gpus=None if gpus is None else ",".join(gpus),
        nccl_check=spec["nccl_check"] if gpus is not None else 0,
        nccl_port=record.nccl_port if record else 0, warm_socket=warm)
    res = _launch.Agent(cmd, env, echo=echo, on_stderr=spill.stderr_line if spill else None,
                        secret=secret if endpoint else None).run(error_file)
    if res.returncode != 0:
        host = socket.gethostname()
        failure = node_failure(res, node_rank, nproc)
        raise NodeFailed(f"torchspark node {node_rank} on host {host}: the agent exited "
                         f"with status {res.returncode}\n{failure.encode()}\n", failure, res)
    return result_file(ship, out_file, node_rank == 0 and spec["fn_bytes"] is not None)


def result_file(ship: bool, out_file: str, rank0_fn: bool) -> Optional[str]:
    """After the agent succeeded: the file this task sends through collect() (rank 0's
    result), or None. ship: the agent was asked to send out_file over the output channel;
    its status document (output_delivered) decides whether the driver has it already."""
    if ship:
        # "refused": over spark.driver.maxResultSize, which collect() would carry the bytes
        # past (an OutOfMemoryError in the executor): none goes; the driver says why.
        if output_outcome(out_file + ".status") in ("delivered", "refused"):
            return None
        # Not delivered (output_delivered said why): the result takes the collect() path;
        # with no file at all, the driver, which got neither, says so.
        sys.stderr.write("torchspark: rank 0's result did not reach the driver over the "
                         "output channel; sending it through collect() instead\n")
        return out_file if os.path.exists(out_file) else None
    if not rank0_fn:
        return None
    if not os.path.exists(out_file):
        raise RuntimeError("TorchDistributor failed during training."
                           "View stdout logs for detailed error message.")
    return out_file
