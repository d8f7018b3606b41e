"""Finds the native pieces, libtorchspark.so and the torchspark-run agent, and loads the
library once per process with one table of the C signatures that the glue calls.

Search order, for both: an environment override (``TORCHSPARK_LIB`` / ``TORCHSPARK_RUN``),
the copy bundled in this package (``torchspark/_bin``, put there by the wheel build), then
a source checkout's build directory (``build/lib``, ``build/bin``; ``TORCHSPARK_BUILD_DIR``
names another), then PATH for the agent.

The public C API behind the table: ``native/include/torchspark/`` (common.h, elect.h,
logserver.h, output.h, gpu.h, plan.h, failure.h, rendezvous.h). Every other module calls
the library through :func:`load_library`.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

# The package root (torchspark/), whichever of its folders this module lives in.
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
for _ in range(__name__.count(".") - 1):
    _PKG_DIR = os.path.dirname(_PKG_DIR)
_BIN_DIR = os.path.join(_PKG_DIR, "_bin")
LIB_NAME = "libtorchspark.so"
AGENT_NAME = "torchspark-run"
JAR_NAME = "torchspark.jar"



class LogLine(ctypes.Structure):
    """tsp_logline_t (logserver.h)."""

    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_uint32), ("rank", ctypes.c_int32),
                ("stream", ctypes.c_uint8), ("flags", ctypes.c_uint8),
                ("reserved", ctypes.c_uint16)]


# The C core's JSON transforms (one signature: request, reply buffer, its needed size, error
# sentence), called through json_call.
JSON_CALLS = (
    "tsp_gang_replay", "tsp_plan_argv", "tsp_hang_diagnose", "tsp_failure_report",
    "tsp_conf_read", "tsp_conf_table", "tsp_outcome_classify", "tsp_runctl_step",
    "tsp_task_launch", "tsp_task_finish", "tsp_elect_call", "tsp_gpu_call", "tsp_result_check",
    "tsp_shape_plan",
)


def _logserver_signatures() -> Dict[str, Tuple[Any, List[Any]]]:
    """The driver's log server (logserver.h): name -> (restype, argtypes)."""
    vp, i, u, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
    sz, lng, P = ctypes.c_size_t, ctypes.c_long, ctypes.POINTER
    err: List[Any] = [c, sz]  # a caller's buffer for the error sentence
    return {
        "tsp_logserver_new": (vp, [c, i, c, u] + err),
        # the server's queries and settings, one JSON call (docs/protocol.md 1.14): json_call
        "tsp_logserver_call": (i, [vp, c, sz, c, sz, P(sz)] + err),
        "tsp_logserver_pull_reports": (i, [vp, P(LogLine), i, i]),
        "tsp_logserver_pull_text": (lng, [vp, vp, sz, i, i, c, c, P(i)]),
        "tsp_logserver_tail": (lng, [vp, i, i, c, sz]),
        "tsp_logserver_fd_check": (i, [i] + err),
        "tsp_logserver_output_data": (i, [vp, P(vp), P(ctypes.c_uint64)]),
        "tsp_logserver_free": (None, [vp]),
    }


def _signatures() -> Dict[str, Tuple[Any, List[Any]]]:
    """name -> (restype, argtypes) of every C function the glue calls."""
    vp, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    sz, P = ctypes.c_size_t, ctypes.POINTER
    err: List[Any] = [c, sz]  # a caller's buffer for the error sentence
    return {
        # the JSON transforms: request -> reply, through json_call
        **{name: (i, [c, sz, c, sz, P(sz)] + err) for name in JSON_CALLS},
        **_logserver_signatures(),
        # rendezvous.h (docs/protocol.md 2.1)
        "tsp_rdv_start": (vp, [c, c, i] + err),
        "tsp_rdv_port": (i, [vp]),
        "tsp_rdv_host": (c, [vp]),
        "tsp_rdv_free": (None, [vp]),
        "tsp_rdv_exchange": (i, [c, i, c, c, c, sz] + err),
        "tsp_rdv_gang": (i, [vp, i, i]),
        "tsp_rdv_gang_state": (i, [vp, P(i)]),
        "tsp_rdv_gang_report": (i, [vp, i, i, c, c, sz]),
        # gang.h (docs/protocol.md 2.2)
        "tsp_gang_call": (i, [c, i, c, i, i, c, i, P(i)] + err),
        "tsp_gang_ask": (i, [i, c, c, c, i]),
    }


def _candidates(env_var: str, name: str, build_sub: str) -> "list[str]":
    found = [os.environ.get(env_var, ""), os.path.join(_BIN_DIR, name)]
    # spark-glue/python/torchspark -> repository root, when running from a checkout.
    root = os.path.abspath(os.path.join(_PKG_DIR, "..", "..", ".."))
    build = os.environ.get("TORCHSPARK_BUILD_DIR", os.path.join(root, "build"))
    if os.path.isdir(build):
        found.append(os.path.join(build, build_sub, name))
    return [c for c in found if c]


def _first_file(env_var: str, name: str, build_sub: str, what_to_do: str) -> str:
    """The first of name's candidates that is a file; else FileNotFoundError naming them."""
    candidates = _candidates(env_var, name, build_sub)
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FileNotFoundError(
        f"{name} was not found (looked at: {', '.join(candidates)}): {what_to_do}")


def library_path() -> str:
    return _first_file("TORCHSPARK_LIB", LIB_NAME, "lib", "install torchspark with "
                       "`pip install ./spark-glue/python` or set TORCHSPARK_LIB")


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
    return _first_file("TORCHSPARK_JAR", JAR_NAME, "java", "build it with CMake (needs javac "
                       "17 and the pyspark package; see docs/jvm.md) and reinstall torchspark")


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def load_library() -> ctypes.CDLL:
    """libtorchspark.so, loaded once per process, every signature of the table declared."""
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(library_path())
            for name, (res, args) in _signatures().items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _lib = lib
        return _lib


def checked(name: str, *args: Any, error: Callable[[str], Exception] = ValueError,
            prefix: str = "", ok: Callable[[Any], bool] = lambda rc: rc == 0) -> Any:
    """Calls the C function name(*args, err, errlen) (the error sentence's buffer last) and
    returns its result; raises error(prefix + the library's sentence) when ok(result) is
    false (0 is success; a constructor's ok is bool: NULL is the failure)."""
    err = ctypes.create_string_buffer(4096)
    rc = getattr(load_library(), name)(*args, err, len(err))
    if not ok(rc):
        raise error(prefix + err.value.decode(errors="replace"))
    return rc


def json_call(name: str, request: Any, error: Callable[[str], Exception] = ValueError,
              handle: Any = None) -> Any:
    """One of the C core's JSON transforms (JSON_CALLS: plan.h's tsp_plan_argv, failure.h's
    tsp_failure_report, outcome.h's tsp_outcome_classify, ...; with handle, the log server's
    tsp_logserver_call on it): request -> its reply, decoded; the library's sentence naming
    what is wrong as error (a ValueError) when it refuses the request."""
    lib = load_library()
    doc = json.dumps(request).encode()
    err = ctypes.create_string_buffer(4096)  # room for every peer's reason (elect.c)
    size, rc = max(16384, 3 * len(doc)), 0  # a reply rarely outgrows 3x its request
    for _ in range(2):
        out = ctypes.create_string_buffer(size)
        needed = ctypes.c_size_t(0)
        args = (doc, len(doc), out, size, ctypes.byref(needed), err, len(err))
        rc = getattr(lib, name)(*args) if handle is None else getattr(lib, name)(handle, *args)
        if rc == 0:
            return json.loads(out.value.decode())
        if rc != -errno.ENOSPC:  # else once more with the size the library asked for
            break
        size = needed.value
    raise error(err.value.decode(errors="replace") or f"{name} failed ({rc})")
