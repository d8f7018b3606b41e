"""The barrier task's entry, pickled by value: it runs before torchspark is imported.

Spark unpickles a task's function before calling it; a function of an installed module
is pickled by reference, so unpickling it would import torchspark on an executor that may
not have it (a driver-only install). The functions here are pickled by value (this module
is registered with cloudpickle) and import nothing of torchspark until :func:`node` has
made the right copy importable: the executor's own installation when it is the driver's
version, else the copy the driver shipped through Spark's file distribution (_ship.py).

Nothing here may refer to another torchspark module at module level.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Iterator, Optional

from pyspark import cloudpickle

if TYPE_CHECKING:  # only the type checker imports it: this module runs before torchspark
    from torchspark.task._spec import NodeSpec, ShipSpec

# Marks the error of a task that cannot import the driver's torchspark, so that the driver
# can ship its package and run the job again (docs: "Driver-only installs").
NOT_INSTALLED = "TORCHSPARK_NOT_INSTALLED"
# Marks any other error of this set-up step, which the driver raises as it is.
SETUP_ERROR = "TORCHSPARK_SETUP_ERROR"


def _executor_identity() -> str:
    import socket

    return f"host {socket.gethostname()}, Python {sys.executable} ({sys.version.split()[0]})"


def _installed_version() -> "tuple[Optional[str], str]":
    """(version, where) of the torchspark this Python imports, or (None, why not)."""
    try:
        import torchspark
    except Exception as e:  # ImportError, or a broken installation
        return None, f"`import torchspark` fails: {type(e).__name__}: {e}"
    where = os.path.dirname(getattr(torchspark, "__file__", "") or "?")
    return getattr(torchspark, "__version__", "?"), where


def _forget_torchspark() -> None:
    for name in [m for m in sys.modules if m == "torchspark" or m.startswith("torchspark.")]:
        del sys.modules[name]


def _use_shipped(ship: ShipSpec) -> None:
    """Puts the driver's shipped package first on this worker's path (and its children's)."""
    from pyspark import SparkFiles

    root = os.path.join(SparkFiles.getRootDirectory(), ship["name"])
    pkg = os.path.join(root, "torchspark")
    here = f"{os.uname().sysname}-{os.uname().machine}"
    install = (f"install torchspark {ship['version']} for that Python on the executors "
               "(pip install torchspark, or the wheel built for their platform)")
    if not os.path.isdir(pkg):
        raise RuntimeError(
            f"{SETUP_ERROR}: the package the driver shipped ({ship['name']}) is not under "
            f"{SparkFiles.getRootDirectory()} on the executor ({_executor_identity()}): "
            f"{install}")
    if here != ship["platform"]:
        raise RuntimeError(
            f"{SETUP_ERROR}: the executor ({_executor_identity()}) runs {here}, but the "
            f"driver's torchspark was built for {ship['platform']}, so its native agent "
            f"cannot run there: {install}")
    bin_dir = os.path.join(pkg, "_bin")
    for name in ("torchspark-run",):  # an archive may not keep the executable bit
        path = os.path.join(bin_dir, name)
        if os.path.isfile(path) and not os.access(path, os.X_OK):
            os.chmod(path, 0o755)
    try:
        import ctypes

        ctypes.CDLL(os.path.join(bin_dir, "libtorchspark.so"))
    except OSError as e:
        raise RuntimeError(
            f"{SETUP_ERROR}: the driver's libtorchspark.so cannot be loaded on the executor "
            f"({_executor_identity()}): {e}: {install}") from None
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[:1] != [root]:  # the agent's Python workers (function mode) import it too
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p])
    _forget_torchspark()


def prepare(ship: Optional[ShipSpec], want: str) -> None:
    """Makes `import torchspark` give the driver's version (want), or raises; a raise
    whose text starts with NOT_INSTALLED asks the driver to ship its package."""
    version, where = _installed_version()
    if version == want:
        return
    if ship is None:
        found = (f"torchspark {version} is installed at {where}" if version is not None
                 else where)
        raise RuntimeError(f"{NOT_INSTALLED}: the executor ({_executor_identity()}) cannot "
                           f"use the driver's torchspark {want}: {found}")
    _use_shipped(ship)
    version, where = _installed_version()
    if version != want:
        raise RuntimeError(f"{SETUP_ERROR}: the package the driver shipped could not be used "
                           f"on the executor ({_executor_identity()}): {where}")


def _place_script(spec: NodeSpec) -> "tuple[NodeSpec, Optional[str]]":
    """Script mode: the executor's own file at that path if there is one (as stock), else
    the driver's copy that came with the job, written to a directory of this task."""
    script = spec["script"]
    if script is None or os.path.exists(script):
        return spec, None
    shipped = spec.get("script_file")
    if shipped is None:
        import socket

        raise RuntimeError(
            f"{SETUP_ERROR}: the training script {script!r} exists neither on the driver "
            f"(working directory {spec.get('driver_cwd')}) nor on the executor (host "
            f"{socket.gethostname()}, working directory {os.getcwd()}): give a path that "
            "exists on the driver (it is shipped with the job) or on every executor")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="torchspark-script-")
    path = os.path.join(tmp, shipped["name"])
    with open(path, "wb") as f:
        f.write(shipped["data"])
    placed = spec.copy()
    placed["script"] = path
    return placed, tmp


def node(spec: NodeSpec, iterator: Iterator[Any]) -> Iterator[bytes]:
    """One node of the job (an RDD barrier partition): yields rank 0's result chunks."""
    prepare(spec.get("ship"), spec["version"])
    from torchspark.task._task import run_node

    tmp = None
    if spec.get("script") is not None:
        spec, tmp = _place_script(spec)
    try:
        yield from run_node(spec, iterator)
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def arrow_node(spec: NodeSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """The same through DataFrame.mapInArrow(schema "chunk binary", barrier=True)."""
    import pyarrow as pa

    for chunk in node(spec, batches):
        yield pa.RecordBatch.from_arrays([pa.array([chunk], type=pa.binary())],
                                         names=["chunk"])


cloudpickle.register_pickle_by_value(sys.modules[__name__])
