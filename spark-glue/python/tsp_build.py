"""In-tree PEP 517 backend for torchspark: builds a platform wheel holding the Python
package plus libtorchspark.so and torchspark-run, using only the standard library.

The agent is in the wheel twice: torchspark/_bin/torchspark-run (what the distributor
runs) and the wheel's scripts (pip puts it in the environment's bin/ as the
`torchspark-run` command). That copy sits beside the environment's `python`, which is
the agent's default interpreter (docs/cli.md), so the command uses the environment it
was installed into, not whatever python3 comes first on PATH.

The native files come from $TORCHSPARK_BUILD_DIR or <repo>/build when they are at least
as new as every native source file; otherwise CMake (re)builds them there, -j2.
"""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sysconfig
import zipfile

NAME = "torchspark"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
NATIVE = {"libtorchspark.so": "lib", "torchspark-run": "bin"}
METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: PyTorch distributed training on Apache Spark with a native agent and log channel
License: Apache-2.0
Requires-Python: >=3.10
Requires-Dist: pyspark>=3.5
Requires-Dist: cloudpickle
Requires-Dist: numpy
Requires-Dist: pyarrow>=11.0
Provides-Extra: torch
Requires-Dist: torch>=2.4; extra == "torch"
"""


def _tag() -> str:
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{plat}"


def _newest_source() -> float:
    newest = 0.0
    for top in ("native", "CMakeLists.txt"):
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            newest = max(newest, os.path.getmtime(path))
        for d, _, files in os.walk(path):
            for f in files:
                newest = max(newest, os.path.getmtime(os.path.join(d, f)))
    return newest


def _native_files() -> dict:
    build = os.environ.get("TORCHSPARK_BUILD_DIR", os.path.join(ROOT, "build"))
    paths = {n: os.path.join(build, sub, n) for n, sub in NATIVE.items()}
    fresh = all(os.path.isfile(p) for p in paths.values()) and \
        min(os.path.getmtime(p) for p in paths.values()) >= _newest_source()
    if not fresh:
        if not os.path.isfile(os.path.join(ROOT, "CMakeLists.txt")):
            raise RuntimeError(f"torchspark's native build is missing in {build} and no "
                               f"CMakeLists.txt is at {ROOT} to build it")
        if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                           check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "-j2", "--target", "torchspark",
                        "torchspark-run"], check=True)
    return paths


def _jar_file():
    """build/java/torchspark.jar, rebuilt when CMake configured the JVM part (it is optional:
    without javac or the pyspark jars there is none, and the wheel carries no jar)."""
    build = os.environ.get("TORCHSPARK_BUILD_DIR", os.path.join(ROOT, "build"))
    if os.path.isfile(os.path.join(build, "CMakeFiles", "torchspark_jar.dir", "build.make")):
        subprocess.run(["cmake", "--build", build, "-j2", "--target", "torchspark_jar"], check=True,
                       stdout=subprocess.DEVNULL)
    jar = os.path.join(build, "java", "torchspark.jar")
    return jar if os.path.isfile(jar) else None


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-{_tag()}.whl"
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files = []
    pkg = os.path.join(HERE, NAME)
    for d, dirs, names in os.walk(pkg):  # the subpackages too (driver/, task/, ...)
        dirs[:] = sorted(n for n in dirs if n not in ("_bin", "__pycache__"))
        for f in sorted(n for n in names if n.endswith(".py")):
            arcname = os.path.relpath(os.path.join(d, f), HERE).replace(os.sep, "/")
            files.append((arcname, os.path.join(d, f), 0o644))
    for n, path in _native_files().items():
        files.append((f"{NAME}/_bin/{n}", path, 0o755))
        if n == "torchspark-run":
            files.append((f"{NAME}-{VERSION}.data/scripts/{n}", path, 0o755))
    jar = _jar_file()
    if jar:
        files.append((f"{NAME}/_bin/torchspark.jar", jar, 0o644))
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname: str, data: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(_record_line(arcname, data))

        for arcname, path, mode in files:
            with open(path, "rb") as fh:
                add(arcname, fh.read(), mode)
        add(f"{dist_info}/METADATA", METADATA.encode())
        add(f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: tsp_build\n"
                                   f"Root-Is-Purelib: false\nTag: {_tag()}\n").encode())
        records.append(f"{dist_info}/RECORD,,")
        z.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("torchspark ships as a wheel built from a checkout: "
                       "pip install ./spark-glue/python")
