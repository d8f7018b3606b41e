"""run()'s waterfall: where the seconds of one TorchDistributor.run() go.

On with ``TORCHSPARK_TIMING=1`` in the driver's environment, or with the "TorchDistributor"
logger at DEBUG. Each phase is a wall-clock time (``time.time()``) taken where it happens:

    driver   run() called, job submitted, result received, run() returned
    task     tasks started (rank 0's barrier task), election done, agents started
    worker   first worker exec (the process's start time, from /proc), torch imported,
             process group up (init_process_group returned), function returned

The task's marks travel to its workers in the environment (TORCHSPARK_TIMING_MARKS, JSON);
rank 0's worker sends every mark back beside the result, never inside it: the output file
holds the user's value pickled as it is, then a timing trailer (:func:`write_trailer`: the
marks as JSON, their length, a magic) that the driver cuts off before it unpickles the
value (:func:`split_result`). Function mode only: a script's
phases are not timed beyond the driver's. The driver prints the waterfall on its stderr
(one line per phase: time since run() was called, time since the phase before). Executors
on other hosts have their own clocks: there, a phase is off by the clock skew.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

ENV = "TORCHSPARK_TIMING"
MARKS_ENV = "TORCHSPARK_TIMING_MARKS"

# The phases in the order they happen, with the text printed for each.
PHASES: List[Tuple[str, str]] = [
    ("run_called", "run() called"),
    ("job_submitted", "job submitted"),
    ("tasks_started", "tasks started"),
    ("election_done", "election done"),
    ("agents_started", "agents started"),
    ("worker_exec", "first worker exec"),
    ("torch_imported", "torch imported"),
    ("pg_up", "process group up"),
    ("fn_returned", "function returned"),
    ("job_ended", "Spark job ended"),  # distributed mode: the barrier job's collect() returned
    ("result_received", "result received"),
    ("run_returned", "run() returned"),
]


def enabled(logger: Optional[logging.Logger] = None) -> bool:
    """True when the driver should time this run()."""
    if os.environ.get(ENV, "") not in ("", "0", "false", "False"):
        return True
    return logger is not None and logger.isEnabledFor(logging.DEBUG)


# The timing trailer after rank 0's pickled value: JSON marks, their length (8 bytes,
# big-endian), this magic. A pickle's last byte is its STOP opcode ".", which ends no
# trailer: an output without one is never read as one.
TRAILER_MAGIC = b"TSPTIMING1"
_LEN = 8


def write_trailer(f: BinaryIO, marks: Dict[str, float]) -> None:
    """Appends the marks beside the value just pickled into f."""
    data = json.dumps(marks).encode()
    f.write(data + len(data).to_bytes(_LEN, "big") + TRAILER_MAGIC)


def split_result(data: Any) -> "Tuple[memoryview, Optional[Dict[str, float]]]":
    """rank 0's output bytes -> (the user's pickled value, without a copy; the marks of its
    timing trailer, or None when it has none)."""
    view = memoryview(data)
    m = len(TRAILER_MAGIC)
    if len(view) < m + _LEN or view[-m:] != TRAILER_MAGIC:
        return view, None
    size = int.from_bytes(view[-m - _LEN:-m], "big")
    end = len(view) - m - _LEN - size
    if end < 0:
        return view, None
    try:
        marks = json.loads(bytes(view[end:-m - _LEN]))
    except ValueError:
        return view, None
    return view[:end], dict(marks) if isinstance(marks, dict) else None


class Clock:
    """The driver's marks for one run() (a no-op when timing is off)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.marks: Dict[str, float] = {}
        self.mark("run_called")

    def mark(self, name: str) -> None:
        if self.on and name not in self.marks:
            self.marks[name] = time.time()

    def value(self, data: Any) -> memoryview:
        """Rank 0's output -> the user's pickled value; the marks of its timing trailer,
        which travels beside the value, join the waterfall."""
        value, marks = split_result(data)
        if marks is not None:
            self.marks.update(marks)
        return value

    def env(self) -> Dict[str, str]:
        """What the tasks (or a local agent) need to time their workers."""
        if not self.on:
            return {}
        return {ENV: "1", MARKS_ENV: json.dumps(self.marks)}

    def report(self, mode: str, stream: Any = None) -> str:
        """Prints the waterfall (and returns its text)."""
        if not self.on:
            return ""
        self.mark("run_returned")
        text = format_waterfall(self.marks, f"torchspark timing ({mode})")
        out = stream if stream is not None else sys.stderr
        try:
            out.write(text)
            out.flush()
        except Exception:
            pass
        return text


class TaskTiming:
    """run()'s waterfall on the task's side: the driver's marks,
    then this task's start and election; handed to the workers in their environment."""

    def __init__(self, timing_env: Dict[str, str]) -> None:
        self.timing_env = timing_env
        self.marks: Optional[Dict[str, float]] = None
        if timing_env:
            self.marks = dict(json.loads(timing_env.get(MARKS_ENV, "{}")))
            self.marks["tasks_started"] = time.time()

    def mark(self, name: str) -> None:
        if self.marks is not None:
            self.marks[name] = time.time()

    def env(self, env: Dict[str, str]) -> Dict[str, str]:
        """env with the marks so far, "agents started" being now."""
        if self.marks is None:
            return env
        self.mark("agents_started")
        return {**env, **self.timing_env, MARKS_ENV: json.dumps(self.marks)}


def format_waterfall(marks: Dict[str, float], title: str) -> str:
    t0 = marks.get("run_called")
    if t0 is None:
        return ""
    lines = [f"{title}: run() phases, seconds since run() was called (+ since the phase "
             "before)"]
    prev = t0
    for key, label in PHASES:
        t = marks.get(key)
        if t is None:
            lines.append(f"  {label:<20} -")
            continue
        lines.append(f"  {label:<20} {t - t0:8.3f}  (+{t - prev:.3f})")
        prev = t
    return "\n".join(lines) + "\n"


# ---- the task's and the worker's side ---------------------------------------------------

def task_marks() -> Optional[Dict[str, float]]:
    """In a barrier task: the marks so far (the driver's), or None when timing is off."""
    raw = os.environ.get(MARKS_ENV)
    if raw is None:
        return None
    try:
        return dict(json.loads(raw))
    except ValueError:
        return {}


def process_start_time() -> Optional[float]:
    """This process's start (its exec) as a time.time() value, from /proc."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat: starttime in clock ticks
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return None


class WorkerTimer:
    """In a function-mode worker: marks the exec, the end of ``import torch`` (a
    meta-path finder that sees the first import of torch finish) and the return of
    ``init_process_group`` (wrapped once torch is in)."""

    def __init__(self, marks: Dict[str, float]) -> None:
        self.marks = marks
        start = process_start_time()
        if start is not None:
            marks.setdefault("worker_exec", start)
        if "torch" in sys.modules:
            self._torch_done()
        else:
            sys.meta_path.insert(0, _TorchFinder(self))

    def _torch_done(self) -> None:
        self.marks.setdefault("torch_imported", time.time())
        dist = getattr(sys.modules.get("torch"), "distributed", None)
        if dist is None:
            return
        for mod in (dist, getattr(dist, "distributed_c10d", None)):
            if mod is None:
                continue
            fn = getattr(mod, "init_process_group", None)
            if fn is None or getattr(fn, "_torchspark_timed", False):
                continue
            mod.init_process_group = self._wrap(fn)

    def _wrap(self, fn: Any) -> Any:
        import functools

        marks = self.marks

        @functools.wraps(fn)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            marks.setdefault("pg_up", time.time())
            return out

        init_process_group._torchspark_timed = True  # type: ignore[attr-defined]
        return init_process_group


class _TorchFinder:
    """Finds nothing itself: on the first import of "torch" it lets the other finders
    find the spec and wraps its loader, so that the end of torch's import is seen."""

    def __init__(self, timer: WorkerTimer) -> None:
        self.timer = timer

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, timer = spec.loader, self.timer
        exec_module = loader.exec_module

        def timed_exec(module: Any) -> None:
            exec_module(module)
            timer._torch_done()

        try:
            loader.exec_module = timed_exec  # type: ignore[method-assign]
        except (AttributeError, TypeError):
            pass
        return spec
