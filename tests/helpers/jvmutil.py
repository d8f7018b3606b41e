"""Helpers for the JVM suites: spark-submit of the test application (TrainApp in
tests/java), and cancelling a PySpark TorchDistributor job mid-training. Shared with
bench/jvm_cancel_bench.py."""
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pyspark

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TORCHSPARK_BUILD_DIR", ROOT / "build"))
JAR = BUILD / "java" / "torchspark.jar"
TEST_JAR = BUILD / "java" / "torchspark_tests.jar"
DDP = ROOT / "spark-glue" / "python" / "examples" / "ddp_train.py"
PLUGIN = "org.torchspark.TorchSparkPlugin"
SPARK_HOME = os.path.dirname(pyspark.__file__)
MASTER = "local-cluster[2,1,1024]"


def built() -> bool:
    return JAR.is_file() and TEST_JAR.is_file()


def submit_command(mode: str, plugin: bool, conf: Optional[Dict[str, str]] = None,
                   master: str = MASTER, app_args: Optional[List[str]] = None,
                   env: Optional[Dict[str, Optional[str]]] = None) -> Tuple[List[str], Dict[str, str]]:
    """spark-submit's command line and environment for TrainApp MODE PYTHON DDP APP_ARGS
    (env: the driver's variables to set, or to unset with None)."""
    cmd = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", master,
           "--conf", "spark.executor.memory=1024m", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.testing=true", "--conf", f"spark.test.home={SPARK_HOME}",
           "--jars", str(JAR)]
    if plugin:
        cmd += ["--conf", f"spark.plugins={PLUGIN}"]
    for k, v in (conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += ["--class", "org.torchspark.TrainApp", str(TEST_JAR), mode, sys.executable, str(DDP)]
    cmd += app_args or []
    penv = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_HOME=SPARK_HOME)
    for k, v in (env or {}).items():
        if v is None:
            penv.pop(k, None)
        else:
            penv[k] = v
    return cmd, penv


def parse_output(stdout: str) -> Dict[str, List[str]]:
    """TrainApp's "KEY: value" lines."""
    out: Dict[str, List[str]] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isupper():
            out.setdefault(key, []).append(value)
    return out


def spark_submit(mode: str, plugin: bool, conf: Optional[Dict[str, str]] = None, rounds: int = 1,
                 timeout: float = 600, master: str = MASTER,
                 env: Optional[Dict[str, Optional[str]]] = None,
                 on_start: Optional[Callable[[int], None]] = None
                 ) -> Tuple[Dict[str, List[str]], str]:
    """Runs TrainApp MODE with the real spark-submit of the pyspark package on
    local-cluster[2,1,1024] (env: the driver's variables to set, or to unset with None;
    on_start: called with spark-submit's pid once it runs); returns its "KEY: value" lines
    and its stderr."""
    stdout, err = _submit(mode, plugin, conf, rounds, timeout, master, env, on_start)
    return parse_output(stdout), err


def spark_submit_modes(modes: List[str], plugin: bool, timeout: float = 1200,
                       conf: Optional[Dict[str, str]] = None,
                       env: Optional[Dict[str, Optional[str]]] = None,
                       on_start: Optional[Callable[[int], None]] = None
                       ) -> Tuple[Dict[str, Dict[str, List[str]]], Dict[str, str]]:
    """Runs several TrainApp modes one after another in one application (TrainApp's A+B:
    one start for several tests; conf, env, on_start as spark_submit's); returns each
    mode's "KEY: value" lines and each mode's stderr."""
    if len(modes) == 1:  # TrainApp prints no MODE line for a single mode
        out, err = spark_submit(modes[0], plugin, conf=conf, timeout=timeout, env=env,
                                on_start=on_start)
        return {modes[0]: out}, {modes[0]: err}
    stdout, err = _submit("+".join(modes), plugin, conf, 1, timeout, MASTER, env, on_start)
    return split_modes(stdout), split_text(err)


def split_text(text: str) -> Dict[str, str]:
    """TrainApp A+B's stdout or stderr: each mode's lines, from its "MODE: name" line to the
    next (what comes before the first, the application's start, belongs to none)."""
    parts: Dict[str, List[str]] = {}
    current: List[str] = []
    for line in text.splitlines():
        if line.startswith("MODE: "):
            current = parts.setdefault(line[len("MODE: "):], [])
        else:
            current.append(line)
    return {m: "\n".join(lines) for m, lines in parts.items()}


def split_modes(stdout: str) -> Dict[str, Dict[str, List[str]]]:
    """TrainApp A+B's stdout: each mode's "KEY: value" lines (split_text)."""
    return {m: parse_output(text) for m, text in split_text(stdout).items()}


def _submit(mode: str, plugin: bool, conf: Optional[Dict[str, str]], rounds: int, timeout: float,
            master: str, env: Optional[Dict[str, Optional[str]]],
            on_start: Optional[Callable[[int], None]]) -> Tuple[str, str]:
    cmd, penv = submit_command(mode, plugin, conf, master, [str(rounds)], env)
    with subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=str(BUILD)) as p:
        if on_start is not None:
            on_start(p.pid)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
    err = stderr.decode(errors="replace")
    if p.returncode != 0:
        raise AssertionError(f"spark-submit exited {p.returncode}:\n{err[-4000:]}")
    return stdout.decode(errors="replace"), err


def stock_processes(mark: str) -> List[int]:
    """The stock path's training processes carrying mark: per node PySpark's wrapper
    (python -m pyspark.ml.torch.torch_run_process_wrapper), its torchrun (python -m
    torch.distributed.run; the two are the agent's counterpart) and the workers."""
    from tests.helpers import tsp_spark

    found = tsp_spark.job_processes(mark)
    needle = f"{tsp_spark.MARK}={mark}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in found:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if b"torch.distributed.run" not in cmd and STOCK_WRAPPER not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        found.append(int(pid))
    return found


STOCK_WRAPPER = b"pyspark.ml.torch.torch_run_process_wrapper"
NOT_STARTED = -2.0  # a round whose training was not up within start_timeout


def start_training(stock: bool = False) -> threading.Thread:
    """Starts an endless TorchDistributor training of DDP (2 processes, not local mode;
    torchspark's, or PySpark's own with stock) on a daemon thread, which swallows the run's
    error (the callers cancel it); returns the thread."""
    if stock:
        from pyspark.ml.torch.distributor import TorchDistributor
    else:
        from torchspark import TorchDistributor

    def train() -> None:
        try:
            TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                str(DDP), "--steps", "100000000")
        except Exception:
            pass

    t = threading.Thread(target=train, daemon=True)
    t.start()
    return t


def cancel_pyspark(spark, mark: str, rounds: int = 1, gone_timeout: float = 15.0,
                   stock: bool = False, start_timeout: float = 600.0) -> List[float]:
    """Starts a TorchDistributor training (2 processes; torchspark's, or PySpark's own with
    stock), cancels every job 3 s after its processes are up (2 agents and 2 workers; stock:
    2 wrappers, 2 torchruns, 2 workers) and returns, per round, the ms until every one of them is gone (-1: not within
    gone_timeout; NOT_STARTED: not up within start_timeout, then cancelled anyway). What is
    left is killed afterwards, so the next round starts clean."""
    from tests.helpers import tsp_spark

    procs = (lambda: stock_processes(mark)) if stock else (lambda: tsp_spark.job_processes(mark))
    need = 6 if stock else 4
    times = []
    for _ in range(rounds):
        t = start_training(stock)
        deadline = time.monotonic() + start_timeout
        while len(procs()) < need and time.monotonic() < deadline:
            time.sleep(0.1)
        started = len(procs()) >= need
        if started:
            time.sleep(3)  # mid-training
        t0 = time.monotonic()
        spark.sparkContext.cancelAllJobs()
        gone = -1.0
        while time.monotonic() - t0 < gone_timeout:
            if not procs():
                gone = (time.monotonic() - t0) * 1000
                break
            time.sleep(0.005)
        times.append(round(gone, 1) if started else NOT_STARTED)
        for pid in procs():
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        t.join(30)
    return times


def pyspark_session(plugin: bool, mark: str):
    from tests.helpers import tsp_spark

    conf = {"spark.jars": str(JAR), f"spark.executorEnv.{tsp_spark.MARK}": mark}
    if plugin:
        conf["spark.plugins"] = PLUGIN
    return tsp_spark.session(MASTER, conf)


def new_mark() -> str:
    return uuid.uuid4().hex


# Every training process gone within this, from the cancel call: the 1 s (measured
# 70-140 ms on a loaded 2-core machine; the median goal of 200 ms is measured in the bench).
GONE_BOUND_MS = 1000


def plugin_stops(app_id: str, needle: str = "torchspark plugin: stopped") -> int:
    """How many times the executors' TorchSparkPlugin logged stopping a killed task's agents
    (or needle: any line) (local-cluster executors write <worker dir>/<app id>/<executor
    id>/stderr, the worker dirs under java.io.tmpdir)."""
    n = 0
    for f in Path(tempfile.gettempdir()).glob(f"worker-*/{app_id}/*/stderr"):
        n += f.read_text(errors="replace").count(needle)
    return n


# The executor's log line when it starts a task (Spark's Executor, INFO).
TASK_STARTED = "INFO Executor: Running task "

# Fine steps first: on a quiet machine the window between the task's start on the
# executor and its agent is a few tens of ms (the election goes through the driver's
# rendezvous); coarse ones after, for a loaded machine.
EARLY_DELAYS = tuple(i / 100 for i in range(12)) + (0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.5)


def cancel_early_pyspark(spark, mark: str, delays=EARLY_DELAYS, until_window: bool = True,
                         base: int = 0) -> List[Tuple]:
    """Starts a torchspark TorchDistributor training (2 processes) per delay and cancels
    every job DELAY s after the first of its tasks was launched (seen in the executors'
    logs, else in the status tracker): before the tasks run, while they elect or wait in the barrier's allGather,
    or just after the agents started. Returns, per round, (delay, processes up at the
    cancel, ms until none is left (-1: not in 15 s), the ms when one was first and last
    seen again in the 3 s after the cancel (a late agent; -1: none), processes alive after
    that). With until_window, the rounds end once the executors' plugin logged a task
    killed with no agent running, or once a cancel came while none of the job's processes
    existed yet (the status tracker sees a launch late and by a varying margin, so the
    delay that hits the window varies; base: how many such lines the application's earlier
    runs logged)."""
    from tests.helpers import tsp_spark

    sc = spark.sparkContext
    app = sc.applicationId
    rounds = []
    for delay in delays:
        launched = plugin_stops(app, TASK_STARTED)
        t = start_training()
        deadline = time.monotonic() + 120
        tracker = sc.statusTracker()
        while time.monotonic() < deadline:
            # The executors' own log line says first (the driver's status tracker hears of a
            # launch through its listener bus, which can lag past the agents' start); the
            # tracker where executors log no INFO.
            if plugin_stops(app, TASK_STARTED) > launched:
                break
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            if not launched and any(i is not None and i.numActiveTasks > 0 for i in infos):
                break
            time.sleep(0.005)
        else:
            raise AssertionError("no task was launched in 120 s")
        time.sleep(delay)
        before = len(tsp_spark.job_processes(mark))
        t0 = time.monotonic()
        sc.cancelAllJobs()
        gone = -1.0
        while time.monotonic() - t0 < 15:
            if not tsp_spark.job_processes(mark):
                gone = (time.monotonic() - t0) * 1000
                break
            time.sleep(0.005)
        # An agent started after the cancel (the task's allGather returned anyway): when a
        # process of the job was first and last seen again, over 3 s after the cancel.
        first = last = -1.0
        while time.monotonic() - t0 < 3:
            if tsp_spark.job_processes(mark):
                last = (time.monotonic() - t0) * 1000
                first = last if first < 0 else first
            time.sleep(0.01)
        t.join(30)
        late = tsp_spark.job_processes(mark)
        rounds.append((delay, before, round(gone, 1), round(first, 1), round(last, 1), len(late)))
        for pid in late:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        if until_window and (before == 0 or
                             plugin_stops(sc.applicationId, "killed with no agent running") > base):
            break
    return rounds
