"""Finds the native pieces: libtorchspark.so (for ctypes) and the torchspark-run agent.

Search order, for both: an environment override (TORCHSPARK_LIB / TORCHSPARK_RUN), the
copy bundled in this package (torchspark/_bin, put there by the wheel build), then a
source checkout's build directory (build/lib, build/bin), then PATH for the agent.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import threading
from typing import Optional

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_BIN_DIR = os.path.join(_PKG_DIR, "_bin")
LIB_NAME = "libtorchspark.so"
AGENT_NAME = "torchspark-run"
JAR_NAME = "torchspark.jar"


def _checkout_build_dir() -> Optional[str]:
    # spark-glue/python/torchspark -> repository root, when running from a checkout.
    root = os.path.abspath(os.path.join(_PKG_DIR, "..", "..", ".."))
    build = os.environ.get("TORCHSPARK_BUILD_DIR", os.path.join(root, "build"))
    return build if os.path.isdir(build) else None


def _candidates(env_var: str, name: str, build_sub: str) -> "list[str]":
    found = [os.environ.get(env_var, ""), os.path.join(_BIN_DIR, name)]
    build = _checkout_build_dir()
    if build:
        found.append(os.path.join(build, build_sub, name))
    return [c for c in found if c]


def library_path() -> str:
    candidates = _candidates("TORCHSPARK_LIB", LIB_NAME, "lib")
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FileNotFoundError(
        f"{LIB_NAME} was not found (looked at: {', '.join(candidates)}): install torchspark "
        "with `pip install ./spark-glue/python` or set TORCHSPARK_LIB"
    )


def agent_path() -> str:
    candidates = _candidates("TORCHSPARK_RUN", AGENT_NAME, "bin")
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which(AGENT_NAME)
    if found:
        return found
    raise FileNotFoundError(
        f"the {AGENT_NAME} agent was not found on host {os.uname().nodename} (looked at: "
        f"{', '.join(candidates)} and PATH): install torchspark on every executor with "
        "`pip install ./spark-glue/python` or set TORCHSPARK_RUN"
    )


def jar_path() -> str:
    """torchspark.jar (the JVM classes, TorchSparkPlugin included, with the native files for
    linux-x86_64), for ``spark.jars``: $TORCHSPARK_JAR, the copy in this wheel, or a
    checkout's build/java."""
    candidates = _candidates("TORCHSPARK_JAR", JAR_NAME, "java")
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FileNotFoundError(
        f"{JAR_NAME} was not found (looked at: {', '.join(candidates)}): build it with CMake "
        "(needs javac 17 and the pyspark package; see docs/jvm.md) and reinstall torchspark"
    )


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def load_library() -> ctypes.CDLL:
    """Loads libtorchspark.so once per process."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = ctypes.CDLL(library_path())
        return _lib
