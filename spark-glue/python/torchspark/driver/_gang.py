"""Gang launch: an attempt as N ordinary tasks that gang up through the driver, for Spark
with dynamic allocation, which refuses every barrier stage (SPARK-24942).

``spark.torchspark.launch`` = ``barrier`` | ``gang`` | ``auto`` (default: gang when
``spark.dynamicAllocation.enabled`` is true, else barrier: resolved by the settings' read,
conf.c). In gang mode the driver arms the
rendezvous' gang (N nodes, ``spark.torchspark.gang.timeout``), asks Spark for the executors
the job needs, and submits ``mapPartitions`` without ``.barrier()``; each task JOINs the gang
(docs/protocol.md 2.2) and waits for GO before it elects or starts anything, node rank =
partition id. The decision (who is admitted, the deadline, the failure's sentence) is the C
core's (torchspark/gang.h): this module binds it, reads Spark's executors for the sentence,
and asks Spark for executors.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Dict, Optional, Tuple

from torchspark.native._lib import load_library
from torchspark.native._rendezvous import task_call
from torchspark.task._spec import NodeSpec

GANG = "gang"  # spark.torchspark.launch (auto resolved by _conf.read)
# tsp_gang_state's results (torchspark/gang.h).
WAIT, GO, FAILED = 0, 1, 3
# Ask Spark for the executors at submission (bench/gang_bench.py turns it off for the
# side-by-side "backlog only").
REQUEST_EXECUTORS = True


def dynamic(spark: Any) -> bool:
    """Whether the session's spark.dynamicAllocation.enabled is true."""
    return str(spark.conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true"


class Gang:
    """The armed gang of one attempt at the driver's rendezvous (tsp_rdv_call's op gang)."""

    def __init__(self, rdv: Any, nnodes: int, timeout_ms: int) -> None:
        self._rdv = rdv
        rdv.call("gang", nnodes=nnodes, timeout_ms=timeout_ms)
        self.hold: Optional[Hold] = None  # submitted once the gang formed (poll())

    def poll(self, spark: Any, done: threading.Event) -> Optional[Dict[str, Any]]:
        """One look at the gang (its deadline is checked by the call): None while it waits
        or once it formed, its hold then submitted (the attempt's tasks placed first; the
        hold ends with the job: done); the failed gang's document once it failed."""
        state = self._rdv.call("gang_state")["state"]
        if state == GO and self.hold is not None:
            self.hold.begin(done)
        return self.failure(spark) if state == FAILED else None

    def end(self) -> None:
        """The attempt's job ended: a hold never submitted (the gang did not form) is dropped."""
        if self.hold is not None and not self.hold.go.is_set():
            self.hold.drop()

    def failure(self, spark: Any) -> Dict[str, Any]:
        """The failed gang's document (the run's report; its message the C core's sentence),
        with what Spark shows of its executors now."""
        executors, cores = executors_seen(spark)
        max_ex = spark.conf.get("spark.dynamicAllocation.maxExecutors", None)
        return dict(self._rdv.call("gang_failure", executors=executors, cores=cores,
                                   max_executors=str(max_ex) if max_ex else None)["report"])


def executors_seen(spark: Any) -> Tuple[int, int]:
    """(executors, their cores in all) from Spark's status store, the driver left out;
    -1 each where it cannot be read (Spark Connect)."""
    try:
        store = spark.sparkContext._jsc.sc().statusStore()
        seq = store.executorList(True)
        ex = cores = 0
        for i in range(seq.size()):
            e = seq.apply(i)
            if str(e.id()) != "driver":
                ex += 1
                cores += int(e.totalCores())
        return ex, cores
    except Exception:
        return -1, -1


def ask(distributor: Any) -> Optional[int]:
    """With dynamic allocation, asks Spark's allocation client for the executors that fit the
    run's nodes at once (the C core's rule, tsp_gang_ask) rather than waiting for its backlog
    ramp; the idle timeout releases them after the run. An elastic attempt on fewer nodes than
    the run's (min_nodes: the controller's TORCHSPARK_MAX_NODES) asks for the run's: an ask for
    its own would lower Spark's requested total below the run's, so that YARN or Kubernetes
    never start the lost executor's replacement and the grow watch waits for its slots. The
    total asked for, or None where it cannot ask (Spark Connect, no allocation client)."""
    spark, logger, own = distributor.spark, distributor.logger, distributor.num_tasks
    if distributor.is_remote or not REQUEST_EXECUTORS or not dynamic(spark):
        return None
    nodes = int(distributor._attempt_env.get("TORCHSPARK_MAX_NODES", own))
    try:
        sc = spark.sparkContext
        raw = [spark.conf.get(k, None) for k in ("spark.executor.cores", "spark.task.cpus",
                                                  "spark.dynamicAllocation.maxExecutors")]
        total = load_library().tsp_gang_ask(nodes, *[None if v is None else str(v).encode()
                                                     for v in raw],
                                            max(0, executors_seen(spark)[0]))
        if total < 0:
            return None
        jvm = sc._jvm
        empty = jvm.PythonUtils.toScalaMap(jvm.java.util.HashMap())
        if not sc._jsc.sc().requestTotalExecutors(total, 0, empty):
            return None
        logger.info(f"Asked Spark for {total} executor(s) for {own} gang task(s)"
                    + (f" (the run's {nodes} nodes)" if own != nodes else ""))
        return total
    except Exception as e:  # never a reason to fail a run: the backlog asks anyway
        logger.info(f"Could not ask Spark for executors ({e!r}); its allocation manager "
                    "asks from the job's backlog")
        return None


class Hold:
    """The run controller's hold (a submit's "hold", docs/protocol.md 11): while an elastic
    attempt runs on fewer nodes than the run's under dynamic allocation, k ordinary tasks,
    one per node the attempt lacks, that each hold a slot (a sleep of ms in the JVM through
    SQL's java_method: no Python worker) until the attempt's job ended. Spark's
    allocation manager counts them, so it keeps asking for the run's executors rather than
    lowering its requested total to the attempt's tasks once their backlog cleared (YARN and
    Kubernetes would cancel the replacement), and a replacement executor runs one of them
    from its registration: busy, spark.dynamicAllocation.executorIdleTimeout does not
    release it before the run grows back onto it (bench/grow_bench.py --dynamic lost 2 of 3
    replacements that way with a 5 s timeout). The grow watch counts the slots by it
    (running(): _restart._Watch), as Spark Connect's by its probe. Its DataFrame is built at
    once (a session's first SQL plan takes seconds under load); its job is submitted once
    the attempt's gang formed (go: the attempt's tasks are placed first) and cancelled, the
    sleep interrupted, when the attempt's job ended (done). Spark Connect's (its probe found
    the slots and holds them so) is _connect.Hold."""

    def __init__(self, spark: Any, k: int, ms: int) -> None:
        self.spark, self.k, self.ms = spark, k, ms
        self.go, self.done = threading.Event(), threading.Event()
        self.group = f"torchspark-hold-{uuid.uuid4().hex}"  # not a run's tag (the plugin's)
        self.thread = threading.Thread(target=self._run, daemon=True, name="torchspark-hold")
        self.thread.start()

    def _run(self) -> None:
        try:
            df = self.spark.range(0, self.k, 1, self.k).selectExpr(
                f"java_method('java.lang.Thread', 'sleep', {int(self.ms)}L)")
            self.go.wait()
            if self.done.is_set():  # dropped: the gang never formed
                return
            threading.Thread(target=self.release, daemon=True,
                             name="torchspark-hold-release").start()
            self._collect(df)
        except Exception:  # cancelled: the attempt ended
            pass

    def _collect(self, df: Any) -> None:
        """Runs the hold's job in its job group (release() cancels the group)."""
        self.spark.sparkContext.setJobGroup(
            self.group, "torchspark: slots held for the run's nodes", interruptOnCancel=True)
        df.collect()

    def _cancel(self) -> None:
        self.spark.sparkContext.cancelJobGroup(self.group)

    def begin(self, done: threading.Event) -> None:
        """The gang formed: submit the job, to be cancelled once done (the attempt's job
        ended) is set."""
        self.done = done
        self.go.set()

    def drop(self) -> None:
        """The gang failed or its job ended before it formed: nothing is submitted."""
        self.done.set()
        self.go.set()

    def running(self) -> bool:
        """Whether all k tasks run now (k slots of the run's held besides the attempt's)."""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            active = 0
            for job in tracker.getJobIdsForGroup(self.group):
                info = tracker.getJobInfo(job)
                for stage in info.stageIds if info is not None else []:
                    st = tracker.getStageInfo(stage)
                    active += st.numActiveTasks if st is not None else 0
            return active >= self.k
        except Exception:  # the session is gone
            return False

    def release(self, wait_s: float = 10.0) -> None:
        """Once the attempt's job ended: cancels the hold's job until its thread ended (a
        job submitted after a cancel is cancelled by the next one)."""
        self.done.wait()
        deadline = time.monotonic() + wait_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            try:
                self._cancel()
            except Exception:  # the session is gone: nothing left to hold
                return
            self.thread.join(0.2)


def hold(distributor: Any) -> Optional[Hold]:
    """The attempt's Hold when the run controller's submit asks for one from the gang's GO
    (_restart.run leaves the submit in the failure times), else None. The grow watch finds
    it in the failure times."""
    plan = (distributor._failure_times.get("submit") or {}).get("hold")
    if not plan or plan["from"] != "go" or not REQUEST_EXECUTORS:
        return None
    held = Hold(distributor.spark, plan["slots"], plan["ms"])
    distributor._failure_times["hold"] = held  # _restart._Watch counts by it
    return held


def start(distributor: Any, rdv: Any, spec: NodeSpec, settings: Dict[str, Any]) -> Optional[Gang]:
    """The attempt's gang (spec gets its "gang" key), or None for a barrier launch;
    settings: the run's spark.torchspark.* values (_conf.read). A Spark Connect client
    cannot ask for executors: there Spark's backlog ramp brings them."""
    if settings["launch"] != GANG:  # auto resolved by the settings' read (_conf.read)
        return None
    if rdv is None:
        raise RuntimeError(
            "torchspark: spark.torchspark.launch=gang needs the driver's rendezvous and log "
            "server, which could not start here (see the warning above, or "
            "TORCHSPARK_RENDEZVOUS=0): set spark.torchspark.launch=barrier and turn "
            "spark.dynamicAllocation.enabled off")
    timeout_ms = int(settings["gang.timeout"])
    gang = Gang(rdv, distributor.num_tasks, timeout_ms)
    spec["gang"] = {"timeout_ms": timeout_ms}
    ask(distributor)
    gang.hold = hold(distributor)
    distributor.logger.info(
        f"Gang launch: {distributor.num_tasks} ordinary tasks that wait for each other up to "
        f"{timeout_ms / 1000:g} s (spark.torchspark.gang.timeout)")
    return gang


# ---- a task's side --------------------------------------------------------------------


def join(spec: NodeSpec, node_rank: int, try_no: int) -> int:
    """This task JOINs the gang and waits for every other node's: the attempt's node count
    (GO). Raises the library's sentence when refused (a retry or a copy, the deadline)."""
    rdv, gang = spec["rendezvous"], spec.get("gang")
    assert rdv is not None and gang is not None
    # The JOIN's host (this host's name) and the wait beyond the gang's timeout are the C's.
    return int(task_call("join", rdv, spec["log_secret_hex"], node_rank=node_rank, attempt=try_no,
                         timeout_ms=int(gang["timeout_ms"]))["nnodes"])


def task_context(spec: NodeSpec, host_of: Any) -> Tuple[Any, int, list]:
    """(task context, node rank, hosts by node: [] where unknown) of this task: a barrier
    task's from Spark; a gang task's after its JOIN (none is known: rank 0 elects towards
    the driver's host, then its own, which the C core names, docs/protocol.md 2)."""
    if not spec.get("gang"):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        return ctx, ctx.partitionId(), [host_of(i.address) for i in ctx.getTaskInfos()]
    from pyspark import TaskContext

    ctx = TaskContext.get()
    node_rank = ctx.partitionId()
    nnodes = join(spec, node_rank, ctx.attemptNumber())
    return ctx, node_rank, [""] * nnodes
