"""A DDP function whose gloo worker threads are starved at the very end, for function mode.

The worker thread that ran the last allreduce drops its AsyncWork only when the main thread
blocks; by then the main thread has returned from the function and is in interpreter
finalization (the race behind "terminate called without an active exception", see
docs/cli.md). Pinning every thread of the process to one CPU and giving all but the main
thread SCHED_IDLE widens a window that a busy machine opens a few times in a hundred runs.

Script mode (`late_gloo.py STEPS`) also holds the race open for certain, for the test that
the window is open (test_exit_race.py): widened is not certain (a loaded CPU let the
starved thread finish before finalization in 4 runs of 7). torch's decref of a Python
object from a C++ thread returns at once when Py_IsInitialized() is false, which CPython
3.11 makes so right when it sets finalizing (Py_FinalizeEx, after the atexit callbacks);
the abort needs the thread to have passed that check and to wait for the GIL then. So
rank 0 leaves one gloo allreduce issued in a backward (its AsyncWork holds the backward's
contextvars.Context) pending on a group of its own, and its last atexit callback (the first
registered) lets rank 1 complete it only while holding the GIL, until the gloo thread is
waiting for it (a new thread state), then returns: the interpreter sets finalizing with the
thread waiting, and the thread dies by pthread_exit inside ~AsyncWork (std::terminate,
SIGABRT) once it has the GIL (a sleep in finalization, _Finalizing, gives it). Through the
agent's bootstrap (no finalization) the same script exits 0. Both ranks are on one host
(rank 0's signal is a file).
"""
import sys
import time


def late_gloo_fn(steps: int, held: bool = False) -> dict:
    import os
    import threading

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    x = torch.randn(8, 16)
    for _ in range(steps - 1):
        model(x).sum().backward()
    main = threading.get_native_id()
    cpu = {min(os.sched_getaffinity(0))}
    starved = 0
    for tid in map(int, os.listdir("/proc/self/task")):
        os.sched_setaffinity(tid, cpu)
        if tid != main:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            starved += 1
    model(x).sum().backward()  # the last allreduce: its gloo thread is now starved
    rank, world = dist.get_rank(), dist.get_world_size()
    if held:
        _arm_held_race(rank)
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "starved_threads": starved}


_HELD: dict = {}  # script mode's held race, rank 0: the flag file, the pending group


def _thread_states() -> int:
    """The interpreter's thread states, read without releasing the GIL (ctypes.pythonapi)."""
    import ctypes

    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    n, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while ts:
        n, ts = n + 1, api.PyThreadState_Next(ts)
    return n


def _complete_while_holding_the_gil() -> None:
    """Rank 0's last atexit callback: every call below keeps the GIL (ctypes.PyDLL and
    pythonapi calls, no blocking I/O), and the switch interval (how long a thread waits
    for the GIL before it asks for it) outlasts the wait, so the gloo thread, once rank 1
    completed the allreduce, waits for the GIL until finalization has begun."""
    import ctypes
    import os
    import sys
    import time

    if _HELD.get("rank") != 0:
        return
    libc = ctypes.PyDLL(None)
    libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    before = _thread_states()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(120)
    fd = libc.open(os.fsencode(_HELD["flag"]), os.O_WRONLY | os.O_CREAT, 0o644)
    libc.close(fd)
    deadline = time.monotonic() + 60
    while _thread_states() <= before and time.monotonic() < deadline:
        libc.usleep(1000)
    sys.setswitchinterval(interval)


def _arm_held_race(rank: int) -> None:
    """A gloo group of its own (destroy_process_group leaves it) with one allreduce that
    rank 0 issues in a backward and leaves pending; rank 1 joins it in _release()."""
    import ctypes
    import datetime
    import os
    import tempfile
    import uuid

    import torch
    import torch.distributed as dist

    store = dist.PrefixStore("late_gloo", dist.distributed_c10d._get_default_store())
    if rank == 0:
        store.set("flag", os.path.join(tempfile.gettempdir(), f"late_gloo.{uuid.uuid4().hex}"))
    group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=120))
    # Never destroyed: in finalization its destructor would join the gloo thread while
    # holding the GIL the thread waits for.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    _HELD.update(rank=rank, flag=store.get("flag").decode(), group=group, tensor=torch.ones(4))
    if rank == 0:
        y = torch.ones(2, requires_grad=True)
        z = y * 2
        z.register_hook(lambda g: (group.allreduce([_HELD["tensor"]]), g)[1])
        z.sum().backward()  # the work's ThreadLocalState holds the backward's Context


def _release() -> None:
    """Rank 1: completes rank 0's pending allreduce once rank 0 holds the GIL at exit."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(_HELD["flag"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.unlink(_HELD["flag"])
    _HELD["group"].allreduce([_HELD["tensor"]]).wait()


class _Finalizing:
    """Cleared with __main__'s globals, after finalizing was set: lets the waiting gloo
    thread have the GIL (a sleep releases it), where it dies; a bound if it never does."""

    def __del__(self, _sys=sys, _sleep=time.sleep, _monotonic=time.monotonic) -> None:
        if _HELD.get("rank") == 0 and _sys.is_finalizing():
            deadline = _monotonic() + 60
            while _monotonic() < deadline:
                _sleep(0.05)


if __name__ == "__main__":  # script mode: torchspark-run late_gloo.py STEPS
    import atexit
    import sys

    atexit.register(_complete_while_holding_the_gil)  # first registered: runs last
    _finalizing = _Finalizing()
    result = late_gloo_fn(int(sys.argv[1]), held=True)
    if result["rank"] == 1:
        _release()
    print(result)
