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
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

__all__ = ["report", "in_run", "SOCKET_ENV"]

SOCKET_ENV = "TORCHSPARK_REPORT_SOCKET"
MAX_RECORD = (1 << 20) - 1  # TSP_WIRE_MAX_LINE - 1: one record is one line on the wire

BATCH_S = 0.05  # the most a record waits in the process before it is sent
MAX_PENDING = 4 << 20  # bytes queued in the process before report() waits (their bounds)
_BIG = 1 << 63  # an int within +-2**63 takes at most 20 characters of JSON, a float 24
_FRAME = 80  # '{"step":,"time":,"metrics":{}}\n' with such a step (or null) and a time
_PER_METRIC = 2 + 1 + 1 + 24  # a name's quotes, its colon, a comma, the number

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


def _encode(doc: Dict[str, Any]) -> bytes:
    data = _ENCODER.encode(doc).encode()
    if len(data) > MAX_RECORD:
        raise ValueError(f"torchspark.report(): the record is {len(data)} bytes, over the "
                         f"channel's {MAX_RECORD}-byte line cap; report fewer metrics per call")
    return data + b"\n"


# A record waiting in the process: (step, time, metrics, bytes at most once encoded), or
# the encoded line itself (a record that may be near the cap, or with params).
_Item = Union[Tuple[Optional[int], float, Dict[str, Any], int], bytes]


def _record(metrics: Mapping[str, Any], step: Optional[int],
            params: Optional[Mapping[str, Any]] = None) -> _Item:
    """Checks one report on the caller's thread (bad input raises here, on the rank) and
    returns it to queue. The JSON line is made later, by the sender, for a whole batch at
    once (one encoder call per batch, off the training thread's step), unless the record
    may be over the channel's line cap: its size is bounded here from the names' lengths
    (a JSON-escaped character takes at most 12 bytes, a float or an int under 2**63 at
    most 24), and a record whose bound is over the cap is encoded here, to refuse it."""
    # type() before isinstance(): the ABCs' checks cost more than the rest of the call.
    if type(metrics) is not dict and not isinstance(metrics, Mapping):
        raise TypeError("torchspark.report(metrics, step=None): metrics must be a dict of "
                        f"name -> number, not {type(metrics).__name__}")
    size = _FRAME
    if step is not None:
        if type(step) is not int:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise TypeError(f"torchspark.report(): step must be an int or None, not "
                                f"{type(step).__name__} {step!r:.40}")
            step = int(step)
        if not -_BIG < step < _BIG:
            size += len(str(step))
    clean: Dict[str, Any] = {}
    for k, v in metrics.items():
        if type(k) is not str and not isinstance(k, str):
            raise TypeError(f"torchspark.report(): metric names must be str, not "
                            f"{type(k).__name__} {k!r:.40}")
        t = type(v)
        if t is not float and (t is not int or not -_BIG < v < _BIG):  # the common case first
            v = _number(k, v)
            if type(v) is int and not -_BIG < v < _BIG:
                size += len(str(v))  # ValueError past Python's int digits limit, as json's
        clean[k] = v
        size += 12 * len(k) + _PER_METRIC
    now = time.time()
    if params or size > MAX_RECORD:
        doc: Dict[str, Any] = {"step": step, "time": now, "metrics": clean}
        if params:  # torchspark.mlflow.log_param(s): MLflow params, as strings (protocol 1.8)
            doc["params"] = {str(k): str(v) for k, v in params.items()}
        return _encode(doc)
    return (step, now, clean, size)


def _lines(items: List[_Item]) -> bytes:
    """The JSON lines of a batch, in order: one encoder call for each run of records.

    The records of a run are encoded as one JSON array and cut between its elements, where
    the text is exactly '},{"step":'. That text occurs nowhere else: a record's objects are
    its own ({"step", "time", "metrics"}) and its metrics' (numbers only), a '"' inside a
    string is escaped, and the metrics' object follows '"metrics":', never '},'."""
    out: List[bytes] = []
    run: List[Dict[str, Any]] = []
    for item in items + [b""]:
        if isinstance(item, tuple):
            run.append({"step": item[0], "time": item[1], "metrics": item[2]})
            continue
        if run:
            text = _ENCODER.encode(run)
            out.append(text[1:-1].replace('},{"step":', '}\n{"step":').encode() + b"\n")
            run = []
        out.append(item)
    return b"".join(out)


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

    report() only appends (the record checked, not yet encoded): a daemon thread wakes
    every ``BATCH_S`` while records come, encodes what accumulated in one go and sends it
    in one send (so the agent is woken ~20 times a second, not once per report: on a busy
    host each wake-up of the agent costs the reporting process its CPU for a scheduling
    slice), and blocks, with no timer, once a wake-up found nothing; the first report()
    after that wakes it. At exit (atexit: the bootstrap runs it before the process ends)
    what is left is sent. Bounded: report() waits while ``MAX_PENDING`` bytes (the
    records' bounds) are queued (the agent or the driver is slower), so nothing is
    dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        self.sock: Optional[socket.socket] = None
        self.buf: List[_Item] = []
        self.size = 0
        self.error: Optional[BaseException] = None
        self.cv = threading.Condition(threading.Lock())
        self.idle = False  # the thread waits for a first record (put() must wake it)
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="torchspark-report-sender")
        self.thread.start()
        atexit.register(self.close)

    def put(self, item: _Item) -> None:
        size = len(item) if isinstance(item, bytes) else item[3]
        with self.cv:
            if self.error is not None:
                raise self.error
            while self.size >= MAX_PENDING and self.error is None:
                self.cv.wait(1.0)
            self.buf.append(item)
            self.size += size
            if self.idle:
                self.idle = False
                self.cv.notify_all()

    def _take(self) -> List[_Item]:
        items = self.buf
        self.buf = []
        if self.size >= MAX_PENDING:
            self.cv.notify_all()  # report() calls wait for room
        self.size = 0
        return items

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
                    self.idle = True
                    self.cv.wait()
                if not self.buf:
                    return
            while True:  # one wake-up per BATCH_S while records come
                if not self.closed:
                    time.sleep(BATCH_S)  # let a batch accumulate (report() does not wait)
                with self.cv:
                    items = self._take()
                if not items:
                    break
                self._send(_lines(items))

    def close(self) -> None:
        """Sends what is left, in order, before the process ends."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(timeout=30)
        with self.cv:
            items = self._take()
        if items and self.error is None:
            self._send(_lines(items))


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


def _send(item: _Item) -> None:
    global _sender, _warned
    sender = _sender
    if sender is not None and sender.pid == os.getpid():  # a forked child sends on its own
        sender.put(item)
        return
    path = os.environ.get(SOCKET_ENV)
    if not path:
        if not _warned:
            _warned = True
            warnings.warn("torchspark.report() outside a torchspark run does nothing "
                          f"({SOCKET_ENV} is not set)", RuntimeWarning, stacklevel=3)
        return
    with _lock:
        if _sender is None or _sender.pid != os.getpid():
            _sender = _Sender(path)
        sender = _sender
    sender.put(item)
