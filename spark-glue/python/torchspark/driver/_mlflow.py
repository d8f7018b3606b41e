"""MLflow from the driver: every ``torchspark.report()`` into one run (docs/distributor.md).

When ``mlflow`` is importable on the driver and a run is active there (or
``spark.torchspark.mlflow=true`` starts one for the job), each report is logged from the
driver, by step: rank 0's metrics under their own names, another rank's as
``rank<R>/name``; params (a rank's ``torchspark.mlflow.log_param``): rank 0's by name,
another rank's as ``rank<R>/name`` only where its value is not rank 0's. Nothing of MLflow (tracking URI,
token) goes to the executors: the ranks only talk to their agent, the agent to the
driver's log server.
"""
from __future__ import annotations

import importlib
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["logger_for", "MlflowLogger"]

FLUSH_EVERY_S = 1.0
FLUSH_AT = 900  # metrics per log_batch call (MLflow's own cap is 1000)


def _conf_true(dist: Any) -> bool:
    """spark.torchspark.mlflow, from the settings the run read once."""
    return bool(dist._settings["mlflow"])


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
        self._params: List[Any] = []
        self._logged: Dict[str, str] = {}  # params logged so far: MLflow's are immutable
        self._later: Dict[Tuple[int, str], str] = {}  # other ranks' params, by (rank, name)
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
        for name, text in (getattr(rep, "params", None) or {}).items():
            self._param(name, str(text), rep.rank)
        if (len(self._buf) + len(self._params) >= FLUSH_AT
                or time.monotonic() - self._last >= FLUSH_EVERY_S):
            self.flush()

    def _param(self, name: str, text: str, rank: int) -> None:
        """Rank 0's params under their names, at once; another rank's under
        ``rank<R>/name`` at the end of the run, and only where its value is not rank 0's
        (a param every rank logs alike is logged once). MLflow's params are immutable:
        a second value under one key is left out."""
        if rank != 0:
            self._later.setdefault((rank, name), text)
            return
        self._add_param(name, text)

    def _add_param(self, key: str, text: str) -> None:
        from mlflow.entities import Param

        if key not in self._logged:
            self._logged[key] = text
            self._params.append(Param(key, text))

    def flush(self) -> None:
        self._last = time.monotonic()
        if self._params:
            params, self._params = self._params, []
            for i in range(0, len(params), 100):  # MLflow's cap of params per log_batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        while self._buf:
            batch, self._buf = self._buf[:FLUSH_AT], self._buf[FLUSH_AT:]
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        for (rank, name), text in sorted(self._later.items()):
            if self._logged.get(name) != text:
                self._add_param(self.key(name, rank), text)
        self.flush()
        if self.end_run:
            import mlflow

            mlflow.end_run()
