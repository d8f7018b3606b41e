"""Local mode (local_mode=True): one node of a barrier task's steps on the driver
(_task._run_agent, standalone): no election, rendezvous or staging; rank 0's result read
from its file here."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import ExitStack
from typing import Any, List, Optional

from pyspark import cloudpickle

from torchspark.driver import _channel
from torchspark.task import _task
from torchspark.driver._pump import _LogPump
from torchspark.task._spec import NodeSpec


def run(dist: Any, train_object: Any, fn_bytes: Optional[bytes],
        script_args: List[str]) -> Optional[Any]:
    gpus = dist._driver_gpus()  # the first num_processes of the driver's (tsp_shape_plan)
    with ExitStack() as stack:
        workdir = tempfile.mkdtemp(prefix="torchspark-")
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ch = stack.enter_context(_channel.Channel(drain_on_failure=5.0)).open(dist, "127.0.0.1")
        spec = _spec(dist, train_object, fn_bytes, script_args, ch)
        dist.logger.info(f"Started local training with {dist.num_processes} processes")
        dist._clock.mark("agents_started")
        facts = {"standalone": True, "nproc_per_node": dist.num_processes,
                 "gpus": gpus or None, "env": dist._clock.env()}
        try:
            out_file = _task._run_agent(
                spec, facts, workdir, echo=False,
                hand=None if ch.server is not None else lambda ln: _LogPump.write(ln + "\n"),
                warm_anchor=os.getpid())
        except _task.NodeFailed as e:
            ch.stop_pump()
            lines = {str(r): "\n".join(ch.tail({"rank": r}) or []) for r in range(dist.num_processes)}
            raise (ch.hang_error("local") or e.failure.error("local", lines)) from None
        ch.stop_pump()
        output = _read_result(dist, out_file) if out_file is not None else None
        dist.logger.info(f"Finished local training with {dist.num_processes} processes")
        return output


def _read_result(dist: Any, out_file: str) -> Any:
    try:
        with open(out_file, "rb") as f:
            output = cloudpickle.load(f)
            dist._clock.value(f.read())  # the trailer after the value
        dist._clock.mark("result_received")
        return output
    except Exception as e:
        raise RuntimeError("TorchDistributor failed due to a pickling error. "
                           "View stdout logs for detailed error message.") from e


def _spec(dist: Any, train_object: Any, fn_bytes: Optional[bytes], script_args: List[str],
          ch: Any) -> NodeSpec:
    """The node spec of local mode's one node: the distributed job's (the keys
    _task._run_agent reads: the channel, the NCCL check, the warm pool) for one node of all
    num_processes on the driver; no ship, rendezvous, staging or output channel."""
    spec = dist._node_spec(train_object, fn_bytes, script_args, None, [], "127.0.0.1", "", ch)
    spec.update({"gpus_per_task": dist.num_processes, "local_master": True,
                 "result_via_channel": False, "gpu_resource": "gpu", "timing_env": {}})
    return spec
