"""The hang doctor's analysis (tsp_hang_diagnose, native/src/driver/hang.c) at scale: a
synthetic DUMP answer of WORLD ranks (default 8,192: 1,024 nodes x 8) built from the
recorded dumps of tests/e2e/hang_dumps/sleep.txt, every rank but one waiting in
all_reduce #2 with a flight recorder and rank 17 asleep in its own code, analysed through
the Python glue's binding. Prints the request's size, the best and median time of
--runs calls, and the line.

    .venv/bin/python -m bench.hang_analysis_bench --world 8192 --runs 5
"""
import ctypes
import json
import re
import time

from bench import harness
from torchspark.native import _lib

DUMPS = harness.ROOT / "tests" / "e2e" / "hang_dumps" / "sleep.txt"


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
    ap = harness.cli(__doc__, runs=5, quick={"world": 1024})
    ap.add_argument("--world", type=int, default=8192, help="ranks in the DUMP answer (8192)")
    a = harness.parse(ap)
    run = harness.Run("hang_analysis_bench", a)
    world, repeat = a.world, a.runs
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
    run.figure("tsp_hang_diagnose wall", c_times, "s")
    run.figure("tsp_hang_diagnose CPU", c_cpu, "s")
    run.figure("through json_call wall", times, "s")
    run.results = {"world": world, "request_bytes": len(doc), "reply_bytes": need.value,
                   "line": got["line"]}
    print(f"world {world}: request {len(doc) / 1e6:.1f} MB, reply {need.value / 1e6:.1f} MB; "
          f"tsp_hang_diagnose alone: best {min(c_times) * 1e3:.0f} ms, median "
          f"{harness.median(c_times) * 1e3:.0f} ms (CPU time best {min(c_cpu) * 1e3:.0f} ms); "
          f"through the glue's json_call (json "
          f"encoding and decoding included): best {min(times) * 1e3:.0f} ms, median "
          f"{harness.median(times) * 1e3:.0f} ms")
    print(got["line"])
    run.finish()


if __name__ == "__main__":
    main()
