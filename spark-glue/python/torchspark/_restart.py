"""The driver's restart policy for distributed runs (docs/distributor.md, "Restarts").

Spark never retries a failed barrier ResultStage (SPARK-25161): the job aborts on the first
task failure, executor loss included. So the driver does: when an attempt fails and
restarts are left, it waits until the cluster has a slot for every task again (Spark's
standalone master replaces a lost executor at once; a replacement is waited for up to
spark.torchspark.job.replacementTimeout) and submits a new barrier job. Each attempt is a
new job: its tasks re-elect the master (so losing rank 0's executor is covered), its
training processes learn the attempt from TORCHSPARK_ATTEMPT and the previous attempt's
root cause from TORCHSPARK_RESTART_CAUSE, and its log lines carry "[attempt N] ". Users
resume from their own checkpoints (torchspark.checkpoint); without one, an attempt starts
from step 0. The final exception lists each attempt's root cause, in order.
"""
from __future__ import annotations

import re
import time
from typing import Dict, Any, Callable, List, Optional

from torchspark._report import TorchDistributorError, outcome

MAX_RESTARTS_CONF = "spark.torchspark.job.maxRestarts"
REPLACEMENT_TIMEOUT_CONF = "spark.torchspark.job.replacementTimeout"
MIN_NODES_CONF = "spark.torchspark.job.minNodes"
ATTEMPT_ENV = "TORCHSPARK_ATTEMPT"
CAUSE_ENV = "TORCHSPARK_RESTART_CAUSE"
MAX_RESTARTS_ENV = "TORCHSPARK_MAX_RESTARTS"
CAUSE_MAX = 1000  # characters of a cause handed to the next attempt


def attempt_env(attempt: int, limit: int, cause: Optional[str]) -> Dict[str, str]:
    env = {ATTEMPT_ENV: str(attempt), MAX_RESTARTS_ENV: str(limit)}
    if cause:
        env[CAUSE_ENV] = cause[:CAUSE_MAX]
    return env


# The line torchspark.checkpoint prints after a checkpoint on request (a decommission
# notice: checkpoint.py); RestartPolicy.java reads the same line.
_ON_REQUEST = re.compile(r"torchspark\.checkpoint: step (\d+) checkpointed on request "
                         r"\(executor decommission\)")


def root_cause(e: BaseException) -> str:
    """One line naming an attempt's root cause: a node whose executor is being
    decommissioned when its rank's last lines say it checkpointed on request; a lost
    executor when Spark says so (the other ranks' errors, e.g. gloo's "Connection reset by
    peer", are its consequences); else the first line of the error."""
    rep = getattr(e, "report", None) or {}  # a node's own record after a checkpoint on request
    if rep.get("reason") in ("preempted", "decommission") and rep.get("summary"):
        return str(rep["summary"])
    # The rank's last lines: its report's, and those its message shows (the driver's).
    tail = getattr(e, "output_tail", None) or []
    lines = (tail.splitlines() if isinstance(tail, str) else list(tail)) + str(e).splitlines()
    for ln in reversed(lines):
        m = _ON_REQUEST.search(str(ln))
        if m:
            node = getattr(e, "node_rank", None)
            who = f"node {node}'s executor" if node is not None else "an executor"
            return (f"{who} is being decommissioned: step {m.group(1)} was checkpointed on "
                    "request and the node stopped")
    # Spark's text is read by the C core's outcome table only (torchspark/outcome.h).
    found = outcome(None, str(e.__cause__ or ""))
    if found["reason"] in ("executor_lost", "decommission"):
        return str(found["cause"])
    text = str(e).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    first = re.sub(r"^TorchDistributor \(distributed\) failed: ", "", first)
    return first[:500]


def free_slots(spark: Any) -> int:
    """How many barrier tasks the cluster can run at once now (active executors' slots)."""
    jsc = spark.sparkContext._jsc.sc()
    try:
        rp = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(rp))
    except Exception:
        # Executors (the driver's entry excluded) x their cores / spark.task.cpus.
        infos = jsc.statusTracker().getExecutorInfos()
        cpus = int(spark.conf.get("spark.task.cpus", "1"))
        return sum(max(0, int(i.totalCores()) // cpus) for i in infos
                   if i.port() > 0 and str(i.host()) != "" and int(i.totalCores()) > 0)


def wait_for_slots(spark: Any, need: int, timeout_s: float, remote: bool,
                   poll_s: float = 0.1) -> int:
    """Waits until the cluster can run `need` barrier tasks (a replacement executor
    registered), up to timeout_s; returns the slots seen last. On Spark Connect the client
    cannot see the executors: Spark's own barrier slot check waits instead."""
    if remote:
        return need
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            slots = free_slots(spark)
        except Exception:
            return need  # cannot tell: let Spark's own check decide
        if slots >= need or time.monotonic() >= deadline:
            return slots
        time.sleep(poll_s)


def exclude_executor(spark: Any, executor_id: str) -> bool:
    """Takes a silent node's executor out of scheduling by its id: Spark would keep
    offering it until its heartbeat timeout (spark.network.timeout, 120 s by default).
    SparkContext.killAndReplaceExecutor marks it pending removal at once (no task is placed
    on it, its slots no longer count) and asks the cluster manager to kill it and start a
    replacement (the application's executor target is kept). False when that is not
    possible (Spark Connect, a scheduler without executor allocation)."""
    try:
        return bool(spark.sparkContext._jsc.sc().killAndReplaceExecutor(executor_id))
    except Exception:
        return False


def min_nodes(value: Optional[int], num_tasks: int) -> int:
    """min_nodes (the keyword's or the conf's, read by _conf), else num_tasks (not
    elastic); at most the run's nodes."""
    if value is None:
        return num_tasks
    if value > num_tasks:
        raise ValueError(f"min_nodes is {value}: give a whole number of nodes (barrier tasks) "
                         f"from 1 to the run's {num_tasks}")
    return value


def lost_nodes(entry: Dict[str, Any]) -> int:
    """How many of an attempt's nodes went with their executor, from its record (what a
    Spark Connect client can know, as it cannot see the executors): 1 when its root cause
    is a lost, decommissioned or silent node, else 0."""
    cause = entry.get("cause") or ""
    if (entry.get("silent_node") is not None or cause.endswith("(ExecutorLostFailure)")
            or " is being decommissioned: " in cause):
        return 1
    return 0


def history_message(causes: List[str], limit: int, last: str) -> str:
    lines = [f"TorchDistributor (distributed) failed after {len(causes)} attempt(s) "
             f"(max_restarts={limit}): {last}", "Root cause of each attempt, in order:"]
    lines += [f"  attempt {i}: {c}" for i, c in enumerate(causes)]
    return "\n".join(lines)


def next_nodes(spark: Any, need: int, least: int, timeout_s: float, remote: bool,
               unusable: int = 0, lost: int = 0) -> int:
    """How many nodes the next attempt runs on: need when the cluster has a slot for each
    now; else, elastic (least < need), the slots there are when they are >= least, at once;
    else need once a replacement executor came within timeout_s; else the slots seen
    last (< least: no restart). unusable: slots Spark still counts that are not (the
    executor of a node that went silent, until Spark's heartbeat timeout removes it).
    On Spark Connect the client cannot count slots: need less the nodes the attempt lost
    with their executors (lost), at least least (elastic), else need; Spark's barrier slot
    check waits for them."""
    if remote:
        return max(least, need - lost)
    try:
        slots = free_slots(spark) - unusable
    except Exception:
        return need
    if slots >= need:
        return need
    if least <= slots:
        return slots
    slots = wait_for_slots(spark, least + unusable, timeout_s, remote) - unusable
    return min(slots, need) if slots >= least else slots


def run(run_once: Callable[[int, Optional[str], int], Any], *, limit: int, spark: Any,
        need_slots: int, replacement_timeout_s: float, remote: bool, logger: Any,
        least_slots: Optional[int] = None, record: Optional[List[Dict[str, Any]]] = None,
        times: Optional[Dict[str, Any]] = None) -> Any:
    """Calls run_once(attempt, cause, nodes) until it returns or limit restarts are used up.
    record, when given, gets one dict per attempt (distributor.attempts); times is where
    run_once leaves when the failure was noticed (root_at, ended_at: _job.Outcome)."""
    causes: List[str] = []
    cause: Optional[str] = None
    least = need_slots if least_slots is None else least_slots
    nodes = need_slots
    rec: List[Dict[str, Any]] = record if record is not None else []
    for attempt in range(limit + 1):
        entry: Dict[str, Any] = {"attempt": attempt, "nodes": nodes, "started": time.time(),
                                 "ended": None, "cause": None}
        rec.append(entry)
        if times is not None:
            times.clear()
        try:
            result = run_once(attempt, cause, nodes)
            entry["ended"] = time.time()
            return result
        except TorchDistributorError as e:
            entry["ended"] = time.time()
            cause = root_cause(e)
            entry["cause"] = cause
            if times:
                entry.update({k: v for k, v in times.items() if v is not None})
            causes.append(cause)
            if attempt == limit:
                if limit == 0:
                    raise
                raise TorchDistributorError(history_message(causes, limit, str(e)),
                                            {**(e.report or {}), "attempts": causes}) from e
            t0 = time.monotonic()
            unusable = 1 if entry.get("silent_node") is not None else 0
            lost = entry.get("silent_executor")
            if unusable and lost is not None and not remote and exclude_executor(spark, lost):
                # Excluded by id: its slots are no longer counted, and a replacement
                # executor may come for it.
                entry["excluded_executor"] = lost
                unusable = 0
                logger.warning(
                    f"TorchDistributor: executor {lost} (node {entry['silent_node']}, silent) "
                    "is excluded from the next attempt: SparkContext.killAndReplaceExecutor "
                    "asked the cluster manager to replace it")
            slots = next_nodes(spark, need_slots, least, replacement_timeout_s, remote,
                               unusable, lost_nodes(entry) if remote else 0)
            if slots < least:
                want = (f"{need_slots}" if least == need_slots
                        else f"at least {least} (min_nodes)")
                causes.append(f"no restart: {want} task slot(s) needed, {slots} "
                              f"available after waiting {replacement_timeout_s:g}s for a "
                              f"replacement executor ({REPLACEMENT_TIMEOUT_CONF})")
                raise TorchDistributorError(history_message(causes, limit, str(e)),
                                            {**(e.report or {}), "attempts": causes}) from e
            nodes = slots
            fewer = (f"; on {nodes} of {need_slots} nodes (min_nodes={least})"
                     if nodes < need_slots else "")
            seen = ("Spark Connect: Spark's barrier slot check waits for the slots" if remote
                    else f"{slots} slot(s) available after {time.monotonic() - t0:.1f}s")
            logger.warning(
                f"TorchDistributor attempt {attempt} failed: {cause}; restarting as attempt "
                f"{attempt + 1} of {limit + 1} ({seen}{fewer})")
    raise AssertionError("unreachable")
