"""The training processes' side of torchspark.DeepspeedTorchDistributor.

Kept apart from deepspeed_distributor.py so that a training process unpickling these
objects imports neither pyspark.sql nor the driver's modules.

PySpark's DeepspeedTorchDistributor gives every training process the command-line
contract of the `deepspeed` launcher: ``--deepspeed`` and, when a configuration was given,
``--deepspeed_config PATH`` after the user's own arguments (a configuration given as a dict
is written to a JSON file on the node that runs the process). A function sees them in
``sys.argv[1:]``, as under PySpark.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Union

Config = Optional[Union[str, Dict[str, Any]]]


def config_path(config: Config) -> str:
    """The path for --deepspeed_config: a dict is written to a new JSON file (removed when
    the process exits); a str is the path itself; None gives "" (no --deepspeed_config)."""
    if isinstance(config, dict):
        fd, path = tempfile.mkstemp(prefix="deepspeed-config-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(config, f)
        atexit.register(_remove, path)
        return path
    if config is None:
        return ""
    return config


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def deepspeed_args(path: str) -> List[str]:
    """PySpark's arguments after the user's: --deepspeed [--deepspeed_config PATH]."""
    return ["--deepspeed"] + (["--deepspeed_config", path] if path else [])


class DeepspeedFunction:
    """The user's training function, called with sys.argv[1:] set to the deepspeed
    arguments (PySpark's generated train script gets them the same way)."""

    def __init__(self, fn: Callable, config: Config) -> None:
        self.fn = fn
        self.config = config

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sys.argv[1:] = deepspeed_args(config_path(self.config))
        return self.fn(*args, **kwargs)


class DeepspeedScript:
    """A training script run as ``__main__`` (runpy) with ``SCRIPT ARGS... --deepspeed
    --deepspeed_config PATH``: used when the configuration is a dict and the script runs on
    executors, which must each write the file. Returns None like a script; a SystemExit
    with status 0 is a normal end."""

    def __init__(self, script: str, args: List[str], config: Config) -> None:
        self.script = script
        self.args = args
        self.config = config

    def __call__(self) -> None:
        import runpy

        path = os.path.realpath(self.script)
        sys.argv[:] = [self.script, *self.args, *deepspeed_args(config_path(self.config))]
        sys.path.insert(0, os.path.dirname(path))
        try:
            runpy.run_path(self.script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
        return None
