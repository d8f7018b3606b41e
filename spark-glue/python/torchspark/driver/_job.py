"""The barrier job of distributed mode, run beside the log server's control channel.

One function submits it for both kinds of session: a classic SparkSession runs an RDD
barrier stage (``rdd.barrier().mapPartitions``), Spark Connect (which has no RDD API) and
any run over an input DataFrame run ``DataFrame.mapInArrow(..., barrier=True)`` with the
schema ``chunk binary``, as PySpark's own TorchDistributor does. Either way each task runs
_boot.node (pickled by value, see _boot.py) and rank 0's result comes back as chunks when
it does not travel over the output channel.

The job runs in its own thread (an InheritableThread, so the caller's job group, tags and
properties apply) with a job tag of its own (SparkContext job tags on classic, the
session's operation tags on Connect); the caller waits for whichever comes first:
the job's end, or the run's root cause from the log server (an agent's failure report, or
an agent lost without goodbye: docs/protocol.md 1.7), at which point the server has
already told every other agent to stop. Spark's own failure (the barrier abort) usually
follows within a second and is kept as the exception's cause; when it does not come in
time (a lost host is noticed by Spark only after spark.network.timeout), the job is
cancelled and run() raises without it.
"""
from __future__ import annotations

import functools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from torchspark.driver import _report, _spark
from torchspark.task import _boot
from torchspark.task._spec import NodeSpec

# After the root cause is known: how long to wait for Spark's own failure (the cause of
# our exception), then for the cancelled job to end.
SPARK_GRACE_S = 3.0
# The same wait when a restart follows: none, the next attempt is submitted at once
# (bench/restart_recovery.py sets it to SPARK_GRACE_S for the side-by-side "before").
RESTART_GRACE_S = 0.0
CANCEL_WAIT_S = 1.0
# After a cancelled job's collect() failed: how long to wait for Spark's job-end event (the
# scheduler fails the job's waiter before it posts it; normally a few ms).
ENDED_WAIT_S = 10.0
LOST_WAIT_S = 2.0  # > the server's lost grace (1 s)
GANG_POLL_S = 0.1  # the driver's look at a gang launch's gang until it formed
# A restarted attempt's job waits for the failed attempt's tasks to give their cores back.
# Spark offers a core freed by a task's end to the waiting task sets for that executor
# alone, which a barrier stage of several tasks cannot use: it launches at the scheduler's
# next offer of every executor (spark.scheduler.revive.interval, 1 s). Until its tasks are
# running, the driver asks for that offer itself every REVIVE_EVERY_S (what Spark does on
# each job submission), for at most REVIVE_FOR_S.
REVIVE_EVERY_S = 0.1
REVIVE_FOR_S = 60.0
REVIVE_ON_RESTART = True  # bench/kill_series.py --no-revive: the side-by-side "before"


# Classic sessions without an input DataFrame use the RDD barrier API: measured side by
# side, mapInArrow added ~60 ms (5%) to a bare 2-task barrier job on local-cluster.
CLASSIC_VIA_ARROW = False


@dataclass
class Outcome:
    chunks: Optional[List[bytes]]  # the job's result (None when it failed)
    spark_error: Optional[BaseException]  # Spark's exception, when it came
    root: Optional[Dict[str, Any]]  # the log server's root cause (LogServer.failure())
    # When (time.time()) the log server named the root cause, and when Spark's job ended:
    # a restart's timeline (distributor.attempts).
    root_at: Optional[float] = None
    ended_at: Optional[float] = None
    # The executor id of a node that went silent (task_executor), None when not known.
    silent_executor: Optional[str] = None
    # A gang launch that failed (its deadline): the C core's document (_gang.py).
    gang_failure: Optional[Dict[str, Any]] = None


class _Tags:
    """Job tags: SparkContext's on a classic session, the session's own on Connect."""

    def __init__(self, spark: Any, remote: bool) -> None:
        self.spark, self.remote = spark, remote

    def add(self, tag: str) -> None:
        if self.remote:
            self.spark.addTag(tag)
        else:
            sc = self.spark.sparkContext
            sc.addJobTag(tag)
            sc.setLocalProperty("torchspark.run", tag)  # marks the tasks for TorchSparkPlugin

    def remove(self, tag: str) -> None:
        if self.remote:
            self.spark.removeTag(tag)
        else:
            sc = self.spark.sparkContext
            sc.removeJobTag(tag)
            sc.setLocalProperty("torchspark.run", None)

    def cancel(self, tag: str) -> None:
        try:
            if self.remote:
                self.spark.interruptTag(tag)
            else:
                self.spark.sparkContext.cancelJobsWithTag(tag)
        except Exception:  # the session is gone: nothing left to cancel
            pass


def collect_chunks(spark: Any, spec: NodeSpec, num_tasks: int, *, remote: bool,
                   input_df: Any = None) -> List[bytes]:
    """Runs the barrier stage (num_tasks tasks, or one per partition of input_df) and
    returns what the tasks yielded, in partition order: rank 0's result chunks or none."""
    barrier = "gang" not in spec  # a gang launch: ordinary tasks (_gang.py)
    if not remote and input_df is None and not CLASSIC_VIA_ARROW:
        rdd = spark.sparkContext.parallelize(range(num_tasks), num_tasks)
        # partial, not a lambda: a lambda would carry this module by reference and import
        # torchspark on the executor before _boot.node could choose which copy.
        return (rdd.barrier() if barrier else rdd).mapPartitions(
            functools.partial(_boot.node, spec)).collect()
    df = input_df if input_df is not None else spark.range(0, num_tasks, 1, num_tasks)
    return _spark.collect_binary(df.mapInArrow(functools.partial(_boot.arrow_node, spec),
                                               "chunk binary", barrier=barrier), "chunk")


def silent(root: Optional[Dict[str, Any]]) -> bool:
    """True when the root cause is a node that is unreachable but not gone (protocol 1.7):
    its agent went silent (no PING: a frozen host), or TCP gave up on it (a network cut).
    Spark learns of such a host only after spark.network.timeout. The outcome's `exclude`
    (torchspark/outcome.h), from the record's structured reason, never from its prose."""
    from torchspark.driver import _report

    return root is not None and bool(_report.outcome(root, None)["exclude"])


def task_executor(spark: Any, tag: str, partition: int) -> Optional[str]:
    """The id of the executor that ran (or runs) the task of partition `partition` in the
    job tagged `tag`, from Spark's status store (classic sessions only); None when Spark
    does not know it. The task of a node is its partition (node_rank = partitionId())."""
    try:
        sc = spark.sparkContext._jsc.sc()
        store = sc.statusStore()
        for job in sc.statusTracker().getJobIdsForTag(tag):
            stages = store.job(job).stageIds()
            for i in range(stages.size()):
                # A barrier stage is never retried (SPARK-25161): its only attempt is 0.
                tasks = store.taskList(int(stages.apply(i)), 0, 1 << 20)
                for j in range(tasks.size()):
                    t = tasks.apply(j)
                    if int(t.index()) == partition:
                        return str(t.executorId())
    except Exception:  # an older Spark, or the session is gone: not known
        return None
    return None


def await_ended(spark: Any, tag: str, wait_s: float = ENDED_WAIT_S) -> None:
    """After a cancel, until every job tagged `tag` shows ended in Spark's status store (not
    before its start was delivered; at once when the store cannot be read: the session is
    stopping), for up to wait_s: Spark fails collect() before it posts the cancelled job's
    end, so run() could otherwise raise while the job still shows active (BarrierJob.ended,
    JVM)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            jsc = spark.sparkContext._jsc
            ids = list(jsc.sc().statusTracker().getJobIdsForTag(tag))
            infos = [jsc.statusTracker().getJobInfo(int(job)) for job in ids]
            if ids and all(i is not None and str(i.status()) != "RUNNING" for i in infos):
                return
        except Exception:
            return
        time.sleep(0.01)


def revive_until_running(spark: Any, tag: str, done: threading.Event,
                         every_s: float = REVIVE_EVERY_S, for_s: float = REVIVE_FOR_S) -> int:
    """Asks Spark's scheduler to offer every executor's free cores (reviveOffers, what it
    does on a job submission and every spark.scheduler.revive.interval) every every_s, until
    the job tagged `tag` has a task running (a barrier stage's tasks are launched together,
    all or none: Spark's status store, whose counts may lag behind by a task, says at least
    one), it ended (done), or for_s passed. Returns how many times it asked (0: not
    possible here, e.g. no such method)."""
    try:
        jsc = spark.sparkContext._jsc
        backend, ids, tracker = jsc.sc().schedulerBackend(), jsc.sc().statusTracker(), \
            jsc.statusTracker()
    except Exception:
        return 0
    asked = 0
    deadline = time.monotonic() + for_s
    while not done.wait(every_s) and time.monotonic() < deadline:
        try:
            running = 0
            for job in ids.getJobIdsForTag(tag):
                info = tracker.getJobInfo(int(job))
                for sid in (info.stageIds() if info is not None else []):
                    st = tracker.getStageInfo(int(sid))
                    if st is not None:
                        running += st.numActiveTasks() + st.numCompletedTasks()
            if running > 0:
                return asked
            backend.reviveOffers()
            asked += 1
        except Exception:  # the session is gone, or an older Spark: leave it to Spark
            return asked
    return asked


def run_barrier_job(spark: Any, spec: NodeSpec, num_tasks: int, server: Any, *,
                    remote: bool, input_df: Any = None,
                    spark_grace_s: float = SPARK_GRACE_S, revive: bool = False,
                    gang: Any = None) -> Outcome:
    """Runs the job (see collect_chunks) and returns how it ended. spark_grace_s: how long
    to wait for Spark's own failure once the root cause is known (0 when a restart follows:
    the next attempt is submitted at once, the log server's root cause naming the node).
    revive: a restarted attempt's job, which waits for the failed attempt's cores: ask for
    Spark's offers until its tasks run (revive_until_running; classic sessions only).
    gang: a gang launch's armed gang (_gang.Gang): when it fails (its deadline), the job is
    cancelled at once and the outcome carries the gang's sentence."""
    tags = _Tags(spark, remote)
    tag = f"torchspark-{uuid.uuid4().hex}"
    done, wake = threading.Event(), threading.Event()
    box: Dict[str, Any] = {}

    def run_job() -> None:
        try:
            tags.add(tag)
            try:
                box["chunks"] = collect_chunks(spark, spec, num_tasks, remote=remote,
                                               input_df=input_df)
            finally:
                tags.remove(tag)
        except BaseException as e:  # noqa: B902 - handed to the caller
            box["error"] = e
        finally:
            box["ended_at"] = time.time()
            done.set()
            wake.set()

    def watch() -> None:
        while not done.is_set():
            root = server.failure(0.25)
            if root is not None:
                box["root"], box["root_at"] = root, time.time()
                wake.set()
                return

    _spark.inheritable_thread(run_job, "torchspark-barrier-job",
                              spark if remote else None).start()
    if server is not None:
        threading.Thread(target=watch, daemon=True, name="torchspark-failure-watch").start()
    if revive and not remote:
        threading.Thread(target=revive_until_running, args=(spark, tag, done),
                         daemon=True, name="torchspark-revive").start()
    try:
        while not wake.wait(GANG_POLL_S):  # a gang launch's gang polled until it formed
            box["gang"] = gang.poll(spark, done) if gang is not None else None
            if box["gang"] is not None:
                tags.cancel(tag)  # every task, the waiting and the never started
                break
        if "root" in box and not done.is_set():
            # A silent node (docs/protocol.md 1.7, PING): Spark notices it only after
            # spark.network.timeout, so its failure is not waited for.
            if not done.wait(0 if silent(box["root"]) else spark_grace_s):
                tags.cancel(tag)
                done.wait(CANCEL_WAIT_S)
    except BaseException:  # KeyboardInterrupt: stop everything now, then re-raise
        if server is not None:
            server.stop_all("the driver was interrupted")
        tags.cancel(tag)
        raise
    return _outcome(spark, server, tag, box, remote, done, gang)


def _await_fact(server: Any, error: Optional[BaseException]) -> Optional[Dict[str, Any]]:
    """The job failed with no root cause yet: Spark learns of an executor's exit at once,
    its node's agent tells the log server a moment later (EVENT EXECUTOR_GONE, or its
    channel ends: the nodes lost, docs/protocol.md 1.7) and the other nodes' errors follow.
    Waits up to LOST_WAIT_S for a root cause, before every agent is stopped (a node stopped
    by the driver is no longer lost), while one can come: a node lost in its grace (its
    record follows), or else, unless a node lost has come, any agent still connected when
    the job was not cancelled (a cancel, the user's or a gang launch's, kills no executor:
    the C core's outcome of Spark's text, docs/protocol.md 10). The root cause, or None."""
    deadline = time.monotonic() + LOST_WAIT_S
    cancelled = _report.outcome(None, _report.spark_text(error))["reason"] == "cancelled"
    root = server.failure(0)
    while root is None and time.monotonic() < deadline and (server.lost_pending() or not (
            cancelled or server.nodes_lost() or not server.stats()["connected"])):
        root = server.failure(0.05)
    return root


def _outcome(spark: Any, server: Any, tag: str, box: Dict[str, Any], remote: bool,
             done: threading.Event, gang: Any) -> Outcome:
    """How the job of run_barrier_job ended (box: what its threads found), every agent
    stopped when it failed; a gang launch's unsubmitted hold dropped (gang.end())."""
    error = box.get("error")
    root = box.get("root")
    if server is not None and (error is not None or root is not None):
        # A failing agent's report is acknowledged before its task ends, so it is here
        # already if there is one; whatever else ended the job, stop every agent now.
        # A host that died is seen by Spark at once but by the server only after the
        # lost grace: wait for it then, to name the host.
        if root is None:
            root = _await_fact(server, error)
            box["root_at"] = time.time() if root is not None else None
        server.stop_all("the Spark job failed" if root is None else root["message"])
    lost = None
    if root is not None and silent(root) and not remote and root.get("node_rank") is not None:
        lost = task_executor(spark, tag, int(root["node_rank"]))
    if gang is not None:
        gang.end()
    if box.get("gang") is not None:
        done.wait(CANCEL_WAIT_S)
        if not remote:  # (a Connect client has no status tracker)
            await_ended(spark, tag)
    return Outcome(box.get("chunks") if error is None else None, error, root,
                   box.get("root_at"), box.get("ended_at"), lost, box.get("gang"))
