"""torchspark: PyTorch distributed training on Spark, natively.

``from torchspark import TorchDistributor`` is a drop-in for
``pyspark.ml.torch.distributor.TorchDistributor``; inside a train function given to
``TorchDistributor.train_on_dataframe``, ``torchspark.get_spark_partition_data_loader``
and ``torchspark.partition_batches`` read the task's partition (torchspark/data.py).
"""
from typing import Any

from torchspark._lib import jar_path
from torchspark._report import TorchDistributorError
from torchspark.distributor import TorchDistributor

__version__ = "0.1.0"
_DATA = ("get_spark_partition_data_loader", "partition_batches", "partition_num_rows")
__all__ = ["TorchDistributor", "TorchDistributorError", "jar_path", "__version__", *_DATA]


def __getattr__(name: str) -> Any:
    # The readers import torch and pyarrow: only where they are used (the workers).
    if name in _DATA:
        from torchspark import data

        return getattr(data, name)
    raise AttributeError(f"module 'torchspark' has no attribute {name!r}")
