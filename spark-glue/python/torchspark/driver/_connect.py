"""What distributed mode needs to know when the session is a Spark Connect client.

Under Connect, this process is not Spark's driver: the executors see the Connect server's
driver, and the log server runs here, in the client. It binds the local address of this
host's route towards the Connect server (the interface the executors' traffic would come
in by, as the master election does towards the other nodes) and is advertised as that
address unless TORCHSPARK_CLIENT_ADDRESS names another one (NAT, a proxy, a name). When
the executors cannot reach it, the agents fall back to their own output and rank 0's
result comes back as collected rows; the distributor then warns once (distributor.py).

A Connect client cannot see the executors either: the grow watch of a smaller attempt
(_restart._Watch) counts the missing nodes' slots by a probe job (:class:`Probe`).
"""
from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any, Callable, Dict, Iterator, List, Tuple

from torchspark.driver import _gang

CLIENT_ADDRESS_ENV = "TORCHSPARK_CLIENT_ADDRESS"


def server_host(spark: Any) -> str:
    """The Connect server's host as this client dials it."""
    builder = getattr(spark.client, "_builder", None)
    return str(getattr(builder, "host", "") or "localhost")


def client_address(spark: Any) -> Tuple[str, str]:
    """(address to bind, address to advertise) of this client's log server."""
    from torchspark.native import _elect

    host = server_host(spark)
    try:
        bind = _elect.route_source(host)
    except Exception:  # no route computed: listen everywhere, advertise our name
        bind = "0.0.0.0"
    advertised = os.environ.get(CLIENT_ADDRESS_ENV, "").strip()
    if not advertised:
        advertised = bind if bind != "0.0.0.0" else socket.gethostname()
    return bind, advertised


def _echo(hold_s: float) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The probe task's function: one row of its start and end (wall clock), holding its
    slot hold_s in between. Nested, so that cloudpickle pickles it by value: the executors
    run it without torchspark (which they may lack)."""

    def echo(batches: Iterator[Any]) -> Iterator[Any]:
        import time as clock

        import pyarrow as pa

        t0 = clock.time()
        for _ in batches:
            pass
        clock.sleep(hold_s)
        yield pa.RecordBatch.from_pydict({"t0": [t0], "t1": [clock.time()]})

    return echo


def probe_ran(rows: List[Any], k: int, barrier: bool) -> bool:
    """Whether the probe's rows show k slots free at once: a barrier stage runs only then;
    ordinary tasks (under dynamic allocation, where Spark refuses barrier stages) show it
    when all k held their slots at the same moment (each started before any ended)."""
    if len(rows) != k:
        return False
    return barrier or max(r["t0"] for r in rows) < min(r["t1"] for r in rows)


# Under dynamic allocation each probe task holds its slot this long: k tasks that overlap
# show k slots free at once (a task on a new executor waits for its Python worker first).
PROBE_HOLD_S = 3.0


class Probe:
    """Spark Connect's slot count for a smaller attempt (docs/protocol.md 11, "Growing back
    on Spark Connect"): a barrier job of k tasks (the nodes the attempt lacks), which Spark
    launches only when k slots are free at once (under dynamic allocation, where Spark
    refuses barrier stages, k ordinary tasks that must overlap: probe_ran). Submitted from the watch's thread once the
    attempt's agents all connected (its own tasks hold their slots then), again after a
    failure; cancelled by its tag when the attempt ends. Once it ran it sets `ran`, so that
    the watch counts at once rather than at its next period. With the controller's hold
    (the submit's, from "probe": under dynamic allocation) the slots it found are then held
    until the attempt ended (Hold): else the idle timeout releases the replacement
    while the attempt stops at its checkpoint (bench/grow_bench.py --connect --dynamic saw
    it), and the grown attempt waits for another executor."""

    def __init__(self, spark: Any, submit: Dict[str, Any], logger: Any, ran: threading.Event) -> None:
        # k: the nodes the attempt lacks; hold: the controller's (from "probe"), or None.
        self.spark, self.logger, self.wake = spark, logger, ran
        self.k, self.hold = int(submit["probe"]), submit.get("hold")
        self.tag = f"torchspark-probe-{uuid.uuid4().hex}"  # not a run's tag (the plugin's)
        self.done, self.ended = threading.Event(), threading.Event()
        self.ok = self.started = False

    def ran(self, ready: bool) -> bool:
        """True once the probe ran; submits it when ready and none is waiting."""
        if self.ok:
            return True
        if ready and (not self.started or self.done.is_set()):
            self.started = True
            self.done.clear()
            threading.Thread(target=self._run, daemon=True,
                             name="torchspark-slot-probe").start()
        return False

    def _run(self) -> None:
        try:
            self.spark.addTag(self.tag)  # this thread's operations only (Connect's tags)
            try:
                # Spark refuses a barrier stage under dynamic allocation (SPARK-24942):
                # there (the controller holds), ordinary tasks that hold their slots
                # PROBE_HOLD_S and must overlap.
                barrier = self.hold is None
                df = self.spark.range(0, self.k, 1, self.k)
                rows = df.mapInArrow(_echo(0.0 if barrier else PROBE_HOLD_S),
                                     "t0 double, t1 double", barrier=barrier).collect()
            finally:
                self.spark.removeTag(self.tag)
            self.ok = probe_ran(rows, self.k, barrier)
            if self.ok and self.hold is not None:
                Hold(self.spark, self.hold["slots"], self.hold["ms"]).begin(self.ended)
            if self.ok:
                self.wake.set()  # the watch counts now, not at its next period
        except Exception as e:  # interrupted, or Spark's barrier slot check gave up
            self.logger.debug(f"torchspark: the slot probe ended without its {self.k} task(s) "
                              f"({e!r}); it is submitted again at the next count")
        finally:
            self.done.set()

    def cancel(self) -> None:
        self.ended.set()  # the held slots go (Hold.release)
        if self.started and not self.ok and not self.done.is_set():
            try:
                self.spark.interruptTag(self.tag)
            except Exception:  # the session is gone: nothing left to cancel
                pass


class Hold(_gang.Hold):
    """The slots the probe found, held (_gang.Hold) on a Spark Connect session: its job
    tagged, interrupted by its tag. A Connect client has no status tracker: running() says
    nothing there (the probe counted the slots)."""

    def _collect(self, df: Any) -> None:
        # This thread's operations: Connect interrupts the task's thread by the tag.
        self.spark.addTag(self.group)
        try:
            df.collect()
        finally:
            self.spark.removeTag(self.group)

    def _cancel(self) -> None:
        self.spark.interruptTag(self.group)
