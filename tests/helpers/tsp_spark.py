"""Helpers for the TorchDistributor suites: Spark sessions (one shared per configuration for
the whole run, or a module's own), fake GPU discovery, and counting a job's processes by a
marker in their environment."""
import json
import os
import stat
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

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
    """A classic session of the caller's own (it stops it); python is the executors'
    interpreter (PYSPARK_PYTHON). A shared session still up is stopped first: a process has
    one SparkContext, and getOrCreate would hand that one out whatever the master."""
    global _previous_conf
    stop_shared()
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


# The shared sessions (docs/testing.md, "Shared Spark"): one per configuration, started by the
# first module that asks for it and kept for every later module of the same configuration; a
# module of another configuration (or one owning its session) stops it first. Their executors
# carry MARK=SHARED_MARK: a module finds its own job's processes by that mark, after waiting
# for the previous job's to be gone, as it does between its own tests.
SHARED_MARK = "shared-" + os.urandom(8).hex()
CLUSTER = "local-cluster[2,1,1024]"  # the spark_cluster fixture's (tests/e2e/conftest.py)
_shared: Dict[str, object] = {"key": None, "session": None}


def shared(master: str, conf: Optional[Dict[str, str]] = None) -> SparkSession:
    """The run's shared session of master and conf (settings Spark fixes when the context
    starts: the cluster's shape, resources, executor environment). Settings read at each run
    (spark.torchspark.*) belong in runtime_conf() instead, so that more modules share."""
    key: Tuple = (master, tuple(sorted((conf or {}).items())))
    s = _shared["session"]
    if _shared["key"] == key and s is not None and s.sparkContext._jsc is not None:
        return s  # type: ignore[return-value]
    stop_shared()
    s = session(master, {f"spark.executorEnv.{MARK}": SHARED_MARK, **(conf or {})})
    _shared.update(key=key, session=s)
    return s


def discard_shared() -> None:
    """A test that broke the shared session (killed an executor for good, froze the driver)
    says so: the next module that asks for it gets a new one."""
    stop_shared()


def stop_shared() -> None:
    s = _shared["session"]
    _shared.update(key=None, session=None)
    if s is not None:
        s.stop()  # type: ignore[attr-defined]


@contextmanager
def runtime_conf(spark: SparkSession, conf: Dict[str, str]) -> Iterator[SparkSession]:
    """Sets settings read at each run (spark.torchspark.*) on spark for a module or a test,
    and puts back what was there before."""
    saved = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield spark
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


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


WARM_POOL_COMM = b"tsp-warm-pool"  # torchspark.worker._warm.POOL_COMM


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
        # A worker forked from a warm pool (torchspark/worker/_warm.py) shows the pool's
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
