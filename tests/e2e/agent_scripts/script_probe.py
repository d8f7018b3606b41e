"""A script whose observable behaviour is compared between `python -u script_probe.py` and
torchspark-run's bootstrap (tests/e2e/test_script_exit.py).

    script_probe.py OUT ACTION [ARGS...]

It records what a script can see of how it was started into OUT (JSON), prints to stdout
without a final newline, starts a non-daemon thread that prints late, registers an atexit
callback, leaves files open with unflushed data (a Python one and a C stdio one), then ends
as ACTION says:
  ok | exit-3 | exit-msg | exit-none | raise-systemexit | raise-systemexit-5 | exit-263 |
  exit-true | exit-tuple | error | interrupt | spawn (checks a spawn-started child first)
"""
import atexit
import json
import os
import pickle
import sys
import threading
import time


class Point:
    def __init__(self, x):
        self.x = x


def double(p):
    return Point(p.x * 2)


def nested_failure(depth):
    if depth == 0:
        raise ValueError("boom in the script")
    nested_failure(depth - 1)


def on_exit():
    main = sys.modules["__main__"]
    print(f"atexit: main is ours {main.__dict__ is _GLOBALS}, "
          f"__file__ {getattr(main, '__file__', None)}, argv {sys.argv}")


def late_thread():
    time.sleep(0.3)
    print("non-daemon thread finished")


if __name__ == "__main__":
    _GLOBALS = globals()
    out, action = sys.argv[1], sys.argv[2]
    main = sys.modules["__main__"]
    seen = {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None)[1:],
        "path0": sys.path[0],
        "path": sys.path,
        "file": __file__,
        "name": __name__,
        "spec": getattr(__spec__, "name", None),
        "loader": type(__loader__).__name__,
        "cached": __cached__,
        "main_is_globals": main.__dict__ is globals(),
        "pickle_roundtrip": pickle.loads(pickle.dumps(Point(4))).x,
        "pickled_class_is_ours": type(pickle.loads(pickle.dumps(Point(1)))) is Point,
        "cmdline_has_script": os.path.basename(__file__).encode()
        in open("/proc/self/cmdline", "rb").read(),
        "cmdline_head": open("/proc/self/cmdline", "rb").read().split(b"\0")[1:3] and [
            a.decode()[:20] for a in open("/proc/self/cmdline", "rb").read().split(b"\0")[1:3]],
        "main_keys": sorted(k for k in main.__dict__ if k.startswith("_")),
    }
    if action == "spawn":
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            seen["spawned_double"] = pool.apply(double, (Point(21),)).x
    with open(out, "w") as f:
        json.dump(seen, f)
    atexit.register(on_exit)
    threading.Thread(target=late_thread).start()
    unclosed = open(out + ".unclosed", "w")
    unclosed.write("written, never flushed or closed")
    sys.stdout.write("last stdout text, no newline")
    import ctypes

    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    cfile = libc.fopen((out + ".cfile").encode(), b"w")  # C stdio, never closed
    libc.fputs(b"C stdio text, buffered until exit", ctypes.c_void_p(cfile))
    if action == "exit-3":
        sys.exit(3)
    elif action == "exit-msg":
        sys.exit("fatal: the message goes to stderr")
    elif action == "exit-none":
        sys.exit(None)
    elif action == "raise-systemexit":
        raise SystemExit
    elif action == "raise-systemexit-5":
        raise SystemExit(5)
    elif action == "exit-263":
        sys.exit(263)
    elif action == "exit-true":
        sys.exit(True)
    elif action == "exit-tuple":
        raise SystemExit(1, "two")
    elif action == "error":
        nested_failure(2)
    elif action == "interrupt":
        raise KeyboardInterrupt
