"""The hang doctor's analysis (tsp_hang_diagnose, native/src/driver/hang.c) at scale: a
synthetic DUMP answer of WORLD ranks (default 8,192: 1,024 nodes x 8) built from the
recorded dumps of tests/e2e/hang_dumps/sleep.txt, every rank but one waiting in
all_reduce #2 with a flight recorder and rank 17 asleep in its own code, analysed through
the Python glue's binding. Prints the request's size, the best and median time of
REPEAT calls, and the line.

    .venv/bin/python bench/hang_analysis_bench.py [WORLD] [REPEAT]
"""
import ctypes
import json
import re
import statistics
import sys
import time
from pathlib import Path

from torchspark import _lib

DUMPS = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "hang_dumps" / "sleep.txt"


def _ranks(world: int, culprit: int):
    by_rank = {}
    for ln in DUMPS.read_text().splitlines():
        m = re.match(r"\[rank (\d+)\] (?:\[stderr\] )?(.*)$", ln)
        by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    waiter, sleeper = by_rank[0], by_rank[2]
    rec = ["torchspark: flight recorder: pg 0 (default_pg): all_reduce #1: completed"]
    out = []
    for r in range(world):
        src = sleeper if r == culprit else waiter
        lines = [re.sub(r"of rank \d+ ", f"of rank {r} ", src[0])]
        lines += src[1:] + rec
        if r != culprit:
            lines.append("torchspark: flight recorder: pg 0 (default_pg): all_reduce #2: "
                         "not completed (scheduled)")
        out.append(lines)
    return out


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    req = {"world": world, "request": 1, "stdlib": [], "read_sources": False,
           "ranks": _ranks(world, 17)}
    doc = json.dumps(req).encode()
    lib = _lib.load_library()
    out = ctypes.create_string_buffer(4 * len(doc))
    err = ctypes.create_string_buffer(512)
    need = ctypes.c_size_t(0)
    c_times, c_cpu, times = [], [], []
    for _ in range(repeat):
        t0, p0 = time.perf_counter(), time.process_time()
        rc = lib.tsp_hang_diagnose(doc, len(doc), out, len(out), ctypes.byref(need), err, 512)
        c_times.append(time.perf_counter() - t0)
        c_cpu.append(time.process_time() - p0)
        assert rc == 0, (rc, err.value)
        t0 = time.perf_counter()
        got = _lib.json_call("tsp_hang_diagnose", req)
        times.append(time.perf_counter() - t0)
    print(f"world {world}: request {len(doc) / 1e6:.1f} MB, reply {need.value / 1e6:.1f} MB; "
          f"tsp_hang_diagnose alone: best {min(c_times) * 1e3:.0f} ms, median "
          f"{statistics.median(c_times) * 1e3:.0f} ms (CPU time best {min(c_cpu) * 1e3:.0f} ms); "
          f"through the glue's json_call (json "
          f"encoding and decoding included): best {min(times) * 1e3:.0f} ms, median "
          f"{statistics.median(times) * 1e3:.0f} ms")
    print(got["line"])


if __name__ == "__main__":
    main()
