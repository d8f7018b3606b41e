"""Hands rank 0's election record to the other barrier tasks through the driver, instead of
BarrierTaskContext.allGather().

Why: Spark's barrier calls wait in whole seconds (BarrierTaskContext.runBarrier polls its
RPC future with Thread.sleep(1000)), so one allGather() costs at least a second of every
distributed run() (measured: 1.07 s in each run, docs/benchmarks.md, "The driver's rendezvous,
pyspark's import and Spark's first failure"). Here rank 0 PUTs the
record to a small server on the driver as soon as it has it, and every other task GETs it
the moment it is there.

On by default for classic sessions, whose executors reach the driver's host anyway;
``spark.torchspark.rendezvous=false`` or ``TORCHSPARK_RENDEZVOUS=0`` turns it off, ``=1``
turns it on for Spark Connect too (see :func:`enabled`). The driver decides for the whole
job: the spec carries an endpoint (every task uses it) or none (every task calls
allGather). A task that cannot reach the endpoint
fails before any training starts with an error marked UNREACHABLE; the driver then runs the
job again with allGather, says so once, and keeps to allGather in that process.

The server and the task's requests are the C core's (native/include/torchspark/rendezvous.h,
the wire of docs/protocol.md 2.1), the same code as the JVM glue's: this module only binds
them and keeps the switch. Every connection is TLS 1.3 keyed by the run's secret (the log
channel's, which the task closure carries already): the spec holds no credential of its own.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from torchspark.native._lib import checked, json_call, load_library
from torchspark.task._spec import RendezvousSpec

RECORD_MAX = 4096  # TSP_RDV_RECORD_MAX

# Marks a task's error when it could not reach the driver's rendezvous (see the module doc);
# TSP_RDV_UNREACHABLE, which begins the library's sentence.
UNREACHABLE = "TORCHSPARK_RENDEZVOUS_UNREACHABLE"


def enabled(settings: Dict[str, Any], remote: bool, gang: bool = False) -> bool:
    """spark.torchspark.rendezvous (TORCHSPARK_RENDEZVOUS=0 / =1 on the driver wins: read
    by the C key table), else on for classic sessions and for a gang launch (gang: its tasks
    JOIN there, _gang.py), on Spark Connect too: a Spark Connect client is often not
    reachable from the executors (a laptop), and each such session would pay a failed first
    attempt of a barrier launch.

    (It was opt-in while an e2e test lost Spark's cause of a failed run with it on; the
    cause was found not to be the rendezvous: Spark's first task failure in a fresh
    session takes it seconds once, with either path: docs/benchmarks.md, "The driver's
    rendezvous, pyspark's import and Spark's first failure".)"""
    value = settings["rendezvous"]
    return (gang or not remote) if value is None else bool(value)


class Server:
    """The driver's end (tsp_rdv_start): its port and one native thread, until close();
    keyed by the run's secret (64 hex digits, the log server's secret_hex)."""

    def __init__(self, host: str, secret_hex: str) -> None:
        self._lib = load_library()
        self._h: Optional[int] = checked("tsp_rdv_start", host.encode(), secret_hex.encode(), 0,
                                         error=OSError, ok=bool)

    def call(self, op: str, **keys: Any) -> Any:
        """The reply of one op of the server's JSON call (tsp_rdv_call, docs/protocol.md 2.3:
        its queries and the gang launch's driver side), keys its request's other members;
        RuntimeError with the library's sentence when it refuses."""
        return json_call("tsp_rdv_call", {"op": op, **keys}, RuntimeError, handle=self._h)

    def spec(self, advertised_host: str) -> RendezvousSpec:
        """The endpoint the tasks are told: the advertised host (the bound one when empty)."""
        ep = self.call("endpoint", advertise=advertised_host)
        return {"host": ep["host"], "port": ep["port"]}

    def close(self) -> None:
        """Ends the run: waiting GETs get ``ERR the run ended``."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.tsp_rdv_free(h)

    def __del__(self) -> None:
        self.close()


def exchange(spec: Optional[RendezvousSpec], secret_hex: Optional[str], ctx: Any,
             node_rank: int, packed: str) -> str:
    """Rank 0's packed record, on every task: through the driver when the spec has an
    endpoint (inside TLS keyed by the run's secret), else through allGather()."""
    if not spec:
        return ctx.allGather(packed)[0]
    return str(task_call("exchange", spec, secret_hex, node_rank=node_rank, record=packed)["record"])


def task_call(op: str, spec: RendezvousSpec, secret_hex: Optional[str], **keys: Any) -> Any:
    """A task's request to the driver's rendezvous at spec, made whole (tsp_rdv_task_call,
    docs/protocol.md 2.3: "exchange", "join"); RuntimeError with the library's sentence."""
    return json_call("tsp_rdv_task_call", {"op": op, "host": spec["host"], "port": int(spec["port"]),
                                           "secret_hex": secret_hex or "", **keys}, RuntimeError)
