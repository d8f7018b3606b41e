"""``torchspark.report()``: a training process's metrics, to the driver (docs/protocol.md 1.8).

The agent beside the worker listens on a Unix socket whose path it puts in
``TORCHSPARK_REPORT_SOCKET``. The first ``report()`` of a process connects and names its
worker (``TSPR1 <local_rank>``); each call then sends one JSON line, which the agent forwards
over its authenticated log channel as a line of stream 4 (REPORT). Sends block while the
agent cannot take more (as ``print()`` does on a full pipe): nothing is dropped.

Outside a torchspark run (no socket in the environment: torchrun, a plain ``python``)
``report()`` does nothing and warns once, so the same script runs there unchanged.
"""
from __future__ import annotations

import json
import numbers
import os
import socket
import threading
import time
import warnings
from typing import Any, Dict, Mapping, Optional

__all__ = ["report", "SOCKET_ENV"]

SOCKET_ENV = "TORCHSPARK_REPORT_SOCKET"
MAX_RECORD = (1 << 20) - 1  # TSP_WIRE_MAX_LINE - 1: one record is one line on the wire

_lock = threading.Lock()
_sock: Optional[socket.socket] = None
_pid = 0
_warned = False


def _number(key: str, value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # a one-element torch tensor or numpy array
    if callable(item):
        try:
            return _number(key, item())
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"torchspark.report(): metric {key!r} is {type(value).__name__} "
                    f"{value!r:.60}; give a number (int, float, or a one-element tensor)")


def _record(metrics: Mapping[str, Any], step: Optional[int]) -> bytes:
    if not isinstance(metrics, Mapping):
        raise TypeError("torchspark.report(metrics, step=None): metrics must be a dict of "
                        f"name -> number, not {type(metrics).__name__}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"torchspark.report(): step must be an int or None, not "
                            f"{type(step).__name__} {step!r:.40}")
        step = int(step)
    clean: Dict[str, Any] = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(f"torchspark.report(): metric names must be str, not "
                            f"{type(k).__name__} {k!r:.40}")
        clean[k] = _number(k, v)
    data = json.dumps({"step": step, "time": time.time(), "metrics": clean},
                      separators=(",", ":")).encode()
    if len(data) > MAX_RECORD:
        raise ValueError(f"torchspark.report(): the record is {len(data)} bytes, over the "
                         f"channel's {MAX_RECORD}-byte line cap; report fewer metrics per call")
    return data + b"\n"


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(f"TSPR1 {int(os.environ.get('LOCAL_RANK', '0'))}\n".encode())
    except BaseException:
        s.close()
        raise
    return s


def report(metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
    """Sends ``metrics`` (names to numbers) of this rank, at ``step``, to the driver.

    On the driver each report reaches ``TorchDistributor(on_report=...)``, the history in
    ``distributor.reports`` and the live progress line (docs/distributor.md). Callable from
    any rank, in function and script mode, from any thread. Outside a torchspark run it
    does nothing (one warning), so the same script runs under torchrun.
    """
    global _sock, _pid, _warned
    path = os.environ.get(SOCKET_ENV)
    data = _record(metrics, step)  # bad input is refused everywhere, in or out of a run
    if not path:
        if not _warned:
            _warned = True
            warnings.warn("torchspark.report() outside a torchspark run does nothing "
                          f"({SOCKET_ENV} is not set)", RuntimeWarning, stacklevel=2)
        return
    with _lock:
        try:
            if _sock is None or _pid != os.getpid():  # a forked child connects on its own
                if _sock is not None:
                    _sock.close()  # the child's copy of its parent's connection
                    _sock = None
                _sock = _connect(path)
                _pid = os.getpid()
            _sock.sendall(data)
        except OSError as e:
            raise RuntimeError(f"torchspark.report(): cannot reach this node's agent at "
                               f"{path} ({e}); is the run ending?") from e
