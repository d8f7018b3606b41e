#!/usr/bin/env python3
"""torchspark-run against torchrun, side by side in one run (docs/benchmarks.md, "torchspark-run
against torchrun").

  .venv/bin/python -m bench.agent_bench [--runs 10] [--svg docs/img/agent_bench.svg]

1. startup: wall time of `LAUNCHER --nproc-per-node 4 --no-python /bin/true`, from fork to
   the launcher's exit status (perf_counter around spawn + waitpid). The two launchers
   alternate run by run, so drifting background load hits both alike.
2. crash-to-gone: 4 Python workers; local rank 0 waits until all are up and the bench
   watches them, writes its CLOCK_REALTIME time to a file and SIGKILLs itself; the others
   sleep. The bench (the launcher's parent) holds a pidfd of each worker and poll()s them:
   "workers gone" is the CLOCK_REALTIME when the last one turned readable (exited). It then
   blocks in waitpid on the launcher, reads CLOCK_REALTIME as soon as it returns, scans
   /proc for any process still carrying the run's marker variable (a descendant that
   outlived the launcher) and, if there is one, polls every millisecond until none is
   left: "tree gone" is that moment. Both figures are measured from the crash time.
3. memory: VmRSS (and VmHWM) of the launcher process itself from /proc/<pid>/status while it
   supervises 8 workers (`--no-python /bin/sleep 3`), read once all 8 are its children.
Medians over --runs runs (default 10), with min and max.

--gpu-modes [TORCHSPARK-RUN] (docs/benchmarks.md, "The agent's memory in each GPU mode"),
instead: the agent's peak resident memory (VmHWM, KiB) in each GPU mode, read from /proc
0.4 s into a 0.6 s worker: the GPU count through NVML, through cuInit (NVML hidden), the
assignment of --gpus, and no GPU at all; the build's torchspark-run unless a path is given.
On a machine without a GPU the build's stub libraries stand in (their threads included); on
a GPU host set GPU_REAL=1 to use the real driver.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness

agentutil = harness.helper("agentutil")
MARKER_VAR, PY, TSR = agentutil.MARKER_VAR, agentutil.PY, agentutil.TSR
free_port, marked_pids, new_marker = agentutil.free_port, agentutil.marked_pids, agentutil.new_marker

CRASH_WORKER = r"""
import os, signal, sys, time
out = sys.argv[1]
lr, n = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
with open(os.path.join(out, f".ready.{lr}"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(out, f".ready.{lr}"), os.path.join(out, f"ready.{lr}"))
if lr != 0:
    time.sleep(120)
    sys.exit(0)
while not os.path.exists(os.path.join(out, "watching")):  # the bench holds pidfds now
    time.sleep(0.005)
time.sleep(0.1)  # let every worker settle into its sleep
t = time.clock_gettime(time.CLOCK_REALTIME)
with open(os.path.join(out, "crash"), "w") as f:
    f.write(repr(t))
    f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def launchers() -> dict[str, list[str]]:
    return {"torchspark-run": [TSR], "torchrun": [PY, "-m", "torch.distributed.run"]}


def env_with(marker: str) -> dict[str, str]:
    env = dict(os.environ)
    env[MARKER_VAR] = marker
    return env


def kill_marked(marker: str) -> None:
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def bench_startup(cmd: list[str]) -> float:
    marker = new_marker()
    t0 = time.perf_counter()
    rc = subprocess.call([*cmd, "--nproc-per-node", "4", "--no-python", "/bin/true"],
                         env=env_with(marker), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    kill_marked(marker)
    if rc != 0:
        raise SystemExit(f"{cmd[0]}: status {rc} for /bin/true")
    return dt


def bench_crash(cmd: list[str], script: str) -> tuple[float, float]:
    """Returns (crash to every worker gone, crash to the whole tree gone) in seconds."""
    marker = new_marker()
    with tempfile.TemporaryDirectory(prefix="tsp-bench-") as out:
        port = free_port()
        p = subprocess.Popen([*cmd, "--nproc-per-node", "4", "--master-port", str(port),
                              script, out], env=env_with(marker), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            ready = [Path(out, f"ready.{i}") for i in range(4)]
            deadline = time.monotonic() + 60
            while not all(r.exists() for r in ready):
                if time.monotonic() > deadline or p.poll() is not None:
                    raise SystemExit(f"{cmd[0]}: workers did not start")
                time.sleep(0.005)
            # A pidfd turns readable when its process exits, parent or not: the workers'
            # exits are observed without polling them.
            fds = [os.pidfd_open(int(r.read_text())) for r in ready]
            Path(out, "watching").touch()
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            left = set(fds)
            while left:
                for fd, _ev in poller.poll(60_000):
                    left.discard(fd)
                    poller.unregister(fd)
            workers_gone = time.clock_gettime(time.CLOCK_REALTIME)
            for fd in fds:
                os.close(fd)
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            kill_marked(marker)
            raise SystemExit(f"{cmd[0]}: did not exit after the crash") from None
        gone = time.clock_gettime(time.CLOCK_REALTIME)
        deadline = time.monotonic() + 60
        while marked_pids(marker):
            if time.monotonic() > deadline:
                kill_marked(marker)
                raise SystemExit(f"{cmd[0]}: processes outlived the launcher by 60 s")
            time.sleep(0.001)
            gone = time.clock_gettime(time.CLOCK_REALTIME)
        crash = float(Path(out, "crash").read_text())
    if p.returncode == 0:
        raise SystemExit(f"{cmd[0]}: status 0 after a crash")
    return workers_gone - crash, gone - crash


def children(pid: int) -> list[int]:
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            kids += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return kids


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def bench_rss(cmd: list[str]) -> tuple[int, int]:
    marker = new_marker()
    p = subprocess.Popen([*cmd, "--nproc-per-node", "8", "--master-port", str(free_port()),
                          "--no-python", "/bin/sleep", "3"], env=env_with(marker),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(children(p.pid)) < 8:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{cmd[0]}: 8 workers did not start")
            time.sleep(0.01)
        time.sleep(0.2)  # steady state: every worker has exec'ed /bin/sleep
        rss, hwm = status_kib(p.pid, "VmRSS"), status_kib(p.pid, "VmHWM")
    finally:
        p.wait(timeout=60)
        kill_marked(marker)
    return rss, hwm


def gpu_modes(run, tsr: str) -> None:
    """The agent's VmHWM in each GPU mode (--gpu-modes), medians of --runs."""
    stubs = harness.ROOT / "build" / "tests" / "unit"
    env = dict(os.environ)
    nvml = str(stubs / "libnvml_stub.so")
    if os.environ.get("GPU_REAL", "0") != "1":
        u0 = "GPU-0a1b2c3d-1111-2222-3333-444455556666"
        env.update(TORCHSPARK_LIBCUDA=str(stubs / "libcuda_stub.so"),
                   STUB_CUDA_DEVICES="0000:01:00.0", STUB_CUDA_UUIDS=u0,
                   STUB_NVML_DEVICES=f"{u0}@00000000:01:00.0@Stub@0@0")
    else:
        nvml = "libnvidia-ml.so.1"
    gpu = ["--standalone", "--nproc-per-node", "gpu"]
    modes = {"count through NVML": (nvml, gpu), "count through cuInit": ("/nonexistent", gpu),
             "--gpus 0": (nvml, [*gpu, "--gpus", "0"]),
             "no GPU": (None, ["--standalone", "--nproc-per-node", "1"])}

    def hwm(lib, args):
        e = dict(env, TORCHSPARK_LIBNVML=lib) if lib else env
        p = subprocess.Popen([tsr, *args, "--no-python", "sh", "-c", "sleep 0.6"], env=e,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.4)
        try:
            return status_kib(p.pid, "VmHWM")
        finally:
            p.wait()

    samples = {name: [] for name in modes}
    for _ in range(run.options["runs"]):
        for name, (lib, args) in modes.items():
            samples[name].append(hwm(lib, args))
    for name, v in samples.items():
        s = run.figure(f"agent VmHWM, {name}", v, "KiB", 0)
        print(f"{name}: {s['median']:.0f} KiB" + (f" (min {s['min']:.0f}, max {s['max']:.0f})"
                                                  if s["n"] > 1 else ""))
    run.finish()


def svg(results: dict, path: Path) -> None:
    """A hand-written bar chart (matplotlib is not a dependency): one panel per measure,
    bars scaled to the larger value of the pair, the median written beside each bar."""
    panels = [("startup, 4 x /bin/true (ms)", "startup_ms"),
              ("crash to last process gone (ms)", "crash_ms"),
              ("launcher RSS, 8 workers (MiB)", "rss_mib")]
    w, bar_h, gap, left = 640, 22, 14, 130
    h = 20 + len(panels) * (2 * bar_h + 3 * gap + 16)
    colors = {"torchspark-run": "#2b6cb0", "torchrun": "#b7791f"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>']
    y = 20
    for title, key in panels:
        parts.append(f'<text x="10" y="{y}" font-weight="bold">{title}, median</text>')
        y += gap
        top = max(results[name][key][0] for name in colors)
        for name, color in colors.items():
            value = results[name][key][0]
            length = max(1.0, (w - left - 110) * value / top)
            parts.append(f'<text x="10" y="{y + bar_h - 6}">{name}</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar_h}" '
                         f'fill="{color}"/>')
            parts.append(f'<text x="{left + length + 6:.1f}" y="{y + bar_h - 6}">'
                         f'{value:.3g}</text>')
            y += bar_h + 4
        y += 2 * gap
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    ap = harness.cli(__doc__, runs=10)
    ap.add_argument("--svg", type=Path)
    ap.add_argument("--gpu-modes", nargs="?", const=str(harness.ROOT / "build" / "bin" / "torchspark-run"),
                    metavar="TORCHSPARK-RUN", help="the agent's VmHWM in each GPU mode instead")
    args = harness.parse(ap)
    if args.gpu_modes:
        return gpu_modes(harness.Run("agent_bench_gpu_modes", args), args.gpu_modes)
    if args.runs < 5 and not args.quick:
        ap.error("--runs must be at least 5 (medians of >= 5), or --quick")
    run = harness.Run("agent_bench", args)
    info = dict(run.before, **{"torchspark-run": subprocess.run(
        [TSR, "--version"], capture_output=True, text=True).stdout.strip()})
    cmds = launchers()
    raw: dict[str, dict[str, list[float]]] = {n: {"startup_ms": [], "crash_ms": [], "workers_ms": [],
                                                  "rss_mib": [], "hwm_mib": []} for n in cmds}
    with tempfile.TemporaryDirectory(prefix="tsp-bench-") as d:
        script = Path(d, "crash_worker.py")
        script.write_text(CRASH_WORKER)
        for i in range(args.runs):
            for name, cmd in cmds.items():  # alternate: A B A B ...
                raw[name]["startup_ms"].append(bench_startup(cmd) * 1e3)
            for name, cmd in cmds.items():
                workers, tree = bench_crash(cmd, str(script))
                raw[name]["workers_ms"].append(workers * 1e3)
                raw[name]["crash_ms"].append(tree * 1e3)
            for name, cmd in cmds.items():
                rss, hwm = bench_rss(cmd)
                raw[name]["rss_mib"].append(rss / 1024)
                raw[name]["hwm_mib"].append(hwm / 1024)
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr)

    units = {"startup_ms": "ms", "crash_ms": "ms", "workers_ms": "ms", "rss_mib": "MiB",
             "hwm_mib": "MiB"}
    for key, unit in units.items():
        run.compare(key, raw["torchspark-run"][key], raw["torchrun"][key], unit,
                    "torchspark-run", "torchrun")
    results = {n: {k: tuple(run.figures[f"{k}, {n}"][x] for x in ("median", "min", "max"))
                   for k in m} for n, m in raw.items()}
    ours, theirs = results["torchspark-run"], results["torchrun"]
    ratio = 100 * ours["startup_ms"][0] / theirs["startup_ms"][0]

    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"runs: {args.runs} per launcher and measure; median (min-max)\n")
    print("| measure | torchspark-run | torchrun | goal |")
    print("|---|---|---|---|")
    rows = [("startup, `--nproc-per-node 4 --no-python /bin/true` (ms)", "startup_ms",
             f"< 2% of torchrun: {ratio:.2f}%"),
            ("crash of a worker to last process gone (ms)", "crash_ms", "< 50 ms"),
            ("crash of a worker to every worker gone (ms)", "workers_ms", ""),
            ("launcher VmRSS, 8 workers (MiB)", "rss_mib", "< 8 MiB"),
            ("launcher VmHWM, 8 workers (MiB)", "hwm_mib", "")]
    for label, key, goal in rows:
        cells = [f"{r[key][0]:.2f} ({r[key][1]:.2f}-{r[key][2]:.2f})" for r in (ours, theirs)]
        print(f"| {label} | {cells[0]} | {cells[1]} | {goal} |")

    run.results = {"torchspark-run": info["torchspark-run"], "raw": raw, "results": results}
    run.finish()
    if args.svg:
        svg(results, args.svg)


if __name__ == "__main__":
    main()
