"""The driver -> task contract: what TorchDistributor's barrier job hands every task.

The driver builds one :class:`NodeSpec` (distributor.py), the job pickles it into each
task's function (_job.py), and the task reads it (_boot.py, _task.py, _partition.py,
_rendezvous.py). At run time each is a plain dict (TypedDicts are dicts: nothing to import
on an executor before torchspark is found, and the pickle is unchanged); the type checker
(mypy, in the test command's lint step) checks every key read or written against these
classes, so a misspelled or missing key fails the lint, not a run on a cluster.
"""
from __future__ import annotations

from typing import Dict, List, Optional, TypedDict


class ShipSpec(TypedDict):
    """The package archive shipped with the job for a driver-only install (_ship.py)."""

    name: str
    version: str
    platform: str


class ScriptFile(TypedDict):
    """A script that exists on the driver, shipped with the job (script mode)."""

    name: str
    data: bytes


class RendezvousSpec(TypedDict):
    """Where the tasks exchange rank 0's election record through the driver
    (_rendezvous.py; docs/protocol.md 2.1)."""

    host: str
    port: int  # the connection is TLS keyed by the run's secret (NodeSpec.log_secret_hex)


class GangSpec(TypedDict):
    """A gang launch's attempt (_gang.py; docs/protocol.md 2.2): its tasks JOIN at the
    rendezvous and wait up to the deadline for every node."""

    timeout_ms: int


class DataFrameSpec(TypedDict):
    """What every task needs to stage its partition (train_on_dataframe, _partition.py)."""

    schema_json: str
    num_tasks: int
    num_processes: int
    per_task: int


class _NodeSpecRequired(TypedDict):
    version: str  # the driver's torchspark version (the task refuses another)
    ship: Optional[ShipSpec]  # the shipped package, when the executors lack it
    use_gpu: bool
    gpus_per_task: int
    local_master: bool  # Spark's local[...] master: GPUs come from the driver's list
    driver_gpus: List[str]
    driver_host: str
    fn_bytes: Optional[bytes]  # function mode: the pickled function; None: a script
    script: Optional[str]  # script mode: the script's path
    script_file: Optional[ScriptFile]  # script mode: the driver's copy, if small enough
    driver_cwd: str
    script_args: List[str]
    log_endpoint: Optional[str]  # HOST:PORT of the driver's log server; None: no channel
    log_secret_hex: Optional[str]
    result_via_channel: bool  # rank 0's result comes over the output channel
    nccl_check: float  # seconds of the NCCL preflight; 0: off
    warm_idle_s: float  # the warm pools' idle timeout; 0: no warm pool
    gpu_resource: str  # the Spark resource name of GPUs
    timing_env: Dict[str, str]  # run()'s waterfall: {} unless TORCHSPARK_TIMING is on
    rendezvous: Optional[RendezvousSpec]  # None: allGather
    attempt_env: Dict[str, str]  # a restarted run's TORCHSPARK_ATTEMPT etc. (_restart.py)


class NodeSpec(_NodeSpecRequired, total=False):
    """The whole contract: the keys above always, dataframe under train_on_dataframe,
    report_rows when the job has a log channel."""

    dataframe: DataFrameSpec
    report_rows: str  # the run's tag of report rows, hex (_report_rows.py); absent: none
    gang: GangSpec  # a gang launch (_gang.py); absent: a barrier stage
