"""The barrier job of distributed mode, run beside the log server's control channel.

The job runs in its own thread (an InheritableThread, so the caller's job group and
properties apply) with a job tag of its own; the caller waits for whichever comes first:
the job's end, or the run's root cause from the log server (an agent's failure report, or
an agent lost without goodbye: docs/protocol.md 1.7), at which point the server has
already told every other agent to stop. Spark's own failure (the barrier abort) usually
follows within a second and is kept as the exception's cause; when it does not come in
time (a lost host is noticed by Spark only after spark.network.timeout), the job is
cancelled and run() raises without it.
"""
from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

# After the root cause is known: how long to wait for Spark's own failure (the cause of
# our exception), then for the cancelled job to end.
SPARK_GRACE_S = 3.0
CANCEL_WAIT_S = 1.0
LOST_WAIT_S = 2.0  # > the server's lost grace (1 s)


@dataclass
class Outcome:
    chunks: Optional[List[bytes]]  # the job's result (None when it failed)
    spark_error: Optional[BaseException]  # Spark's exception, when it came
    root: Optional[Dict[str, Any]]  # the log server's root cause (LogServer.failure())


def run_barrier_job(sc: Any, job: Callable[[], List[bytes]], server: Any) -> Outcome:
    """Runs job() (a collect() of the barrier stage) and returns how it ended."""
    from pyspark.util import InheritableThread

    tag = f"torchspark-{uuid.uuid4().hex}"
    done, wake = threading.Event(), threading.Event()
    box: Dict[str, Any] = {}

    def run_job() -> None:
        try:
            sc.addJobTag(tag)
            sc.setLocalProperty("torchspark.run", tag)  # marks the tasks for TorchSparkPlugin
            try:
                box["chunks"] = job()
            finally:
                sc.removeJobTag(tag)
        except BaseException as e:  # noqa: B902 - handed to the caller
            box["error"] = e
        finally:
            done.set()
            wake.set()

    def watch() -> None:
        while not done.is_set():
            root = server.failure(0.25)
            if root is not None:
                box["root"] = root
                wake.set()
                return

    InheritableThread(run_job, daemon=True, name="torchspark-barrier-job").start()
    if server is not None:
        threading.Thread(target=watch, daemon=True, name="torchspark-failure-watch").start()
    try:
        while not wake.wait(0.5):
            pass
        if "root" in box and not done.is_set():
            if not done.wait(SPARK_GRACE_S):
                sc.cancelJobsWithTag(tag)
                done.wait(CANCEL_WAIT_S)
    except BaseException:  # KeyboardInterrupt: stop everything now, then re-raise
        if server is not None:
            server.stop_all("the driver was interrupted")
        sc.cancelJobsWithTag(tag)
        raise
    error = box.get("error")
    root = box.get("root")
    if server is not None and (error is not None or root is not None):
        # A failing agent's report is acknowledged before its task ends, so it is here
        # already if there is one; whatever else ended the job, stop every agent now.
        # A host that died is seen by Spark at once but by the server only after the
        # lost grace: wait for it then, to name the host.
        root = root or server.failure(LOST_WAIT_S if server.lost_pending() else 0)
        server.stop_all("the Spark job failed" if root is None else root["message"])
    return Outcome(box.get("chunks") if error is None else None, error, root)
