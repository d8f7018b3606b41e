"""torchspark: PyTorch distributed training on Spark, natively.

``from torchspark import TorchDistributor`` is a drop-in for
``pyspark.ml.torch.distributor.TorchDistributor``, and ``DeepspeedTorchDistributor`` for
``pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor``; inside a train
function given to ``TorchDistributor.train_on_dataframe``,
``torchspark.get_spark_partition_data_loader`` and ``torchspark.partition_batches`` read the
task's partition (torchspark/data.py); ``torchspark.report(metrics, step)`` sends a rank's
metrics to the driver (torchspark/worker/_metrics.py, docs/distributor.md).

Everything is imported on first use (PEP 562): the modules that run on executors and in
training processes (``torchspark.task._task``, ``torchspark.worker._fn_runner``) import this package
too, and should not pay for the driver's imports of pyspark.sql, nor for torch and pyarrow
where the readers are not used.
"""
from typing import Any

from torchspark.native._lib import jar_path

__version__ = "0.1.0"
_DATA = ("get_spark_partition_data_loader", "partition_batches", "partition_num_rows")
__all__ = ["TorchDistributor", "DeepspeedTorchDistributor", "TorchDistributorError",
           "jar_path", "report", "Report", "__version__", *_DATA]

_LAZY = {
    "TorchDistributor": "torchspark.distributor",
    "TorchDistributorError": "torchspark.driver._report",
    "DeepspeedTorchDistributor": "torchspark.deepspeed_distributor",
    "report": "torchspark.worker._metrics",
    "Report": "torchspark.driver._progress",
    **{name: "torchspark.data" for name in _DATA},
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchspark' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(list(globals()) + list(_LAZY))
