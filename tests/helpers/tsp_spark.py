"""Helpers for the TorchDistributor suites: one SparkSession per module, fake GPU
discovery, and counting a job's processes by a marker in their environment."""
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Dict, List

import pyspark
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "spark-glue" / "python" / "examples"
MARK = "TSP_E2E_MARK"  # in the environment of every process a test's job starts
CONNECT_MARK = "connect-" + os.urandom(8).hex()  # MARK's value on the Connect server


def fake_gpu_script(directory: Path, addresses: List[str]) -> str:
    path = directory / "gpus.sh"
    path.write_text("#!/bin/sh\necho '%s'\n" % json.dumps({"name": "gpu", "addresses": addresses}))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


_previous_conf: Dict[str, str] = {}


def _forget_previous_conf(conf: Dict[str, str]) -> None:
    """The JVM outlives a stopped SparkContext, and the confs of the session that launched
    it stay JVM system properties, which every later SparkConf loads: a local[2] module after
    the local-cluster one would inherit its task GPU amount and never get a task scheduled."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:
        return
    for key in _previous_conf:
        if key not in conf:
            jvm.java.lang.System.clearProperty(key)


def session(master: str, conf: Dict[str, str], python: str = sys.executable) -> SparkSession:
    """A classic session; python is the executors' interpreter (PYSPARK_PYTHON)."""
    global _previous_conf
    _forget_previous_conf(conf)
    _previous_conf = dict(conf)
    # Executors and agents run this interpreter (the checkout's .venv with torchspark).
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    home = os.path.dirname(pyspark.__file__)
    b = (SparkSession.builder.master(master).appName("torchspark-e2e")
         .config("spark.ui.enabled", "false")
         .config("spark.testing", "true").config("spark.test.home", home)
         .config("spark.executor.memory", "1024m")
         .config("spark.python.worker.reuse", "true"))
    for k, v in conf.items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def python_without_torchspark(directory: Path, other_version: str = "") -> str:
    """A venv whose Python imports pyspark and torch (through a .pth file) but not
    torchspark, which the checkout installs into .venv only: the executors' Python of a
    driver-only install. With other_version, it has a stand-in torchspark package of that
    version instead (an executor with another version installed)."""
    import subprocess
    import sysconfig

    import torch

    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = str(directory / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    deps = {os.path.dirname(os.path.dirname(m.__file__)) for m in (pyspark, torch)}
    assert sysconfig.get_paths()["purelib"] not in deps, "torchspark shares pyspark's site"
    Path(site.stdout.strip(), "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    if other_version:
        pkg = Path(site.stdout.strip(), "torchspark")
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"__version__ = {other_version!r}\n")
    return python


WARM_POOL_COMM = b"tsp-warm-pool"  # torchspark._warm.POOL_COMM


def warm_pool_child(pid: int) -> bool:
    """pid was forked by a warm worker pool (a function-mode training process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm", "rb") as f:
            return f.read().strip() == WARM_POOL_COMM
    except (OSError, ValueError, IndexError):
        return False


def job_processes(mark: str) -> List[int]:
    """Training processes (workers: TORCHELASTIC_RUN_ID set; agents: torchspark-run)
    whose environment carries MARK=mark."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle not in env or state == b"Z":
            continue
        # A worker forked from a warm pool (torchspark/_warm.py) shows the pool's
        # environment, without the run's variables: it is known by its parent.
        is_worker = (any(e.startswith(b"TORCHELASTIC_RUN_ID=") for e in env)
                     or warm_pool_child(int(pid)))
        is_agent = b"torchspark-run" in cmd.split(b"\0")[0]
        if is_worker or is_agent:
            found.append(int(pid))
    return found


def wait_gone(mark: str, timeout: float) -> List[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = job_processes(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def wait_present(mark: str, n: int, timeout: float) -> List[int]:
    deadline = time.monotonic() + timeout
    while True:
        found = job_processes(mark)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
