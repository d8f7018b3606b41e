"""The driver's end of ``torchspark.report()`` (docs/protocol.md 1.8, docs/distributor.md).

One thread pulls the workers' report records from the native log server (their own queue,
beside the lines'), keeps the history (``TorchDistributor.reports``), calls the user's
``on_report`` callback, hands each report to the MLflow logger when there is one, and feeds
the live progress line on the driver's stderr (_progress_line.py).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from torchspark.driver import _progress_line
from torchspark.driver._pump import _LogPump
from torchspark.task import _report_rows

__all__ = ["Report", "ReportHub", "configure"]

# The history keeps the last HISTORY_KEEP to 2 * HISTORY_KEEP reports (the driver's memory
# stays bounded on a long run of many ranks; docs/distributor.md, "Reports at scale").
HISTORY_KEEP = 100_000
WAIT_MS = 20  # one pull's wait: stop() is seen within it


class Report(NamedTuple):
    """One ``torchspark.report()`` call: the reporting rank, its step (None when not
    given), the worker's wall time of the call (``time.time()``), the metrics, the
    driver's wall time when the report arrived, the MLflow params a rank logged
    through ``torchspark.mlflow`` (None when the record has none), and, for a rank that
    reported faster than its share of the job's report rate (its agent's, or the driver's
    budget), the ``summary`` of the reports this one stands for (``count``,
    ``first_time``, ``min``/``max``/``mean`` of each metric; metrics and step are the last
    report's; docs/distributor.md, "Reports at scale"); None for a single report."""

    rank: int
    step: Optional[int]
    time: float
    metrics: Dict[str, Any]
    received: float
    params: Optional[Dict[str, str]] = None
    summary: Optional[Dict[str, Any]] = None


class ReportHub:
    """Pulls reports from ``server`` until :meth:`stop`; see the module's doc."""

    def __init__(self, server: Any, on_report: Optional[Callable[[Report], Any]] = None,
                 progress: bool = True, sinks: Optional[List[Any]] = None) -> None:
        self.server = server
        self.on_report = on_report
        self.line = _progress_line.ProgressLine(progress)
        self.sinks = list(sinks or [])  # objects with .log(report) (the MLflow logger)
        self.reports: List[Report] = []
        self.total = 0  # report() calls seen (a summary's count), trimmed ones included
        self._warned: set = set()
        self._spilled: List[Any] = []  # records back with the result (_report_rows.py)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="torchspark-reports")
        self._thread.start()

    # ---- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._take(self.server.pull_reports(4096, WAIT_MS))
                self.line.show(self.total, final=False)
            while True:
                batch = self.server.pull_reports(4096, 0)
                if not batch:
                    break
                self._take(batch)
        except Exception as e:  # never fail training because of a report
            self._warn("thread", f"torchspark: the report reader stopped: {e!r}")

    def _take(self, lines: List[Any]) -> None:
        now = time.time()
        for ln in lines:
            data = ln.data  # a whole record: the C core rejoined its pieces (reportagg.c)
            try:
                doc = json.loads(data)
                step = doc.get("step")
                params = doc.get("params")
                summary = doc.get("summary")
                rep = Report(ln.rank, None if step is None else int(step), float(doc["time"]),
                             dict(doc["metrics"]), now,
                             None if params is None else {str(k): str(v)
                                                          for k, v in params.items()},
                             None if summary is None else dict(summary))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                self._warn("bad", f"torchspark: WARNING: a report of rank {ln.rank} is not "
                                  f"a torchspark report record ({e}); skipped: {data[:80]!r}")
                continue
            self.reports.append(rep)
            self.total += int(rep.summary.get("count", 1)) if rep.summary else 1
            if len(self.reports) >= 2 * HISTORY_KEEP:
                del self.reports[:HISTORY_KEEP]
            self.line.take(rep)
            if self.on_report is not None:
                try:
                    self.on_report(rep)
                except Exception as e:
                    self._warn("callback", f"torchspark: WARNING: on_report raised {e!r} "
                                           "(further errors of the callback are not shown)")
            for sink in self.sinks:
                try:
                    sink.log(rep)
                except Exception as e:
                    self._warn(id(sink), f"torchspark: WARNING: {type(sink).__name__} could "
                                         f"not log a report: {e!r} (not shown again)")

    def add(self, records: List[Any]) -> None:
        """Records the agents could not send over the channel, back with the job's result
        (_report_rows.py): taken by :meth:`stop`, after what the channel delivered."""
        self._spilled.extend(records)

    def _warn(self, key: Any, text: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        _LogPump.write(text + "\n")

    def stop(self) -> List[Report]:
        """Takes what is left (call after the log server closed: the agents drained), shows
        the last progress line, and returns the history."""
        self._stop.set()
        self._thread.join(timeout=10)
        spilled, self._spilled = self._spilled, []
        self._take(_report_rows.fresh(spilled, self.reports))
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                self._warn(id(sink), f"torchspark: WARNING: {type(sink).__name__} could not "
                                     f"finish: {e!r}")
        try:
            self.line.show(self.total, final=True)
        except Exception:
            pass
        return self.reports


def configure(dist: Any, on_report: Optional[Callable[[Report], Any]], progress: bool) -> None:
    """The constructor's part: checks and keeps the extension arguments (progress: the
    keyword's, else spark.torchspark.progress, read by _conf)."""
    if on_report is not None and not callable(on_report):
        raise TypeError(f"on_report must be a callable taking a torchspark.Report, not "
                        f"{type(on_report).__name__}")
    dist.on_report = on_report
    dist.progress = bool(progress)
    dist.reports = []

