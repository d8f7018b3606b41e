"""The driver's end of one run's channel: the native log server, the pump of its lines,
the report hub, the hang doctor and the rendezvous, opened for one run (local or one
distributed attempt) and closed in one order, whatever happened (a ``with`` block)."""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Dict, List, Optional

from pyspark import cloudpickle

from torchspark.driver import _doctor, _mlflow, _progress
from torchspark.native import _native, _rendezvous
from torchspark.native._lib import json_call
from torchspark.driver._pump import _LogPump
from torchspark.driver._report import TorchDistributorError

TAIL_FROM_SERVER = 20  # a failed rank's last lines in the run's exception


class Channel:
    """What a run holds on the driver; every member None where it did not start."""

    def __init__(self, drain_on_failure: float) -> None:
        self.server: Any = None
        self.pump: Optional[_LogPump] = None
        self.hub: Any = None
        self.doctor: Optional[_doctor.HangDoctor] = None
        self.rdv: Optional[_rendezvous.Server] = None
        self.ok = False  # set once the run succeeded: the server drains its agents longer
        self._drain_on_failure = drain_on_failure

    def open(self, dist: Any, host: str, fmt: Optional[str] = None,
             rendezvous_host: Optional[str] = None) -> "Channel":
        """The log server bound to host (None, with a WARNING, when it cannot start) and,
        with it, the pump, the hub, the doctor and (rendezvous_host) the rendezvous."""
        _native.fd_check(dist.num_tasks)  # a connection per node: the limit must hold them
        try:
            # the doctor's watch raises the tails to TSP_LOGSERVER_HANG_TAIL lines (a dump fits)
            self.server = _native.LogServer(host=host, port=0)
            self.server.encryption(dist._settings["encryption"])
        except Exception as e:
            self.server = None
            dist.logger.warning(
                f"Starting torchspark's log server on {host} failed ({e!r}): worker output "
                "goes to the executors' logs and rank 0's result travels through "
                "collect() (bounded by spark.driver.maxResultSize)")
            return self
        if dist.hang_timeout:
            dist.hang_reports = []
            self.doctor = _doctor.HangDoctor(self.server, dist.hang_timeout, dist.hang_action,
                                             dist.num_processes, dist.logger, dist.hang_reports)
        self.pump = _LogPump(self.server, fmt=fmt, tick=self.doctor.poll if self.doctor else None)
        sinks = [s for s in (_mlflow.logger_for(dist),) if s is not None]
        self.hub = _progress.ReportHub(self.server, dist.on_report, dist.progress, sinks)
        dist.reports = self.hub.reports  # the run's (live) history from now on
        if rendezvous_host is not None:
            try:
                self.rdv = _rendezvous.Server(rendezvous_host, self.server.secret_hex)
            except OSError:
                pass  # every task then uses allGather
        return self

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: Any) -> None:
        # Last pushed, first run: the doctor's last events, then the server drains while the pump
        # still runs, so the agents' last lines are shown (after a failure every agent was
        # stopped, so a short drain is enough); each step runs even if one before raised.
        with ExitStack() as stack:
            if self.hub is not None:
                stack.callback(self.hub.stop)
            stack.callback(self.stop_pump)
            if self.rdv is not None:
                stack.callback(self.rdv.close)
            if self.server is not None:
                stack.callback(self.server.close,
                               drain_timeout=5.0 if self.ok else self._drain_on_failure)
            if self.doctor is not None:
                stack.callback(self.doctor.poll)

    def stop_pump(self) -> None:
        """Every line shown: before the run's exception or its result."""
        if self.pump is not None:
            self.pump.stop()
            self.pump = None

    def hang_error(self, mode: str) -> Optional[TorchDistributorError]:
        """The error of a run the hang doctor cancelled, or None: the C core's text and
        its document as the report (docs/protocol.md 1.11), the same as the JVM runner's."""
        if self.doctor is None:
            return None
        self.doctor.poll()
        ev = self.server.hang_summary()["cancel"]  # the C watchdog's, kept by the server
        if ev is None:
            return None
        return TorchDistributorError(f"TorchDistributor ({mode}) " + ev["message"],
                                     ev["diagnosis"].get("report") or {})

    def tail(self, report: Dict) -> Optional[List[str]]:
        """The driver's last lines of the failed rank of report, or None."""
        rank = report.get("rank")
        if self.server is None or rank is None:
            return None
        try:
            lines = self.server.tail(rank, TAIL_FROM_SERVER)
        except Exception:
            return None
        return [ln.decode("utf-8", errors="replace") for ln in lines] or None

    def warn_unreachable(self, dist: Any, endpoint: Optional[str]) -> bool:
        """Warns (and says True) when no agent ever got through to the log server (the
        executors cannot reach the address they were given)."""
        try:
            if self.server is None or self.server.stats().get("authenticated", 1) != 0:
                return False
        except Exception:
            return False
        dist.logger.warning(
            f"The executors could not reach torchspark's log server at {endpoint}: the "
            "workers' output stayed in the executors' logs, and rank 0's result and the "
            "workers' reports came back as collected rows (bounded by "
            "spark.driver.maxResultSize). "
            + ("Set TORCHSPARK_CLIENT_ADDRESS to an address of this machine that the executors "
               "can reach." if dist.is_remote else
               "Check that spark.driver.host is reachable from the executors."))
        return True

    def result(self, dist: Any, chunks: List[bytes], unreachable: bool) -> Any:
        """Rank 0's value of a distributed run: over the output channel, else from the
        collected rows (chunks)."""
        server = self.server
        data = server.output_view() if server is not None else None
        if data is None and server is not None:  # the rows, or the error (docs/protocol.md 10.1)
            said = json_call("tsp_result_check", {
                "product": "TorchDistributor", "mode": "distributed",
                "error": server.output_error, "rows": bool(chunks), "quiet": unreachable})
            if said["raise"] is not None:
                raise TorchDistributorError(said["raise"])
            if said["warn"] is not None:
                dist.logger.warning(said["warn"])
        if data is None:
            data = b"".join(chunks)
        if not data:
            raise RuntimeError("TorchDistributor failed during training."
                               "View stdout logs for detailed error message.")
        try:
            result = cloudpickle.loads(dist._clock.value(data))
        except Exception as e:
            raise RuntimeError("TorchDistributor failed due to a pickling error. "
                               "View stdout logs for detailed error message.") from e
        dist._clock.mark("result_received")
        return result

