"""``torchspark.report()``: a training process's metrics, to the driver (docs/protocol.md 1.8).

The agent beside the worker listens on a Unix socket whose path it puts in
``TORCHSPARK_REPORT_SOCKET``. A process's first ``report()`` starts a sender thread that
connects and names its worker (``TSPR1 <local_rank>``); each call appends one JSON line,
which the thread sends (batched, within ``BATCH_S``) and the agent forwards over its
authenticated log channel as a line of stream 4 (REPORT). report() waits while too much is
queued (the agent cannot take more, as ``print()`` waits on a full pipe): nothing is
dropped. What is queued is sent at exit (atexit); a process killed by SIGKILL or ending in
``os._exit`` loses the reports of its last ``BATCH_S``.

Outside a torchspark run (no socket in the environment: torchrun, a plain ``python``)
``report()`` does nothing and warns once, so the same script runs there unchanged.
"""
from __future__ import annotations

import atexit
import json
import numbers
import os
import socket
import threading
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["report", "in_run", "SOCKET_ENV"]

SOCKET_ENV = "TORCHSPARK_REPORT_SOCKET"
MAX_RECORD = (1 << 20) - 1  # TSP_WIRE_MAX_LINE - 1: one record is one line on the wire

BATCH_S = 0.05  # the most a record waits in the process before it is sent
MAX_PENDING = 4 << 20  # bytes queued in the process before report() waits

# One encoder for every record: json.dumps(separators=...) builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_lock = threading.Lock()
_sender: Optional["_Sender"] = None
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


def _record(metrics: Mapping[str, Any], step: Optional[int],
            params: Optional[Mapping[str, Any]] = None) -> bytes:
    # type() before isinstance(): the ABCs' checks cost more than the rest of the call.
    if type(metrics) is not dict and not isinstance(metrics, Mapping):
        raise TypeError("torchspark.report(metrics, step=None): metrics must be a dict of "
                        f"name -> number, not {type(metrics).__name__}")
    if step is not None and type(step) is not int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"torchspark.report(): step must be an int or None, not "
                            f"{type(step).__name__} {step!r:.40}")
        step = int(step)
    clean: Dict[str, Any] = {}
    for k, v in metrics.items():
        if type(k) is not str and not isinstance(k, str):
            raise TypeError(f"torchspark.report(): metric names must be str, not "
                            f"{type(k).__name__} {k!r:.40}")
        t = type(v)
        clean[k] = v if t is float or t is int else _number(k, v)  # the common case first
    doc: Dict[str, Any] = {"step": step, "time": time.time(), "metrics": clean}
    if params:  # torchspark.mlflow.log_param(s): MLflow params, as strings (protocol 1.8)
        doc["params"] = {str(k): str(v) for k, v in params.items()}
    data = _ENCODER.encode(doc).encode()
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


class _Sender:
    """This process's connection to its agent and the records not yet sent.

    report() only appends: a daemon thread sends what accumulated at most every
    ``BATCH_S`` (one send per batch, so the agent is woken ~20 times a second, not once per
    report: on a busy host each wake-up of the agent costs the reporting process its CPU
    for a scheduling slice), and at exit (atexit: the bootstrap runs it before the process
    ends). Bounded: report() waits while ``MAX_PENDING`` bytes are queued (the agent or the
    driver is slower), so nothing is dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        self.sock: Optional[socket.socket] = None
        self.buf: List[bytes] = []
        self.size = 0
        self.error: Optional[BaseException] = None
        self.cv = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="torchspark-report-sender")
        self.thread.start()
        atexit.register(self.close)

    def put(self, data: bytes) -> None:
        with self.cv:
            if self.error is not None:
                raise self.error
            while self.size >= MAX_PENDING and self.error is None:
                self.cv.wait(1.0)
            self.buf.append(data)
            self.size += len(data)
            if len(self.buf) == 1:
                self.cv.notify_all()

    def _take(self) -> bytes:
        data = b"".join(self.buf)
        self.buf = []
        self.size = 0
        self.cv.notify_all()
        return data

    def _send(self, data: bytes) -> None:
        try:
            if self.sock is None:
                self.sock = _connect(self.path)
            self.sock.sendall(data)
        except OSError as e:
            with self.cv:
                self.error = RuntimeError(f"torchspark.report(): cannot reach this node's "
                                          f"agent at {self.path} ({e}); is the run ending?")
                self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.buf and not self.closed:
                    self.cv.wait()
                if not self.buf:
                    return
            time.sleep(BATCH_S)  # let a batch accumulate (report() does not wait for it)
            with self.cv:
                data = self._take()
            self._send(data)

    def close(self) -> None:
        """Sends what is left, in order, before the process ends."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(timeout=30)
        with self.cv:
            data = self._take()
        if data and self.error is None:
            self._send(data)


def report(metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
    """Sends ``metrics`` (names to numbers) of this rank, at ``step``, to the driver.

    On the driver each report reaches ``TorchDistributor(on_report=...)``, the history in
    ``distributor.reports`` and the live progress line (docs/distributor.md). Callable from
    any rank, in function and script mode, from any thread. Outside a torchspark run it
    does nothing (one warning), so the same script runs under torchrun.
    """
    _send(_record(metrics, step))  # bad input is refused everywhere, in or out of a run


def in_run() -> bool:
    """Whether this process runs inside a torchspark run (its agent's report socket)."""
    return bool(os.environ.get(SOCKET_ENV))


def _send(data: bytes) -> None:
    global _sender, _warned
    path = os.environ.get(SOCKET_ENV)
    if not path:
        if not _warned:
            _warned = True
            warnings.warn("torchspark.report() outside a torchspark run does nothing "
                          f"({SOCKET_ENV} is not set)", RuntimeWarning, stacklevel=3)
        return
    sender = _sender
    if sender is None or sender.pid != os.getpid():  # a forked child sends on its own
        with _lock:
            if _sender is None or _sender.pid != os.getpid():
                _sender = _Sender(path)
            sender = _sender
    sender.put(data)
