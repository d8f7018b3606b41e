"""``from torchspark import mlflow``: a rank's MLflow logging calls, into the driver's run.

Inside a torchspark run, ``log_metric``, ``log_metrics``, ``log_param`` and ``log_params``
do not talk to MLflow: they send the values to the driver over the log channel, as
``torchspark.report()`` does (docs/protocol.md 1.8), and the driver logs them to its run
(the active one, or the one ``spark.torchspark.mlflow=true`` starts; docs/distributor.md).
So the executors need neither the mlflow package nor a tracking URI or token. Outside a
torchspark run (torchrun, a plain ``python``, the driver) each call is the real
``mlflow``'s, so the same script runs there unchanged.

Opting in is the import: ``import mlflow`` keeps its own behaviour everywhere.
"""
from __future__ import annotations

import importlib
import numbers
from typing import Any, Dict, Mapping, Optional

from torchspark.worker import _metrics

__all__ = ["log_metric", "log_metrics", "log_param", "log_params"]


def _real() -> Any:
    try:
        return importlib.import_module("mlflow")
    except ImportError:
        raise ImportError("torchspark.mlflow outside a torchspark run calls the mlflow "
                          "package, which cannot be imported here: pip install mlflow "
                          "(or mlflow-skinny)") from None


def _no_run_id(fn: str, kwargs: Dict[str, Any]) -> None:
    if kwargs.get("run_id") is not None:
        raise ValueError(f"torchspark.mlflow.{fn}(run_id=...) inside a torchspark run: the "
                         "values go to the driver's run; leave run_id out")


def _step(fn: str, step: Optional[int]) -> Optional[int]:
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise TypeError(f"torchspark.mlflow.{fn}(): step must be an int or None, not "
                        f"{type(step).__name__} {step!r:.40}")
    return step


def log_metric(key: str, value: float, step: Optional[int] = None, **kwargs: Any) -> None:
    """As ``mlflow.log_metric``; inside a run, to the driver's run (``timestamp`` is the
    time of the call, as the channel records it)."""
    if not _metrics.in_run():
        _real().log_metric(key, value, step=step, **kwargs)
        return
    _no_run_id("log_metric", kwargs)
    _metrics._send(_metrics._record({key: value}, _step("log_metric", step)))


def log_metrics(metrics: Mapping[str, float], step: Optional[int] = None,
                **kwargs: Any) -> None:
    """As ``mlflow.log_metrics``; inside a run, to the driver's run."""
    if not _metrics.in_run():
        _real().log_metrics(metrics, step=step, **kwargs)
        return
    _no_run_id("log_metrics", kwargs)
    _metrics._send(_metrics._record(metrics, _step("log_metrics", step)))


def log_param(key: str, value: Any, **kwargs: Any) -> Any:
    """As ``mlflow.log_param``; inside a run, to the driver's run (as ``str(value)``)."""
    if not _metrics.in_run():
        return _real().log_param(key, value, **kwargs)
    _metrics._send(_metrics._record({}, None, {key: value}))
    return value


def log_params(params: Mapping[str, Any], **kwargs: Any) -> None:
    """As ``mlflow.log_params``; inside a run, to the driver's run."""
    if not _metrics.in_run():
        _real().log_params(params, **kwargs)
        return
    if not isinstance(params, Mapping):
        raise TypeError("torchspark.mlflow.log_params(params): params must be a dict of "
                        f"name -> value, not {type(params).__name__}")
    _metrics._send(_metrics._record({}, None, dict(params)))
