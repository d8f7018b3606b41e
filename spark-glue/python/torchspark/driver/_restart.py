"""The driver's restart loop for distributed runs (docs/distributor.md, "Restarts"): an
adapter of the C run controller (torchspark/runctl.h, docs/protocol.md 11), which decides.

Spark never retries a failed barrier ResultStage (SPARK-25161), so the driver does: the
controller says when to submit an attempt (its nodes and its training processes'
TORCHSPARK_ATTEMPT / TORCHSPARK_MAX_RESTARTS / TORCHSPARK_RESTART_CAUSE), when to count the
free slots and for how long to wait for a replacement executor, which executor to exclude,
what to warn and what to raise at the end (each attempt's root cause, in order). This loop
only performs those actions through Spark. RestartPolicy.java is the JVM's twin adapter.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Any, Callable, List, Optional

from torchspark.driver import _connect, _gang
from torchspark.native._lib import json_call
from torchspark.driver._report import TorchDistributorError, spark_text

_WATCH_SCALE = 1.0  # the controller's waits, scaled (tests only)


def step(state: Optional[Dict[str, Any]], event: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One step of the run controller: {"state", "actions"} (docs/protocol.md 11)."""
    result: Dict[str, Any] = json_call("tsp_runctl_step", {"state": state, "event": event})
    return result


def start_event(dist: Any) -> Dict[str, Any]:
    """The controller's start of a TorchDistributor's run: its nodes and settings, the
    attempts' launch (auto resolved by _conf.read) and spark.dynamicAllocation.enabled."""
    settings = dist._settings
    return {"event": "start", "glue": "python", "nodes": dist.num_tasks,
            "max_restarts": dist.max_restarts, "min_nodes": dist.min_nodes,
            "replacement_timeout_ms": int(settings["job.replacementTimeout"]),
            "remote": dist.is_remote, "batch": settings["elastic.batch"],
            "launch": settings["launch"], "dynamic": _gang.dynamic(dist.spark)}


def min_nodes(value: Optional[int], num_tasks: int) -> int:
    """min_nodes (the keyword's or the conf's), else num_tasks: checked by the controller."""
    start = {"event": "start", "glue": "python", "nodes": num_tasks, "min_nodes": value}
    return int(step(None, start)["state"]["min_nodes"])


def failed_event(e: TorchDistributorError, times: Dict[str, Any]) -> Dict[str, Any]:
    """What the glue observed of a failed attempt (docs/protocol.md 11, attempt_failed):
    its exception's report as it is (docs/protocol.md 8: the controller reads the reason,
    the node, a checkpoint on request's step), what run_once left in times (when the
    failure was noticed, the silent node and its executor: _job.Outcome), the nodes its
    log server saw lost (docs/protocol.md 1.7: read once the attempt ended, after its
    drain: a dying node's agent told it by then), Spark's text for the outcome table."""
    server = times.get("server")
    return {"event": "attempt_failed", "message": str(e),
            "spark_error": spark_text(e.__cause__),
            "report": e.report if isinstance(e.report, dict) else None,
            "silent_node": times.get("silent_node"), "executor": times.get("silent_executor"),
            "lost_nodes": server.nodes_lost() if server is not None else None,
            "root_at": times.get("root_at"), "ended_at": times.get("ended_at")}


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


def count_slots(spark: Any) -> Optional[int]:
    """The free slots now; None when Spark cannot tell (the controller asks again while it
    waits for a replacement: docs/protocol.md 11, count_slots)."""
    try:
        return free_slots(spark)
    except Exception:
        return None


def exclude_executor(spark: Any, executor_id: str) -> bool:
    """Takes a silent node's executor out of scheduling by its id: Spark would keep
    offering it until its heartbeat timeout (spark.network.timeout, 120 s by default).
    SparkContext.killAndReplaceExecutor marks it pending removal at once and asks the
    cluster manager to kill it and start a replacement. False when that is not possible
    (Spark Connect, a scheduler without executor allocation)."""
    try:
        return bool(spark.sparkContext._jsc.sc().killAndReplaceExecutor(executor_id))
    except Exception:
        return False


class _Watch:
    """A shrunk attempt's slot watch (docs/protocol.md 11, "Growing back"): from its own
    thread while the attempt runs, counts the slots when the controller says (on Spark
    Connect by the submit's probe of `probe` tasks: _connect.Probe), sends them (and whether
    the attempt's log server, times["server"], is still to come: server_pending) and performs
    its answers (warn, watch_slots, checkpoint_and_stop through that log server). end() waits
    for the step in flight, so the attempt's own event follows the last state."""

    def __init__(self, spark: Any, state: Dict[str, Any], submit: Dict[str, Any], logger: Any,
                 times: Dict[str, Any]) -> None:
        self.spark, self.state, self.logger, self.times = spark, state, logger, times
        self.nodes = int(submit["nodes"])
        self.ended = threading.Event()
        self.wake = threading.Event()  # the attempt ended, or its probe ran: count now
        self.probe = (_connect.Probe(spark, submit, logger, self.wake)
                      if submit.get("probe") else None)
        self.thread = threading.Thread(target=self._loop, args=(submit["watch_ms"],), daemon=True,
                                       name="torchspark-grow-watch")
        self.thread.start()

    def _loop(self, wait_ms: Optional[int]) -> None:
        while wait_ms is not None:
            self.wake.wait(wait_ms / 1000 * _WATCH_SCALE)
            self.wake.clear()
            if self.ended.is_set():
                return
            pending = self.times.get("server") is None
            reply = step(self.state, {**_slots(self._count), "server_pending": pending})
            self.state, wait_ms = reply["state"], None
            for act in reply["actions"]:
                if act["do"] == "warn":
                    self.logger.warning(act["text"])
                elif act["do"] == "watch_slots":
                    wait_ms = act["wait_ms"]
                elif act["do"] == "checkpoint_and_stop" and not self._ask():
                    self.logger.warning(act["unreachable"])

    def _count(self) -> Optional[int]:
        held = self.times.get("hold")  # a gang launch's slots held (_gang.Hold), if it holds
        if held is not None and held.thread.is_alive():
            return self.nodes + (held.k if held.running() else 0)
        if self.probe is None:
            return count_slots(self.spark)
        server = self.times.get("server")
        ready = server is not None and server.stats()["authenticated"] >= self.nodes
        return self.nodes + (self.probe.k if self.probe.ran(ready) else 0)

    def _ask(self) -> bool:
        """CHECKPOINT to the attempt's agents (the controller asks once its log server is
        up: server_pending); False when they cannot be asked."""
        server = self.times.get("server")
        return server is not None and bool(server.checkpoint_all(1))

    def end(self) -> Dict[str, Any]:
        self.ended.set()
        self.wake.set()
        self.thread.join()
        if self.probe is not None:
            self.probe.cancel()
        return self.state


def _slots(count: Callable[[], Optional[int]], wait_s: float = 0) -> Dict[str, Any]:
    """The slots event of one count after wait_s (count_slots, or the grow watch's), with
    how long it took."""
    t0 = time.monotonic()
    time.sleep(wait_s)
    free = count()
    return {"event": "slots", "free": free, "waited_ms": int((time.monotonic() - t0) * 1000)}


def _perform(spark: Any, act: Dict[str, Any]) -> Dict[str, Any]:
    """The event of a count_slots or exclude_executor action, once performed."""
    if act["do"] == "count_slots":
        return _slots(lambda: count_slots(spark), act["wait_ms"] / 1000)
    return {"event": "excluded", "ok": exclude_executor(spark, act["id"])}  # the id: the controller's


def run(run_once: Callable[[Dict[str, Any]], Any], start: Dict[str, Any], *,
        spark: Any, logger: Any, record: List[Dict[str, Any]], times: Dict[str, Any]) -> Any:
    """Calls run_once(submit) (the controller's submit action: attempt, nodes, last, env)
    as the controller, started by start (start_event), says until it returns or the
    controller raises. record is the controller's record of each attempt as it is
    (distributor.attempts: its state's attempts, each event with the glue's clock in "at");
    times is where run_once leaves when the failure was noticed (root_at, ended_at:
    _job.Outcome) and which node went silent; the submit is left there (_gang.hold)."""
    reply = step(None, {**start, "at": time.time()})
    error: Optional[TorchDistributorError] = None
    result: Any = None
    while True:
        event: Optional[Dict[str, Any]] = None
        state = reply["state"]
        record[:] = state["attempts"]
        for act in reply["actions"]:
            if act["do"] == "warn":
                logger.warning(act["text"])
            elif act["do"] == "return":
                return result
            elif act["do"] == "raise" and error is not None:
                if act["kind"] == "failed":
                    raise error
                raise TorchDistributorError(act["message"], act["report"]) from error
            elif act["do"] == "submit":
                times.clear()
                times["submit"] = act
                watch = _Watch(spark, state, act, logger, times) if act.get("watch_ms") else None
                try:
                    result = run_once(act)
                    event = {"event": "attempt_succeeded"}
                except TorchDistributorError as e:
                    error = e
                    event = failed_event(e, times)
                finally:
                    if watch is not None:
                        state = watch.end()
            elif act["do"] in ("count_slots", "exclude_executor"):
                event = _perform(spark, act)
        # (None: refused by the controller, named)
        reply = step(state, None if event is None else {**event, "at": time.time()})
