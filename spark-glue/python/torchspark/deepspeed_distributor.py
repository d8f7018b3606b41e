"""torchspark.DeepspeedTorchDistributor: a drop-in for
pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor.

Same constructor (numGpus, nnodes, localMode, useGpu, deepspeedConfig as a path or a
dict), the same SSL override key (``deepspeed.spark.distributor.ignoreSsl``), the same
errors, and the same command-line contract for the training processes: ``--deepspeed``,
then ``--deepspeed_config PATH`` when a configuration was given, after the user's own
arguments (a function sees them in ``sys.argv[1:]``). Underneath, everything is
torchspark.TorchDistributor's (the native agent instead of torchrun, logs, errors).

A script is started as a script (the agent runs ``python SCRIPT ARGS... --deepspeed
[--deepspeed_config PATH]``) except in one case: a dict configuration in distributed mode,
which must be written to a file on every executor; the script then runs as ``__main__``
through runpy in a training process that wrote the file first (see _deepspeed_launch.py).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Union

from torchspark.worker._deepspeed_launch import (DeepspeedFunction, DeepspeedScript, config_path,
                                          deepspeed_args)
from torchspark.distributor import TorchDistributor

__all__ = ["DeepspeedTorchDistributor"]


class DeepspeedTorchDistributor(TorchDistributor):
    """Runs DeepSpeed training on Spark; see PySpark's DeepspeedTorchDistributor.

    Parameters
    ----------
    numGpus : int
        Processes (GPUs) per node, as the deepspeed launcher's ``--num_gpus``.
    nnodes : int
        Number of nodes; num_processes is ``numGpus * nnodes``.
    localMode : bool
        Train on the driver (True) or on the executors.
    useGpu : bool
        Whether training uses GPUs.
    deepspeedConfig : str, dict or None
        The DeepSpeed configuration: a JSON file's path, a dict (written to a JSON file
        where the training processes run), or None (DeepSpeed's defaults: no
        ``--deepspeed_config``).
    """

    _DEEPSPEED_SSL_CONF = "deepspeed.spark.distributor.ignoreSsl"

    def __init__(self, numGpus: int = 1, nnodes: int = 1, localMode: bool = True,
                 useGpu: bool = True,
                 deepspeedConfig: Optional[Union[str, Dict[str, Any]]] = None) -> None:
        num_processes = numGpus * nnodes
        self.deepspeed_config = deepspeedConfig
        super().__init__(num_processes, localMode, useGpu,
                         _ssl_conf=DeepspeedTorchDistributor._DEEPSPEED_SSL_CONF)
        self.cleanup_deepspeed_conf = False

    def _create_input_params(self) -> Dict[str, Any]:
        params = super()._create_input_params()
        params["deepspeed_config"] = self.deepspeed_config
        return params

    def run(self, train_object: Union[Callable, str], *args: Any, **kwargs: Any) -> Optional[Any]:
        """Runs train_object (a function, or the path of a script) with the deepspeed
        arguments; a function's return value on rank 0 is returned, a script returns None.
        """
        config = self.deepspeed_config
        if not isinstance(train_object, str):
            return super().run(DeepspeedFunction(train_object, config), *args, **kwargs)
        if kwargs:
            raise ValueError(
                "DeepspeedTorchDistributor with pytorch file doesn't support keyword arguments")
        script_args = [str(a) for a in args]
        if not isinstance(config, dict):
            return super().run(train_object, *script_args, *deepspeed_args(config_path(config)))
        if self.local_mode:  # the processes run here: the file is written here
            path = config_path(config)
            try:
                return super().run(train_object, *script_args, *deepspeed_args(path))
            finally:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        super().run(DeepspeedScript(train_object, script_args, config))
        return None
