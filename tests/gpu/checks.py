"""The device checks H1-H10 of docs/gpu.md (design: ../shared/design/gpu.md section 9), one
subcommand per check, each run by tests/gpu/run.sh in its own process under its own timeout:

    python tests/gpu/checks.py env|h1|h2|...|h10

Exit status: 0 passed, 1 failed, 77 skipped (the reason on the last line). Lines that start
with "FIGURE | " are the figures run.sh gathers into one table for docs/benchmarks.md ("GPUs and the NCCL
preflight").
Needs nvidia-smi, torch with CUDA, the build (torchspark-run, libtorchspark.so) and
spark-glue/python on PYTHONPATH (run.sh sets it up; docs/gpu.md, "Running the device check
on a GPU machine"). Every process started here is killed with its session on a timeout;
run.sh looks for anything left (TSP_GPU_MARK) after each check.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
HWM_GOAL_KIB = 8 * 1024  # the agent's memory goal (docs/benchmarks.md, "The agent's memory in each GPU mode")


# ---- helpers ---------------------------------------------------------------------------

def say(*a: object) -> None:
    print(*a, flush=True)


def figure(fid: str, what: str, value: str, runs: str = "") -> None:
    """One row of the figures table (run.sh collects these lines)."""
    say(f"FIGURE | {fid} | {what} | {value} | {runs} |")


def fmt(xs: Sequence[float], unit: str = "s", digits: int = 2) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in xs) + (f" {unit}" if unit else "")


def agent() -> str:
    from torchspark.native._lib import agent_path

    return agent_path()


def nccl_lib() -> Optional[str]:
    """The libnccl the training uses: TORCHSPARK_NCCL_LIB, else torch's nvidia-nccl wheel."""
    from torchspark.task._launch import find_libnccl

    return os.environ.get("TORCHSPARK_NCCL_LIB") or find_libnccl()


def nccl_args() -> List[str]:
    lib = nccl_lib()
    return [f"--nccl-lib={lib}"] if lib else []


@dataclass
class Run:
    rc: int
    out: str
    wall: float

    @property
    def timed_out(self) -> bool:
        return self.rc == 124


def _kill_session(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass


def run(cmd: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 60,
        show: bool = False) -> Run:
    """cmd in its own session (killed whole after timeout: rc 124), stdout and stderr
    together."""
    t0 = time.monotonic()
    p = subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True, text=True,
                         errors="replace")
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        _kill_session(p)
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a descendant of another session holds the pipe
            out = "(output lost: a process outside the session kept the pipe open)"
        rc = 124
    wall = time.monotonic() - t0
    if show:
        say(out.rstrip())
    return Run(rc, out, wall)


def env_with(**kv: Optional[str]) -> Dict[str, str]:
    """This environment with kv set (None: removed)."""
    env = dict(os.environ)
    for k, v in kv.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smi(query: str, what: str = "gpu") -> List[List[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()
            if line.strip()]


def compute_pids() -> List[int]:
    """The processes nvidia-smi lists as running compute work."""
    pids = []
    for row in smi("pid", "compute-apps"):
        try:
            pids.append(int(row[0]))
        except (ValueError, IndexError):
            pass
    return pids


def norm_bus(bus: str) -> str:
    """0000:3b:00.0 from NVML's 00000000:3B:00.0, nvidia-smi's or CUDA's forms."""
    bus = bus.strip().lower()
    dom, _, rest = bus.partition(":")
    try:
        return f"{int(dom, 16):04x}:{rest}"
    except ValueError:
        return bus


def nvidia_fds(pid: int) -> List[str]:
    """The /dev/nvidia* files pid holds open."""
    found = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return ["(cannot read /proc/%d/fd)" % pid]
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.append(f"{fd} -> {target}")
    return found


GPU_MAX, MIG_MAX, UUID_MAX = 64, 8, 96


class Info(ctypes.Structure):  # tsp_gpu_info_t (native/include/torchspark/gpu.h)
    _fields_ = [("index", ctypes.c_int), ("uuid", ctypes.c_char * UUID_MAX),
                ("bus", ctypes.c_char * 32), ("name", ctypes.c_char * 96),
                ("mem_total", ctypes.c_ulonglong), ("mem_used", ctypes.c_ulonglong),
                ("mig_mode", ctypes.c_int), ("nmig", ctypes.c_int),
                ("mig", (ctypes.c_char * UUID_MAX) * MIG_MAX), ("compute_mode", ctypes.c_int),
                ("nprocs", ctypes.c_int), ("procs_mem", ctypes.c_ulonglong)]


class Inventory(ctypes.Structure):  # tsp_gpu_inventory_t
    _fields_ = [("ndev", ctypes.c_int), ("dev", Info * GPU_MAX)]


class Nvml:
    """GPU memory in use through NVML (no CUDA context in this process)."""

    class _Mem(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(os.environ.get("TORCHSPARK_LIBNVML") or "libnvidia-ml.so.1")
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise RuntimeError(f"nvmlInit_v2 returned {rc}")

    def used_mib(self, index: int) -> float:
        h = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}")
        m = self._Mem()
        rc = self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetMemoryInfo returned {rc}")
        return m.used / (1 << 20)


class PeakSampler(threading.Thread):
    """The largest GPU memory in use on one device, sampled every few milliseconds."""

    def __init__(self, nvml: Nvml, index: int) -> None:
        super().__init__(daemon=True)
        self.nvml, self.index = nvml, index
        self.peak = nvml.used_mib(index)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.nvml.used_mib(self.index))
            time.sleep(0.005)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.peak


def settled(nvml: Nvml, index: int, base: float) -> float:
    """GPU memory in use above base once the driver freed an ended process's (up to 3 s)."""
    left = nvml.used_mib(index) - base
    for _ in range(30):
        if left <= 2:
            break
        time.sleep(0.1)
        left = nvml.used_mib(index) - base
    return left


def first_gpu() -> Tuple[int, str, str]:
    """(index, UUID, bus) of nvidia-smi's first GPU."""
    row = smi("index,uuid,pci.bus_id")[0]
    return int(row[0]), row[1], norm_bus(row[2])


def check_worker(rank: int, world: int, local_rank: int, comm_id: str, mask: str,
                 deadline: float) -> Tuple[subprocess.Popen, int]:
    """One NCCL check process (`torchspark-run --nccl-check-worker`) started as the agent
    starts it (native/src/gpu/nccl.c), its result line on the returned descriptor."""
    r, w = os.pipe()
    env = env_with(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                   NCCL_COMM_ID=comm_id, CUDA_VISIBLE_DEVICES=mask,
                   TORCHSPARK_NCCL_CHECK_TIMEOUT=str(deadline),
                   TORCHSPARK_NCCL_RESULT_FD=str(w), TORCHSPARK_NCCL_LIB=nccl_lib(),
                   NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"))
    p = subprocess.Popen([agent(), "--nccl-check-worker"], env=env, pass_fds=(w,),
                         stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(w)
    return p, r


def worker_result(p: subprocess.Popen, r: int, timeout: float) -> Tuple[Optional[dict], float]:
    """The check process's JSON result and when it ended (monotonic), or None."""
    data = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([r], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    try:
        p.wait(timeout=max(0.1, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_session(p)
        p.wait()
    ended = time.monotonic()
    try:
        return json.loads(data.decode().strip().splitlines()[0]), ended
    except (ValueError, IndexError):
        return None, ended


# ---- the checks ------------------------------------------------------------------------

def check_env() -> int:
    """What this machine is: the lines docs/benchmarks.md ("The device check on an H200") records
    beside the figures."""
    gpus = smi("index,name,uuid,pci.bus_id,driver_version,memory.total")
    for g in gpus:
        say("GPU", ", ".join(g))
    r = run([sys.executable, "-c",
             "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, "
             "'NCCL', torch.cuda.nccl.version(), 'available', torch.cuda.is_available(), "
             "'devices', torch.cuda.device_count())"], timeout=120)
    say(r.out.strip())
    say("python", sys.version.split()[0], sys.executable)
    say("libnccl", nccl_lib() or "(the loader's libnccl.so.2)")
    say("agent", agent())
    try:  # as a training process loads it: pyspark's cloudpickle only (no py4j here)
        from torchspark.worker import _cloudpickle

        say("pyspark's cloudpickle", _cloudpickle.load().__file__)
    except ImportError as e:
        say(f"pyspark's Python package is missing ({e}): carry it (docs/gpu.md)")
        return 1
    ok = r.rc == 0 and "available True" in r.out
    if not ok:
        say("torch cannot use CUDA here")
    return 0 if ok else 1


def check_h1() -> int:
    """H1: the NVML inventory (tsp_gpu_inventory) and the CUDA driver's devices (in PCI
    order) against nvidia-smi: the same GPUs with the same UUIDs and bus ids."""
    from torchspark.native._lib import load_library

    inv = Inventory()
    err = ctypes.create_string_buffer(1024)
    rc = load_library().tsp_gpu_inventory(ctypes.byref(inv), err, len(err))
    if rc != 0:
        say(f"tsp_gpu_inventory failed: {rc} {err.value.decode()}")
        return 1
    rows = smi("index,uuid,pci.bus_id,mig.mode.current,compute_mode")
    ok = len(rows) == inv.ndev
    say(f"nvidia-smi: {len(rows)} GPU(s); NVML through libtorchspark: {inv.ndev}")
    ours = [(d.index, d.uuid.decode(), norm_bus(d.bus.decode())) for d in inv.dev[:inv.ndev]]
    for i, row in enumerate(rows):
        theirs = (int(row[0]), row[1], norm_bus(row[2]))
        same = i < len(ours) and ours[i] == theirs
        ok &= same
        say(f"{'ok ' if same else 'BAD'} nvidia-smi {theirs} mig={row[3]} mode={row[4]}; "
            f"NVML {ours[i] if i < len(ours) else None}")
    # The CUDA driver, all devices in PCI order (as Spark's discovery script numbers them).
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cu = ctypes.CDLL(os.environ.get("TORCHSPARK_LIBCUDA") or "libcuda.so.1")
    rc = cu.cuInit(0)
    n = ctypes.c_int(0)
    if rc != 0 or cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
        say(f"cuInit/cuDeviceGetCount failed ({rc})")
        return 1
    migs = [r[3] for r in rows if r[3].lower() == "enabled"]
    for i in range(n.value):
        dev = ctypes.c_int()
        cu.cuDeviceGet(ctypes.byref(dev), i)
        bus = ctypes.create_string_buffer(64)
        cu.cuDeviceGetPCIBusId(bus, 64, dev)
        raw = ctypes.create_string_buffer(16)
        cu.cuDeviceGetUuid_v2(raw, dev)
        h = raw.raw.hex()
        uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        cuda = (i, uuid, norm_bus(bus.value.decode()))
        same = i < len(ours) and ours[i] == cuda
        if not migs:
            ok &= same
        say(f"{'ok ' if same else 'BAD'} CUDA {cuda}")
    if not migs:
        ok &= n.value == len(rows)
    else:
        say("MIG is enabled: CUDA lists MIG devices, compared for information only")
    return 0 if ok else 1


def agent_wall(extra: Sequence[str], runs: int, expect: str = "") -> Tuple[List[float], str]:
    """The agent's wall time for `--standalone --nproc-per-node gpu --gpus 0 EXTRA --no-python
    true`, runs times; raises with its output when a run fails."""
    walls = []
    out = ""
    for _ in range(runs):
        r = run([agent(), "--standalone", "--nproc-per-node", "gpu", "--gpus", "0", *extra,
                 "--no-python", "true"], timeout=90)
        if r.rc != 0 or (expect and expect not in r.out):
            raise RuntimeError(f"status {r.rc} after {r.wall:.2f} s:\n{r.out}")
        walls.append(r.wall)
        out = r.out
    return walls, out


def check_h2() -> int:
    """H2 (F1, F4): the check at world size 1 with torch's libnccl, through the agent (its
    cost: the agent's wall with it minus without it) and as one check process alone (the
    split: CUDA, NCCL init, all_reduce; its peak GPU memory; memory after it)."""
    say("libnccl:", nccl_lib() or "(the loader's libnccl.so.2)")
    try:
        without, _ = agent_wall([], 5)
        with_, out = agent_wall(["--nccl-check=60", *nccl_args()], 5, "NCCL check passed")
    except RuntimeError as e:
        say(f"the agent failed: {e}")
        return 1
    say([ln for ln in out.splitlines() if "NCCL check passed" in ln][-1])
    figure("F1", "agent wall, world size 1, without the check (median)",
           f"{statistics.median(without):.2f} s", fmt(without))
    figure("F1", "agent wall, world size 1, with --nccl-check (median)",
           f"{statistics.median(with_):.2f} s", fmt(with_))
    cost = statistics.median(with_) - statistics.median(without)
    figure("F1", "the check's cost (difference of the medians; goal <= 3 s)", f"{cost:.2f} s")
    index, _, _ = first_gpu()
    nvml = Nvml()
    split: Dict[str, List[float]] = {"t_cuda": [], "t_init": [], "t_allreduce": []}
    peaks, after, algbw = [], [], []
    for _ in range(3):
        base = nvml.used_mib(index)
        sampler = PeakSampler(nvml, index)
        sampler.start()
        p, r = check_worker(0, 1, 0, f"127.0.0.1:{free_port()}", str(index), 60)
        res, _ = worker_result(p, r, 90)
        peak = sampler.stop()
        left = settled(nvml, index, base)
        if not res or not res.get("ok"):
            say(f"the check process failed: {res}")
            return 1
        for k in split:
            split[k].append(float(res[k]))
        algbw.append(float(res["algbw"]))
        peaks.append(peak - base)
        after.append(left)
    for k, what in (("t_cuda", "cuInit + context + buffers"), ("t_init", "NCCL init")):
        figure("F1", f"check process: {what} (median)", f"{statistics.median(split[k]):.3f} s",
               fmt(split[k], digits=3))
    us = [t * 1e6 for t in split["t_allreduce"]]  # the mean of the 20 timed ones, each run
    figure("F1", "check process: one timed all_reduce of 32 MiB (median)",
           f"{statistics.median(us):.1f} us", fmt(us, "us", 1))
    figure("F4", "check process: peak GPU memory above baseline (median)",
           f"{statistics.median(peaks):.0f} MiB", fmt(peaks, "MiB", 0))
    figure("F4", "GPU memory after the check process ended, above baseline",
           f"{max(after):+.0f} MiB", fmt(after, "MiB", 0))
    figure("F5", "check process: algbw at 32 MiB, 1 rank (median)",
           f"{statistics.median(algbw):.1f} GB/s", fmt(algbw, "GB/s", 1))
    ok = cost <= 3.0 and max(after) <= 2
    if cost > 3.0:
        say(f"the check costs {cost:.2f} s, more than the 3 s that keeps it on by default")
    if max(after) > 2:
        say(f"GPU memory is {max(after):.0f} MiB above the baseline after the check")
    return 0 if ok else 1


def check_h3() -> int:
    """H3 (F3): two ranks on one GPU. Up front: one agent with --gpus 0,0 (G7, no worker
    starts). Across agents: two agents of a 2-node job on this host, both on GPU 0, with
    the check: NCCL's "Duplicate GPU detected", and how long until both ended."""
    r = run([agent(), "--standalone", "--nproc-per-node", "gpu", "--gpus", "0,0", "--no-python",
             "true"], timeout=30, show=True)
    ok = r.rc == 2 and r.wall < 5
    figure("F3", "two workers on one GPU in one agent (--gpus 0,0): refused after", f"{r.wall:.2f} s")
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for node in (0, 1):
        cmd = [agent(), "--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
               f"--master-port={port}", "--nproc-per-node=gpu", "--gpus=0", "--nccl-check=30",
               *nccl_args(), "--no-python", "true"]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      text=True, errors="replace"))
    outs, ends = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, 45 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _kill_session(p)
            out, _ = p.communicate()
        outs.append(out)
        ends.append(time.monotonic() - t0)
    text = "\n".join(outs)
    say(text.rstrip())
    dup = "Duplicate GPU detected" in text
    failed = all(p.returncode not in (0, None) for p in procs)
    figure("F3", "two agents, one GPU, the check: NCCL's 'Duplicate GPU detected' after",
           f"{min(ends):.2f} s (both ended {max(ends):.2f} s)")
    if not dup:
        say("NCCL's 'Duplicate GPU detected' is not in the agents' output")
    if not failed:
        say("an agent did not fail")
    return 0 if ok and dup and failed and max(ends) < 35 else 1


def check_h4() -> int:
    """H4 (F3): a missing rank: node 0 of 2 alone with a 10 s deadline ends at 10 s with
    the timeout's message, and the GPU's memory is back at its baseline."""
    index, _, _ = first_gpu()
    nvml = Nvml()
    base = nvml.used_mib(index)
    deadline = 10
    r = run([agent(), "--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
             f"--master-port={free_port()}", "--nproc-per-node=gpu", "--gpus=0",
             f"--nccl-check={deadline}", *nccl_args(), "--no-python", "true"], timeout=40,
            show=True)
    left = settled(nvml, index, base)
    figure("F3", f"a missing rank, deadline {deadline} s: the agent ended after", f"{r.wall:.2f} s")
    figure("F4", "GPU memory after the timed-out check, above baseline", f"{left:+.0f} MiB")
    ok = (r.rc not in (0, 124) and f"NCCL check timed out after {deadline} s" in r.out
          and deadline <= r.wall <= deadline + 2 and left <= 2)
    return 0 if ok else 1


def gpu_count_of(mask: Optional[str]) -> int:
    r = run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            env=env_with(CUDA_VISIBLE_DEVICES=mask), timeout=120)
    try:
        return int(r.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        say(r.out)
        return -1


def check_h5() -> int:
    """H5: every CUDA_VISIBLE_DEVICES form under `--nproc-per-node gpu` (the count in the
    agent), each run bounded (the full UUID hung on main, issue 18): the full UUID, a
    prefix and an index run one worker each, as torch counts them; an empty mask and an
    index that does not exist are refused with a message; torch agrees on every count."""
    index, uuid, _ = first_gpu()
    ndev = len(smi("index"))
    forms = [("full UUID", uuid, 1, 5), ("UUID prefix", uuid[:14], 1, 3),
             ("index", str(index), 1, 3), ("empty", "", 0, 2), ("missing index", str(ndev), 0, 2)]
    ok = True
    for name, mask, want, runs in forms:
        torch_n = gpu_count_of(mask)
        for extra in ([], ["--gpus", "0"]) if want else ([],):
            for i in range(runs if not extra else 2):
                r = run([agent(), "--standalone", "--nproc-per-node", "gpu", *extra,
                         "--no-python", "sh", "-c", 'echo "world=$WORLD_SIZE"'],
                        env=env_with(CUDA_VISIBLE_DEVICES=mask), timeout=20)
                world = [ln.split("world=", 1)[1] for ln in r.out.splitlines() if "world=" in ln]
                if want:
                    good = r.rc == 0 and world == [str(want)]
                else:
                    good = r.rc not in (0, 124) and "CUDA" in r.out and not world
                tag = "ok " if good else "BAD"
                say(f"{tag} CUDA_VISIBLE_DEVICES={mask!r} ({name}) {' '.join(extra)}: status "
                    f"{r.rc}{' (timed out: the agent hung)' if r.timed_out else ''} in "
                    f"{r.wall:.2f} s, workers {world}")
                if not good or i == 0 and not want:
                    say("   " + r.out.strip().replace("\n", "\n   "))
                ok &= good
        good = torch_n == want
        say(f"{'ok ' if good else 'BAD'} torch.cuda.device_count() with {mask!r}: {torch_n} "
            f"(expected {want})")
        ok &= good
    return 0 if ok else 1


def check_h6() -> int:
    """H6: NCCL_SOCKET_IFNAME=doesnotexist at world size 1 with the check: a failure with
    NCCL's own WARN lines, fast."""
    r = run([agent(), "--standalone", "--nproc-per-node", "gpu", "--gpus", "0",
             "--nccl-check=30", *nccl_args(), "--no-python", "true"],
            env=env_with(NCCL_SOCKET_IFNAME="doesnotexist"), timeout=60, show=True)
    warns = [ln for ln in r.out.splitlines() if "NCCL WARN" in ln]
    figure("H6", f"NCCL_SOCKET_IFNAME=doesnotexist: the agent ended (status {r.rc}) after",
           f"{r.wall:.2f} s", "; ".join(w.split("NCCL WARN", 1)[1].strip() for w in warns[:2]))
    return 0 if r.rc not in (0, 124) and warns and r.wall < 30 else 1


def check_h7() -> int:
    """H7: the election's held nccl_port (SO_REUSEADDR + SO_REUSEPORT, never listening) is
    the check's NCCL_COMM_ID port: real NCCL's bootstrap root binds over it, 5 of 5 times."""
    from torchspark.native import _elect

    ok = True
    walls = []
    for i in range(5):
        peer = socket.gethostname()
        try:
            record, _, held = _elect.elect_master(peer)
        except _elect.ElectionError:
            record, _, held = _elect.elect_master("127.0.0.1")
        with held:
            r = run([agent(), "--nnodes=1", "--node-rank=0",
                     f"--master-addr={record['master_addr']}",
                     f"--master-port={record['master_port']}",
                     f"--nccl-comm-port={record['nccl_port']}", "--nproc-per-node=gpu", "--gpus=0",
                     "--nccl-check=30", *nccl_args(), "--no-python", "true"],
                    env=env_with(NCCL_SOCKET_IFNAME=record["ifname"] or None), timeout=60)
        good = r.rc == 0 and "NCCL check passed" in r.out
        say(f"{'ok ' if good else 'BAD'} run {i + 1}: master {record['master_addr']}:"
            f"{record['master_port']}, nccl_port {record['nccl_port']} held, status {r.rc}, "
            f"{r.wall:.2f} s")
        if not good:
            say(r.out)
        ok &= good
        walls.append(r.wall)
    passed = sum(1 for w in walls if w > 0) if ok else 0
    figure("H7", "the check on the election's held nccl_port: passed", f"{passed} of 5",
           fmt(walls))
    return 0 if ok else 1


PROBE = ('for f in /proc/$$/fd/*; do echo "fd $(readlink "$f")"; done; '
         'echo "parent $(cat /proc/$PPID/comm)"; grep VmHWM /proc/$PPID/status')


def check_h8() -> int:
    """H8 (F2): what the agent holds in each GPU mode: no /dev/nvidia* descriptor reaches
    a worker; the agent's VmHWM (goal 8 MiB) and start-to-exit wall."""
    modes = [("NVML count (--nproc-per-node gpu)", ["--nproc-per-node", "gpu"], {}),
             ("cuInit count (NVML hidden)", ["--nproc-per-node", "gpu"],
              {"TORCHSPARK_LIBNVML": "/nonexistent/libnvidia-ml.so.1"}),
             ("--gpus 0 (NVML assignment)", ["--nproc-per-node", "gpu", "--gpus", "0"], {}),
             ("--nproc-per-node 1 (no GPU code)", ["--nproc-per-node", "1"], {})]
    ok = True
    for name, opts, extra in modes:
        hwm, walls = [], []
        for _ in range(3):
            r = run([agent(), "--standalone", *opts, "--no-python", "sh", "-c", PROBE],
                    env=env_with(**extra), timeout=30)
            fds = [ln for ln in r.out.splitlines() if "fd /dev/nvidia" in ln]
            kib = [int(ln.split()[-2]) for ln in r.out.splitlines() if "VmHWM:" in ln]
            parent = [ln for ln in r.out.splitlines() if "parent " in ln]
            good = r.rc == 0 and not fds and len(kib) >= 1 and "torchspark-run" in " ".join(parent)
            if not good:
                say(f"BAD {name}: status {r.rc}\n{r.out}")
                ok = False
                break
            hwm.append(max(kib) / 1024)
            walls.append(r.wall)
        if len(hwm) == 3:
            med = statistics.median(hwm)
            say(f"{'ok ' if med * 1024 <= HWM_GOAL_KIB else 'BAD'} {name}: no /dev/nvidia* in "
                f"the worker; agent VmHWM {fmt(hwm, 'MiB', 1)}")
            figure("F2", f"agent VmHWM, {name} (median; goal <= 8 MiB)", f"{med:.1f} MiB",
                   fmt(hwm, "MiB", 1))
            figure("F2", f"agent wall with one `sh` worker, {name} (median)",
                   f"{statistics.median(walls):.3f} s", fmt(walls, digits=3))
            ok &= med * 1024 <= HWM_GOAL_KIB
    return 0 if ok else 1


def check_h9() -> int:
    """H9 (F6): one DDP step with backend nccl under torchspark-run and under torchrun,
    3 runs each, alternating: launch to the first all_reduce and to the end."""
    script = os.path.join(HERE, "ddp_nccl.py")
    cmds = {"torchspark-run": [agent(), "--standalone", "--nproc-per-node", "gpu",
                               "--python", sys.executable, script],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "1", script]}
    first: Dict[str, List[float]] = {k: [] for k in cmds}
    walls: Dict[str, List[float]] = {k: [] for k in cmds}
    for i in range(3):
        for name, cmd in cmds.items():
            r = run(cmd, env=env_with(TSP_GPU_T0=repr(time.time())), timeout=120)
            got = [ln for ln in r.out.splitlines() if "first all_reduce" in ln]
            if r.rc != 0 or not got:
                say(f"BAD {name}: status {r.rc}\n{r.out}")
                return 1
            first[name].append(float(got[-1].split("after launch:")[1].split()[0]))
            walls[name].append(r.wall)
            if i == 0:
                say(f"{name}: {got[-1].strip()}")
    for name in cmds:
        figure("F6", f"launch to the first NCCL all_reduce, {name}, 1 GPU (median)",
               f"{statistics.median(first[name]):.2f} s", fmt(first[name]))
        figure("F6", f"launch to exit, one DDP step, {name} (median)",
               f"{statistics.median(walls[name]):.2f} s", fmt(walls[name]))
    return 0


def check_h10() -> int:
    """H10 (F5): nccl-tests' all_reduce_perf -b 32M -e 32M -g 1 beside the check process's
    32 MiB algbw, when nccl-tests is here (NCCL_TESTS_BIN or all_reduce_perf on PATH)."""
    perf = os.environ.get("NCCL_TESTS_BIN") or shutil.which("all_reduce_perf")
    if not perf:
        say("skipped: nccl-tests' all_reduce_perf is not here (build it with nvcc against the "
            "nvidia-nccl wheel and set NCCL_TESTS_BIN)")
        return SKIP
    r = run([perf, "-b", "32M", "-e", "32M", "-g", "1"], timeout=120, show=True)
    rows = [ln.split() for ln in r.out.splitlines() if ln.strip().startswith("33554432")]
    if r.rc != 0 or not rows:
        return 1
    theirs = float(rows[0][6])
    index, _, _ = first_gpu()
    p, fd = check_worker(0, 1, 0, f"127.0.0.1:{free_port()}", str(index), 60)
    res, _ = worker_result(p, fd, 90)
    if not res or not res.get("ok"):
        say(f"the check process failed: {res}")
        return 1
    ours = float(res["algbw"])
    figure("F5", "algbw 32 MiB, 1 GPU: check process vs nccl-tests (goal within 5 %)",
           f"{ours:.1f} vs {theirs:.1f} GB/s")
    return 0 if abs(ours - theirs) <= 0.05 * theirs else 1


CHECKS: Dict[str, Callable[[], int]] = {
    "env": check_env, "h1": check_h1, "h2": check_h2, "h3": check_h3, "h4": check_h4,
    "h5": check_h5, "h6": check_h6, "h7": check_h7, "h8": check_h8, "h9": check_h9,
    "h10": check_h10,
}


def main(argv: List[str]) -> int:
    if len(argv) != 2 or argv[1] not in CHECKS:
        say(f"usage: checks.py {'|'.join(CHECKS)}")
        return 2
    return CHECKS[argv[1]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
