"""MLflow from the driver: every ``torchspark.report()`` into one run (docs/distributor.md).

When ``mlflow`` is importable on the driver and a run is active there (or
``spark.torchspark.mlflow=true`` starts one for the job), each report is logged from the
driver, by step: rank 0's metrics under their own names, another rank's as
``rank<R>/name``. Nothing of MLflow (tracking URI, token) goes to the executors: the ranks
only talk to their agent, the agent to the driver's log server.
"""
from __future__ import annotations

import importlib
import sys
import time
from typing import Any, List, Optional

__all__ = ["logger_for", "MlflowLogger"]

FLUSH_EVERY_S = 1.0
FLUSH_AT = 900  # metrics per log_batch call (MLflow's own cap is 1000)


def _conf_true(dist: Any) -> bool:
    try:
        raw = dist.spark.conf.get("spark.torchspark.mlflow", "false")
    except Exception:
        return False
    return str(raw).strip().lower() in ("true", "1", "yes", "on")


def logger_for(dist: Any) -> Optional["MlflowLogger"]:
    """The run's logger, or None (mlflow not importable, or no active run and the conf
    does not ask for one)."""
    # A run can only be active where the driver imported mlflow: no import (seconds) for
    # everyone else, unless the conf asks for a run.
    mlflow: Any = sys.modules.get("mlflow")
    if mlflow is None:
        if not _conf_true(dist):
            return None
        try:
            mlflow = importlib.import_module("mlflow")
        except ImportError:
            raise RuntimeError("spark.torchspark.mlflow is true but mlflow cannot be imported "
                               "on the driver: pip install mlflow (or mlflow-skinny), or unset "
                               "the conf") from None
    run = mlflow.active_run()
    started = False
    if run is None:
        if not _conf_true(dist):
            return None
        run = mlflow.start_run()
        started = True
    return MlflowLogger(run.info.run_id, end_run=started)


class MlflowLogger:
    """Buffers metrics and writes them with ``MlflowClient.log_batch`` from the report
    thread (at most every ``FLUSH_EVERY_S`` and at the end)."""

    def __init__(self, run_id: str, end_run: bool = False) -> None:
        from mlflow.tracking import MlflowClient

        self.run_id = run_id
        self.end_run = end_run
        self.client = MlflowClient()
        self._buf: List[Any] = []
        self._last = time.monotonic()

    @staticmethod
    def key(name: str, rank: int) -> str:
        # A prefix, not a suffix: "loss" and "loss/rank1" cannot both be files of a store.
        return name if rank == 0 else f"rank{rank}/{name}"

    def log(self, rep: Any) -> None:
        from mlflow.entities import Metric

        ts = int(rep.time * 1000)
        step = rep.step if rep.step is not None else 0
        for name, value in rep.metrics.items():
            self._buf.append(Metric(self.key(name, rep.rank), float(value), ts, step))
        if len(self._buf) >= FLUSH_AT or time.monotonic() - self._last >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        while self._buf:
            batch, self._buf = self._buf[:FLUSH_AT], self._buf[FLUSH_AT:]
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.flush()
        if self.end_run:
            import mlflow

            mlflow.end_run()
