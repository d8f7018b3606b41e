"""Worker entry of function mode: ``python -m torchspark.worker._fn_runner FN_FILE OUT_FILE``.

Loads the cloudpickled (fn, args, kwargs), calls fn, and on global rank 0 only writes
the cloudpickled return value to OUT_FILE (written to a temporary name, then renamed, so
that a reader never sees half a result). The other ranks' return values are dropped, as
with PySpark's TorchDistributor, which returns rank 0's.

The process ends without CPython's interpreter finalization (see _end_process): torch's
gloo backend can otherwise kill a finished worker with SIGABRT at exit.
"""
import os
import sys


def _write_error_file(e: BaseException) -> None:
    """The torchelastic error file (as torch's @record writes it), so that the agent's
    report and TorchDistributor's exception carry the traceback of the user's function,
    chained causes included (traceback.format_exc prints the whole chain). Written to a
    temporary name and renamed, so the agent never reads half a file."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or isinstance(e, SystemExit) or os.path.exists(path):
        return
    import json
    import time
    import traceback

    data = {"message": {"message": f"{type(e).__name__}: {e}",
                        "extraInfo": {"py_callstack": traceback.format_exc(),
                                      "timestamp": str(int(time.time()))}}}
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _end_process(code: int) -> None:
    """Exit like the interpreter does, minus Py_FinalizeEx.

    Why: every DDP allreduce issued during backward() is an AsyncWork whose saved
    ThreadLocalState holds a Python object (the contextvars.Context that
    torch.autograd.graph._engine_run_backward stashes in TLS). A gloo worker thread drops
    its reference only after the work's future completed; when that thread is late (a busy
    machine) and the drop happens once Py_FinalizeEx has begun, taking the GIL ends the
    thread with pthread_exit (CPython <= 3.13), whose forced unwind crosses the noexcept
    ~AsyncWork: std::terminate, "terminate called without an active exception", SIGABRT
    after the function returned. Measured under torchrun as well (docs/cli.md). Without
    finalization that thread can never be told to exit, so the run ends with `code`.

    What finalization would still do and matters here is done first, in its order: wait
    for non-daemon threads, run atexit callbacks, flush the standard streams.
    """
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: "list[str]") -> int:
    if len(argv) != 3:
        print("usage: python -m torchspark.worker._fn_runner FN_FILE OUT_FILE", file=sys.stderr)
        return 2
    # pyspark's cloudpickle without pyspark's package until the function uses it
    # (torchspark/worker/_cloudpickle.py: 0.2-1.9 s of every run).
    from torchspark.worker import _cloudpickle

    cloudpickle = _cloudpickle.load()
    fn_file, out_file = argv[1], argv[2]
    del sys.argv[1:3]  # the function sees no arguments, as under PySpark's train script
    marks = None
    if os.environ.get("TORCHSPARK_TIMING_MARKS") is not None:  # run()'s waterfall
        from torchspark.driver import _timing

        marks = _timing.task_marks()
        if marks is not None:
            _timing.WorkerTimer(marks)
    with open(fn_file, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    try:
        output = fn(*args, **kwargs)
    except BaseException as e:
        _write_error_file(e)
        raise
    if marks is not None:
        import time

        marks["fn_returned"] = time.time()
    if os.environ.get("RANK", "0") == "0":
        tmp = f"{out_file}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            cloudpickle.dump(output, f)
            if marks is not None:  # beside the value, not inside it (_timing.py)
                _timing.write_trailer(f, marks)
        os.replace(tmp, out_file)
    return 0


if __name__ == "__main__":
    _end_process(main(sys.argv))
