"""torchspark: PyTorch distributed training on Spark, natively.

``from torchspark import TorchDistributor`` is a drop-in for
``pyspark.ml.torch.distributor.TorchDistributor``.
"""
from torchspark._lib import jar_path
from torchspark._report import TorchDistributorError
from torchspark.distributor import TorchDistributor

__version__ = "0.1.0"
__all__ = ["TorchDistributor", "TorchDistributorError", "jar_path", "__version__"]
