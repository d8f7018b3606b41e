"""Shipping the driver's torchspark to executors that do not have it (driver-only installs).

And a script that exists only on the driver travels with the job (:func:`script_file`).

A task that cannot import the driver's version of torchspark fails at once, before any
training starts, with _boot.NOT_INSTALLED in its error (_boot.prepare). The distributor
then ships its own package through Spark's file distribution and runs the job again:
one zip (the Python files, libtorchspark.so and torchspark-run, as installed on the
driver) added with ``SparkContext.addArchive`` (classic) or
``SparkSession.addArtifacts(archive=True)`` (Connect). Spark fetches and unpacks it once
per executor (per session under Connect) into the tasks' SparkFiles root; _boot.prepare
puts it first on the task's sys.path and PYTHONPATH. Executors that have the driver's
version keep using their own; installs that match cost nothing (no archive is added).

The archive's name carries the package's version and a digest of its content, so a
rebuilt package is a new archive and a session never sees two packages under one name.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import zipfile
from typing import Any, Dict, Optional, Set, Tuple

from torchspark.task._spec import ScriptFile, ShipSpec

PLATFORM = f"{os.uname().sysname}-{os.uname().machine}"

_lock = threading.Lock()
_archive: Optional[Tuple[str, str]] = None  # (path, name), built once per process
_shipped: Set[str] = set()  # sessions (application or Connect session ids) shipped to


def _package_files() -> Dict[str, str]:
    """Archive name -> file on this driver: the package's Python files and its native
    pieces, found the way the driver itself loads them."""
    import torchspark
    from torchspark.native import _lib

    pkg = os.path.dirname(os.path.abspath(torchspark.__file__))
    files = {}
    for d, dirs, names in os.walk(pkg):  # the subpackages too (driver/, task/, ...)
        dirs[:] = sorted(n for n in dirs if n not in ("_bin", "__pycache__"))
        for f in sorted(n for n in names if n.endswith(".py")):
            files[os.path.relpath(os.path.join(d, f), os.path.dirname(pkg))] = os.path.join(d, f)
    files["torchspark/_bin/libtorchspark.so"] = _lib.library_path()
    files["torchspark/_bin/torchspark-run"] = _lib.agent_path()
    return files


def _build_archive() -> Tuple[str, str]:
    import torchspark

    files = _package_files()
    digest = hashlib.sha256()
    for arcname, path in files.items():
        digest.update(arcname.encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    name = f"torchspark-{torchspark.__version__}-{digest.hexdigest()[:12]}.zip"
    tmp = tempfile.mkdtemp(prefix="torchspark-ship-")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, src in files.items():
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if arcname.endswith("torchspark-run") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(src, "rb") as f:
                z.writestr(info, f.read())
    return path, name


def archive() -> Tuple[str, str]:
    """(path, name) of this driver's package archive, built on first use."""
    global _archive
    with _lock:
        if _archive is None or not os.path.exists(_archive[0]):
            _archive = _build_archive()
        return _archive


def _session_key(spark: Any, remote: bool) -> str:
    if remote:
        return "connect:" + str(spark.client._session_id)
    return "classic:" + spark.sparkContext.applicationId


def info(name: str) -> ShipSpec:
    """What a task needs to find and check the shipped package (spec["ship"])."""
    import torchspark

    return {"name": name, "version": torchspark.__version__, "platform": PLATFORM}


def shipped(spark: Any, remote: bool) -> Optional[ShipSpec]:
    """spec["ship"] when this session already has the package, else None."""
    with _lock:
        if _archive is None or _session_key(spark, remote) not in _shipped:
            return None
        return info(_archive[1])


def ship(spark: Any, remote: bool, logger: Any, why: str) -> ShipSpec:
    """Adds the package archive to this session (once), says so with why (the task's error:
    torchspark not installed on the executors) and returns spec["ship"]."""
    path, name = archive()
    key = _session_key(spark, remote)
    with _lock:
        if key not in _shipped:
            if remote:
                spark.addArtifacts(path, archive=True)
            else:
                spark.sparkContext.addArchive(path)
            _shipped.add(key)
    spec = info(name)
    logger.info(f"torchspark {spec['version']} is not installed on the executors ({why}); "
                f"shipped the driver's package ({spec['name']}: Python files, "
                "libtorchspark.so, torchspark-run) through Spark's file distribution")
    return spec


# A script that exists on the driver travels with the job (inside the task's closure)
# for executors that lack it; larger ones must be on every executor (stock's rule).
SCRIPT_SHIP_MAX = 16 << 20


def script_file(path: str) -> Optional[ScriptFile]:
    """{"name", "data"} of a script file on the driver, to ship with the job, or None."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > SCRIPT_SHIP_MAX:
            return None
        with open(path, "rb") as f:
            return {"name": os.path.basename(path), "data": f.read()}
    except OSError:
        return None
